"""The search's rounds: ResNet-18's tasks (autosched.testing.models) tuned with the local runner
from fresh logs, with this version's evolution (2 generations over a population mostly carried
from the task's last round) and with the earlier one (3 generations over fresh random samples,
``TuneOptions(generations=3, carry=0)``), per seed: wall and search seconds, candidates
lowered, and the weight-summed best costs of the tasks (what the search optimizes, each task
timed alone); then the tuned models timed in alternating rounds in this process.

    python benchmarks/search_rounds.py --trials 800 --seeds 2 3

Prints the machine (date, commit, CPU, load average) and writes
benchmarks/results/search_rounds.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

from autosched.search import evolution  # noqa: E402
from autosched.search.record import RecordLog  # noqa: E402
from autosched.search.runner import make_runner  # noqa: E402
from autosched.search.tune import TuneOptions, tune  # noqa: E402
from benchmarks.tune_ray import resnet18_tasks, tuned_latencies  # noqa: E402

VERSIONS = {"this": {}, "3 fresh generations": {"generations": 3, "carry": 0.0}}


def _counting_lowerings() -> dict[str, int]:
    """Counts the candidates the searches lower (not cached yet), from now on."""
    count = {"lowered": 0}
    concrete_many = evolution.EvolutionarySearch.concrete_many

    def counted(self: Any, cands: Any) -> Any:
        count["lowered"] += len({c for c in cands if c not in self._cache})
        return concrete_many(self, cands)

    evolution.EvolutionarySearch.concrete_many = counted  # type: ignore[method-assign]
    return count


def run(tasks: list, weights: list[int], log: Path, trials: int, seed: int,
        count: dict[str, int], **evolution_opts: Any) -> dict[str, Any]:
    runner = make_runner("local", tasks[0].target)
    measure, inside = runner.measure, [0.0]

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return measure(*a, **kw)
        finally:
            inside[0] += time.perf_counter() - t

    runner.measure = timed  # type: ignore[method-assign]
    count["lowered"] = 0
    t0 = time.perf_counter()
    try:
        tune(tasks, trials=trials, log=log, weights=weights, runner=runner,
             options=TuneOptions(batch_size=16, seed=seed, verbose=False, **evolution_opts))
    finally:
        runner.close()
    secs = time.perf_counter() - t0
    best: dict[str, float] = {}
    for r in RecordLog(log).load():
        if r.ok:
            best[r.workload_key] = min(best.get(r.workload_key, float("inf")), r.cost)
    weighted = sum(w * best.get(t.workload_key, float("nan")) for t, w in zip(tasks, weights))
    return {"tune_s": round(secs, 1), "search_s": round(secs - inside[0], 1),
            "lowered": count["lowered"], "weighted_best_ms": round(weighted * 1e3, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=800)
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--image", type=int, default=56)
    ap.add_argument("--target", default="llvm -num-cores=1")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    ap.add_argument("--out", default="benchmarks/results/search_rounds.json")
    args = ap.parse_args()
    graph, feeds, tasks, weights = resnet18_tasks(args.image, args.target, args.trials)
    count = _counting_lowerings()
    work = Path(tempfile.mkdtemp(prefix="search_rounds-"))
    rows: dict[str, Any] = {}
    print("| version | seed | tune s | search s | lowered | weighted best ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for seed in args.seeds:
        for name, opts in VERSIONS.items():
            log = work / f"{len(rows)}.jsonl"
            got = run(tasks, weights, log, args.trials, seed, count, **opts)
            rows[f"{name}/{seed}"] = {**got, "log": str(log)}
            print(f"| {name} | {seed} | {got['tune_s']} | {got['search_s']} | "
                  f"{got['lowered']} | {got['weighted_best_ms']} |", flush=True)
    logs = {k: v["log"] for k, v in rows.items()}
    for k, ms in tuned_latencies(graph, args.target, logs, feeds, args.rounds, 1.0).items():
        rows[k]["latency_ms"] = ms
    baseline.save({"machine": baseline.header(), "trials": args.trials, "runs": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
