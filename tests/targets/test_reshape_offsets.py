"""A reshape fused into a kernel indexes its input with the flat index split into the input's
axes (``x[i // 2560, i // 80 % 32, i % 80]``); the backends put it back together row-major
and simplify, so the access is ``x[i]`` again: no division or remainder per element, on the
CPU (the generated LLVM IR, before optimization) and in CUDA C, and the values unchanged."""

from __future__ import annotations

import re

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.te.ops import reshape
from autosched.tir import ir
from tests.support.nvrtc import NVRTC_SKIP


def _flattened(shape: tuple[int, ...]) -> tuple[te.Tensor, te.Tensor]:
    x = te.placeholder(shape, name="x")
    flat = reshape(x, (int(np.prod(shape)),))
    return x, te.compute(flat.shape, lambda i: flat[i] * 2.0 + 1.0, name="y")


def test_split_and_recombined_offset_is_the_flat_index() -> None:
    i = te.var("i")
    buf = ir.Buffer("x", (1, 24, 32, 80), "float32")
    parts = (i // 61440, i // 2560 % 24, i // 80 % 32, i % 80)
    off, merged = ir.access_offset(buf, parts)
    assert merged and te.structural_equal(off, i), off
    assert not ir.access_offset(buf, (i, i, i, i))[1]  # nothing to merge


@pytest.mark.parametrize("shape", [(1, 24, 32, 80), (3, 5, 7)])
def test_llvm_reshape_reads_the_flat_index(shape: tuple[int, ...], rng: np.random.Generator
                                           ) -> None:
    x, y = _flattened(shape)
    s = te.create_schedule(y.op)
    mod = aus.build(s, [x, y], target="llvm")
    body = mod.get_llvm_ir(optimized=False)
    assert not re.search(r"\b[su](div|rem)\b", body), body  # before: one per axis
    a = rng.standard_normal(shape).astype("float32")
    out = np.full(a.size, np.nan, "float32")
    mod(a, out)
    np.testing.assert_array_equal(out, a.reshape(-1) * 2 + 1)


@pytest.mark.skipif(NVRTC_SKIP is not None, reason=str(NVRTC_SKIP))
def test_cuda_reshape_reads_the_flat_index() -> None:
    x, y = _flattened((1, 24, 32, 80))
    s = te.create_schedule(y.op)
    mod = aus.build(s, [x, y], target="cuda -arch=sm_90")
    reads = re.findall(r"v_x\[([^\]]*)\]", mod.get_source())
    assert reads and not any("/" in r or "%" in r for r in reads), reads
