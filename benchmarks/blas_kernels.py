"""numpy's GEMM with OpenBLAS's own kernel for this CPU against a forced one, in alternation.

    .venv/bin/python benchmarks/blas_kernels.py [--force Haswell] [--rounds 5] [--threads 1]

OpenBLAS picks its kernel once, when numpy loads it, so each side runs in its own child
process: one with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset, one with them forced. The
children alternate. Each reports GFLOPS of float32 GEMM 1024 per wall second and per CPU
second of the process: with one thread the second is steady on a busy machine, since it counts
only the time the process ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import baseline  # noqa: E402

N = 1024


def child(seconds: float) -> dict:
    """Time GEMM N in this process for ``seconds`` of CPU time; what ran and how fast."""
    import numpy as np

    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (N, N)).astype("float32")
    b = rng.uniform(-1, 1, (N, N)).astype("float32")
    a @ b
    calls, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
    while time.process_time() - cpu0 < seconds:
        a @ b
        calls += 1
    flop = 2.0 * N**3 * calls
    blas = baseline.numpy_blas()
    return {"kernel": blas.kernel, "threads": blas.threads,
            "gflops_per_cpu_s": flop / (time.process_time() - cpu0) / 1e9,
            "gflops_wall": flop / (time.perf_counter() - wall0) / 1e9}


def run_child(env: dict[str, str], seconds: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(seconds)], env=env,
                         capture_output=True, text=True, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", default="Haswell", help="the OPENBLAS_CORETYPE to compare with")
    ap.add_argument("--l2-size", default="512", help="the OPENBLAS_L2_SIZE forced with it")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=1.5, help="CPU seconds per child")
    ap.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    own = {k: v for k, v in os.environ.items() if k not in baseline.FORCED_BLAS_VARS}
    own["OPENBLAS_NUM_THREADS"] = str(args.threads)
    forced = dict(own, OPENBLAS_CORETYPE=args.force, OPENBLAS_L2_SIZE=args.l2_size)
    print(baseline.header(), flush=True)
    runs = baseline.alternate_calls({"own": lambda: run_child(own, args.seconds),
                                     "forced": lambda: run_child(forced, args.seconds)},
                                    args.rounds)
    for name, got in runs.items():
        print(f"{name:6} kernel {got[0]['kernel']}, {got[0]['threads']} threads: GEMM {N} "
              f"median GFLOPS per CPU second "
              f"{statistics.median(r['gflops_per_cpu_s'] for r in got):.1f}, per wall second "
              f"{statistics.median(r['gflops_wall'] for r in got):.1f} ({args.rounds} rounds)")
    print(f"# load average {baseline.load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
