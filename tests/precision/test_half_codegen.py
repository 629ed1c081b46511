"""Half types through te and the code generators: bfloat16 is a storage type (cast, never
computed on) whose conversions round to nearest even exactly as ml_dtypes does, on LLVM
(scalar and vector: i16 bits and shifts), the reference evaluator, the CUDA C run on the host
and on the IR, and the GPU; NVRTC finds cuda_fp16.h and cuda_bf16.h."""

from __future__ import annotations

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import TEError
from autosched.targets.cuda.codegen import generate
from autosched.targets.cuda.nvrtc import compile_cuda
from autosched.targets.target import parse
from tests.precision.conftest import TARGETS
from tests.support.nvrtc import NVRTC_SKIP, needs_nvrtc

N = 1000


def _specials() -> np.ndarray:
    """float32 values at the edges of bfloat16 rounding: ties to even both ways, overflow to
    inf, the largest finite, subnormals, signed zeros, inf and NaN."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x7F7FFFFF, 0x7F7F7FFF,
                     0x00008000, 0x00018000, 0x80000000, 0x00000000, 0x7F800000, 0xFF800000,
                     0x7FC00000, 0x7F800001], dtype=np.uint32)
    return bits.view(np.float32)


def _round_trip(lanes: int) -> tuple[list, object]:
    """c = float32(bfloat16(float32(a) * 2 + x)) over N elements, ``lanes`` wide."""
    a = te.placeholder((N,), "bfloat16", name="a")
    x = te.placeholder((N,), "float32", name="x")
    b = te.compute((N,), lambda i: te.cast("bfloat16", te.cast("float32", a[i]) * 2.0 + x[i]),
                   name="b")
    c = te.compute((N,), lambda i: te.cast("float32", b[i]), name="c")
    s = te.create_schedule(c.op)
    if lanes > 1:
        _, inner = s[c].split(c.op.axis[0], factor=lanes)
        s[c].vectorize(inner)
    return [a, x, c], s


def _gpu_schedule(args: list) -> object:
    c = args[-1]
    s = te.create_schedule(c.op)
    bx, tx = s[c].split(c.op.axis[0], factor=64)
    s[c].bind(bx, te.thread_axis("blockIdx.x"))
    s[c].bind(tx, te.thread_axis("threadIdx.x"))
    return s


@pytest.mark.parametrize("target", ["llvm vectorized", "ref", *TARGETS, pytest.param(
    "cuda -emulate=ir", marks=pytest.mark.skipif(NVRTC_SKIP is not None, reason=str(NVRTC_SKIP)))])
def test_bfloat16_conversions_round_to_nearest_even(target: str, rng: np.random.Generator
                                                    ) -> None:
    args, s = _round_trip(8 if target == "llvm vectorized" else 1)
    if target == "llvm vectorized":
        target = "llvm"
    elif target.startswith("cuda"):
        s = _gpu_schedule(args)
    f = aus.build(s, args, target=target)
    a = rng.standard_normal(N).astype("bfloat16")
    x = rng.standard_normal(N).astype(np.float32) * np.float32(10.0)
    a[:14] = 0
    x[:14] = _specials()
    c = np.full(N, np.nan, np.float32)
    f(a, x, c)
    with np.errstate(invalid="ignore"):  # the signalling NaN
        wide = a.astype(np.float32) * np.float32(2.0) + x
    want = wide.astype("bfloat16").astype(np.float32)
    nan = np.isnan(want)  # any NaN will do; every other value bit for bit
    np.testing.assert_array_equal(np.isnan(c), nan)
    np.testing.assert_array_equal(c.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_arithmetic_on_bfloat16_needs_a_cast() -> None:
    a = te.placeholder((4,), "bfloat16", name="a")
    with pytest.raises(TEError, match="^bfloat16 is a storage type: te.cast it to float32"):
        te.compute((4,), lambda i: a[i] * a[i])
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(TEError, match="storage type"):
        te.compute((1,), lambda i: te.sum(a[k], axis=k))


@needs_nvrtc
def test_nvrtc_finds_the_half_headers() -> None:
    h = te.placeholder((N,), "float16", name="h")
    a = te.placeholder((N,), "bfloat16", name="a")
    c = te.compute((N,), lambda i: te.cast("bfloat16", te.cast("float32", h[i])
                                           + te.cast("float32", a[i])), name="c")
    s = _gpu_schedule([h, a, c])
    func = aus.lower(s, [h, a, c])
    source = generate(func, parse("cuda -arch=sm_90"))
    assert "#include <cuda_fp16.h>" in source.code and "#include <cuda_bf16.h>" in source.code
    assert "__nv_bfloat16* __restrict__" in source.code and source.uses_half
    binary = compile_cuda(source.code, "sm_90", needs_headers=True, name="halves.cu")
    assert binary.data
