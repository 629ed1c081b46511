"""Deployed model libraries on this CPU: the library's C entry point (through ctypes, one call
a run), the in-process executor (the same glue, JIT-compiled) and onnxruntime, in one run.

    python benchmarks/deploy_cpu.py --rounds 5 [--log tuning_logs/resnet18-llvm.jsonl]

For ResNet-18 and MobileNetV2 (autosched.testing.models, batch 1, ``--image``) and the demo
CNN: compile (tuned with ``--log`` when it has records, else the default schedules), export to a
temporary build dir, load it with ``autosched.load``; then the three sides are timed in
alternation over ``--rounds`` rounds (each the median of runs lasting ``--min-s`` seconds;
benchmarks/baseline.py), all on ``--threads`` threads. Prints the machine (date, commit, CPU,
load average: on a loaded machine the rounds spread) and the library's size; results go to
benchmarks/results/deploy_cpu.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.graph.deploy import export  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402


def measure(name: str, proto: object, args: argparse.Namespace, build: Path) -> dict:
    """Compile, export and load ``proto``; its three sides timed in alternating rounds."""
    target = f"llvm -num-cores={args.threads}"
    graph = from_onnx(proto)
    feeds = random_inputs(graph)
    model = aus.compile(graph, target=target, log=args.log)
    lib = export(model, build / name, name=name)
    deployed = aus.load(build / name, threads=args.threads)
    sess = models.ort_session(proto, args.threads)
    want = sess.run(None, feeds)
    for got in (model.run(feeds), deployed.run(feeds)):
        np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=2e-3)
    timers = {
        "library": lambda: deployed.time(feeds, min_s=args.min_s),
        "in-process": lambda: model.time(feeds, min_s=args.min_s),
        "onnxruntime": lambda: baseline.median_seconds(lambda: sess.run(None, feeds),
                                                       min_s=args.min_s, min_runs=20),
    }
    got = baseline.alternate(timers, args.rounds)
    print(f"{name}: {len(model.kernels)} kernels, library {lib.stat().st_size / 1e6:.2f} MB; "
          f"ms, median of {args.rounds} alternating rounds (best round): "
          f"{baseline.rounds_line(got, digits=3)}", flush=True)
    return {"kernels": len(model.kernels), "library_bytes": lib.stat().st_size,
            **{f"{side}_rounds_ms": [t * 1e3 for t in r.seconds] for side, r in got.items()},
            **{f"{side}_median_ms": r.median * 1e3 for side, r in got.items()}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", type=int, default=224, help="ResNet-18's image size")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--log", default=None, help="tuning log for both models")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-s", type=float, default=1.0, help="seconds per side and round")
    ap.add_argument("--out", default="benchmarks/results/deploy_cpu.json")
    args = ap.parse_args()
    print(baseline.header())
    print(f"# threads {args.threads}: autosched OMP_WAIT_POLICY {baseline.omp_wait_policy()}; "
          f"{baseline.ort_peer(args.threads)}", flush=True)
    rows = {"machine": baseline.header(), "threads": args.threads, "image": args.image}
    with tempfile.TemporaryDirectory() as tmp:
        for name, proto in (("demo_cnn", models.small_cnn()),
                            ("resnet18", models.resnet18(image=args.image)),
                            ("mobilenet_v2", models.mobilenet_v2(image=args.image))):
            rows[name] = measure(name, proto, args, Path(tmp))
    baseline.save(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
