"""`make demo`: build a hand-scheduled GEMM for this CPU, check it, time it next to numpy.

(When the auto-scheduler lands, the demo tunes instead of using a hand schedule.)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import autosched as aus
from autosched import te


def gemm_schedule(n: int, bn: int = 32, vec: int = 16):
    """The classic blocked GEMM: tiles of bn x bn, the k loop split by 4, packed B,
    a local accumulator, vectorized inner loop and parallel outer loop."""
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    packed = te.compute((n // bn, n, bn), lambda x, y, z: B[y, x * bn + z], name="packedB")
    C = te.compute(
        (n, n), lambda i, j: te.sum(A[i, k] * packed[j // bn, k, j % bn], axis=k), name="C"
    )
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, bn, bn)
    s[CC].compute_at(s[C], jo)
    ci, cj = s[CC].op.axis
    (kk,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(kk, factor=4)
    s[CC].reorder(ko, ci, ki, cj)
    s[CC].unroll(ki)
    s[CC].vectorize(cj)
    s[C].parallel(io)
    x, y, z = s[packed].op.axis
    s[packed].vectorize(z)
    s[packed].parallel(x)
    return s, [A, B, C]


def median_seconds(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=512, help="GEMM size (n x n x n)")
    parser.add_argument("--target", default="llvm")
    args = parser.parse_args()
    n = args.n
    s, tensors = gemm_schedule(n)
    print(aus.lower(s, tensors) if n <= 64 else s.to_python())
    mod = aus.build(s, tensors, target=args.target)
    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (n, n)).astype("float32")
    b = rng.uniform(-1, 1, (n, n)).astype("float32")
    c = np.full((n, n), np.nan, dtype="float32")
    mod(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-3, atol=1e-3)
    flops = 2.0 * n**3
    t_ours = median_seconds(lambda: mod(a, b, c))
    t_np = median_seconds(lambda: a @ b)
    print(f"\nGEMM {n}x{n}x{n} float32 on {args.target}: output matches numpy")
    print(f"{'':10}{'ms':>10}{'GFLOPS':>10}")
    print(f"{'autosched':10}{t_ours * 1e3:10.2f}{flops / t_ours / 1e9:10.1f}")
    print(f"{'numpy':10}{t_np * 1e3:10.2f}{flops / t_np / 1e9:10.1f}")
    print(f"ratio autosched / numpy: {t_np / t_ours:.2f}")


if __name__ == "__main__":
    main()
