"""ResNet-18 (batch 1, 224x224, autosched.testing.models) end to end on this CPU: default
schedules, then tuned for a stated trial budget, next to onnxruntime in the same run.

    python benchmarks/e2e_cpu.py --trials 300 --log tuning_logs/resnet18-llvm.jsonl

The log is appended to (a rerun resumes; with the budget already in the log it only times).
autosched and onnxruntime (its intra-op thread count stated) are timed in alternation over
``--rounds`` rounds (each the median of runs lasting 2 s; benchmarks/baseline.py), so a slow
spell of a shared machine does not land on one side only; the median round and the best round
of each side are reported and every round is kept in the JSON. Prints the machine (date,
commit, CPU and ISA, load average) and numpy's OpenBLAS kernel. Results go to
benchmarks/results/e2e_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.cli.model import task_table  # noqa: E402
from autosched.graph.compiler import extract_tasks  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.search.tune import TuneOptions  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402


def ort_timer(proto: object, feeds: dict, threads: int | None):  # noqa: ANN201
    """One round of onnxruntime: the median of runs lasting 2 s."""
    sess = models.ort_session(proto, threads)
    return lambda: baseline.median_seconds(lambda: sess.run(None, feeds), min_s=2.0, min_runs=20)


def compare(tuned: object, proto: object, feeds: dict, threads: int | None, rounds: int,
            rows: dict) -> None:
    """Time the tuned model and onnxruntime in alternating rounds on ``threads`` threads."""
    tuned.set_threads(threads)
    print(f"# threads {threads or os.cpu_count()}: autosched OMP_WAIT_POLICY "
          f"{baseline.omp_wait_policy()}; {baseline.ort_peer(threads)}", flush=True)
    got = baseline.alternate({"autosched": lambda: tuned.time(feeds, min_s=2.0),
                              "onnxruntime": ort_timer(proto, feeds, threads)}, rounds)
    suffix = "_1thread" if threads == 1 else ""
    for key, name in (("tuned", "autosched"), ("ort", "onnxruntime")):
        r = got[name]
        rows[f"{key}{suffix}_ms"], rows[f"{key}{suffix}_median_ms"] = r.best * 1e3, r.median * 1e3
        rows[f"{key}{suffix}_rounds_ms"] = [t * 1e3 for t in r.seconds]
    print(f"threads {threads or os.cpu_count()}, ms, median of {rounds} alternating rounds "
          f"(best round): {baseline.rounds_line(got, digits=2)}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--log", default="tuning_logs/resnet18-llvm.jsonl")
    ap.add_argument("--out", default="benchmarks/results/e2e_cpu.json")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    args = ap.parse_args()
    proto = models.resnet18(image=args.image)
    graph = from_onnx(proto)
    feeds = random_inputs(graph)
    tasks, weights = extract_tasks(graph, "llvm")
    print(baseline.header())
    print(f"# numpy (not timed here) {baseline.numpy_peer()}")
    print(f"ResNet-18 1x3x{args.image}x{args.image}: {len(tasks)} tasks, {sum(weights)} kernels",
          flush=True)
    rows: dict[str, object] = {"trials": args.trials, "image": args.image,
                               "cores": os.cpu_count(), "machine": baseline.header()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = aus.compile(graph, "llvm")
    rows["default_ms"] = [default.time(feeds, min_s=2.0) * 1e3,
                          default.time(feeds, min_s=2.0, stat="min") * 1e3]
    t0 = time.perf_counter()
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    aus.tune_graph(graph, "llvm", trials=args.trials, log=args.log,
                   options=TuneOptions(batch_size=args.batch_size, seed=0, verbose=False),
                   min_repeat_ms=20.0)
    rows["tune_s"] = time.perf_counter() - t0
    table, estimate = task_table(tasks, weights, args.log)
    print(table)
    rows["estimate_ms"] = estimate * 1e3
    (y,) = (tuned := aus.compile(graph, "llvm", log=args.log)).run(feeds)
    (ref,) = models.ort_run(proto, feeds)
    rows["matches_ort"] = bool(np.allclose(y, ref, rtol=1e-4, atol=1e-4))
    for threads in (None, 1):
        compare(tuned, proto, feeds, threads, args.rounds, rows)
    rows["load_average"] = os.getloadavg()
    print(json.dumps(rows, indent=1))
    baseline.save(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
