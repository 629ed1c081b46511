"""What the tuner's search costs per candidate: ResNet-18's tasks (autosched.testing.models),
random candidates of their search spaces, each scheduled, lowered, hashed and featurized in
this process (the build workers do the same for the evolutionary search); best of several
passes over the same candidates. ``--trials N`` also tunes the model with the local runner
from a fresh log and splits its wall time into the runner's (build and run) and the rest
(search and training).

    python benchmarks/search_cost.py                      # per-candidate milliseconds
    python benchmarks/search_cost.py --trials 160          # and a tune's search share

The IR hash of the candidates (one line, ``hashes``) names what was lowered: a change meant
to leave lowering alone keeps it. Prints the machine (date, commit, CPU, load average) and
writes benchmarks/results/search_cost.json.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

from autosched.cost_model.features import extract_features  # noqa: E402
from autosched.errors import AutoschedError  # noqa: E402
from autosched.graph.compiler import extract_tasks  # noqa: E402
from autosched.search.record import ir_hash  # noqa: E402
from autosched.search.space import SearchSpace  # noqa: E402
from autosched.testing import models  # noqa: E402
from benchmarks.tune_ray import tune_with  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402

PHASES = ("schedule", "lower", "ir_hash", "features")


def per_candidate(tasks: list[Any], per_task: int, passes: int) -> dict[str, Any]:
    """Milliseconds per legal candidate in each phase (the best pass) and the IR hash of all."""
    rng = np.random.default_rng(0)
    work = [(t, s, s.sample(rng)) for t in tasks for s in [SearchSpace(t)]
            for _ in range(per_task)]
    best: dict[str, float] | None = None
    hashes: list[str] = []
    for _ in range(passes):
        spent = dict.fromkeys(PHASES, 0.0)
        hashes = []
        for task, space, cand in work:
            t0 = time.perf_counter()
            sch = space.schedule(cand)
            t1 = time.perf_counter()
            try:
                func = task.lower(sch)
            except AutoschedError:
                continue
            t2 = time.perf_counter()
            hashes.append(ir_hash(func))
            t3 = time.perf_counter()
            extract_features(func, task.target)
            t4 = time.perf_counter()
            for k, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                spent[k] += dt
        if best is None or sum(spent.values()) < sum(best.values()):
            best = spent
    assert best is not None
    n = max(len(hashes), 1)
    ms = {k: round(v / n * 1e3, 3) for k, v in best.items()}
    return {"candidates": len(hashes), "ms": ms, "total_ms": round(sum(ms.values()), 3),
            "hashes": hashlib.sha256("".join(hashes).encode()).hexdigest()[:16]}


def tune_share(tasks: list[Any], weights: list[int], trials: int) -> dict[str, float]:
    """A local tune of ``trials`` candidates from a fresh log (tune_ray's ``tune_with``): wall
    seconds, those inside the runner, and the rest (searching, training)."""
    log = Path(tempfile.mkdtemp(prefix="search_cost-")) / "resnet18.jsonl"
    got = tune_with("local", tasks, weights, log,
                    argparse.Namespace(trials=trials, batch_size=16, node_builds=False,
                                       min_repeat_ms=20.0))  # as in its earlier rows
    return {**{k: round(v, 2) for k, v in got.items()},
            "search_s": round(got["tune_s"] - got["runner_s"], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=int, default=56)
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--per-task", type=int, default=30, help="random candidates per task")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--trials", type=int, default=0, help="also tune this many candidates")
    ap.add_argument("--out", default="benchmarks/results/search_cost.json")
    args = ap.parse_args()
    tasks, weights = extract_tasks(from_onnx(models.resnet18(image=args.image)), args.target)
    print(baseline.header())
    print(f"ResNet-18 1x3x{args.image}x{args.image} on {args.target}: {len(tasks)} tasks, "
          f"{args.per_task} random candidates each", flush=True)
    rows: dict[str, Any] = {"machine": baseline.header(), "image": args.image,
                            "target": args.target,
                            "per_candidate": per_candidate(tasks, args.per_task, args.passes)}
    pc = rows["per_candidate"]
    print(f"ms per candidate: {pc['ms']} (total {pc['total_ms']}) over {pc['candidates']} "
          f"legal candidates; hashes {pc['hashes']}", flush=True)
    if args.trials:
        rows["tune"] = tune_share(tasks, weights, args.trials)
        print(f"local tune: {rows['tune']}")
    baseline.save(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
