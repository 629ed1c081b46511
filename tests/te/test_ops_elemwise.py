"""Unary elementwise operators against numpy on fresh random inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from tests.support.helpers import check, run_te

_erf = np.vectorize(math.erf)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


FLOAT_CASES = {
    "exp": (ops.exp, np.exp),
    "log": (ops.log, lambda x: np.log(np.abs(x) + 0.1)),
    "sqrt": (ops.sqrt, lambda x: np.sqrt(np.abs(x) + 0.1)),
    "rsqrt": (ops.rsqrt, lambda x: 1 / np.sqrt(np.abs(x) + 0.1)),
    "tanh": (ops.tanh, np.tanh),
    "sigmoid": (ops.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "erf": (ops.erf, _erf),
    "floor": (ops.floor, np.floor),
    "ceil": (ops.ceil, np.ceil),
    "round": (ops.round, np.round),
    "sin": (ops.sin, np.sin),
    "cos": (ops.cos, np.cos),
    "log1p": (ops.log1p, lambda x: np.log1p(np.abs(x))),
    "expm1": (ops.expm1, np.expm1),
    "reciprocal": (ops.reciprocal, lambda x: 1 / (np.abs(x) + 0.5)),
    "negative": (ops.negative, np.negative),
    "abs": (ops.abs, np.abs),
    "square": (ops.square, np.square),
    "sign": (ops.sign, np.sign),
    "relu": (ops.relu, lambda x: np.maximum(x, 0)),
    "leaky_relu": (lambda t: ops.leaky_relu(t, 0.3), lambda x: np.where(x > 0, x, 0.3 * x)),
    "elu": (lambda t: ops.elu(t, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
    "selu": (ops.selu, lambda x: 1.0507009873554805 * np.where(
        x > 0, x, 1.6732632423543772 * np.expm1(x))),
    "softplus": (ops.softplus, lambda x: np.log1p(np.exp(x))),
    "softsign": (ops.softsign, lambda x: x / (1 + np.abs(x))),
    "gelu": (ops.gelu, lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2)))),
    "gelu_tanh": (lambda t: ops.gelu(t, approximate="tanh"), _gelu_tanh),
    "hard_sigmoid": (lambda t: ops.hard_sigmoid(t, 0.3, 0.4),
                     lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
    "hard_swish": (ops.hard_swish, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "clip": (lambda t: ops.clip(t, -0.5, 1.25), lambda x: np.clip(x, -0.5, 1.25)),
    "clip_low": (lambda t: ops.clip(t, a_min=0.1), lambda x: np.maximum(x, 0.1)),
}
# inputs of these are made positive (the reference shows the same transform)
POSITIVE = {"log": 0.1, "sqrt": 0.1, "rsqrt": 0.1, "log1p": 0.0, "reciprocal": 0.5}


@pytest.mark.parametrize("name", sorted(FLOAT_CASES))
def test_float_unary(name: str, target: str) -> None:
    rng = np.random.default_rng()
    op, ref = FLOAT_CASES[name]
    x = te.placeholder((3, 1, 7), name="x")
    a = (rng.standard_normal((3, 1, 7)) * 3).astype("float32")
    if name in POSITIVE:
        a = np.abs(a) + POSITIVE[name]
        ref = {"log": np.log, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v),
               "log1p": np.log1p, "reciprocal": lambda v: 1 / v}[name]
    if name == "round":  # keep away from .5 ties, whose rounding numpy and C agree on anyway
        a = np.round(a) + rng.uniform(-0.45, 0.45, a.shape).astype("float32")
    y = op(x)
    assert y.shape == x.shape and y.op.tag == "elemwise"
    (got,) = run_te(y, {x: a}, target)
    check(got, ref(a.astype(np.float64)), "float32")


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "gelu", "hard_swish", "relu", "erf"])
def test_float16(name: str, target: str) -> None:
    op, ref = FLOAT_CASES[name]
    x = te.placeholder((5, 3), dtype="float16", name="x")
    a = np.random.default_rng().uniform(-2, 2, (5, 3)).astype("float16")
    (got,) = run_te(op(x), {x: a}, target)
    check(got, ref(a.astype(np.float64)), "float16")


@pytest.mark.parametrize("dtype", ["int32", "int8", "int64"])
def test_integer_unary(dtype: str, target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((4, 5), dtype=dtype, name="x")
    a = rng.integers(-50, 50, (4, 5)).astype(dtype)
    outs = [ops.relu(x), ops.abs(x), ops.negative(x), ops.clip(x, -7, 9), ops.sign(x),
            ops.clip(x, 3.0, None)]
    got = run_te(outs, {x: a}, target)
    wants = [np.maximum(a, 0), np.abs(a), -a, np.clip(a, -7, 9), np.sign(a), np.maximum(a, 3)]
    for g, w in zip(got, wants):
        check(g, w.astype(dtype), dtype)


def test_prelu(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((2, 3, 4), name="x")
    s = te.placeholder((3,), name="slope")
    a = rng.standard_normal((2, 3, 4)).astype("float32")
    sv = rng.uniform(0.1, 0.9, 3).astype("float32")
    (got,) = run_te(ops.prelu(x, s), {x: a, s: sv}, target)
    check(got, np.where(a > 0, a, a * sv[None, :, None]))


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("int32", "float32"),
                                     ("float32", "float16"), ("int32", "bool"),
                                     ("bool", "float32"), ("int8", "int64")])
def test_cast(src: str, dst: str, target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((3, 5), dtype=src, name="x")
    if src == "bool":
        a = rng.integers(0, 2, (3, 5)).astype(bool)
    elif src.startswith("float"):
        a = (rng.standard_normal((3, 5)) * 20).astype(src)
    else:
        a = rng.integers(-3, 3, (3, 5)).astype(src)
    y = ops.cast(x, dst)
    assert y.dtype == dst
    (got,) = run_te(y, {x: a}, target)
    if dst == "bool":
        want = a != 0
    elif src.startswith("float") and not dst.startswith("float"):
        want = np.trunc(a).astype(dst)
    else:
        want = a.astype(dst)
    check(got, want, dst, **({} if dst != "float16" else dict(rtol=1e-3, atol=1e-2)))


def test_logical_not(target: str) -> None:
    x = te.placeholder((6,), dtype="bool", name="x")
    a = np.random.default_rng().integers(0, 2, 6).astype(bool)
    (got,) = run_te(ops.logical_not(x), {x: a}, target)
    np.testing.assert_array_equal(got, ~a)


def test_symbolic_shape_passes_through() -> None:
    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    y = ops.sigmoid(ops.relu(x))
    assert y.shape[1] == 4 and not isinstance(y.shape[0], int)


@pytest.mark.parametrize("build,words", [
    (lambda: ops.exp(te.placeholder((3,), dtype="int32", name="q")), ["exp", "int32", "q"]),
    (lambda: ops.gelu(te.placeholder((3,)), approximate="fast"), ["gelu", "fast"]),
    (lambda: ops.clip(te.placeholder((3,)), 2.0, 1.0), ["clip", "2.0", "1.0"]),
    (lambda: ops.clip(te.placeholder((3,), dtype="int32"), 0.5, 4), ["clip", "0.5", "int32"]),
    (lambda: ops.relu(te.placeholder((3,), dtype="bool", name="b")), ["relu", "bool"]),
    (lambda: ops.logical_not(te.placeholder((3,))), ["logical_not", "float32"]),
    (lambda: ops.prelu(te.placeholder((2, 3)), te.placeholder((2,))), ["prelu", "(2,)", "(3,)"]),
    (lambda: ops.relu(np.zeros(3)), ["relu", "te.Tensor"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
