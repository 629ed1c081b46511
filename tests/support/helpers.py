"""Test helpers for the operator tests: run a TE graph on a backend, pick tolerances."""

from __future__ import annotations

import os

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.te.tensor import Tensor
from tests.backends import CPU_TARGETS

# Run only when named in AUTOSCHED_TEST_TARGETS (comma-separated): "interp" is
# tests/te_interp.py, a numpy oracle that needs no schedule or lowering; "cuda" builds the
# default (auto-bound) GPU schedule and needs a GPU (marked gpu, skipped without one).
_NAMED = os.environ.get("AUTOSCHED_TEST_TARGETS", "").split(",")
TARGETS: list = CPU_TARGETS + [t for t in ("interp",) if t in _NAMED] + [
    pytest.param("cuda", marks=pytest.mark.gpu) for t in ("cuda",) if t in _NAMED]


def run_te(outputs: Tensor | list[Tensor], inputs: dict, target: str = "ref") -> list[np.ndarray]:
    """outputs: Tensor or list; inputs: {placeholder Tensor: array}. Builds the default
    schedule, runs it, returns output arrays (allocated with np.empty and filled with NaN / 77,
    so an element the kernel forgets to write shows)."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if target == "interp":
        from tests.te_interp import evaluate

        return evaluate(outs, inputs)
    s = te.create_schedule([t.op for t in outs])
    placeholders = list(inputs)
    mod = aus.build(s, placeholders + outs, target=target)
    results = []
    for t in outs:
        arr = np.empty(tuple(int(d) for d in t.shape), dtype=t.dtype)
        arr.fill(np.nan if t.dtype.startswith("float") else 77)
        results.append(arr)
    mod(*[np.require(inputs[p], requirements="C") for p in placeholders], *results)
    return results


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    """The backend an operator test runs on (import this fixture into a test module)."""
    return request.param


def tol(dtype: str) -> dict[str, float]:
    return {"float16": dict(rtol=1e-2, atol=1e-2), "float32": dict(rtol=2e-5, atol=2e-5),
            "float64": dict(rtol=1e-10, atol=1e-10)}.get(dtype, dict(rtol=0, atol=0))


def check(got: np.ndarray, want: np.ndarray, dtype: str | None = None, **kw: float) -> None:
    """Compare with numpy: same shape and dtype, values within the dtype's tolerance."""
    want = np.asarray(want)
    dtype = dtype or str(got.dtype)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert str(got.dtype) == dtype, f"dtype {got.dtype} != {dtype}"
    np.testing.assert_allclose(got.astype(np.float64) if got.dtype != bool else got,
                               want.astype(got.dtype).astype(np.float64)
                               if got.dtype != bool else want, **{**tol(dtype), **kw})
