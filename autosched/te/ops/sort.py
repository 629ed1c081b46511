"""Selection by rank: topk (ONNX TopK).

Without a sort primitive, an element's place in the sorted order is its rank: how many
elements come before it (larger ones for ``largest``, and equal ones at lower positions, so
ties keep index order as ONNX requires). The k-th output is the element whose rank is k. Both
steps are reductions over the axis (n^2 work per row), fine for the few hundred to few
thousand candidates that detection heads rank.

Example::

    from autosched import te
    from autosched.te.ops.sort import topk
    x = te.placeholder((2, 100), name="x")
    values, indices = topk(x, 5, axis=-1)           # (2, 5) each, indices int64
"""

from __future__ import annotations

from autosched.errors import TEError
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr, cast
from autosched.te.ops import args
from autosched.te.ops.tags import INJECTIVE, REDUCE
from autosched.te.tensor import Tensor, compute, reduce_axis


def rank(x: Tensor, axis: int, largest: bool = True) -> Tensor:
    """int32 place of each element in the order along ``axis`` (descending when ``largest``),
    ties broken by position."""
    args.tensor(x, "rank")
    ax = args.axis(axis, x.ndim, "rank")
    n = args.static_shape(x, "rank")[ax]
    j = reduce_axis((0, n), name="j")

    def body(*i: Expr) -> Expr:
        mine, other = x[i], x[(*i[:ax], j.var, *i[ax + 1:])]
        ahead = other > mine if largest else other < mine
        before = I.any(ahead, I.all(other == mine, j.var < i[ax]))
        return R.sum(I.if_then_else(before, 1, 0), axis=j)

    return compute(x.shape, body, name="T_rank", tag=REDUCE)


def topk(x: Tensor, k: int, axis: int = -1, largest: bool = True) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest) elements along ``axis`` in order, and their int64
    positions (the lower position first among equal values)."""
    args.tensor(x, "topk")
    ax = args.axis(axis, x.ndim, "topk")
    shape = args.static_shape(x, "topk")
    if not 0 <= k <= shape[ax]:
        raise TEError(f"topk: k = {k} is outside [0, {shape[ax]}] for axis {axis} of {x.name} "
                      f"{shape}")
    order = rank(x, ax, largest)
    j = reduce_axis((0, shape[ax]), name="j")
    out_shape = (*shape[:ax], k, *shape[ax + 1:])

    def position(*o: Expr) -> Expr:
        at = (*o[:ax], j.var, *o[ax + 1:])
        return R.max(I.if_then_else(order[at] == o[ax], j.var, 0), axis=j)

    pos = compute(out_shape, position, name="T_topk_pos", tag=REDUCE)
    values = compute(out_shape, lambda *o: x[(*o[:ax], pos[o], *o[ax + 1:])],
                     name="T_topk_values", tag=INJECTIVE)
    indices = compute(out_shape, lambda *o: cast("int64", pos[o]), name="T_topk_indices",
                      tag=INJECTIVE)
    return values, indices
