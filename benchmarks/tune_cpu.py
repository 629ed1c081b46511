"""Auto-scheduler benchmark on this CPU: autosched next to numpy and TVM MetaSchedule, in one run.

For each workload and trial budget, tune from scratch (a fresh log), then time the best schedule
and numpy (where numpy has the operator; OpenBLAS with its own kernel for this CPU, see
benchmarks/baseline.py) in alternating rounds, and the untuned default schedule once; when the
TVM venv exists (.venv-tvm, see requirements-tvm.txt), run benchmarks/tvm_baseline.py in the
same run, after autosched, at the same budgets. "tuner ms" is the best record of the tuning log
(the tuner's own measurement in its run worker, the fastest of all candidates); "tuner's timer
again" re-measures that schedule the same way, in the rounds; "autosched ms" is the final timing
of that schedule here. Timings in rounds are the median round (best round). Prints a table and
writes benchmarks/results/tune_cpu.json.

    .venv/bin/python benchmarks/tune_cpu.py --trials 64 256
    .venv/bin/python benchmarks/tune_cpu.py --workloads gemm --trials 256 --no-tvm
    .venv/bin/python benchmarks/tune_cpu.py --trials 16 --tvm-trials 64   # 16 of ours, 64 of TVM's
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it
# Our kernels' OpenMP threads wait passively here as in the tuner's measurement workers: with
# libgomp's default (spinning ~300k iterations at every barrier) the final timing ran up to
# 2x slower than the tuner's measurement of the same schedule on a busy machine. Read when
# libgomp loads, so before the first kernel runs.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.search.measure import Measurer  # noqa: E402
from autosched.search.record import RecordLog  # noqa: E402
from autosched.search.workloads import make  # noqa: E402

TVM_PYTHON = ROOT / ".venv-tvm" / "bin" / "python"
SHAPES = {
    "gemm": [1024, 1024, 1024],
    "conv2d": [1, 64, 56, 56, 64, 3, 3, 1, 1],
    "depthwise_conv2d": [1, 144, 56, 56, 3, 1, 1],
    "batch_matmul": [12, 128, 64, 128],
    "softmax": [128, 4096],
}


def _numpy_fn(name: str, xs: list[np.ndarray]):  # noqa: ANN202
    """A numpy implementation of the workload, or None."""
    if name in ("gemm", "batch_matmul"):
        return lambda: np.matmul(xs[0], xs[1])
    if name == "softmax":
        def softmax() -> np.ndarray:
            e = np.exp(xs[0] - xs[0].max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)
        return softmax
    if name == "conv2d":
        x, w = xs
        o, c, kh, kw = w.shape

        def conv() -> np.ndarray:  # im2col + matmul
            xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
            cols = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
            cols = cols.transpose(0, 2, 3, 1, 4, 5).reshape(-1, c * kh * kw)
            return (cols @ w.reshape(o, -1).T).reshape(1, 56, 56, o).transpose(0, 3, 1, 2)
        return conv
    return None  # numpy has no depthwise convolution


def _schedule_timer(task: aus.Task, sch, inputs: list[np.ndarray],  # noqa: ANN001, ANN202
                    repeat: int = 7):
    """A timer of ``sch``: the median of ``repeat`` repeats of at least 100 ms (warm, after a
    call)."""
    mod = task.build(sch)
    outs = [np.empty(tuple(o.shape), o.dtype) for o in task.outputs]
    return lambda: mod.time(*inputs, *outs, repeat=repeat, min_repeat_ms=100).median


def _timers(task: aus.Task, sch, inputs: list[np.ndarray], np_fn,  # noqa: ANN001
            measurer: Measurer) -> dict:
    """Round timers: the schedule here, the tuner's own measurement of it (a run worker with the
    tuner's settings, caches flushed between repeats), and numpy (calls lasting 0.7 s in all)."""
    timers = {"autosched": _schedule_timer(task, sch, inputs),
              "tuner's timer": lambda: measurer.measure(task, [sch])[0].cost}
    if np_fn is not None:
        timers["numpy"] = lambda: baseline.median_seconds(np_fn, min_s=0.7, min_runs=7)
    return timers


