"""The CPU reduce rule's untuned defaults follow the reduction's memory layout: a row
reduction (its reduce axis contiguous) accumulates vector partials (rfactor), a column
reduction (its reduce axis strided, its last data axis contiguous) runs the reduce loop
outside a vectorized loop over the outputs; every other candidate stays reachable. Each
lowers to what it says and matches numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.search.sketch import reduce_layout
from autosched.search.space import SearchSpace
from autosched.search.task import Task
from autosched.te.ops import reduction
from autosched.tir import ir as lir
from autosched.tir.visit import walk

TARGET = "llvm -num-cores=2"
P = te.placeholder


def _loops(func: lir.PrimFunc) -> list[lir.For]:
    return [s for s in walk(func.body) if isinstance(s, lir.For)]


def _run(space: SearchSpace, inputs: list[te.Tensor], out: te.Tensor,
         values: list[np.ndarray]) -> np.ndarray:
    mod = aus.build(space.default_schedule(), [*inputs, out], target=TARGET)
    got = np.full(tuple(int(d) for d in out.shape), np.nan, out.dtype)
    mod(*values, got)
    return got


CASES: dict[str, tuple[Any, ...]] = {
    # name: (input shape, op, axis, numpy, layout)
    "row max": ((48, 100), reduction.max, 1, np.max, "row"),
    "row sum, two axes": ((6, 10, 12), reduction.sum, (1, 2), np.sum, "row"),
    "column sum": ((1, 96, 40), reduction.sum, 1, np.sum, "column"),
    "column max": ((70, 33), reduction.max, 0, np.max, "column"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_untuned_reduction_follows_its_layout_and_matches_numpy(
        name: str, rng: np.random.Generator) -> None:
    shape, op, axis, ref, layout = CASES[name]
    x = P(shape, name="x")
    out = op(x, axis=axis)
    task = Task(out, target=TARGET)
    (stage,) = [st for st in task.schedule().stages if st.name == out.op.name]
    assert reduce_layout(stage.compute_op) == layout
    space = SearchSpace(task)
    params = dict(space.default_candidate().params)
    rf, rows = params[f"{out.op.name}.rfactor"], params.get(f"{out.op.name}.rows")
    low = space.lower(space.default_candidate())
    assert low is not None and low.func is not None
    loops = _loops(low.func)
    if layout == "row":
        assert rf > 0 and rows is None
        assert any(lp.kind == "vectorized" for lp in loops)  # the partials' vector
    else:
        assert rf == 0 and rows == 1
        # the reduce loop encloses the vectorized loop over the outputs
        assert any(lp.var.name.startswith("k") and any(
            isinstance(s, lir.For) and s.kind == "vectorized" for s in walk(lp.body))
            for lp in loops), low.func
    values = [rng.uniform(-3, 3, shape).astype(np.float32)]
    np.testing.assert_allclose(_run(space, [x], out, values), ref(values[0], axis=axis),
                               rtol=1e-5, atol=1e-5)


def test_column_reduction_still_offers_the_plain_order(rng: np.random.Generator) -> None:
    x = P((1, 96, 40), name="x")
    out = reduction.sum(x, axis=1)
    space = SearchSpace(Task(out, target=TARGET))
    knob = {k.name: k for k in space.sketches[0].knobs}[f"{out.op.name}.rows"]
    assert set(knob.options) == {0, 1}
    from autosched.search.space import Candidate

    c = space.default_candidate()
    plain = Candidate(c.sketch, tuple((n, 0 if n == knob.name else v) for n, v in c.params))
    low = space.lower(plain)
    assert low is not None and low.ir_hash != space.lower(c).ir_hash
    mod = aus.build(low.schedule, [x, out], target=TARGET)
    v = rng.uniform(-3, 3, (1, 96, 40)).astype(np.float32)
    got = np.full((1, 40), np.nan, np.float32)
    mod(v, got)
    np.testing.assert_allclose(got, v.sum(axis=1), rtol=1e-5, atol=1e-5)
