"""Reductions over axes: sum, mean, max, min, prod, argmax, argmin (tag ``reduce``).

``axis`` is None (all axes), an int or a tuple of ints (negative counts from the end);
``keepdims`` keeps reduced axes as size-1 dims. Reducing every axis without keepdims gives a 0-d
tensor, as numpy does. Reductions accumulate in the input dtype.

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((3, 5, 7), name="x")
    s = ops.sum(x, axis=(0, 2), keepdims=True)     # (1, 5, 1)
    m = ops.mean(x, axis=-1)                       # (3, 5)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr, IterVar, cast
from autosched.te.ops import args
from autosched.te.ops.tags import ELEMWISE, REDUCE
from autosched.te.tensor import Tensor, compute, reduce_axis

Axis = None | int | Sequence[int]


def _layout(x: Tensor, axes: tuple[int, ...], keepdims: bool) -> tuple[list[Any], list[IterVar]]:
    """Output shape, and one reduce axis per reduced input axis."""
    shape = [1 if d in axes else s for d, s in enumerate(x.shape) if keepdims or d not in axes]
    rvs = [reduce_axis((0, x.shape[d]), name=f"k{d}") for d in axes]
    return shape, rvs


def _input_index(
    x: Tensor, axes: tuple[int, ...], keepdims: bool, out: Sequence[Expr], rvs: list[IterVar]
) -> tuple[Any, ...]:
    """The input element that output ``out`` and reduce axes ``rvs`` read."""
    it, rit = iter(out), iter(rvs)
    idx: list[Any] = []
    for d in range(x.ndim):
        if d in axes:
            idx.append(next(rit))
            if keepdims:
                next(it)
        else:
            idx.append(next(it))
    return tuple(idx)


def reduce(
    x: Tensor, axis: Axis, keepdims: bool, reducer: R.Reducer, name: str, op: str
) -> Tensor:
    """``reducer`` (te.sum, te.max, a te.comm_reducer ...) of ``x`` over ``axis``."""
    args.tensor(x, op)
    axes = args.axes(axis, x.ndim, op)
    if not axes:  # numpy: reducing over no axis is a copy
        return compute(x.shape, lambda *i: x[i], name=name, tag=ELEMWISE)
    shape, rvs = _layout(x, axes, keepdims)

    def body(*i: Expr) -> Expr:
        return reducer(x[_input_index(x, axes, keepdims, i, rvs)], axis=rvs)

    return compute(tuple(shape), body, name=name, tag=REDUCE)


def _number(x: Tensor, op: str) -> None:
    args.tensor(x, op)
    if x.dtype == "bool":
        raise TEError(f"{op}: cannot reduce a bool tensor {x.name}; cast it first")


def sum(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (compute ``T_sum``)."""
    _number(x, "sum")
    return reduce(x, axis, keepdims, R.sum, "T_sum", "sum")


def prod(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    _number(x, "prod")
    return reduce(x, axis, keepdims, R.prod, "T_prod", "prod")


def max(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    _number(x, "max")
    return reduce(x, axis, keepdims, R.max, "T_max", "max")


def min(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    _number(x, "min")
    return reduce(x, axis, keepdims, R.min, "T_min", "min")


def count(x: Tensor, axis: Axis) -> int:
    """How many elements each output of a reduction over ``axis`` combines (static shapes)."""
    shape = args.static_shape(x, "mean")
    return args.prod([shape[d] for d in args.axes(axis, x.ndim, "mean")])


def mean(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean of a float tensor: ``T_sum`` then ``T_mean`` = sum * (1 / count)."""
    args.tensor(x, "mean")
    args.float_dtype(x, "mean")
    total = reduce(x, axis, keepdims, R.sum, "T_sum", "mean")
    scale = 1.0 / count(x, axis)
    return compute(total.shape, lambda *i: total[i] * scale, name="T_mean", tag=ELEMWISE)


def _arg_reduce(
    x: Tensor, axis: int, keepdims: bool, select_last_index: bool, dtype: str, op: str
) -> Tensor:
    _number(x, op)
    if not dt.is_int(dtype):
        raise TEError(f"{op}: dtype must be an integer type, got {dtype!r}")
    ax = args.axis(axis, x.ndim, op)
    extreme = reduce(x, ax, True, R.max if op == "argmax" else R.min, f"T_{op}_value", op)
    shape, rvs = _layout(x, (ax,), keepdims)
    n = x.shape[ax]

    # the first (or last) position that holds the extreme value; NaNs are not special-cased
    def body(*i: Expr) -> Expr:
        src = _input_index(x, (ax,), keepdims, i, rvs)
        held = extreme[tuple(0 if d == ax else s for d, s in enumerate(src))]
        k = rvs[0].var
        if select_last_index:
            return R.max(I.if_then_else(x[src] == held, k, -1), axis=rvs)
        return R.min(I.if_then_else(x[src] == held, k, n), axis=rvs)

    pos = compute(tuple(shape), body, name=f"T_{op}", tag=REDUCE)
    if dtype == pos.dtype:
        return pos
    return compute(pos.shape, lambda *i: cast(dtype, pos[i]), name=f"T_{op}_cast", tag=ELEMWISE)


def argmax(
    x: Tensor, axis: int = 0, keepdims: bool = True, select_last_index: bool = False,
    dtype: str = "int64",
) -> Tensor:
    """Index of the largest element along ``axis`` (ONNX ArgMax: first occurrence unless
    ``select_last_index``; int64 by default)."""
    return _arg_reduce(x, axis, keepdims, select_last_index, dtype, "argmax")


def argmin(
    x: Tensor, axis: int = 0, keepdims: bool = True, select_last_index: bool = False,
    dtype: str = "int64",
) -> Tensor:
    """Index of the smallest element along ``axis`` (ONNX ArgMin)."""
    return _arg_reduce(x, axis, keepdims, select_last_index, dtype, "argmin")
