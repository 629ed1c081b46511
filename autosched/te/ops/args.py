"""Argument checking and normalisation shared by the operators.

Every check raises TEError naming the operator and the values it was given, so a model that
fails to build says which node broke which rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te.expr import Const, Expr, as_expr, const, structural_equal
from autosched.te.tensor import Tensor

Dim = int | Expr


def tensor(x: Any, op: str, what: str = "input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TEError(f"{op}: {what} must be a te.Tensor, got {type(x).__name__} ({x!r})")
    return x


def static_shape(x: Tensor, op: str) -> tuple[int, ...]:
    """The shape as ints; symbolic dims are refused by operators that need to know sizes."""
    dims = []
    for n, s in enumerate(x.shape):
        if not isinstance(s, int):
            raise TEError(
                f"{op}: dim {n} of {x.name} {x.shape} is symbolic ({s}); this operator needs "
                "static shapes (bind the size first)"
            )
        dims.append(s)
    return tuple(dims)


def ndim_is(x: Tensor, n: int, op: str, what: str) -> None:
    if x.ndim != n:
        raise TEError(f"{op}: {what} {x.name} must be {n}-d, got shape {x.shape}")


def axis(a: Any, ndim: int, op: str, what: str = "axis", end_ok: bool = False) -> int:
    """``a`` in [-ndim, ndim) (or [-ndim, ndim] with ``end_ok``), made non-negative."""
    hi = ndim + 1 if end_ok else ndim
    if isinstance(a, bool) or not isinstance(a, int):
        raise TEError(f"{op}: {what} must be an int, got {a!r}")
    if not -ndim <= a < hi:
        raise TEError(f"{op}: {what} {a} is out of range [{-ndim}, {hi - 1}] for a {ndim}-d tensor")
    return a + ndim if a < 0 else a


def axes(a: None | int | Sequence[int], ndim: int, op: str) -> tuple[int, ...]:
    """None means all axes; an int or a sequence of distinct ints, sorted and non-negative."""
    if a is None:
        return tuple(range(ndim))
    items = list(a) if isinstance(a, (tuple, list)) else [a]
    out = [axis(v, ndim, op) for v in items]
    if len(set(out)) != len(out):
        raise TEError(f"{op}: repeated axis in {a!r} for a {ndim}-d tensor")
    return tuple(sorted(out))


def int_tuple(value: Any, n: int, op: str, what: str, minimum: int = 1) -> tuple[int, ...]:
    """An int (repeated ``n`` times) or a sequence of ``n`` ints, each >= ``minimum``."""
    items = [value] * n if isinstance(value, int) else list(value)
    if len(items) != n or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise TEError(f"{op}: {what} must be an int or {n} ints, got {value!r}")
    if any(v < minimum for v in items):
        raise TEError(f"{op}: {what} must be >= {minimum}, got {value!r}")
    return tuple(items)


def padding2d(padding: Any, op: str) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, a pair (pad_h, pad_w) or a 4-tuple
    (top, left, bottom, right) as ONNX ``pads`` orders them."""
    if isinstance(padding, int) and not isinstance(padding, bool):
        items = [padding] * 4
    else:
        items = list(padding) if isinstance(padding, (tuple, list)) else []
        if len(items) == 2:
            items = items * 2
    if len(items) != 4 or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise TEError(
            f"{op}: padding must be an int, (pad_h, pad_w) or (top, left, bottom, right), "
            f"got {padding!r}"
        )
    if any(v < 0 for v in items):
        raise TEError(f"{op}: padding must be non-negative, got {padding!r}")
    top, left, bottom, right = items
    return top, left, bottom, right


def scalar(value: Any, dtype: str, op: str) -> Const:
    """A Python scalar as a constant of ``dtype``: ints fit any number type, floats need a float
    dtype (or an integral value for an int dtype), bools only bool."""
    if isinstance(value, Const):
        value = value.value
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # a numpy scalar
        value = value.item()
    if dtype == "bool":
        if not isinstance(value, bool):
            raise TEError(f"{op}: scalar {value!r} cannot combine with a bool tensor")
        return const(value, dtype)
    if isinstance(value, bool):
        raise TEError(f"{op}: bool scalar {value!r} cannot combine with a {dtype} tensor")
    if isinstance(value, float) and not dt.is_float(dtype) and not value.is_integer():
        raise TEError(
            f"{op}: float scalar {value!r} cannot combine with a {dtype} tensor without a cast"
        )
    if not isinstance(value, (int, float)):
        raise TEError(f"{op}: expected a tensor or a Python scalar, got {type(value).__name__}")
    return const(value, dtype)


def same_dim(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return structural_equal(as_expr(a), as_expr(b))


def is_one(d: Dim) -> bool:
    return isinstance(d, int) and d == 1


def float_dtype(x: Tensor, op: str) -> None:
    if not dt.is_float(x.dtype):
        raise TEError(f"{op}: needs a float tensor, got {x.dtype} ({x.name}); use ops.cast first")


def same_dtype(tensors: Sequence[Tensor], op: str) -> str:
    dtypes = sorted({t.dtype for t in tensors})
    if len(dtypes) != 1:
        names = ", ".join(f"{t.name}:{t.dtype}" for t in tensors)
        raise TEError(f"{op}: inputs must share one dtype, got {names}; use ops.cast first")
    return dtypes[0]


def prod(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out
