"""TVM MetaSchedule baseline for the auto-scheduler benchmark (issue 5).

Standalone: runs in the separate TVM venv (see benchmarks/requirements-tvm.txt) and does not
import autosched, so the two tuners never share a process, a thread pool or a compiler.

For each workload it builds the computation with TVM's TE, makes a PrimFunc with
``te.create_prim_func``, times that PrimFunc untuned (TVM's default lowering, no schedule), then
for every trial budget runs ``tune_tir`` from scratch (fresh work dir), compiles the best record,
checks its output against numpy and times it with ``time_evaluator``.

Example (from the repository root)::

    .venv-tvm/bin/python benchmarks/tvm_baseline.py --workloads gemm softmax \\
        --trials 64 256 --out benchmarks/results/tvm_baseline.json

Results are merged into --out after every run (an existing row with the same workload and
budget is replaced), so a long job that is stopped keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# XGBoost (MetaSchedule's cost model) and TVM's thread pool must not spin while kernels are timed.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import baseline  # noqa: E402  standard library only: no autosched here

baseline.prepare()

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import te  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.target import codegen  # noqa: E402

DTYPE = "float32"


@dataclass(frozen=True)
class Workload:
    """One benchmark row: TE tensors (inputs then output), its flop count, a numpy reference."""

    name: str
    build: Callable[[], list[te.Tensor]]
    flops: float
    reference: Callable[[list[np.ndarray]], np.ndarray]


def _gemm(m: int = 1024, n: int = 1024, k: int = 1024) -> list[te.Tensor]:
    a = te.placeholder((m, k), DTYPE, name="A")
    b = te.placeholder((k, n), DTYPE, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return [a, b, c]


def _pad(x: te.Tensor, pad: int) -> te.Tensor:
    n, c, h, w = (int(d) for d in x.shape)

    def body(i, ch, y, z):
        inside = te.all(y >= pad, y < h + pad, z >= pad, z < w + pad)
        return te.if_then_else(inside, x[i, ch, y - pad, z - pad], te.const(0.0, DTYPE))

    return te.compute((n, c, h + 2 * pad, w + 2 * pad), body, name="pad")


def _conv2d(n=1, c=64, h=56, w=56, k=64, kh=3, kw=3, pad=1) -> list[te.Tensor]:
    x = te.placeholder((n, c, h, w), DTYPE, name="X")
    wt = te.placeholder((k, c, kh, kw), DTYPE, name="W")
    xp = _pad(x, pad)
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    rc = te.reduce_axis((0, c), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    y = te.compute(
        (n, k, oh, ow),
        lambda b, f, i, j: te.sum(xp[b, rc, i + ry, j + rx] * wt[f, rc, ry, rx], axis=[rc, ry, rx]),
        name="Y",
    )
    return [x, wt, y]


def _depthwise(n=1, c=144, h=56, w=56, kh=3, kw=3, pad=1) -> list[te.Tensor]:
    x = te.placeholder((n, c, h, w), DTYPE, name="X")
    wt = te.placeholder((c, 1, kh, kw), DTYPE, name="W")
    xp = _pad(x, pad)
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    y = te.compute(
        (n, c, oh, ow),
        lambda b, ch, i, j: te.sum(xp[b, ch, i + ry, j + rx] * wt[ch, 0, ry, rx], axis=[ry, rx]),
        name="Y",
    )
    return [x, wt, y]


def _batch_matmul(b=12, m=128, k=64, n=128) -> list[te.Tensor]:
    x = te.placeholder((b, m, k), DTYPE, name="A")
    y = te.placeholder((b, k, n), DTYPE, name="B")
    r = te.reduce_axis((0, k), name="k")
    z = te.compute((b, m, n), lambda p, i, j: te.sum(x[p, i, r] * y[p, r, j], axis=r), name="C")
    return [x, y, z]


def _softmax(m=128, n=4096) -> list[te.Tensor]:
    x = te.placeholder((m, n), DTYPE, name="X")
    r1 = te.reduce_axis((0, n), name="k1")
    mx = te.compute((m,), lambda i: te.max(x[i, r1], axis=r1), name="row_max")
    ex = te.compute((m, n), lambda i, j: te.exp(x[i, j] - mx[i]), name="exp")
    r2 = te.reduce_axis((0, n), name="k2")
    sm = te.compute((m,), lambda i: te.sum(ex[i, r2], axis=r2), name="row_sum")
    y = te.compute((m, n), lambda i, j: ex[i, j] / sm[i], name="Y")
    return [x, y]


def _ref_conv(xs: list[np.ndarray], groups_depthwise: bool) -> np.ndarray:
    x, w = xs
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    out = np.zeros((n, w.shape[0], h, wd), dtype=np.float64)
    for dy in range(kh):
        for dx in range(kw):
            patch = xp[:, :, dy : dy + h, dx : dx + wd].astype(np.float64)
            if groups_depthwise:
                out += patch * w[None, :, 0, dy, dx, None, None]
            else:
                out += np.einsum("nchw,kc->nkhw", patch, w[:, :, dy, dx])
    return out.astype(np.float32)


def _ref_softmax(xs: list[np.ndarray]) -> np.ndarray:
    x = xs[0]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# Flop conventions: a multiply-add counts 2; softmax counts 5 per element (max, subtract, exp,
# add, divide), the same convention the autosched side must use for the GFLOPS columns to compare.
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("gemm", _gemm, 2.0 * 1024**3, lambda xs: xs[0] @ xs[1]),
        Workload("conv2d", _conv2d, 2.0 * 64 * 56 * 56 * 64 * 9, lambda xs: _ref_conv(xs, False)),
        Workload(
            "depthwise_conv2d", _depthwise, 2.0 * 144 * 56 * 56 * 9, lambda xs: _ref_conv(xs, True)
        ),
        Workload(
            "batch_matmul",
            _batch_matmul,
            2.0 * 12 * 128 * 64 * 128,
            lambda xs: np.matmul(xs[0], xs[1]),
        ),
        Workload("softmax", _softmax, 5.0 * 128 * 4096, _ref_softmax),
    ]
}


def host_target(num_cores: int) -> tvm.target.Target:
    """The LLVM target for this CPU, e.g. {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}."""
    return tvm.target.Target(
        {"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": num_cores}
    )


def _random_args(tensors: list[te.Tensor], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, size=[int(d) for d in t.shape]).astype(DTYPE) for t in tensors]


def time_module(
    lib: tvm.runtime.Executable, tensors: list[te.Tensor], wl: Workload, repeat: int = 7
) -> tuple[float, float]:
    """(median, min) milliseconds of ``lib["main"]``; checks the output against numpy first.

    Each repeat runs the kernel enough times to last at least 100 ms (min_repeat_ms), so
    single-call timer noise does not dominate fast kernels. The minimum is kept as well because
    the machine is shared: other jobs only ever make a repeat slower.
    """
    dev = tvm.cpu(0)
    inputs = _random_args(tensors[:-1], seed=0)
    out_shape = [int(d) for d in tensors[-1].shape]
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, dtype=DTYPE), dev)
    lib["main"](*args, out)
    expected = wl.reference(inputs)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-3, atol=1e-3)
    evaluator = lib.mod.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=100)
    results = evaluator(*args, out).results
    return statistics.median(results) * 1e3, min(results) * 1e3


def untuned_ms(wl: Workload, target: tvm.target.Target) -> tuple[float, float]:
    """Time of the PrimFunc straight from te.create_prim_func, with no schedule applied."""
    tensors = wl.build()
    lib = tvm.compile(te.create_prim_func(tensors), target=target)
    return time_module(lib, tensors, wl, repeat=3)


def build_without_intrinsics(mod: tvm.IRModule, target: tvm.target.Target, _params) -> object:
    """MetaSchedule's default_build minus its ``import tvm.s_tir.tensor_intrin``.

    LocalBuilder starts a fresh worker pool for every batch, and that import costs each worker
    about 25 CPU-seconds on this machine (it parses hundreds of TVMScript intrinsics). Float32
    CPU schedules never tensorize, so the import only adds a fixed cost per batch that says
    nothing about the search; the build itself is otherwise identical.
    """
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.driver.build(mod, target=target)


def best_schedule_times(
    database: ms.database.Database, wl: Workload, target: tvm.target.Target, trials: int
) -> dict:
    """Compile the best record of ``database`` for ``wl`` and time it: the row's timing fields."""
    tensors = wl.build()
    sch = ms.tir_integration.compile_tir(database, te.create_prim_func(tensors), target)
    if sch is None:
        raise RuntimeError(f"{wl.name}: MetaSchedule found no valid schedule in {trials} trials")
    median, low = time_module(tvm.compile(sch.mod, target=target), tensors, wl)
    return {
        "best_ms": round(median, 4),
        "gflops": round(wl.flops / (median * 1e-3) / 1e9, 2),
        "best_min_ms": round(low, 4),
        "timed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def retime(args, target: tvm.target.Target) -> None:
    """Re-measure the rows already in --out from their kept work dirs, without tuning.

    Tuning and timing happen under whatever else runs on the machine; this lets the final
    numbers be taken together, in a quieter moment, with untuned and tuned back to back.
    """
    rows = json.loads(args.out.read_text())
    for row in rows:
        if row["workload"] not in args.workloads or row["trials"] not in args.trials:
            continue
        wl = WORKLOADS[row["workload"]]
        work_dir = args.work_dir / f"{wl.name}_{row['trials']}"
        database = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)
        row.update(best_schedule_times(database, wl, target, row["trials"]))
        base, base_min = untuned_ms(wl, target)
        row.update(_untuned_fields(wl, base, base_min))
        _merge(args.out, row)
        print(f"{wl.name} trials={row['trials']}: retimed {row['best_ms']:.4f} ms", flush=True)


