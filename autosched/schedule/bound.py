"""Bound inference: which part of each stage must be computed, and where its loops range.

A stage computed at the root covers its whole domain. A stage attached with compute_at at loop
``x`` of stage ``T`` covers the union of what its consumers read inside one iteration of ``x``:
loops outside and at ``x`` are fixed, loops inside range over their extents. For a stage in
"shared" scope, threadIdx-bound loops range too (all threads of a block share the buffer).

Each leaf loop runs from 0 to its extent; a root axis value is ``region_min + value`` where
``value`` is rebuilt from the leaves through the split / fuse relations.

A split whose factor does not divide its axis overhangs: its loops reach past the axis's end.
At a root axis the root guard (value < extent) drops those iterations. An axis that is the
inner part of another split is no root, though: there an overhang does not go out of range, it
lands on indices the next outer iteration covers too (``k = ko * 4 + ki`` with ``ki`` reaching
5 computes ``k = 4`` twice). Such inner parts get a guard of their own (``inner_guards``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autosched.errors import ScheduleError
from autosched.schedule.schedule import FuseRel, Schedule, SplitRel, Stage, split_extents
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.tensor import ComputeOp
from autosched.te.visit import post_order, substitute
from autosched.tir.arith import Analyzer, interval, interval_extent, simplify
from autosched.tir.evaluate import const_int


@dataclass
class StageBound:
    region_min: list[E.Expr]             # per data axis: first index computed
    region_ext: list[E.Expr]             # per data axis: how many (a constant where possible)
    extent: dict[int, E.Expr] = field(default_factory=dict)  # every axis var uid -> extent
    value: dict[int, E.Expr] = field(default_factory=dict)   # root var uid -> f(leaf vars)
    # value < extent of every split's inner part that is split or fused again: (kind, condition)
    inner_guards: list[tuple[str, E.Expr]] = field(default_factory=list)
    # root var uid -> value with each guarded inner part as a variable of its own, and those
    # variables' ranges: what the guards let a reader's indices reach
    guarded_value: dict[int, E.Expr] = field(default_factory=dict)
    guarded_ranges: dict[E.Var, tuple[E.Expr, E.Expr]] = field(default_factory=dict)

    def full_value(self, st: Stage, guarded: bool = False) -> dict[E.Var, E.Expr]:
        """Root var -> its index in the op's domain, in terms of loop variables (``guarded``:
        and of the guarded inner parts' own variables)."""
        op = st.op
        assert isinstance(op, ComputeOp)
        value = self.guarded_value if guarded else self.value
        out: dict[E.Var, E.Expr] = {}
        for d, a in enumerate(op.axis):
            out[a.var] = self.region_min[d] + value[a.var.uid]
        for r in op.reduce_axis:
            out[r.var] = r.dom.min + value[r.var.uid]
        return out


