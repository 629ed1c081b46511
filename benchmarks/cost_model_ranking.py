"""How well the cost model ranks real timings: random matmul schedules, measured, then ranked.

    python benchmarks/cost_model_ranking.py measure --n 200 --out /tmp/mm_timings.jsonl
    python benchmarks/cost_model_ranking.py evaluate /tmp/mm_timings.jsonl

benchmarks/results/cost_model_mm_timings.jsonl holds 400 schedules measured this way on a
16-core Xeon (Emerald Rapids) with 4 threads (target llvm -num-cores=4).

``measure`` builds random schedules (splits, orders, vectorize / parallel / unroll) of two
matmul shapes with the LLVM backend, times each one (median of 3 repeats of at least 20 ms)
and writes one JSON line per schedule: shape, steps, costs, and the target's CPU. Run it on a
quiet machine; on a loaded one parallel kernels time at random.

``measure-space`` / ``evaluate-log`` do the same with candidates sampled from the search space of
a named workload (any target; through the real Measurer, written as a tuning log):

    python benchmarks/cost_model_ranking.py measure-space --workload gemm --shape 1024 1024 1024 \
        --target cuda --n 256 --log /tmp/gemm_cuda.jsonl
    python benchmarks/cost_model_ranking.py evaluate-log --workload gemm --shape 1024 1024 1024 \
        --target "cuda -arch=sm_90" --log /tmp/gemm_cuda.jsonl

``evaluate`` re-lowers every schedule here, extracts features, and for several training-set
sizes compares the model's objectives on held-out schedules of each shape: pairwise ordering
accuracy and top-8 recall (the best true throughput among the 8 best predicted, over the best
held out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.cost_model.features import extract_features  # noqa: E402
from autosched.cost_model.xgb_model import XGBModel  # noqa: E402
from autosched.schedule.steps import step_from_dict  # noqa: E402
from autosched.targets.target import parse  # noqa: E402
from tests.support.cost_model import (  # noqa: E402
    matmul,
    pairwise_accuracy,
    random_matmul_schedule,
)

SHAPES = ((256, 256, 256), (128, 512, 64))


def measure(n: int, out: str, seed: int) -> None:
    rng = random.Random(seed)
    tgt = parse("llvm")
    with open(out, "w") as fh:
        for shape in SHAPES:
            M, N, K = shape
            A, B, C = matmul(M, N, K)
            a = np.random.rand(M, K).astype("float32")
            b = np.random.rand(K, N).astype("float32")
            c = np.zeros((M, N), "float32")
            seen: set[str] = set()
            t0 = time.time()
            while len(seen) < n:
                s, _ = random_matmul_schedule(rng, A, B, C)
                key = str(aus.lower(s, [A, B, C]))
                if key in seen:
                    continue
                seen.add(key)
                mod = aus.build(s, [A, B, C], tgt)
                res = mod.time(a, b, c, repeat=3, min_repeat_ms=20)
                fh.write(json.dumps({"shape": shape, "steps": [st.to_dict() for st in s.steps],
                                     "costs": list(res.samples), "cost": res.median,
                                     "cpu": tgt.cpu, "vector_bits": tgt.vector_bits,
                                     "threads": tgt.num_cores})
                         + "\n")
                fh.flush()
            print(f"{shape}: {n} schedules in {time.time() - t0:.0f} s", flush=True)


def evaluate(path: str, reps: int) -> None:
    rows = [json.loads(line) for line in open(path)]
    first = rows[0]
    threads = int(first["threads"] or 2)
    tgt = dataclasses.replace(parse("llvm"), cpu=first["cpu"], vector_bits=first["vector_bits"],
                              num_cores=threads)
    data: dict[tuple, tuple[list, list]] = {}
    t_feat = 0.0
    for r in rows:
        shape = tuple(r["shape"])
        A, B, C = matmul(*shape)
        s = te.create_schedule(C.op)
        for d in r["steps"]:
            s.apply(step_from_dict(d))
        f = aus.lower(s, [A, B, C])
        t0 = time.perf_counter()
        x = extract_features(f, tgt)
        t_feat += time.perf_counter() - t0
        feats, thr = data.setdefault(shape, ([], []))
        feats.append(x)
        thr.append(1.0 / r["cost"])
    print(f"{len(rows)} schedules, features {1e3 * t_feat / len(rows):.2f} ms each")
    for shape, (_, thr) in data.items():
        t = np.array(thr)
        print(f"  {shape}: best {1 / t.max() * 1e6:.0f} us, median {1 / np.median(t) * 1e6:.0f} us,"
              f" worst {1 / t.min() * 1e6:.0f} us")
    compare_objectives(data, reps)


def compare_objectives(data: dict, reps: int) -> None:
    """Held-out pairwise accuracy and top-8 recall of each objective, per training size; every
    objective sees the same random splits."""
    n_per = min(len(v[0]) for v in data.values())
    rng = np.random.default_rng(0)
    for n_train in (25, 50, 100, 150):
        if n_train >= n_per - 20:
            continue
        splits = [{shape: rng.permutation(len(feats)) for shape, (feats, _) in data.items()}
                  for _ in range(reps)]
        for objective in ("rank", "regression", "log_regression", "auto"):
            accs, recalls, fit_s = [], [], []
            for split in splits:
                tr_x, tr_y, tr_g, tests = [], [], [], []
                for shape, (feats, thr) in data.items():
                    tr, ho = split[shape][:n_train], split[shape][n_train:]
                    tr_x += [feats[i] for i in tr]
                    tr_y += [thr[i] for i in tr]
                    tr_g += [str(shape)] * len(tr)
                    tests.append(([feats[i] for i in ho], np.array([thr[i] for i in ho])))
                model = XGBModel(objective=objective)
                t0 = time.perf_counter()
                model.fit(tr_x, tr_y, tr_g)
                fit_s.append(time.perf_counter() - t0)
                for hx, hy in tests:
                    p = model.predict(hx)
                    accs.append(pairwise_accuracy(p, hy))
                    recalls.append(hy[np.argsort(-p)[:8]].max() / hy.max())
            print(f"train {n_train:3d}/shape {objective:14s} pairwise {np.mean(accs):.3f} "
                  f"top-8 recall {np.mean(recalls):.3f}  fit {np.mean(fit_s):.2f} s "
                  f"({len(tr_y)} samples)", flush=True)


def measure_space(workload: str, shape: list[int], target: str, n: int, log_path: str,
                  seed: int) -> None:
    from autosched.search.measure import Measurer
    from autosched.search.record import RecordLog, records_from
    from autosched.search.space import SearchSpace
    from autosched.search.task import Task
    from autosched.search.workloads import WORKLOADS

    task = Task(WORKLOADS[workload], args=shape, target=target, name=workload)
    space = SearchSpace(task)
    rng = np.random.default_rng(seed)
    log = RecordLog(log_path)
    seen: set[str] = set()
    t0 = time.time()
    with Measurer(task.target, repeat=3, min_repeat_ms=20) as m:
        while len(seen) < n:
            batch = []
            for _ in range(2000):
                if len(batch) == 32 or len(seen) >= n:
                    break
                low = space.lower(space.sample(rng))
                if low is None or low.ir_hash in seen:
                    continue
                seen.add(low.ir_hash)
                batch.append(low.schedule)
            if not batch:
                break
            log.append(records_from(task, batch, m.measure(task, batch)))
            print(f"{len(seen)} measured, {time.time() - t0:.0f} s", flush=True)


def evaluate_log(workload: str, shape: list[int], target: str, path: str, reps: int) -> None:
    from autosched.search.record import RecordLog
    from autosched.search.task import Task
    from autosched.search.workloads import WORKLOADS

    task = Task(WORKLOADS[workload], args=shape, target=target, name=workload)
    records = [r for r in RecordLog(path).load() if r.ok]
    feats, thr = [], []
    for r in records:
        sch = task.schedule([step_from_dict(d) for d in r.steps])
        feats.append(extract_features(task.lower(sch), task.target))
        thr.append(1.0 / r.cost)
    t = np.array(thr)
    print(f"{workload} {shape} on {target}: {len(records)} ok records; best "
          f"{1e6 / t.max():.0f} us, median {1e6 / np.median(t):.0f} us, worst {1e6 / t.min():.0f} us")
    compare_objectives({tuple(shape): (feats, thr)}, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--n", type=int, default=200)
    m.add_argument("--out", default="mm_timings.jsonl")
    m.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("evaluate")
    e.add_argument("path")
    e.add_argument("--reps", type=int, default=5)
    for name in ("measure-space", "evaluate-log"):
        p = sub.add_parser(name)
        p.add_argument("--workload", default="gemm")
        p.add_argument("--shape", type=int, nargs="+", default=[512, 512, 512])
        p.add_argument("--target", default="llvm")
        p.add_argument("--log", required=True)
        if name == "measure-space":
            p.add_argument("--n", type=int, default=256)
            p.add_argument("--seed", type=int, default=0)
        else:
            p.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.cmd == "measure":
        measure(args.n, args.out, args.seed)
    elif args.cmd == "evaluate":
        evaluate(args.path, args.reps)
    elif args.cmd == "measure-space":
        measure_space(args.workload, args.shape, args.target, args.n, args.log, args.seed)
    else:
        evaluate_log(args.workload, args.shape, args.target, args.log, args.reps)


if __name__ == "__main__":
    main()
