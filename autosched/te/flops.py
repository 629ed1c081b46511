"""Floating-point operation counts of a DAG (for GFLOPS reports and the task scheduler)."""

from __future__ import annotations

from collections.abc import Sequence

from autosched.te import expr as E
from autosched.te.tensor import ComputeOp, Operation
from autosched.te.visit import post_order


def _extent(iv: E.IterVar) -> int:
    return int(iv.dom.extent.value) if isinstance(iv.dom.extent, E.Const) else 1


def _count(e: E.Expr) -> int:
    """Floating-point arithmetic of one evaluation. Index arithmetic (integers), comparisons
    and selects (padding: data movement) are not counted, as FLOP counts conventionally go."""
    n = 0
    for node in post_order(e):
        if isinstance(node, (E.Binary, E.Call)) and node.dtype.startswith(
                ("float", "bfloat")):
            n += 1
    return n


def flop_count(ops: Sequence[Operation]) -> int:
    """Arithmetic operations per output element times the iteration space, summed over ops;
    a reduction counts its source plus one combine per element."""
    total = 0
    for op in ops:
        if not isinstance(op, ComputeOp):
            continue
        points = 1
        for a in op.axis + op.reduce_axis:
            points *= _extent(a)
        body = op.body
        per = _count(body.source) + 1 if isinstance(body, E.Reduce) else _count(body)
        total += points * per
    return total
