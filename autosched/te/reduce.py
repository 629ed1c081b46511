"""Reductions: sum, max, min, prod and user-defined commutative reducers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te.expr import CommReducer, Const, Expr, IterVar, Reduce, Var, as_expr, binary, const
from autosched.te.opcodes import Op


class Reducer:
    """A callable reduction: ``reducer(expr, axis=k, where=cond, init=value)``."""

    def __init__(self, fcombine: Callable[[Expr, Expr], Any], fidentity: Callable[[str], Any], name: str):
        self.fcombine = fcombine
        self.fidentity = fidentity
        self.name = name

    def combiner(self, dtype: str) -> CommReducer:
        lhs, rhs = Var("x", dtype), Var("y", dtype)
        result = as_expr(self.fcombine(lhs, rhs), like=dtype)
        identity = as_expr(self.fidentity(dtype), like=dtype)
        if result.dtype != dtype or identity.dtype != dtype:
            raise TEError(
                f"reducer {self.name}: combine gives {result.dtype} and identity {identity.dtype} "
                f"for {dtype} inputs"
            )
        return CommReducer(self.name, lhs, rhs, result, identity)

    def __call__(
        self,
        expr: Any,
        axis: IterVar | Sequence[IterVar],
        where: Any = None,
        init: Any = None,
    ) -> Reduce:
        if not isinstance(axis, (IterVar, list, tuple)):
            # te.max(a, b): the elementwise combine, as in TVM
            a = as_expr(expr)
            b = as_expr(axis, like=a.dtype)
            return self.fcombine(*_pair(a, b))
        source = as_expr(expr)
        axes = (axis,) if isinstance(axis, IterVar) else tuple(axis)
        if not axes:
            raise TEError(f"{self.name} needs at least one reduce axis")
        for a in axes:
            if not isinstance(a, IterVar) or a.kind != "reduce":
                raise TEError(f"{self.name}: axis {a} is not a te.reduce_axis")
        cond = None if where is None else as_expr(where, like="bool")
        if cond is not None and cond.dtype != "bool":
            raise TEError(f"{self.name}: where= must be a bool expression, got {cond.dtype}")
        init_e = None if init is None else as_expr(init, like=source.dtype)
        return Reduce(self.combiner(source.dtype), source, axes, cond, init_e)


def _pair(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    if isinstance(a, Const) and not isinstance(b, Const):
        a = as_expr(a.value, like=b.dtype)
    return a, b


def comm_reducer(
    fcombine: Callable[[Expr, Expr], Any], fidentity: Callable[[str], Any], name: str = "reduce"
) -> Reducer:
    """A custom commutative reducer, e.g.
    ``te.comm_reducer(lambda x, y: x * y, lambda t: te.const(1, t), name="prod")``."""
    return Reducer(fcombine, fidentity, name)


sum = comm_reducer(lambda x, y: binary(Op.ADD, x, y), lambda t: const(0, t), "sum")  # noqa: A001
max = comm_reducer(lambda x, y: binary(Op.MAX, x, y), lambda t: const(dt.min_value(t), t), "max")  # noqa: A001
min = comm_reducer(lambda x, y: binary(Op.MIN, x, y), lambda t: const(dt.max_value(t), t), "min")  # noqa: A001
prod = comm_reducer(lambda x, y: binary(Op.MUL, x, y), lambda t: const(1, t), "prod")
