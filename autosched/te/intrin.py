"""Math intrinsics, selection, casts and integer division with explicit semantics."""

from __future__ import annotations

import functools
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te.expr import Call, Const, Expr, as_expr, binary, cast, const, logical, select
from autosched.te.opcodes import Op

# Unary float intrinsics a backend must provide (name -> numpy reference, used by evaluators).
FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "floor", "ceil", "round",
               "sin", "cos", "log2", "exp2", "log1p", "expm1")


def _float_call(name: str, x: Any) -> Expr:
    e = as_expr(x)
    if not dt.is_float(e.dtype):
        raise TEError(f"{name} needs a float operand, got {e.dtype} ({e}); use te.cast first")
    return Call(name, (e,), e.dtype)


def _make(name: str):
    def fn(x: Any) -> Expr:
        return _float_call(name, x)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} of a float expression."
    return fn


exp = _make("exp")
log = _make("log")
sqrt = _make("sqrt")
rsqrt = _make("rsqrt")
tanh = _make("tanh")
erf = _make("erf")
sigmoid = _make("sigmoid")
floor = _make("floor")
ceil = _make("ceil")
round = _make("round")  # noqa: A001  (rounds half to even, as numpy.round)
sin = _make("sin")
cos = _make("cos")
log2 = _make("log2")
exp2 = _make("exp2")
log1p = _make("log1p")
expm1 = _make("expm1")


def abs(x: Any) -> Expr:  # noqa: A001
    e = as_expr(x)
    if e.dtype == "bool":
        raise TEError(f"abs of a bool ({e})")
    if isinstance(e, Const):
        return const(-e.value if e.value < 0 else e.value, e.dtype)
    return Call("abs", (e,), e.dtype)


def pow(a: Any, b: Any) -> Expr:  # noqa: A001
    return binary(Op.POW, a, b)


def min(a: Any, b: Any) -> Expr:  # noqa: A001
    return binary(Op.MIN, a, b)


def max(a: Any, b: Any) -> Expr:  # noqa: A001
    return binary(Op.MAX, a, b)


def floordiv(a: Any, b: Any) -> Expr:
    """Division rounding toward negative infinity (Python's ``//``): floordiv(-7, 2) == -4."""
    return binary(Op.FLOORDIV, a, b)


def floormod(a: Any, b: Any) -> Expr:
    """Remainder with the sign of the divisor (Python's ``%``): floormod(-7, 2) == 1."""
    return binary(Op.FLOORMOD, a, b)


def truncdiv(a: Any, b: Any) -> Expr:
    """Division rounding toward zero (C's ``/``): truncdiv(-7, 2) == -3."""
    return binary(Op.TRUNCDIV, a, b)


def truncmod(a: Any, b: Any) -> Expr:
    """Remainder with the sign of the dividend (C's ``%``): truncmod(-7, 2) == -1."""
    return binary(Op.TRUNCMOD, a, b)


def if_then_else(cond: Any, true_value: Any, false_value: Any) -> Expr:
    """``true_value`` where ``cond`` holds, else ``false_value``; only the taken side is read."""
    return select(cond, true_value, false_value)


def all(*conds: Any) -> Expr:  # noqa: A001
    """Logical and of bool expressions (``te.all()`` is True)."""
    true: Expr = const(True)
    return functools.reduce(lambda a, b: logical(Op.AND, a, b), conds, true)


def any(*conds: Any) -> Expr:  # noqa: A001
    """Logical or of bool expressions (``te.any()`` is False)."""
    false: Expr = const(False)
    return functools.reduce(lambda a, b: logical(Op.OR, a, b), conds, false)


__all__ = [
    "abs", "all", "any", "cast", "ceil", "cos", "erf", "exp", "exp2", "expm1", "floor",
    "floordiv", "floormod", "if_then_else", "log", "log1p", "log2", "max", "min", "pow",
    "round", "rsqrt", "select", "sigmoid", "sin", "sqrt", "tanh", "truncdiv", "truncmod",
]
