"""Reductions (sum, mean, max, min, prod, argmax, argmin) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from tests.support.helpers import check, run_te

CASES = {"sum": (ops.sum, np.sum), "mean": (ops.mean, np.mean), "max": (ops.max, np.max),
         "min": (ops.min, np.min), "prod": (ops.prod, np.prod)}


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (2, 1, 0), ()])
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reduce_float(name: str, axis, keepdims: bool, target: str) -> None:  # noqa: ANN001
    op, ref = CASES[name]
    x = te.placeholder((3, 1, 5), name="x")
    a = np.random.default_rng().uniform(0.5, 1.5, (3, 1, 5)).astype("float32")
    out = op(x, axis=axis, keepdims=keepdims)
    want = ref(a.astype(np.float64), axis=axis, keepdims=keepdims)
    assert tuple(out.shape) == want.shape
    (got,) = run_te(out, {x: a}, target)
    check(got, want, "float32")


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_reduce_int(name: str, target: str) -> None:
    op, ref = CASES[name]
    x = te.placeholder((4, 6), dtype="int32", name="x")
    a = np.random.default_rng().integers(-4, 5, (4, 6)).astype("int32")
    (got,) = run_te(op(x, axis=1), {x: a}, target)
    check(got, ref(a, axis=1).astype("int32"), "int32")


def test_reduce_float16(target: str) -> None:
    x = te.placeholder((2, 9), dtype="float16", name="x")
    a = np.random.default_rng().uniform(-1, 1, (2, 9)).astype("float16")
    got = run_te([ops.sum(x, axis=1), ops.mean(x, axis=1), ops.max(x, axis=0)], {x: a}, target)
    for g, w in zip(got, [a.astype(np.float64).sum(1), a.astype(np.float64).mean(1),
                          a.max(0)]):
        check(g, w, "float16", rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op,ref", [(ops.argmax, np.argmax), (ops.argmin, np.argmin)])
@pytest.mark.parametrize("axis,keepdims", [(0, True), (-1, False), (1, False)])
def test_arg_reduce(op, ref, axis: int, keepdims: bool, target: str) -> None:  # noqa: ANN001
    rng = np.random.default_rng()
    x = te.placeholder((3, 4, 5), dtype="int32", name="x")
    a = rng.integers(-3, 3, (3, 4, 5)).astype("int32")  # many ties: first occurrence wins
    out = op(x, axis=axis, keepdims=keepdims)
    assert out.dtype == "int64"
    got_first, got_last = run_te([out, op(x, axis=axis, keepdims=keepdims,
                                          select_last_index=True)], {x: a}, target)
    want = ref(a, axis=axis)
    flipped = a.shape[axis] - 1 - ref(np.flip(a, axis=axis), axis=axis)
    if keepdims:
        want, flipped = np.expand_dims(want, axis), np.expand_dims(flipped, axis)
    check(got_first, want.astype("int64"), "int64")
    check(got_last, flipped.astype("int64"), "int64")


def test_reduce_tag_and_names() -> None:
    x = te.placeholder((2, 3), name="x")
    s = ops.sum(x, axis=1)
    assert s.op.tag == "reduce" and s.op.name == "T_sum"
    m = ops.mean(x)
    assert m.shape == () and m.op.name == "T_mean"


@pytest.mark.parametrize("build,words", [
    (lambda: ops.sum(te.placeholder((2, 3)), axis=2), ["sum", "axis 2", "2-d"]),
    (lambda: ops.max(te.placeholder((2, 3)), axis=-3), ["max", "-3"]),
    (lambda: ops.sum(te.placeholder((2, 3)), axis=(1, -1)), ["sum", "repeated", "(1, -1)"]),
    (lambda: ops.mean(te.placeholder((2, 3), dtype="int32")), ["mean", "int32"]),
    (lambda: ops.sum(te.placeholder((2, 3), dtype="bool", name="flag")), ["sum", "bool",
                                                                          "flag"]),
    (lambda: ops.argmax(te.placeholder((2, 3)), axis=(0, 1)), ["argmax", "axis"]),
    (lambda: ops.sum(te.placeholder((2, 3)), axis=1.0), ["sum", "1.0"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
