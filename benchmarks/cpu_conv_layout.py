"""The ResNet-18 convolutions on the CPU, kernel OIHW (sums NCHW, the row is the vector) next
to IHWO (sums channels-last, output channels the vector), each followed by ReLU, checked
against each other: with their untuned default schedules, or with ``--trials N`` each tuned
for N trials from a fresh log (what decides ``graph.passes.packing_pays``). Prints a table.

    .venv/bin/python benchmarks/cpu_conv_layout.py [--trials N] [C,HW,K,STRIDE,KSIZE ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.search.space import SearchSpace  # noqa: E402
from autosched.te import ops  # noqa: E402

# (in channels, input size, out channels, stride, kernel size) of ResNet-18 at 224
LAYERS = [(3, 224, 64, 2, 7), (64, 56, 64, 1, 3), (64, 56, 128, 2, 3), (128, 28, 128, 1, 3),
          (128, 28, 256, 2, 3), (256, 14, 256, 1, 3), (256, 14, 512, 2, 3), (512, 7, 512, 1, 3),
          (256, 14, 512, 2, 1)]


def conv_task(c: int, hw: int, k: int, stride: int, ks: int, layout: str) -> aus.Task:
    x = te.placeholder((1, c, hw, hw), name="x")
    w = te.placeholder((k, c, ks, ks) if layout == "OIHW" else (c, ks, ks, k), name="w")
    y = ops.relu(ops.conv2d_nchw(x, w, stride=stride, padding=ks // 2, kernel_layout=layout))
    return aus.Task(lambda: [x, w, y], target="llvm", name=f"conv_{layout}")


def schedule_of(task: aus.Task, trials: int, work: Path):  # noqa: ANN201
    if not trials:
        return SearchSpace(task).default_schedule()
    log = work / f"{task.name}.jsonl"
    log.unlink(missing_ok=True)
    aus.tune(task, trials=trials, log=log, options=aus.TuneOptions(seed=0, verbose=False))
    return aus.best_schedule(task, log)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=0, help="tune each layout (0: defaults)")
    ap.add_argument("layers", nargs="*", help="C,HW,K,STRIDE,KSIZE (default: ResNet-18's)")
    args = ap.parse_args(argv)
    layers = [tuple(int(v) for v in a.split(",")) for a in args.layers] or LAYERS
    work = Path(tempfile.mkdtemp(prefix="conv_layout_"))
    print("schedules: " + (f"tuned for {args.trials} trials" if args.trials else "defaults"))
    rng = np.random.default_rng(0)
    print("| C | HW | K | stride | k | OIHW ms | IHWO ms | OIHW GFLOPS | IHWO GFLOPS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, hw, k, stride, ks in layers:
        x = rng.uniform(-1, 1, (1, c, hw, hw)).astype("float32")
        w = rng.uniform(-1, 1, (k, c, ks, ks)).astype("float32")
        ms, gf, outs = {}, {}, {}
        for layout in ("OIHW", "IHWO"):
            task = conv_task(c, hw, k, stride, ks, layout)
            mod = task.build(schedule_of(task, args.trials, work))
            wv = w if layout == "OIHW" else np.ascontiguousarray(w.transpose(1, 2, 3, 0))
            out = np.empty(tuple(task.outputs[0].shape), "float32")
            mod(x, wv, out)
            outs[layout] = out.copy()
            t = mod.time(x, wv, out, repeat=5, min_repeat_ms=50).median
            ms[layout], gf[layout] = t * 1e3, task.flop_count / t / 1e9
        np.testing.assert_allclose(outs["IHWO"], outs["OIHW"], rtol=1e-4, atol=1e-4)
        print(f"| {c} | {hw} | {k} | {stride} | {ks} | {ms['OIHW']:.3f} | {ms['IHWO']:.3f} | "
              f"{gf['OIHW']:.1f} | {gf['IHWO']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
