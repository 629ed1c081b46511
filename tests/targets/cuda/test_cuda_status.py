"""The status word of CUDA kernels that check an index at run time (``take(mode="strict")``,
what Gather imports to): only those kernels take it, a failed check sets STATUS_INDEX and the
call raises KernelFailure after reading the clamped element; the CUDA C of a kernel without
checks is what it was before status words existed. The GPU runs are in
tests/graph/test_gather_checks.py (marked gpu)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import RuntimeError_
from autosched.targets.cuda.cexpr import PRELUDE_STATUS, STATUS_PARAM
from autosched.targets.cuda.host_emulate import run_on_host, unavailable
from autosched.targets.status import STATUS_INDEX, KernelFailure
from autosched.te import ops
from tests.support.nvrtc import needs_nvrtc

pytestmark = needs_nvrtc

N = 23  # rows of the table
TARGET = "cuda -arch=sm_90"
needs_host = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _take(mode: str, name: str = "take", then_double: bool = False, target: str = TARGET
          ) -> Any:
    """take(x, i, axis 0) with ``mode``; ``then_double`` adds a second kernel reading it."""
    x = te.placeholder((N, 3), name="x")
    i = te.placeholder((7,), dtype="int64", name="i")
    y = ops.take(x, i, 0, mode=mode)
    if not then_double:
        return aus.build(te.create_schedule(y.op), [x, i, y], target=target, name=name)
    z = te.compute(y.shape, lambda r, c: y[r, c] * 2.0, name="z")
    return aus.build(te.create_schedule(z.op), [x, i, z], target=target, name=name)


def _unchecked(code: str) -> str:
    """``code`` with the status word and the index checks taken out."""
    code = code.replace(PRELUDE_STATUS, "").replace(f", int* __restrict__ {STATUS_PARAM}", "")
    check = re.compile(r"as_index_check\(\(long long\)\((.*)\), \(long long\)\(23LL\), "
                       rf"{STATUS_PARAM}\)")
    return check.sub(r"\1", code)  # one check per line: ``.*`` stops at its end


def test_only_a_kernel_with_a_check_takes_the_status_word() -> None:
    """mode="normalize" lowers to the loads of "strict" without the check: its CUDA C has no
    status word, and the strict kernel's differs by the word, its helper and the check alone."""
    plain, strict = _take("normalize"), _take("strict")
    assert not plain.checks and STATUS_PARAM not in plain.get_source()
    assert "as_index_check" not in plain.get_source() and "atomicOr" not in plain.get_source()
    assert strict.checks and [k.checks for k in strict.source.kernels] == [True]
    assert strict.get_source().count(f"int* __restrict__ {STATUS_PARAM})") == 1
    assert strict.get_source() != plain.get_source()
    assert _unchecked(strict.get_source()) == plain.get_source()


def test_the_kernel_without_a_check_keeps_its_signature() -> None:
    mod = _take("strict", then_double=True)
    assert [k.checks for k in mod.source.kernels] == [True, False]
    signatures = [line for line in mod.get_source().splitlines() if "__global__" in line]
    assert STATUS_PARAM in signatures[0] and STATUS_PARAM not in signatures[1]


def test_launches_of_a_checking_module_need_a_status_word() -> None:
    """Launching kernels whose failures nobody reads would drop them (no GPU needed to say so)."""
    mod = _take("strict")
    a, out = np.ones((N, 3), "float32"), np.empty((7, 3), "float32")
    with pytest.raises(RuntimeError_, match="take: .* status word; launches.. needs its address"):
        mod.launches(a, np.zeros(7, np.int64), out)


@needs_host
@pytest.mark.parametrize("bad", [N, -N - 1, 2**31, -(2**40)])
def test_host_emulation_reports_the_index_and_reads_the_clamped_element(bad, rng) -> None:
    """The checked build sees no access out of bounds: the clamp keeps the read in range; the
    second kernel still runs; the call raises once the outputs are back."""
    mod = _take("strict", name="lookup_twice", then_double=True)
    a = rng.uniform(-1, 1, (N, 3)).astype("float32")
    iv = rng.integers(-N, N, 7).astype(np.int64)
    out = np.full((7, 3), np.nan, "float32")
    run_on_host(mod, a, iv, out)
    np.testing.assert_array_equal(out, 2 * np.take(a, iv, 0))
    iv[int(rng.integers(7))] = bad
    out[...] = np.nan
    with pytest.raises(KernelFailure, match="^lookup_twice: an index read from the indices "
                                            "tensor is out of range$") as failure:
        run_on_host(mod, a, iv, out)
    assert failure.value.status == STATUS_INDEX
    clamped = np.clip(np.where(iv < 0, iv + N, iv), 0, N - 1)
    np.testing.assert_array_equal(out, 2 * a[clamped])


@pytest.mark.gpu
def test_device_arrays_get_the_status_checked_on_the_gpu(rng) -> None:
    """Arguments already on the device (as measurement passes them): the word is read all the
    same, for a call and for a timing, and cleared for the next call."""
    import pycuda.gpuarray as gpuarray

    mod = _take("strict", name="lookup_twice", then_double=True, target="cuda")
    a = rng.uniform(-1, 1, (N, 3)).astype("float32")
    iv = rng.integers(-N, N, 7).astype(np.int64)
    bad = iv.copy()
    bad[int(rng.integers(7))] = -N - 1
    args = [gpuarray.to_gpu(a), gpuarray.to_gpu(bad), gpuarray.empty((7, 3), np.float32)]
    for run in (lambda: mod(*args), lambda: mod.time(*args, warmup=0, repeat=2)):
        with pytest.raises(KernelFailure, match="^lookup_twice: an index .* out of range$"):
            run()
    args[1] = gpuarray.to_gpu(iv)
    mod(*args)
    np.testing.assert_array_equal(args[2].get(), 2 * np.take(a, iv, 0))
