"""rfactor: turn part of a reduction into a data-parallel axis of a new stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autosched.errors import ScheduleError
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.tensor import ComputeOp, reduce_axis
from autosched.te.visit import substitute

if TYPE_CHECKING:
    from autosched.schedule.schedule import Stage


def rfactor_ops(st: Stage, axis: E.IterVar, factor_axis: int, name: str) -> tuple[ComputeOp, ComputeOp]:
    """The factored op (reduction minus ``axis``, with ``axis`` as a data dim at ``factor_axis``)
    and the op that finishes the reduction over that dim."""
    from autosched.schedule.bound import inner_parts_split_again
    from autosched.schedule.schedule import FuseRel, SplitRel

    op = st.op
    if not isinstance(op, ComputeOp) or not isinstance(op.body, E.Reduce):
        raise ScheduleError(f"rfactor of {st.name}: it is not a reduction")
    if axis.kind != "reduce":
        raise ScheduleError(f"rfactor of {st.name}: axis {axis.name} is not a reduction axis")
    if not 0 <= factor_axis <= len(op.axis):
        raise ScheduleError(f"rfactor of {st.name}: factor_axis {factor_axis} not in [0, {len(op.axis)}]")
    for rel in st.relations:
        if (rel.fused if isinstance(rel, FuseRel) else rel.parent).kind != "reduce":
            raise ScheduleError(
                f"rfactor of {st.name}: only splits and fusions of reduction axes may come "
                "before rfactor")
    body = op.body
    # new loop variables: the factored axis becomes data, the other reduce leaves stay reductions
    data_axes = [E.IterVar(E.Var(a.name), a.dom, "data") for a in op.axis]
    rf_axis = E.IterVar(E.Var(axis.name), E.Range(E.const(0), axis.dom.extent), "data")
    leaves = [iv for iv in st.leaf if iv.kind == "reduce" and iv.var.uid != axis.var.uid]
    new_red = [reduce_axis(iv.dom.extent, name=iv.name) for iv in leaves]
    leaf_value: dict[int, E.Expr] = {axis.var.uid: rf_axis.var}
    leaf_value.update({iv.var.uid: n.var for iv, n in zip(leaves, new_red)})
    guards: list[E.Expr] = []
    fused = {rel.fused.var.uid for rel in st.relations if isinstance(rel, FuseRel)}
    for rel in reversed(st.relations):
        if isinstance(rel, FuseRel):  # the fused index taken apart, innermost axis first
            value = leaf_value[rel.fused.var.uid]
            for a in reversed(rel.axes[1:]):
                leaf_value[a.var.uid] = value % a.dom.extent
                value = value // a.dom.extent
            leaf_value[rel.axes[0].var.uid] = value
            continue
        inner_ext = rel.inner.dom.extent
        value = leaf_value[rel.outer.var.uid] * inner_ext + leaf_value[rel.inner.var.uid]
        leaf_value[rel.parent.var.uid] = value
        if rel.parent.var.uid in fused and (rel.nparts is not None
                                            or not _divides(rel.parent.dom.extent, rel.factor)):
            guards.append(value < rel.parent.dom.extent)  # a fused axis's overhang
    mapping: dict[E.Var, E.Expr] = {a.var: d.var for a, d in zip(op.axis, data_axes)}
    for r in op.reduce_axis:
        value = leaf_value.get(r.var.uid, r.var)
        mapping[r.var] = r.dom.min + value
        if any(isinstance(rel, SplitRel) and rel.parent.var.uid == r.var.uid and rel.nparts is None
               and not _divides(r.dom.extent, rel.factor) for rel in st.relations) or any(
                isinstance(rel, SplitRel) and rel.nparts is not None for rel in st.relations):
            guards.append(value < r.dom.extent)
    # an inner part split again may overhang itself while the root index stays in range
    guards += [leaf_value[iv.var.uid] < iv.dom.extent for iv in inner_parts_split_again(st.relations)]
    source = substitute(body.source, mapping)
    cond = substitute(body.condition, mapping) if body.condition is not None else None
    for g in guards:
        cond = g if cond is None else E.logical(Op.AND, cond, g)
    rf_axes = list(data_axes)
    rf_axes.insert(factor_axis, rf_axis)
    if new_red:
        rf_body: E.Expr = E.Reduce(body.combiner, source, tuple(new_red), cond)
    else:
        rf_body = source if cond is None else E.select(cond, source, body.combiner.identity)
    rf_op = ComputeOp(name, tuple(rf_axes), rf_body, tuple(new_red), tag="rfactor")
    final_axes = tuple(E.IterVar(E.Var(a.name), a.dom, "data") for a in op.axis)
    kr = reduce_axis(axis.dom.extent, name=f"{axis.name}.v")
    idx = [a.var for a in final_axes]
    idx.insert(factor_axis, kr.var)
    final = E.Reduce(body.combiner, rf_op.output()[tuple(idx)], (kr,), None, body.init)
    final_op = ComputeOp(op.name, final_axes, final, (kr,), op.tag, op.attrs)
    return rf_op, final_op


def _divides(extent: E.Expr, factor: int | None) -> bool:
    return factor is not None and isinstance(extent, E.Const) and extent.value % factor == 0
