"""Unary elementwise operators: out[i] = f(x[i]), same shape, tag ``elemwise``.

Float operators (exp, gelu, sigmoid, ...) need a float tensor (float16/32/64) and compute in its
dtype; relu, abs, negative, clip and sign also take integers.

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((4, 7), name="x")
    y = ops.gelu(ops.add(x, 1.0), approximate="tanh")
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te.expr import Expr, Not
from autosched.te.expr import cast as cast_expr
from autosched.te.ops import args
from autosched.te.ops.tags import BROADCAST, ELEMWISE
from autosched.te.tensor import Tensor, compute


def unary(x: Tensor, fn: Callable[[Expr], Any], name: str, tag: str = ELEMWISE) -> Tensor:
    """The elementwise map ``fn`` over ``x``: ``unary(x, lambda v: v * v, "T_square")``."""
    args.tensor(x, name)
    return compute(x.shape, lambda *i: fn(x[i]), name=name, tag=tag)


def _float_unary(name: str, fn: Callable[[Expr], Expr]) -> Callable[[Tensor], Tensor]:
    def op(x: Tensor) -> Tensor:
        args.tensor(x, name)
        args.float_dtype(x, name)
        return unary(x, fn, f"T_{name}")

    op.__name__ = name
    op.__doc__ = f"Elementwise {name} of a float tensor (compute ``T_{name}``)."
    return op


exp = _float_unary("exp", I.exp)
log = _float_unary("log", I.log)
sqrt = _float_unary("sqrt", I.sqrt)
rsqrt = _float_unary("rsqrt", I.rsqrt)
tanh = _float_unary("tanh", I.tanh)
sigmoid = _float_unary("sigmoid", I.sigmoid)
erf = _float_unary("erf", I.erf)
floor = _float_unary("floor", I.floor)
ceil = _float_unary("ceil", I.ceil)
round = _float_unary("round", I.round)  # noqa: A001  (half to even, as numpy.round)
sin = _float_unary("sin", I.sin)
cos = _float_unary("cos", I.cos)
log2 = _float_unary("log2", I.log2)
exp2 = _float_unary("exp2", I.exp2)
log1p = _float_unary("log1p", I.log1p)
expm1 = _float_unary("expm1", I.expm1)
reciprocal = _float_unary("reciprocal", lambda v: 1.0 / v)


def _number(x: Tensor, op: str) -> None:
    args.tensor(x, op)
    if x.dtype == "bool":
        raise TEError(f"{op}: needs a number tensor, got bool ({x.name})")


def identity(x: Tensor) -> Tensor:
    """A copy of ``x`` (compute ``T_identity``)."""
    return unary(x, lambda v: v, "T_identity")


def abs(x: Tensor) -> Tensor:  # noqa: A001
    """|x| for float or integer tensors."""
    _number(x, "abs")
    return unary(x, I.abs, "T_abs")


def negative(x: Tensor) -> Tensor:
    """-x for float or signed integer tensors."""
    _number(x, "negative")
    return unary(x, lambda v: -v, "T_negative")


def square(x: Tensor) -> Tensor:
    _number(x, "square")
    return unary(x, lambda v: v * v, "T_square")


def sign(x: Tensor) -> Tensor:
    """-1, 0 or 1 in the dtype of ``x``; NaN stays NaN (as in numpy and onnxruntime)."""
    _number(x, "sign")
    one, zero = args.scalar(1, x.dtype, "sign"), args.scalar(0, x.dtype, "sign")
    if dt.is_signed(x.dtype):
        minus = args.scalar(-1, x.dtype, "sign")

        def rest(v: Expr) -> Expr:  # v is 0 or NaN: only NaN differs from itself
            return I.if_then_else(v == v, zero, v) if dt.is_float(x.dtype) else zero

        return unary(x, lambda v: I.if_then_else(v > 0, one, I.if_then_else(v < 0, minus, rest(v))),
                     "T_sign")
    return unary(x, lambda v: I.if_then_else(v > 0, one, zero), "T_sign")


def relu(x: Tensor) -> Tensor:
    """max(x, 0) for float or integer tensors (compute ``T_relu``)."""
    _number(x, "relu")
    return unary(x, lambda v: I.max(v, args.scalar(0, x.dtype, "relu")), "T_relu")


def leaky_relu(x: Tensor, alpha: float = 0.01) -> Tensor:
    """x where x > 0, else alpha * x (ONNX LeakyRelu; default alpha 0.01)."""
    args.tensor(x, "leaky_relu")
    args.float_dtype(x, "leaky_relu")
    return unary(x, lambda v: I.if_then_else(v > 0, v, v * float(alpha)), "T_leaky_relu")


def prelu(x: Tensor, slope: Tensor, axis: int = 1) -> Tensor:
    """x where x > 0, else slope[c] * x with c the index along ``axis``; ``slope`` is 1-d of
    length x.shape[axis] (TVM prelu). For numpy-broadcast slopes use ops.where."""
    args.tensor(x, "prelu")
    args.tensor(slope, "prelu", "slope")
    args.float_dtype(x, "prelu")
    args.same_dtype([x, slope], "prelu")
    ax = args.axis(axis, x.ndim, "prelu")
    if slope.ndim != 1 or not args.same_dim(slope.shape[0], x.shape[ax]):
        raise TEError(
            f"prelu: slope must have shape ({x.shape[ax]},) to match axis {axis} of {x.shape}, "
            f"got {slope.shape}"
        )

    def body(*i: Expr) -> Expr:
        v = x[i]
        return I.if_then_else(v > 0, v, v * slope[i[ax]])

    return compute(x.shape, body, name="T_prelu", tag=BROADCAST)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """x where x > 0, else alpha * (exp(x) - 1) (ONNX Elu)."""
    args.tensor(x, "elu")
    args.float_dtype(x, "elu")
    return unary(x, lambda v: I.if_then_else(v > 0, v, float(alpha) * I.expm1(v)), "T_elu")


def selu(x: Tensor, alpha: float = 1.6732632423543772, gamma: float = 1.0507009873554805) -> Tensor:
    """gamma * (x where x > 0, else alpha * (exp(x) - 1)) (ONNX Selu defaults)."""
    args.tensor(x, "selu")
    args.float_dtype(x, "selu")
    a, g = float(alpha), float(gamma)
    return unary(x, lambda v: I.if_then_else(v > 0, g * v, (g * a) * I.expm1(v)), "T_selu")


def softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)) so large x cannot overflow."""
    args.tensor(x, "softplus")
    args.float_dtype(x, "softplus")
    return unary(x, lambda v: I.max(v, 0.0) + I.log1p(I.exp(-I.abs(v))), "T_softplus")


