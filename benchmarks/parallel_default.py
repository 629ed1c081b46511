"""Untuned models with small kernels serial (the sketches' SERIAL_US rule) against every stage
parallel (SERIAL_US = 0, the rule before), both on the same thread count, in alternating
rounds; with ``--kernels``, each kernel's time on 1 and 2 threads next to its flops and bytes,
the measurement SERIAL_US and the rates in autosched/search/sketch.py were read from.

    python benchmarks/parallel_default.py                        # demo, ResNet-18, MobileNetV2
    python benchmarks/parallel_default.py --models demo --rounds 7 --kernels

Results go to benchmarks/results/parallel_default.json.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.search import sketch  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402

MODELS: dict[str, Callable[[], Any]] = {"demo": models.small_cnn, "resnet18": models.resnet18,
                                        "mobilenet_v2": models.mobilenet_v2}


def compile_with(graph: Any, serial_us: float) -> Any:
    """``graph`` compiled untuned with stages under ``serial_us`` of work serial."""
    kept = sketch.SERIAL_US
    sketch.SERIAL_US = serial_us
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no tuning record: the point here
            return aus.compile(graph, target="llvm")
    finally:
        sketch.SERIAL_US = kept


def timer(model: Any, feeds: dict[str, Any], threads: int, min_s: float
          ) -> Callable[[], float]:
    """One round: ``model`` on ``threads`` threads, the executor's median."""
    def one_round() -> float:
        model.set_threads(threads)
        return model.time(feeds, min_s=min_s)

    return one_round


def kernel_table(sides: dict[str, Any], feeds: dict[str, Any], rounds: int
                 ) -> list[dict[str, Any]]:
    """Per kernel: flops, bytes of its arguments, whether the sides' code differs, and median
    seconds of every stage parallel on 1 and 2 threads and of small kernels serial on 2 (the
    runs taking turns ``rounds`` times)."""
    runs = [("parallel", 1), ("parallel", 2), ("serial_below", 2)]
    seen: dict[tuple[str, int], list[list[float]]] = {r: [] for r in runs}
    for _ in range(rounds):
        for side, threads in runs:
            sides[side].set_threads(threads)
            seen[side, threads].append([t for _, t in sides[side].kernel_times(feeds)])
            sides[side].set_threads(None)
    med = {r: np.median(np.array(v), axis=0) for r, v in seen.items()}
    rows = []
    for i, (k, other) in enumerate(zip(sides["parallel"].kernels,
                                       sides["serial_below"].kernels)):
        nbytes = sum(int(np.prod([int(getattr(d, "value", d)) for d in t.shape]))
                     * np.dtype(t.dtype).itemsize for t in k.task.args)
        differs = k.module.get_llvm_ir(optimized=False) != other.module.get_llvm_ir(
            optimized=False)
        rows.append({"kernel": k.task.name, "flops": k.task.flop_count, "bytes": nbytes,
                     "differs": differs, "parallel_t1": float(med["parallel", 1][i]),
                     "parallel_t2": float(med["parallel", 2][i]),
                     "serial_below_t2": float(med["serial_below", 2][i])})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-s", type=float, default=0.5, help="seconds per round and side")
    ap.add_argument("--kernels", action="store_true", help="also time each kernel in place")
    ap.add_argument("--out", default="benchmarks/results/parallel_default.json")
    args = ap.parse_args()
    print(baseline.header())
    print(f"# SERIAL_US {sketch.SERIAL_US}, {sketch.FLOPS_PER_US:.0f} flops and "
          f"{sketch.BYTES_PER_US:.0f} bytes per us; {args.threads} threads")
    results: dict[str, Any] = {"header": baseline.header(), "serial_us": sketch.SERIAL_US,
                               "threads": args.threads, "models": {}}
    print("| model | every stage parallel ms | small kernels serial ms | load average |")
    print("|---|---:|---:|---|")
    for name in args.models.split(","):
        graph = from_onnx(MODELS[name]())
        feeds = random_inputs(graph, seed=1)
        sides = {"parallel": compile_with(graph, 0.0),
                 "serial_below": compile_with(graph, sketch.SERIAL_US)}

        before = baseline.load()
        got = baseline.alternate({k: timer(m, feeds, args.threads, args.min_s)
                                  for k, m in sides.items()}, args.rounds)
        loadavg = f"{before} -> {baseline.load()}"
        cells = [f"{got[s].median * 1e3:.3f} (best {got[s].best * 1e3:.3f})" for s in sides]
        print(f"| {name} | {' | '.join(cells)} | {loadavg} |", flush=True)
        entry: dict[str, Any] = {"load_average": loadavg,
                                 **{s: r.as_dict() for s, r in got.items()}}
        if args.kernels:
            entry["kernels"] = rows = kernel_table(sides, feeds, args.rounds)
            print("kernel (* where it runs serially), MFLOP, KB, us: every stage "
                  "parallel on 1 and 2 threads, small kernels serial on 2")
            for r in rows:
                print(f"{r['kernel'][:30] + ' *' * r['differs']:32}{r['flops'] / 1e6:9.3f}"
                      f"{r['bytes'] / 1e3:9.1f}{r['parallel_t1'] * 1e6:10.1f}"
                      f"{r['parallel_t2'] * 1e6:10.1f}{r['serial_below_t2'] * 1e6:10.1f}")
            changed = [r for r in rows if r["differs"]]
            print(f"# the {len(changed)} kernels that differ, 2 threads: every stage parallel "
                  f"{sum(r['parallel_t2'] for r in changed) * 1e6:.1f} us, small kernels serial "
                  f"{sum(r['serial_below_t2'] for r in changed) * 1e6:.1f} us")
        results["models"][name] = entry
    baseline.save(results, args.out)
    print(f"# median round (best round); written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