def _untuned_fields(wl: Workload, base: float, base_min: float) -> dict:
    return {
        "untuned_ms": round(base, 4),
        "untuned_min_ms": round(base_min, 4),
        "untuned_gflops": round(wl.flops / (base * 1e-3) / 1e9, 3),
    }


def tune_one(wl: Workload, trials: int, target: tvm.target.Target, work_root: Path, args) -> dict:
    """Tune ``wl`` from scratch with ``trials`` trials; return the result row."""
    tensors = wl.build()
    func = te.create_prim_func(tensors)
    work_dir = work_root / f"{wl.name}_{trials}"
    shutil.rmtree(work_dir, ignore_errors=True)  # each budget starts with an empty database
    work_dir.mkdir(parents=True)
    start = time.perf_counter()
    database = ms.tune_tir(
        mod=func,
        target=target,
        work_dir=str(work_dir),
        max_trials_global=trials,
        num_trials_per_iter=args.trials_per_iter,
        builder=ms.builder.LocalBuilder(
            timeout_sec=args.build_timeout,
            f_build=None if args.stock_builder else build_without_intrinsics,
        ),
        runner=ms.runner.LocalRunner(),
        num_tuning_cores=args.num_cores,
        seed=args.seed,
    )
    tune_wall = time.perf_counter() - start
    records = database.get_all_tuning_records()
    measured = [
        float(np.mean([float(c) for c in r.run_secs]))
        for r in records
        if r.run_secs is not None and len(r.run_secs) > 0
    ]
    valid = [s for s in measured if s < 1e9]  # MetaSchedule stores 1e10 for failed runs
    return {
        "workload": wl.name,
        "trials": trials,
        **best_schedule_times(database, wl, target, trials),
        "tune_wall_s": round(tune_wall, 1),
        "tvm_version": tvm.__version__,
        "records": len(records),
        "valid_records": len(valid),
        "ms_best_measured_ms": round(min(valid) * 1e3, 4) if valid else None,
        "trials_per_iter": args.trials_per_iter,
        "target": str(target),
        "builder": "stock" if args.stock_builder else "build_without_intrinsics",
    }