def run_autosched(name: str, budgets: list[int], work: Path, rng: np.random.Generator,
                  rounds: int) -> list[dict]:
    tensors = make(name, SHAPES[name])
    task = aus.Task(lambda: tensors, target="llvm", name=name)
    inputs = [rng.uniform(-1, 1, tuple(t.shape)).astype(t.dtype) for t in task.args
              if t not in task.outputs]
    default = _schedule_timer(task, task.schedule(), inputs, repeat=3)()  # seconds per call
    np_fn = _numpy_fn(name, inputs)
    rows = []
    for trials in budgets:
        log = work / f"{name}_{trials}.jsonl"
        log.unlink(missing_ok=True)
        t0 = time.perf_counter()
        aus.tune(task, trials=trials, log=log, options=aus.TuneOptions(seed=0, verbose=True))
        wall = time.perf_counter() - t0
        tuner = min((r.cost for r in RecordLog(log).records_for(task.workload_key, task.target)
                     if r.ok), default=float("inf"))
        # check=False: the timer only times (the tuner checked this schedule's output)
        with Measurer(task.target, check=False) as measurer:
            got = baseline.alternate(
                _timers(task, aus.best_schedule(task, log), inputs, np_fn, measurer), rounds)
        best, numpy, again = got["autosched"], got.get("numpy"), got["tuner's timer"]
        rows.append({"workload": name, "trials": trials, "default_ms": default * 1e3,
                     "tuner_ms": tuner * 1e3, "tuner_again_ms": again.median * 1e3,
                     "tuner_again_best_ms": again.best * 1e3, "autosched_ms": best.median * 1e3,
                     "autosched_best_ms": best.best * 1e3,
                     "numpy_ms": numpy.median * 1e3 if numpy else None,
                     "numpy_best_ms": numpy.best * 1e3 if numpy else None,
                     "gflops": task.flop_count / best.median / 1e9, "tune_wall_s": wall,
                     "rounds": {n: r.as_dict() for n, r in got.items()}})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run_tvm(names: list[str], budgets: list[int], out: Path) -> dict:
    py = TVM_PYTHON
    if not py.exists():
        print("TVM baseline skipped: .venv-tvm not found (see benchmarks/requirements-tvm.txt)")
        return {}
    out.unlink(missing_ok=True)
    cmd = [str(py), str(ROOT / "benchmarks" / "tvm_baseline.py"), "--workloads", *names,
           "--trials", *map(str, budgets), "--out", str(out), "--work-dir", "/tmp/tvm_bench"]
    print("running", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False, env=dict(os.environ, PYTHONPATH=""))
    if not out.exists():
        return {}
    return {(r["workload"], r["trials"]): r for r in json.loads(out.read_text())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--trials", nargs="+", type=int, default=[64, 256])
    p.add_argument("--extra", nargs="*", default=[],
                   help="more budgets, e.g. gemm=256 (a workload not in --workloads: only those)")
    p.add_argument("--no-tvm", action="store_true")
    p.add_argument("--tvm-trials", nargs="+", type=int, default=None,
                   help="TVM's budgets, one per --trials budget (default: the same budgets)")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating timing rounds of the best schedule and numpy")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tune_cpu.json")
    args = p.parse_args()
    if args.tvm_trials and len(args.tvm_trials) != len(args.trials):
        p.error(f"--tvm-trials {args.tvm_trials}: one budget per --trials budget {args.trials}")
    work = Path("/tmp/autosched_bench")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = np.random.default_rng()
    machine = baseline.header()
    print(machine)
    print(f"# autosched: OMP_WAIT_POLICY {baseline.omp_wait_policy()}; "
          f"peers: {baseline.numpy_peer()}; TVM MetaSchedule "
          f"{'in .venv-tvm' if TVM_PYTHON.exists() and not args.no_tvm else 'not run'}",
          flush=True)
    rows = []
    budgets = {name: args.trials for name in args.workloads}
    for spec in args.extra:  # e.g. gemm=256: one more budget for one workload
        name, _, n = spec.partition("=")
        budgets[name] = budgets.get(name, []) + [int(n)]
    for name in budgets:  # autosched then TVM per workload: both see similar load
        mine = run_autosched(name, budgets[name], work, rng, args.rounds)
        theirs = dict(zip(budgets[name], args.tvm_trials or budgets[name]))
        tvm = {} if args.no_tvm else run_tvm([name], sorted(set(theirs.values())),
                                             work / f"tvm_{name}.json")
        for r in mine:
            t = tvm.get((r["workload"], theirs.get(r["trials"], r["trials"])))
            r["tvm_trials"] = t["trials"] if t else None
            r["tvm_ms"] = t["best_ms"] if t else None
            r["tvm_wall_s"] = t["tune_wall_s"] if t else None
            r["load_avg"] = os.getloadavg()[0]
        rows += mine
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine, "peer": baseline.numpy_peer(),
                                        "rows": rows}, indent=1) + "\n")
        print_table(rows)
    return 0


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _tvm(r: dict) -> str:
    return "-" if r.get("tvm_ms") is None else f"{r['tvm_ms']:.3f} ({r['tvm_trials']})"


def print_table(rows: list[dict]) -> None:
    head = (f"| {'workload':17} | trials | default ms | tuner ms | tuner's timer again ms "
            "| autosched ms median (best) "
            "| GFLOPS | numpy ms median (best) | TVM ms (trials) | autosched wall s | TVM wall s "
            "| load |")
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for r in rows:
        mine = f"{r['autosched_ms']:.3f} ({r['autosched_best_ms']:.3f})"
        again = f"{r['tuner_again_ms']:.3f} ({r['tuner_again_best_ms']:.3f})"
        numpy = "-" if r["numpy_ms"] is None else f"{r['numpy_ms']:.3f} ({r['numpy_best_ms']:.3f})"
        print(f"| {r['workload']:17} | {r['trials']:6} | {r['default_ms']:10.3f} | "
              f"{r['tuner_ms']:8.3f} | {again:>22} | {mine:>26} | {r['gflops']:6.1f} | {numpy:>22} | "
              f"{_tvm(r):>15} | {r['tune_wall_s']:16.0f} | "
              f"{_fmt(r.get('tvm_wall_s'), '.0f'):>10} | {r['load_avg']:4.1f} |")


if __name__ == "__main__":
    sys.exit(main())
