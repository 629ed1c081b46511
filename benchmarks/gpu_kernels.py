"""Where a model's GPU time goes: each kernel of one compile timed in place (the whole model
runs, ``kernel_seconds``), sorted, with its launch sizes, whether its CUDA C uses
tensor cores (wmma / mma), and its share of the total; one table per configuration.

    python benchmarks/gpu_kernels.py --models resnet18 --batch 32 --precision fp16 fp32 \
        [--log LOG | --schedule default] [--top 12]

Run on a GPU machine; ``AUTOSCHED_CONV_GEMM=implicit`` times implicit-GEMM convolutions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autosched import compile  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.testing.models import MODELS  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402


def uses_tensor_cores(source: str) -> bool:
    """Whether a kernel's CUDA C multiplies on tensor cores (wmma, inline mma or wgmma)."""
    return "mma_sync" in source or "mma.sync" in source or "wgmma.mma_async" in source


def launch(module: object) -> str:
    """'grid x block' of the module's first kernel, when its sizes are constants."""
    try:
        info = module.source.kernels[0]  # type: ignore[attr-defined]
        return "x".join(str(g) for g in info.grid) + " / " + "x".join(str(b) for b in info.block)
    except (AttributeError, IndexError):
        return "?"


def table(name: str, batch: int, precision: str, log: str | None, top: int,
          schedule: str | None = None) -> None:
    graph = from_onnx(MODELS[name](batch=batch))
    model = compile(graph, target="cuda", log=log, precision=precision, schedule=schedule)
    seconds = model.kernel_seconds(random_inputs(graph), repeat=20)
    times = [(k.task.name, float(t)) for k, t in zip(model.kernels, seconds)]
    total = sum(t for _, t in times)
    rows = sorted(zip(times, model.kernels), key=lambda r: -r[0][1])
    print(f"\n{name}, batch {batch}, {precision}: {len(times)} kernels, {total * 1e3:.3f} ms in "
          f"kernels (model.time {model.time(random_inputs(graph)) * 1e3:.3f} ms)")
    print("| kernel | ms | share | tensor cores | grid / block |\n|---|---:|---:|---|---|")
    for (task, t), k in rows[:top]:
        src = k.module.get_source() if hasattr(k.module, "get_source") else ""
        print(f"| {task} | {t * 1e3:.3f} | {t / total:.0%} | "
              f"{'yes' if uses_tensor_cores(src) else 'no'} | {launch(k.module)} |")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18"], choices=sorted(MODELS))
    ap.add_argument("--batch", nargs="+", type=int, default=[32])
    ap.add_argument("--precision", nargs="+", default=["fp16"])
    ap.add_argument("--log", help="a tuning log (default: the cost model's picks)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--schedule", choices=("default", "model"),
                    help="without a log: the untuned defaults or the cost model's picks "
                         "(default: compile's choice)")
    args = ap.parse_args()
    for name in args.models:
        for batch in args.batch:
            for precision in args.precision:
                table(name, batch, precision, args.log, args.top, args.schedule)


if __name__ == "__main__":
    main()