class Bounds:
    """Bound inference over a whole schedule; ``bodies`` are the stages' bodies after inlining."""

    def __init__(self, sch: Schedule, bodies: dict[str, E.Expr]):
        self.sch = sch
        self.bodies = bodies
        self.stage_bounds: dict[str, StageBound] = {}
        self.var_bounds: dict[E.Var, tuple[int, int]] = {}
        self.var_extent: dict[E.Var, E.Expr] = {}
        self.thread_vars: list[E.Var] = []
        for st in reversed(sch.stages):
            if st.name in bodies:
                self._infer(st)

    def __getitem__(self, name: str) -> StageBound:
        return self.stage_bounds[name]

    # -- regions ---------------------------------------------------------------------------------
    def _infer(self, st: Stage) -> None:
        op = st.op
        assert isinstance(op, ComputeOp)
        full: list[tuple[E.Expr, E.Expr]] = [(E.const(0, s.dtype), s) for s in op.shape]
        if st.attach[0] == "at":
            region = self._attached_region(st, full)
        else:
            region = full
        bound = StageBound([r[0] for r in region], [r[1] for r in region])
        for d, a in enumerate(op.axis):
            bound.extent[a.var.uid] = bound.region_ext[d]
        for r in op.reduce_axis:
            bound.extent[r.var.uid] = r.dom.extent
        self._leaf_extents(st, bound)
        self.stage_bounds[st.name] = bound

    def _attached_region(self, st: Stage, full: list[tuple[E.Expr, E.Expr]]) -> list[tuple[E.Expr, E.Expr]]:
        _, target_name, axis_name = st.attach
        target = self.sch.stage(target_name)
        if target.name not in self.bodies:
            raise ScheduleError(f"{st.name} is computed at {target.name}.{axis_name}, but {target.name} is inlined")
        x = target.leaf_named(axis_name)
        ndim = len(full)
        lows: list[list[E.Expr]] = [[] for _ in range(ndim)]
        highs: list[list[E.Expr]] = [[] for _ in range(ndim)]
        unknown = [False] * ndim
        readers = [c for c in self.sch.stages if c.name in self.bodies and self.reads(c, st)]
        if not readers:
            raise ScheduleError(f"{st.name} is computed at {target.name}.{axis_name} but nothing reads it")
        for c in readers:
            ranging = self._inner_vars(c, target, x, st)
            if ranging is None:
                raise ScheduleError(
                    f"compute_at {st.name} to {target.name}.{axis_name}: {c.name} reads {st.name} "
                    f"outside that loop (compute_at needs a loop enclosing every use)"
                )
            if st.scope == "shared":
                ranging = ranging + [v for v in self.thread_vars if v not in ranging]
            ranges = {v: (E.const(0, v.dtype), self.var_extent[v] - 1) for v in ranging}
            cb = self.stage_bounds[c.name]
            cvalue = cb.full_value(c)
            held = cb.full_value(c, guarded=True) if cb.guarded_ranges else None
            for read in self.reads(c, st):
                for d, idx in enumerate(read.indices):
                    box = interval(substitute(idx, cvalue), ranges, self.var_bounds)
                    if box is not None and held is not None:
                        box = self._tighter(box, interval(substitute(idx, held),
                                                          {**ranges, **cb.guarded_ranges},
                                                          self.var_bounds))
                    if box is None:
                        unknown[d] = True
                    else:
                        lows[d].append(box[0])
                        highs[d].append(box[1])
        region = []
        for d in range(ndim):
            if unknown[d]:
                region.append(full[d])
                continue
            lo = _fold(lows[d], Op.MIN, self.var_bounds)
            hi = _fold(highs[d], Op.MAX, self.var_bounds)
            ext = interval_extent(lo, hi, self.var_bounds)
            region.append(full[d] if ext is None else (lo, E.const(ext, lo.dtype)))
        return region

    def _tighter(self, box: tuple[E.Expr, E.Expr], guarded: tuple[E.Expr, E.Expr] | None
                 ) -> tuple[E.Expr, E.Expr]:
        """``box`` with each end moved in to ``guarded``'s (the interval the inner guards let
        the reads reach) where that is provably inside: an overhanging split of the reader's
        loops never makes its producer compute past what the guards let through."""
        if guarded is None:
            return box
        lo, hi = box
        if (const_int(simplify(guarded[0] - lo, self.var_bounds)) or 0) > 0:
            lo = guarded[0]
        if (const_int(simplify(hi - guarded[1], self.var_bounds)) or 0) > 0:
            hi = guarded[1]
        return lo, hi

    def reads(self, consumer: Stage, producer: Stage) -> list[E.TensorRead]:
        """The reads of ``producer`` in ``consumer``'s body (none for unscheduled stages)."""
        uids = producer.uids
        body = self.bodies.get(consumer.name)
        if body is None:
            return []
        return [n for n in post_order(body)
                if isinstance(n, E.TensorRead) and n.tensor.op.uid in uids]

    def _inner_vars(self, c: Stage, target: Stage, x: E.IterVar, producer: Stage) -> list[E.Var] | None:
        """Loop variables between loop ``x`` of ``target`` and the reads in ``c``, or None when
        ``c`` is not inside that loop."""
        if c is target:
            pos = target.position(x)
            return [iv.var for iv in target.leaf[pos + 1:]]
        out = [iv.var for iv in c.leaf]
        walk = c
        while walk.attach[0] == "at":
            parent = self.sch.stage(walk.attach[1])
            y = parent.leaf_named(walk.attach[2])
            ypos = parent.position(y)
            if parent is target:
                xpos = target.position(x)
                if ypos < xpos or (ypos == xpos and not _after(self.sch, walk, producer)):
                    return None
                return out + [iv.var for iv in target.leaf[xpos + 1: ypos + 1]]
            out += [iv.var for iv in parent.leaf[: ypos + 1]]
            walk = parent
        return None

    # -- leaf loops ------------------------------------------------------------------------------
    def _leaf_extents(self, st: Stage, bound: StageBound) -> None:
        ext = bound.extent
        plain = Analyzer().simplify  # extents: no variable bounds (one analyzer, shared memos)
        for rel in st.relations:
            if isinstance(rel, SplitRel):
                outer, inner = split_extents(ext[rel.parent.var.uid], rel.factor, rel.nparts)
                ext[rel.outer.var.uid] = plain(outer)
                ext[rel.inner.var.uid] = plain(inner)
            else:
                total: E.Expr = E.const(1)
                for a in rel.axes:
                    total = total * ext[a.var.uid]
                ext[rel.fused.var.uid] = plain(total)
        guarded = inner_parts_split_again(st.relations)
        value = _values(st, ext, set())
        held = _values(st, ext, {iv.var.uid for iv in guarded}) if guarded else None
        for iv in st.leaf:
            e = ext[iv.var.uid] = plain(ext[iv.var.uid])
            self.var_extent[iv.var] = e
            if isinstance(e, E.Const):
                self.var_bounds[iv.var] = (0, max(int(e.value) - 1, 0))
            if st.bindings.get(iv.var.uid, "").startswith("threadIdx"):
                self.thread_vars.append(iv.var)
        bounded = Analyzer(self.var_bounds).simplify
        for iv in st.root:
            bound.value[iv.var.uid] = bounded(value[iv.var.uid])
            if held is not None:
                bound.guarded_value[iv.var.uid] = bounded(held[iv.var.uid])
        bound.inner_guards = [(iv.kind, bounded(value[iv.var.uid]) < ext[iv.var.uid])
                              for iv in guarded]
        bound.guarded_ranges = {iv.var: (E.const(0, iv.var.dtype), ext[iv.var.uid] - 1)
                                for iv in guarded}


