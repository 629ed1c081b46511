"""GPU diagnosis for a device session: the pinned WRONG_ANSWER SGEMM candidates of
tests/support/sgemm_candidates.py run directly (numpy and GPUArray arguments, twice), the default
schedule, then short tuning runs of SGEMM 4096 / 1024 and a ResNet conv with their first
failures printed.
Run on the device machine:

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-wheels/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_diagnose.py
"""

from __future__ import annotations

import collections
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pycuda.gpuarray as ga  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.search.record import RecordLog  # noqa: E402
from autosched.search.workloads import make  # noqa: E402
from tests.support.sgemm_candidates import FAILING, lowered  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))


def stats(c: np.ndarray, ref: np.ndarray) -> str:
    """'ok', or how many elements are NaN / wrong and where."""
    bad = ~np.isclose(c, ref, rtol=1e-3, atol=1e-3)
    if not bad.any():
        return "ok"
    idx = np.argwhere(bad)
    return (f"nan={int(np.isnan(c).sum())} bad={int(bad.sum())}/{c.size} "
            f"rows={len(np.unique(idx[:, 0]))} cols={len(np.unique(idx[:, 1]))} "
            f"first={tuple(idx[0])} last={tuple(idx[-1])}")


def direct_runs(rng: np.random.Generator, sizes: tuple[int, ...]) -> None:
    for n in sizes:
        a = rng.uniform(-1, 1, (n, n)).astype("float32")
        b = rng.uniform(-1, 1, (n, n)).astype("float32")
        ref = a.astype(np.float64) @ b
        task = None
        for i, params in enumerate(FAILING):
            task, low = lowered(params, n)
            mod = task.build(low.schedule)
            c = np.full((n, n), np.nan, "float32")
            mod(a, b, c)
            da, db = ga.to_gpu(a), ga.to_gpu(b)
            dc = ga.to_gpu(np.full((n, n), np.nan, "float32"))
            mod(da, db, dc)
            second = stats(dc.get(), ref)
            mod(da, db, dc)
            print(f"n={n} candidate {i}: numpy {stats(c, ref)} | gpuarray {second} | "
                  f"again {stats(dc.get(), ref)}", flush=True)
            if n == 256:
                (OUT / f"candidate{i}_256.cu").write_text(mod.get_source())
        assert task is not None
        c = np.full((n, n), np.nan, "float32")
        task.build(task.schedule())(a, b, c)
        print(f"n={n} default schedule: {stats(c, ref)}", flush=True)


def tuning_runs() -> None:
    workloads = {"sgemm_4096": ("gemm", [4096] * 3), "sgemm_1024": ("gemm", [1024] * 3),
                 "conv3x3_64": ("conv2d", [1, 64, 56, 56, 64, 3, 3, 1, 1])}
    for name, (op, shape) in workloads.items():
        tensors = make(op, shape)
        task = aus.Task(lambda t=tensors: t, target="cuda", name=name)
        log = OUT / f"{name}.jsonl"
        t0 = time.time()
        aus.tune(task, trials=32, log=log,
                 options=aus.TuneOptions(batch_size=32, seed=0, verbose=False),
                 build_workers=12, repeat=3, min_repeat_ms=10)
        recs = RecordLog(log).records_for(task.workload_key, task.target)
        counts = collections.Counter(r.error_code for r in recs)
        print(name, f"{time.time() - t0:.0f} s", dict(counts), flush=True)
        for r in [r for r in recs if not r.ok][:4]:
            print("   ", r.error_code, r.error_msg[:400])


if __name__ == "__main__":
    only_direct = sys.argv[1:] == ["direct"]
    direct_runs(np.random.default_rng(0), (256, 1024) if only_direct else (256, 1024, 4096))
    if not only_direct:
        tuning_runs()
