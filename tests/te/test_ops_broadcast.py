"""Broadcasting binary operators, comparisons, logical ops and where against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from tests.support.helpers import check, run_te

SHAPES = [((4, 1, 5), (3, 1)), ((1,), (2, 3)), ((2, 3), (2, 3)), ((3, 1, 1), (1, 4, 2)),
          ((5,), ())]

ARITH = {
    "add": (ops.add, np.add),
    "subtract": (ops.subtract, np.subtract),
    "multiply": (ops.multiply, np.multiply),
    "divide": (ops.divide, np.divide),
    "power": (ops.power, np.power),
    "maximum": (ops.maximum, np.maximum),
    "minimum": (ops.minimum, np.minimum),
    "floor_divide": (ops.floor_divide, np.floor_divide),
    "floor_mod": (ops.floor_mod, np.mod),
    "mod": (ops.mod, np.fmod),
}
COMPARE = {
    "equal": (ops.equal, np.equal),
    "not_equal": (ops.not_equal, np.not_equal),
    "less": (ops.less, np.less),
    "less_equal": (ops.less_equal, np.less_equal),
    "greater": (ops.greater, np.greater),
    "greater_equal": (ops.greater_equal, np.greater_equal),
}


def _pair(rng: np.random.Generator, sa: tuple, sb: tuple, dtype: str, name: str):  # noqa: ANN202
    if dtype.startswith("float"):
        a = rng.uniform(-2, 2, sa).astype(dtype)
        b = rng.uniform(-2, 2, sb).astype(dtype)
        if name in ("divide", "floor_divide", "floor_mod", "mod"):
            b = (np.sign(b) + (b == 0)) * (np.abs(b) + 0.25)
        if name == "power":
            a = np.abs(a) + 0.1
    else:
        a = rng.integers(-30, 30, sa).astype(dtype)
        b = rng.integers(-30, 30, sb).astype(dtype)
        b = np.where(b == 0, 7, b).astype(dtype)
    return a, b


@pytest.mark.parametrize("sa,sb", SHAPES)
@pytest.mark.parametrize("name", sorted(ARITH))
def test_arith_float(name: str, sa: tuple, sb: tuple, target: str) -> None:
    rng = np.random.default_rng()
    op, ref = ARITH[name]
    x, y = te.placeholder(sa, name="x"), te.placeholder(sb, name="y")
    a, b = _pair(rng, sa, sb, "float32", name)
    out = op(x, y)
    want = ref(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == want.shape
    assert out.op.tag == ("elemwise" if sa == sb else "broadcast")
    (got,) = run_te(out, {x: a, y: b}, target)
    check(got, want, "float32", rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "maximum", "minimum",
                                  "floor_divide", "floor_mod", "mod"])
def test_arith_int(name: str, target: str) -> None:
    rng = np.random.default_rng()
    op, ref = ARITH[name]
    if name == "divide":  # integers divide toward zero, as C and ONNX
        def ref(p, q):  # noqa: ANN001, ANN202
            return np.trunc(p / q).astype(p.dtype)
    x = te.placeholder((3, 4), dtype="int32", name="x")
    y = te.placeholder((4,), dtype="int32", name="y")
    a, b = _pair(rng, (3, 4), (4,), "int32", name)
    (got,) = run_te(op(x, y), {x: a, y: b}, target)
    check(got, ref(a, b).astype("int32"), "int32")


def test_int32_int64_widen(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((2, 3), dtype="int32", name="x")
    y = te.placeholder((3,), dtype="int64", name="y")
    a = rng.integers(-9, 9, (2, 3)).astype("int32")
    b = rng.integers(2**33, 2**34, (3,)).astype("int64")
    out = ops.add(x, y)
    assert out.dtype == "int64"
    (got,) = run_te(out, {x: a, y: b}, target)
    check(got, a.astype(np.int64) + b, "int64")


def test_float16(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((3, 1), dtype="float16", name="x")
    y = te.placeholder((1, 5), dtype="float16", name="y")
    a, b = (rng.uniform(-2, 2, s).astype("float16") for s in ((3, 1), (1, 5)))
    (got,) = run_te(ops.multiply(ops.add(x, y), 0.5), {x: a, y: b}, target)
    check(got, (a.astype(np.float64) + b) * 0.5, "float16")


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_compare(name: str, target: str) -> None:
    rng = np.random.default_rng()
    op, ref = COMPARE[name]
    x = te.placeholder((2, 1, 4), dtype="int32", name="x")
    y = te.placeholder((3, 1), dtype="int32", name="y")
    a = rng.integers(-3, 3, (2, 1, 4)).astype("int32")
    b = rng.integers(-3, 3, (3, 1)).astype("int32")
    out = op(x, y)
    assert out.dtype == "bool"
    got = run_te([out, op(x, 1)], {x: a, y: b}, target)
    np.testing.assert_array_equal(got[0], ref(a, b))
    np.testing.assert_array_equal(got[1], ref(a, 1))


def test_scalars(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((3, 2), name="x")
    a = rng.standard_normal((3, 2)).astype("float32")
    outs = [ops.add(x, 2), ops.subtract(1.5, x), ops.divide(1.0, ops.add(ops.abs(x), 1.0)),
            ops.maximum(0.25, x), ops.power(ops.abs(x), 2), ops.multiply(x, np.float32(0.5))]
    wants = [a + 2, 1.5 - a, 1 / (np.abs(a) + 1), np.maximum(0.25, a), np.abs(a) ** 2, a * 0.5]
    for g, w in zip(run_te(outs, {x: a}, target), wants):
        check(g, w, "float32")


def test_logical(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((2, 3), dtype="bool", name="x")
    y = te.placeholder((3,), dtype="bool", name="y")
    a = rng.integers(0, 2, (2, 3)).astype(bool)
    b = rng.integers(0, 2, (3,)).astype(bool)
    outs = [ops.logical_and(x, y), ops.logical_or(x, y), ops.logical_xor(x, y),
            ops.logical_and(x, True)]
    wants = [a & b, a | b, a ^ b, a]
    for g, w in zip(run_te(outs, {x: a, y: b}, target), wants):
        np.testing.assert_array_equal(g, w)


def test_where(target: str) -> None:
    rng = np.random.default_rng()
    c = te.placeholder((3, 1), dtype="bool", name="c")
    x = te.placeholder((1, 4), name="x")
    y = te.placeholder((3, 4), name="y")
    cv = rng.integers(0, 2, (3, 1)).astype(bool)
    a = rng.standard_normal((1, 4)).astype("float32")
    b = rng.standard_normal((3, 4)).astype("float32")
    outs = [ops.where(c, x, y), ops.where(c, x, -1.0), ops.where(ops.greater(y, 0.0), y, 0.0)]
    wants = [np.where(cv, a, b), np.where(cv, a, -1.0) * np.ones((3, 4)), np.where(b > 0, b, 0)]
    for g, w in zip(run_te(outs, {c: cv, x: a, y: b}, target), wants):
        check(g, w, "float32")


def test_broadcast_to(target: str) -> None:
    x = te.placeholder((3, 1), name="x")
    a = np.random.default_rng().standard_normal((3, 1)).astype("float32")
    (got,) = run_te(ops.broadcast_to(x, (2, 3, 4)), {x: a}, target)
    check(got, np.broadcast_to(a, (2, 3, 4)))


def test_symbolic_broadcast() -> None:
    n = te.var("n")
    x, y = te.placeholder((n, 1), name="x"), te.placeholder((1, 5), name="y")
    out = ops.add(x, y)
    assert out.shape[1] == 5 and not isinstance(out.shape[0], int)
    with pytest.raises(TEError, match="do not broadcast"):
        ops.add(x, te.placeholder((te.var("m"), 5)))


@pytest.mark.parametrize("build,words", [
    (lambda: ops.add(te.placeholder((2, 3)), te.placeholder((4, 3))),
     ["add", "(2, 3)", "(4, 3)", "broadcast"]),
    (lambda: ops.multiply(te.placeholder((5, 1, 3)), te.placeholder((2, 2))),
     ["multiply", "(5, 1, 3)", "(2, 2)"]),
    (lambda: ops.where(te.placeholder((2,), dtype="bool"), te.placeholder((3,)), 0.0),
     ["where", "(2,)", "(3,)"]),
    (lambda: ops.add(te.placeholder((2,), name="p"), te.placeholder((2,), dtype="float16",
                                                                      name="q")),
     ["add", "float32", "float16", "p", "q"]),
    (lambda: ops.add(te.placeholder((2,), dtype="int32"), 1.5), ["add", "1.5", "int32"]),
    (lambda: ops.add(1, 2), ["add", "tensor"]),
    (lambda: ops.logical_and(te.placeholder((2,)), True), ["logical_and", "bool"]),
    (lambda: ops.where(te.placeholder((2,)), 1.0, 0.0), ["where", "bool"]),
    (lambda: ops.add(te.placeholder((2,), dtype="bool"), te.placeholder((2,), dtype="bool")),
     ["add", "bool"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
