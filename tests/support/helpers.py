"""Test helpers for the operator tests: run a TE graph on a backend, pick tolerances; a model
built and imported once per test process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

import autosched as aus
from autosched import te
from autosched.te.tensor import Tensor
from tests.support.backends import INTERP, garbage


def run_te(outputs: Tensor | list[Tensor], inputs: dict, target: str = "ref") -> list[np.ndarray]:
    """outputs: Tensor or list; inputs: {placeholder Tensor: array}. Builds the default
    schedule, runs it on fresh ``garbage`` outputs (an element the kernel forgets to write
    shows), returns them. Target "interp" evaluates the graph with the numpy interpreter."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if target == INTERP:
        from tests.support.te_interp import evaluate

        return evaluate(outs, inputs)
    s = te.create_schedule([t.op for t in outs])
    placeholders = list(inputs)
    mod = aus.build(s, placeholders + outs, target=target)
    results = [garbage(tuple(int(d) for d in t.shape), t.dtype) for t in outs]
    mod(*[np.require(inputs[p], requirements="C") for p in placeholders], *results)
    return results


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


@functools.cache
def imported(build: Callable[[], Any]) -> tuple[Any, Any]:
    """(ModelProto, imported Graph) of the model ``build()`` makes, built and imported once per
    test process (``build`` is a model table's entry)."""
    from importers.onnx import from_onnx

    proto = build()
    return proto, from_onnx(proto)
