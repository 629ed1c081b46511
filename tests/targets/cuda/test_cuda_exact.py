"""Float32 arithmetic in the CUDA C rounds as onnxruntime's does (autosched/targets/rounding.py):
elementwise a*b+c as two rounded ops, never contracted into an FMA by NVRTC (read in the PTX);
a reduction's update acc + a*b as one FMA, so SGEMM and convolution keep theirs; the results to
the bit on the host (CUDA C run by g++) and on the GPU. Sigmoid and tanh against onnxruntime
are in tests/importers/test_ops_onnx_dqlstm.py."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.search.workloads import make
from autosched.targets.cuda.host_emulate import unavailable
from autosched.targets.cuda.nvrtc import compile_cuda
from autosched.targets.rounding import fma32
from autosched.testing.gpu_sgemm_schedule import sgemm_schedule
from tests.support.nvrtc import NVRTC_SKIP, needs_nvrtc

HOST_SKIP = NVRTC_SKIP or unavailable()
TARGETS = [
    pytest.param("cuda -emulate=host", marks=pytest.mark.skipif(HOST_SKIP is not None,
                                                                reason=str(HOST_SKIP))),
    pytest.param("cuda", marks=pytest.mark.gpu)]


def _ptx_ops(s: te.Schedule, args: list, target: str = "cuda -arch=sm_90") -> dict[str, int]:
    """How often each float instruction (``fma.rn.f32``, ``mul.rn.f32``, ...) occurs in the
    PTX that NVRTC makes of the generated CUDA C."""
    mod = aus.build(s, args, target=target)
    options = ("--use_fast_math",) if "fast-math" in target else ()
    ptx = compile_cuda(mod.source.code, "sm_90", options, ptx=True).data.decode()
    counts: dict[str, int] = {}
    for op in re.findall(r"^\s*((?:fma|mul|add|sub)(?:\.\w+)*\.f(?:32|64))\s", ptx, re.M):
        counts[op] = counts.get(op, 0) + 1
    return counts


def _fused(counts: dict[str, int]) -> int:
    return sum(n for op, n in counts.items() if op.startswith("fma"))


def _cell(n: int, dtype: str = "float32") -> tuple[te.Schedule, list]:
    """An LSTM cell's c' = f*c + i*g: onnxruntime rounds both products."""
    f, c, i, g = (te.placeholder((n,), name=x, dtype=dtype) for x in "fcig")
    out = te.compute((n,), lambda k: f[k] * c[k] + i[k] * g[k], name="cell")
    return te.create_schedule(out.op), [f, c, i, g, out]


@needs_nvrtc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_elementwise_multiply_add_is_not_fused(dtype: str) -> None:
    counts = _ptx_ops(*_cell(1000, dtype))
    bits = dtype[-2:]
    assert _fused(counts) == 0, counts
    assert counts.get(f"mul.rn.f{bits}") == 2 and counts.get(f"add.rn.f{bits}") == 1, counts


@needs_nvrtc
def test_fast_math_fuses_anything() -> None:
    """-fast-math gives the exactness up: NVRTC contracts the elementwise multiply-add."""
    counts = _ptx_ops(*_cell(1000), target="cuda -arch=sm_90 -fast-math")
    assert _fused(counts) >= 1, counts


@needs_nvrtc
def test_sgemm_and_conv_keep_their_fmas() -> None:
    """The reduction's update stays one FMA: an 8 x 8 register tile over 8-deep slices of K is
    512 of them in SGEMM's unrolled inner loop, with no separate multiply or add."""
    counts = _ptx_ops(*sgemm_schedule(512, 512, 512, tile=128, reg=8, bk=8))
    assert counts.get("fma.rn.f32", 0) >= 512, counts
    assert not {"mul.rn.f32", "add.rn.f32"} & counts.keys(), counts
    x, w, y = make("conv2d", [1, 16, 14, 14, 16, 3, 3, 1, 1])
    counts = _ptx_ops(te.create_schedule(y.op), [x, w, y])
    assert counts.get("fma.rn.f32", 0) >= 1, counts
    assert not {"mul.rn.f32", "add.rn.f32"} & counts.keys(), counts


def test_fma32_rounds_once() -> None:
    """The Python FMA of the reference evaluator's sigmoid and tanh, against exact rational
    arithmetic: random operands, and operands where a*b + c lies just inside half a float32
    ulp of an odd c, so that rounding to float64 first lands on the midpoint and ties to even
    go the wrong way."""
    rng = np.random.default_rng(7)
    n, h = 2000, 1000
    a, b, c = (rng.standard_normal(n).astype("float32") for _ in range(3))
    k = rng.integers(15, 23, h).astype("float32")
    c[:h] = (c[:h].view("int32") | 1).view("float32")
    half_ulp = np.spacing(np.abs(c[:h])) / 2
    a[:h] = rng.choice([-1, 1], h) * half_ulp * (1 + 2 ** -k)
    b[:h] = 1 - 2 ** -k
    wrong = 0
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist()):
        want = np.float32(_round_f32(Fraction(x) * Fraction(y) + Fraction(z)))
        assert np.float32(fma32(x, y, z)).view("int32") == want.view("int32"), (x, y, z)
        wrong += np.float32(x * y + z) != want
    assert wrong >= h, "rounding twice went right: the cases test nothing"


def _round_f32(q: Fraction) -> float:
    """The float32 nearest to ``q`` (ties to even), exactly."""
    lo = np.float32(float(q))  # within one float32 ulp of q
    cands = [np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))]
    dist = [abs(Fraction(float(v)) - q) for v in cands]
    best = min(dist)
    ties = [v for v, d in zip(cands, dist) if d == best]
    return float(min(ties, key=lambda v: int(v.view("int32")) & 1))


@pytest.mark.parametrize("target", TARGETS)
def test_cell_rounds_each_op(target: str, rng: np.random.Generator) -> None:
    """f*c + i*g to the bit of numpy's float32, which rounds each op (values where an FMA's
    single rounding differs are common: the test checks that it would notice)."""
    n = 3001
    s, args = _cell(n)
    ins = [rng.standard_normal(n).astype("float32") for _ in range(4)]
    out = np.full(n, np.nan, "float32")
    aus.build(s, args, target=target)(*ins, out)
    f, c, i, g = ins
    want = f * c + i * g
    np.testing.assert_array_equal(out.view("int32"), want.view("int32"))
    fused = np.array([fma32(float(x), float(y), float(p)) for x, y, p in zip(f, c, i * g)],
                     "float32")
    assert (fused != want).any()


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_accumulates_in_fmas(target: str, rng: np.random.Generator) -> None:
    """SGEMM's register tiles sum each output over k in order, one FMA per step: to the bit of
    that sum in Python (and not of the sum with the product rounded first)."""
    M = N = 64
    K = 32
    a = rng.standard_normal((M, K)).astype("float32")
    b = rng.standard_normal((K, N)).astype("float32")
    c = np.full((M, N), np.nan, "float32")
    aus.build(*sgemm_schedule(M, N, K, tile=32, reg=4, bk=4), target=target)(a, b, c)
    want = np.zeros((M, N), "float32")
    rounded = np.zeros((M, N), "float32")
    for k in range(K):
        for i in range(M):
            for j in range(N):
                want[i, j] = fma32(float(a[i, k]), float(b[k, j]), float(want[i, j]))
        rounded += a[:, k, None] * b[None, k, :]
    np.testing.assert_array_equal(c.view("int32"), want.view("int32"))
    assert (rounded != want).any()
