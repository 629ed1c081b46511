"""A log from another vector ISA seeds tuning here: how many trials each task of ResNet-18 needs
to come within 10% of its best, tuned from an empty log and from a log that holds only another
CPU's records (by default the bundled log of an AVX2 znver3), in one run on this machine.

    python benchmarks/seed_transfer.py --trials 400          # ResNet-18 at 224, ~15 minutes
    python benchmarks/seed_transfer.py --trials 48           # a smoke run

The seed log's records do not apply here (another vector width gets other code: docs/TARGETS.md)
but are related: they seed the search's first population and the cost model. Both runs tune
the same graph with the same seed and trial budget from a log of their own; a task's "best" is
the best of both runs, so both race to the same line. The table gives per task the trials (of
that task) until a record came within 10% of it, and the estimated latency (each task's best
times its count, over the tasks both runs measured) after the whole budget.
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import autosched as aus  # noqa: E402
from autosched.search.record import RecordLog, target_keys  # noqa: E402
from autosched.search.tune import TuneOptions  # noqa: E402
from autosched.targets.target import parse  # noqa: E402
from autosched.testing import models  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SEED_LOG = ROOT / "tuning_logs" / "resnet18_llvm_znver3_4100.jsonl.gz"
WITHIN = 1.10


def _costs(log: Path, tasks: list[Any]) -> dict[str, list[float]]:
    """Per workload key, the costs of this machine's records in the order they were measured
    (the seed's records are of another target and are not listed)."""
    rl = RecordLog(log)
    return {t.workload_key: [r.cost for r in rl.records_for(t.workload_key, t.target)]
            for t in tasks}


def _reached(costs: list[float], line: float) -> int | None:
    return next((n for n, c in enumerate(costs, 1) if c <= line), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--image", type=int, default=224, help="the seed log's model size")
    ap.add_argument("--seed-log", default=str(SEED_LOG))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/seed_transfer.json")
    args = ap.parse_args()
    target = parse("llvm")
    graph = aus.from_onnx(models.resnet18(image=args.image))
    tasks, weights = aus.extract_tasks(graph, target)
    seed = Path(args.seed_log)
    seed_text = (gzip.open(seed, "rt") if seed.suffix == ".gz" else open(seed)).read()
    seed_targets = {r.target_key for r in RecordLog(seed).load()}
    print(baseline.header())
    print(f"# seed log {seed.name}: targets {sorted(seed_targets)}; this machine "
          f"{target_keys(target).exact}; load average {os.getloadavg()[0]:.2f}", flush=True)
    costs, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("scratch", "seeded"):
            log = Path(tmp) / f"{mode}.jsonl"
            log.write_text(seed_text if mode == "seeded" else "")
            t0 = time.perf_counter()
            aus.tune_graph(graph, target, trials=args.trials, log=log, choose=False,
                           options=TuneOptions(batch_size=args.batch_size, seed=args.seed,
                                               verbose=False))
            seconds[mode] = time.perf_counter() - t0
            costs[mode] = _costs(log, tasks)
            print(f"# {mode}: {args.trials} trials in {seconds[mode]:.0f} s", flush=True)
    print(f"\n{'task':34s} {'n':>2s} {'best ms':>9s} {'trials to within 10%':>22s}")
    print(f"{'':34s} {'':>2s} {'':>9s} {'scratch':>10s} {'seeded':>11s}")
    rows, e2e = [], {m: 0.0 for m in costs}
    for t, w in zip(tasks, weights):
        key = t.workload_key
        best = min((c for m in costs for c in costs[m][key]), default=math.inf)
        reach = {m: _reached(costs[m][key], best * WITHIN) for m in costs}
        if all(costs[m][key] for m in costs):  # tasks both runs measured
            for m in costs:
                e2e[m] += w * min(costs[m][key])
        rows.append({"task": t.name, "key": key, "weight": w, "best_s": best,
                     **{f"{m}_trials": reach[m] for m in costs},
                     **{f"{m}_measured": len(costs[m][key]) for m in costs}})
        shown = {m: "-" if reach[m] is None else f"{reach[m]} of {len(costs[m][key])}"
                 for m in costs}
        print(f"{t.name[:34]:34s} {w:2d} {best * 1e3:9.3f} {shown['scratch']:>10s} "
              f"{shown['seeded']:>11s}")
    reached = {m: [r[f"{m}_trials"] for r in rows] for m in costs}
    print(f"\ntasks within 10% of their best: scratch {sum(r is not None for r in reached['scratch'])}"
          f", seeded {sum(r is not None for r in reached['seeded'])} of {len(rows)}; trials "
          f"to get there, summed over tasks that both reached: "
          f"scratch {sum(a for a, b in zip(*reached.values()) if a and b)}, "
          f"seeded {sum(b for a, b in zip(*reached.values()) if a and b)}")
    print("estimated latency after the budget, tasks both runs measured: "
          + ", ".join(f"{m} {v * 1e3:.2f} ms" for m, v in e2e.items()))
    baseline.save({"machine": baseline.header(), "seed_log": seed.name,
                   "trials": args.trials, "seconds": seconds, "rows": rows,
                   "estimated_ms": {m: v * 1e3 for m, v in e2e.items()}}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
