"""ResNet-18 (batch 1, 224x224, benchmarks/models.py) end to end on this CPU: default
schedules, then tuned for a stated trial budget, next to onnxruntime in the same run.

    python benchmarks/e2e_cpu.py --trials 300 --log tuning_logs/resnet18-llvm.jsonl

The log is appended to (a rerun resumes; with the budget already in the log it only times).
autosched and onnxruntime are timed in alternation over ``--rounds`` rounds (each the median
of runs lasting 2 s) and each side's best round is reported, so a slow spell of a shared
machine does not land on one side only; every round is kept in the JSON. Prints the load
average too. Results go to benchmarks/results/e2e_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import autosched as aus  # noqa: E402
from autosched.graph.cli_model import task_table  # noqa: E402
from autosched.graph.compiler import extract_tasks, load_graph  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.search.tune import TuneOptions  # noqa: E402
from benchmarks import models  # noqa: E402


def ort_times(proto: object, feeds: dict, threads: int | None) -> tuple[float, float]:
    sess = models.ort_session(proto, threads)
    sess.run(None, feeds)
    ts = []
    deadline = time.perf_counter() + 2.0
    while len(ts) < 20 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(np.min(ts))


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
    graph = load_graph(proto)
    feeds = random_inputs(graph)
    tasks, weights = extract_tasks(graph, "llvm")
    print(f"ResNet-18 1x3x{args.image}x{args.image}: {len(tasks)} tasks, {sum(weights)} kernels; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()}", flush=True)
    rows: dict[str, object] = {"trials": args.trials, "image": args.image,
                               "cores": os.cpu_count()}
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
    for suffix, threads in (("", None), ("_1thread", 1)):
        if threads:
            os.environ["AUTOSCHED_NUM_THREADS"] = str(threads)
        ours, theirs = [], []
        for _ in range(args.rounds):  # alternate, so both sides see the same machine
            ours.append(tuned.time(feeds, min_s=2.0) * 1e3)
            theirs.append(ort_times(proto, feeds, threads)[0] * 1e3)
        rows[f"tuned{suffix}_ms"], rows[f"ort{suffix}_ms"] = min(ours), min(theirs)
        rows[f"tuned{suffix}_rounds_ms"], rows[f"ort{suffix}_rounds_ms"] = ours, theirs
        print(f"threads {threads or os.cpu_count()}: autosched {min(ours):.2f} ms, onnxruntime "
              f"{min(theirs):.2f} ms (best of {args.rounds} alternating rounds)", flush=True)
    rows["load_average"] = os.getloadavg()
    print(json.dumps(rows, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