def softsign(x: Tensor) -> Tensor:
    """x / (1 + |x|)."""
    args.tensor(x, "softsign")
    args.float_dtype(x, "softsign")
    return unary(x, lambda v: v / (1.0 + I.abs(v)), "T_softsign")


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU. ``approximate="none"``: 0.5 x (1 + erf(x / sqrt 2)); ``"tanh"``:
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (ONNX Gelu, PyTorch)."""
    args.tensor(x, "gelu")
    args.float_dtype(x, "gelu")
    if approximate == "none":
        inv_sqrt2 = 1.0 / math.sqrt(2.0)
        return unary(x, lambda v: 0.5 * v * (1.0 + I.erf(v * inv_sqrt2)), "T_gelu")
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return unary(
            x, lambda v: 0.5 * v * (1.0 + I.tanh(c * (v + 0.044715 * (v * v * v)))), "T_gelu"
        )
    raise TEError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def hard_sigmoid(x: Tensor, alpha: float = 0.2, beta: float = 0.5) -> Tensor:
    """max(0, min(1, alpha * x + beta)) (ONNX HardSigmoid defaults)."""
    args.tensor(x, "hard_sigmoid")
    args.float_dtype(x, "hard_sigmoid")
    a, b = float(alpha), float(beta)
    return unary(x, lambda v: I.max(I.min(a * v + b, 1.0), 0.0), "T_hard_sigmoid")


def hard_swish(x: Tensor) -> Tensor:
    """x * max(0, min(1, x / 6 + 1 / 2)) (ONNX HardSwish)."""
    args.tensor(x, "hard_swish")
    args.float_dtype(x, "hard_swish")
    return unary(x, lambda v: v * I.max(I.min(v * (1.0 / 6.0) + 0.5, 1.0), 0.0), "T_hard_swish")


def clip(x: Tensor, a_min: float | int | None = None, a_max: float | int | None = None) -> Tensor:
    """min(max(x, a_min), a_max); None leaves that side open. Integer tensors need integral
    bounds."""
    _number(x, "clip")
    if a_min is not None and a_max is not None and a_min > a_max:
        raise TEError(f"clip: a_min {a_min} is greater than a_max {a_max}")
    lo = None if a_min is None else args.scalar(a_min, x.dtype, "clip")
    hi = None if a_max is None else args.scalar(a_max, x.dtype, "clip")

    def fn(v: Expr) -> Expr:
        if lo is not None:
            v = I.max(v, lo)
        if hi is not None:
            v = I.min(v, hi)
        return v

    return unary(x, fn, "T_clip")


def logical_not(x: Tensor) -> Tensor:
    """not x for a bool tensor."""
    args.tensor(x, "logical_not")
    if x.dtype != "bool":
        raise TEError(f"logical_not: needs a bool tensor, got {x.dtype} ({x.name})")
    return unary(x, Not, "T_logical_not")


def cast(x: Tensor, dtype: str) -> Tensor:
    """``x`` converted to ``dtype`` with C semantics: float to int truncates toward zero (out of
    range is undefined), anything to bool is ``!= 0``."""
    args.tensor(x, "cast")
    dt.check(dtype)
    if dtype == "bool" and x.dtype != "bool":
        zero = args.scalar(0, x.dtype, "cast")
        return unary(x, lambda v: v != zero, "T_cast")
    return unary(x, lambda v: cast_expr(dtype, v), "T_cast")
