"""Parallel loops on autosched's thread pool against libgomp, on an idle CPU and with one core
busy: the demo CNN and ResNet-18 (untuned, default schedules) at 1 and 2 threads, onnxruntime
with the same thread count next to them.

    python benchmarks/cpu_threads.py                          # demo CNN and ResNet-18
    python benchmarks/cpu_threads.py --models demo --rounds 5

Each model is compiled twice in this process, once per runtime (AUTOSCHED_PARALLEL=gomp while
the libgomp copy is generated). "busy" runs a spinning Python process beside the timing (one
core taken by another job). The three sides are timed in alternating rounds
(benchmarks/baseline.py), each round the median of runs lasting ``--min-s``; the median round
and the best round are reported, with the load average before and after each block. Results
go to benchmarks/results/cpu_threads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import autosched as aus  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402

MODELS: dict[str, Callable[[], Any]] = {"demo": models.small_cnn, "resnet18": models.resnet18}
RUNTIMES = ("pool", "gomp")


def compile_with(graph: Any, runtime: str) -> Any:
    """``graph`` compiled with its parallel loops on ``runtime`` ("pool" or "gomp")."""
    old = os.environ.get("AUTOSCHED_PARALLEL")
    os.environ["AUTOSCHED_PARALLEL"] = runtime
    try:
        return aus.compile(graph, target="llvm")
    finally:
        if old is None:
            del os.environ["AUTOSCHED_PARALLEL"]
        else:
            os.environ["AUTOSCHED_PARALLEL"] = old


@contextmanager
def load(kind: str) -> Iterator[None]:
    """Nothing ("idle"), or a spinning process beside the timing ("busy")."""
    if kind == "idle":
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def make_timers(compiled: dict[str, Any], proto: Any, feeds: dict[str, Any], threads: int,
                min_s: float) -> dict[str, Callable[[], float]]:
    """One round's timer per side: each compiled model on ``threads`` threads, onnxruntime."""
    sess = models.ort_session(proto, threads)

    def ours(model: Any) -> Callable[[], float]:
        def one_round() -> float:
            model.set_threads(threads)
            return model.time(feeds, repeat=20, min_s=min_s)

        return one_round

    timers = {rt: ours(m) for rt, m in compiled.items()}
    timers["onnxruntime"] = lambda: baseline.median_seconds(lambda: sess.run(None, feeds),
                                                            min_s=min_s, min_runs=20)
    return timers


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="demo,resnet18")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-s", type=float, default=1.0, help="seconds per round and side")
    ap.add_argument("--out", default="benchmarks/results/cpu_threads.json")
    args = ap.parse_args()
    built: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
    for name in args.models.split(","):
        proto = MODELS[name]()
        graph = from_onnx(proto)
        built[name] = proto, random_inputs(graph), {rt: compile_with(graph, rt) for rt in RUNTIMES}
    print(baseline.header())
    print(f"# wait policy (pool and libgomp): {baseline.omp_wait_policy()}, GOMP_SPINCOUNT "
          f"{os.environ.get('GOMP_SPINCOUNT', 'unset')}")
    rows: list[dict[str, Any]] = []
    print("| model | load | threads | pool ms | libgomp ms | onnxruntime ms | load average |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, (proto, feeds, compiled) in built.items():
        for kind in ("idle", "busy"):
            for threads in map(int, args.threads.split(",")):
                timers = make_timers(compiled, proto, feeds, threads, args.min_s)
                before = baseline.load()
                with load(kind):
                    got = baseline.alternate(timers, args.rounds)
                loadavg = f"{before} -> {baseline.load()}"
                cells = [f"{got[s].median * 1e3:.3f} ({got[s].best * 1e3:.3f})"
                         for s in (*RUNTIMES, "onnxruntime")]
                print(f"| {name} | {kind} | {threads} | {' | '.join(cells)} | {loadavg} |",
                      flush=True)
                rows.append({"model": name, "load": kind, "threads": threads,
                             "load_average": loadavg,
                             **{s: r.as_dict() for s, r in got.items()}})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"header": baseline.header(), "rounds": args.rounds,
                               "min_s": args.min_s, "rows": rows}, indent=1) + "\n")
    print(f"# median round (best round), ms; written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