def _values(st: Stage, ext: dict[int, E.Expr], held: set[int]) -> dict[int, E.Expr]:
    """Every axis's value rebuilt from the leaf loops through the relations, the axes in
    ``held`` (uids) standing as variables of their own instead."""
    value: dict[int, E.Expr] = {iv.var.uid: iv.var for iv in st.leaf}
    for rel in reversed(st.relations):
        if isinstance(rel, SplitRel):
            inner = rel.inner.var if rel.inner.var.uid in held else value[rel.inner.var.uid]
            value[rel.parent.var.uid] = value[rel.outer.var.uid] * ext[rel.inner.var.uid] + inner
        else:
            fused = value[rel.fused.var.uid]
            stride: E.Expr = E.const(1)
            for n, a in enumerate(reversed(rel.axes)):
                part = E.binary(Op.FLOORDIV, fused, stride) if n else fused
                if n < len(rel.axes) - 1:
                    part = E.binary(Op.FLOORMOD, part, ext[a.var.uid])
                value[a.var.uid] = part
                stride = stride * ext[a.var.uid]
    return value


def inner_parts_split_again(relations: Sequence[SplitRel | FuseRel]) -> list[E.IterVar]:
    """Inner parts of splits that are split or fused again, so are not loops themselves.

    Every overhang climbs towards the roots: an outer part's overhang makes its parent's, and a
    fused axis's makes its outermost axis's (the others are taken modulo their extent). The
    climb ends at a root (guarded there) or at the inner part of a split, where it repeats
    iterations instead: guarding those keeps every index computed exactly once. Dividing
    splits give guards the simplifier proves and drops.
    """
    consumed = {rel.parent.var.uid for rel in relations if isinstance(rel, SplitRel)}
    consumed |= {a.var.uid for rel in relations if isinstance(rel, FuseRel) for a in rel.axes}
    return [rel.inner for rel in relations
            if isinstance(rel, SplitRel) and rel.inner.var.uid in consumed]


def _after(sch: Schedule, a: Stage, b: Stage) -> bool:
    """Stages attached at the same loop run in stage order: does ``a`` come after ``b``?"""
    return sch.stages.index(a) > sch.stages.index(b)


def _fold(items: list[E.Expr], op: Op, bounds: dict) -> E.Expr:
    out = items[0]
    for it in items[1:]:
        if not E.structural_equal(it, out):
            out = simplify(E.binary(op, out, it), bounds)
    return out