def _merge(out: Path, row: dict) -> None:
    rows = json.loads(out.read_text()) if out.exists() else []
    rows = [r for r in rows if (r["workload"], r["trials"]) != (row["workload"], row["trials"])]
    rows.append(row)
    rows.sort(key=lambda r: (list(WORKLOADS).index(r["workload"]), r["trials"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--trials", nargs="+", type=int, default=[64, 256])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/tvm_baseline.json"))
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/tvm_baseline"))
    p.add_argument("--trials-per-iter", type=int, default=64)
    p.add_argument("--build-timeout", type=float, default=240.0, help="seconds per build")
    p.add_argument("--num-cores", type=int, default=os.cpu_count() or 2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--stock-builder",
        action="store_true",
        help="use MetaSchedule's default_build (re-imports tensor intrinsics in every batch)",
    )
    p.add_argument(
        "--retime",
        action="store_true",
        help="re-measure the rows in --out from their work dirs instead of tuning",
    )
    p.add_argument("--note", default="", help="free text stored in every row")
    args = p.parse_args(argv)

    target = host_target(args.num_cores)
    # TuneContext imports the tensor intrinsics once per process (~30 s here); do it before any
    # timer starts so the first tuning run is not charged for it.
    import tvm.s_tir.tensor_intrin  # noqa: F401

    print(baseline.header())
    print(f"TVM {tvm.__version__}, target {target}, {platform.processor() or platform.machine()}")
    if args.retime:
        retime(args, target)
        return 0
    base: dict[str, tuple[float, float]] = {}
    for name in args.workloads:
        wl = WORKLOADS[name]
        base[name] = untuned_ms(wl, target)
        print(f"{name}: untuned {base[name][0]:.3f} ms", flush=True)
    # Budgets outermost, so a job cut short still has every workload at the smaller budgets.
    for trials in args.trials:
        for name in args.workloads:
            wl = WORKLOADS[name]
            row = tune_one(wl, trials, target, args.work_dir, args)
            row.update(_untuned_fields(wl, *base[name]))
            if args.note:
                row["note"] = args.note
            _merge(args.out, row)
            print(
                f"{name} trials={trials}: best {row['best_ms']:.4f} ms, {row['gflops']} GFLOPS, "
                f"tuning {row['tune_wall_s']} s ({row['valid_records']}/{row['records']} valid)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
