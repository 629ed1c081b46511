"""dense, matmul and batch_matmul against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from tests.support.helpers import check, run_te


def _rand(shape: tuple, dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng()
    if dtype.startswith("float"):
        return rng.uniform(-1, 1, shape).astype(dtype)
    return rng.integers(-100, 100, shape).astype(dtype)


@pytest.mark.parametrize("with_bias", [False, True])
def test_dense(with_bias: bool, target: str) -> None:
    x, w, b = te.placeholder((5, 13), name="x"), te.placeholder((7, 13), name="w"), \
        te.placeholder((7,), name="b")
    a, wv, bv = _rand((5, 13)), _rand((7, 13)), _rand((7,))
    out = ops.dense(x, w, b if with_bias else None)
    assert out.shape == (5, 7)
    inputs = {x: a, w: wv, **({b: bv} if with_bias else {})}
    (got,) = run_te(out, inputs, target)
    want = a.astype(np.float64) @ wv.T.astype(np.float64) + (bv if with_bias else 0)
    check(got, want)
    if not with_bias:
        assert out.op.tag == "dense" and out.op.name == "T_dense"


def test_dense_int8_accumulates_in_int32(target: str) -> None:
    x, w = te.placeholder((3, 17), dtype="int8", name="x"), te.placeholder((4, 17), dtype="int8",
                                                                            name="w")
    a, wv = _rand((3, 17), "int8"), _rand((4, 17), "int8")
    out = ops.dense(x, w, out_dtype="int32")
    (got,) = run_te(out, {x: a, w: wv}, target)
    check(got, a.astype(np.int32) @ wv.T.astype(np.int32), "int32")


@pytest.mark.parametrize("sa,sb,ta,tb", [
    ((4, 6), (6, 3), False, False),
    ((6, 4), (6, 3), True, False),
    ((4, 6), (3, 6), False, True),
    ((2, 1, 3, 5), (4, 5, 2), False, False),
    ((1, 5, 3), (3, 5, 2), True, False),
    ((5,), (5, 3), False, False),
    ((2, 4, 5), (5,), False, False),
    ((5,), (5,), False, False),
])
def test_matmul(sa: tuple, sb: tuple, ta: bool, tb: bool, target: str) -> None:
    x, y = te.placeholder(sa, name="x"), te.placeholder(sb, name="y")
    a, b = _rand(sa), _rand(sb)
    out = ops.matmul(x, y, transpose_a=ta, transpose_b=tb)
    a64 = np.swapaxes(a, -1, -2) if ta else a
    b64 = np.swapaxes(b, -1, -2) if tb else b
    want = np.matmul(a64.astype(np.float64), b64.astype(np.float64))
    assert tuple(out.shape) == want.shape
    (got,) = run_te(out, {x: a, y: b}, target)
    check(got, want)


def test_matmul_bias_float16(target: str) -> None:
    x, y = te.placeholder((3, 8), dtype="float16", name="x"), \
        te.placeholder((8, 5), dtype="float16", name="y")
    b = te.placeholder((5,), dtype="float16", name="b")
    a, yv, bv = _rand((3, 8), "float16"), _rand((8, 5), "float16"), _rand((5,), "float16")
    (got,) = run_te(ops.matmul(x, y, bias=b), {x: a, y: yv, b: bv}, target)
    check(got, a.astype(np.float64) @ yv + bv, "float16", rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("sa,sb,tb", [((3, 4, 5), (3, 5, 2), False), ((1, 4, 5), (3, 2, 5), True),
                                      ((2, 1, 5), (1, 5, 3), False)])
def test_batch_matmul(sa: tuple, sb: tuple, tb: bool, target: str) -> None:
    x, y = te.placeholder(sa, name="x"), te.placeholder(sb, name="y")
    a, b = _rand(sa), _rand(sb)
    out = ops.batch_matmul(x, y, transpose_b=tb)
    want = np.matmul(a.astype(np.float64), np.swapaxes(b, 1, 2) if tb else b)
    assert tuple(out.shape) == want.shape and out.op.tag == "batch_matmul"
    (got,) = run_te(out, {x: a, y: b}, target)
    check(got, want)


@pytest.mark.parametrize("build,words", [
    (lambda: ops.dense(te.placeholder((3, 4), name="x"), te.placeholder((5, 6), name="w")),
     ["dense", "K=4", "K=6", "(3, 4)", "(5, 6)"]),
    (lambda: ops.dense(te.placeholder((2, 3, 4)), te.placeholder((5, 4))), ["dense", "2-d"]),
    (lambda: ops.matmul(te.placeholder((3, 4)), te.placeholder((3, 4))), ["matmul", "K="]),
    (lambda: ops.matmul(te.placeholder((2, 3, 4)), te.placeholder((3, 4, 2))),
     ["matmul", "(2,)", "(3,)"]),
    (lambda: ops.batch_matmul(te.placeholder((2, 3, 4)), te.placeholder((3, 4, 5))),
     ["batch_matmul", "(2,)", "(3,)"]),
    (lambda: ops.batch_matmul(te.placeholder((3, 4)), te.placeholder((4, 5))),
     ["batch_matmul", "3-d"]),
    (lambda: ops.dense(te.placeholder((3, 4)), te.placeholder((5, 4)), te.placeholder((3, 1, 5))),
     ["dense", "bias", "(3, 1, 5)"]),
    (lambda: ops.dense(te.placeholder((3, 4)), te.placeholder((5, 4), dtype="float16")),
     ["dense", "float16"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
