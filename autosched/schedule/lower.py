"""Lowering: a schedule becomes a loop-nest PrimFunc through a short list of named passes.

    expand_inline   substitute compute_inline'd stages into their readers
    infer_bounds    regions of attached stages, extents of every loop (bound.py)
    build_loops     one loop nest per stage, attached stages nested at their loop, buffers
                    allocated where they live, reads turned into buffer loads; a tensorized
                    loop carries ("tensorize", intrinsic), and a shared stage that a tensorized
                    nest reads stores zeros where its tile overhangs the tensor; a pipelined
                    shared stage (Stage.pipeline) gets a buffer per stage and is fetched
                    ahead: a prologue before its loop, then per iteration a wait and barrier
                    (a loop of one iteration annotated async_wait) and the next fetch (one
                    annotated async_copy, which backends may run asynchronously)
    simplify        integer simplification of indices and guards, dead-branch removal

``lower(s, args, print_after=("build_loops",))`` prints the IR after the named passes (or set
AUTOSCHED_PRINT_AFTER=all).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autosched import settings
from autosched.errors import AutoschedError, LowerError, ScheduleError
from autosched.schedule.bound import Bounds, StageBound
from autosched.schedule.schedule import Schedule, Stage, create_schedule
from autosched.schedule.steps import ident as steps_ident
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.tensor import ComputeOp, Tensor
from autosched.te.visit import free_vars, post_order, rewrite, substitute, substituter, tensors_read
from autosched.tir import ir
from autosched.tir.arith import Analyzer
from autosched.tir.evaluate import const_int
from autosched.tir.visit import loop_vars, map_stmt, substitute_stmt

_KIND = {"parallel": "parallel", "vectorize": "vectorized", "unroll": "unrolled"}


@dataclass
class LowerContext:
    sch: Schedule
    args: list[Tensor]
    name: str
    bodies: dict[str, E.Expr] = field(default_factory=dict)
    bounds: Bounds | None = None
    buffers: dict[str, ir.Buffer] = field(default_factory=dict)
    params: tuple[ir.Buffer, ...] = ()
    body: ir.Stmt | None = None


# -- pass 1: inlining ---------------------------------------------------------------------------
def expand_inline(ctx: LowerContext) -> None:
    """Each scheduled stage's body with inlined stages substituted and reads redirected to the
    producing stage's current operation."""
    sch = ctx.sch
    memo: dict[str, E.Expr] = {}

    def expand(st: Stage) -> E.Expr:
        if st.name in memo:
            return memo[st.name]
        op = st.op
        assert isinstance(op, ComputeOp)

        def fn(node: E.Expr) -> E.Expr | None:
            if not isinstance(node, E.TensorRead):
                return None
            q = sch.resolve_read(st, node.tensor)
            if q.attach == ("inline",):
                inner = expand(q)
                qop = q.op
                assert isinstance(qop, ComputeOp)
                return substitute(inner, {a.var: i for a, i in zip(qop.axis, node.indices)})
            return E.TensorRead(q.op.output(), node.indices)

        memo[st.name] = rewrite(op.body, fn)
        return memo[st.name]

    for st in sch.stages:
        if not st.is_placeholder and st.attach != ("inline",):
            ctx.bodies[st.name] = expand(st)


# -- pass 2: bounds -------------------------------------------------------------------------------
def infer_bounds(ctx: LowerContext) -> None:
    ctx.bounds = Bounds(ctx.sch, ctx.bodies)


# -- pass 3: loops -------------------------------------------------------------------------------
def build_loops(ctx: LowerContext) -> None:
    sch, bounds = ctx.sch, ctx.bounds
    assert bounds is not None
    params = []
    seen: set[str] = set()
    for t in ctx.args:
        if not isinstance(t, Tensor):
            raise LowerError(f"lower: args must be tensors, got {t!r}")
        st = sch[t]
        if st.name in seen:
            raise LowerError(f"lower: {st.name} appears twice in args")
        seen.add(st.name)
        if st.attach == ("inline",):
            raise LowerError(f"lower: {st.name} is an argument but is inlined")
        buf = ir.Buffer(t.name, t.op.shape, t.dtype, "global")
        ctx.buffers[st.name] = buf
        params.append(buf)
    ctx.params = tuple(params)
    for st in sch.stages:
        if st.is_output and st.name not in ctx.buffers:
            raise LowerError(f"lower: output {st.name} is not in args ({', '.join(t.name for t in ctx.args)})")
    builder = _NestBuilder(ctx)
    for st in sch.stages:
        if st.name in ctx.bodies and st.name not in ctx.buffers:
            builder.buffer(st)
    top: list[ir.Stmt] = []
    allocs: list[ir.Buffer] = []
    for st in sch.stages:
        if st.is_placeholder:
            if st.name not in ctx.buffers and any(bounds.reads(c, st) for c in sch.stages):
                raise LowerError(f"lower: placeholder {st.name} is read but is not in args")
            continue
        if st.name not in ctx.bodies or st.attach[0] != "root":
            continue
        if ctx.buffers[st.name] not in params:
            allocs.append(ctx.buffers[st.name])
        top.append(builder.nest(st))
    body = ir.seq(*top)
    for buf in reversed(allocs):
        body = ir.Allocate(buf, body)
    ctx.body = body


class _NestBuilder:
    def __init__(self, ctx: LowerContext):
        self.ctx = ctx
        self.sch = ctx.sch
        assert ctx.bounds is not None, "infer_bounds runs before build_loops"
        self.bounds: Bounds = ctx.bounds
        self.an = Analyzer(self.bounds.var_bounds)  # one memo for the pass
        self.attached: dict[tuple[str, str], list[Stage]] = {}
        for st in self.sch.stages:
            if st.attach[0] == "at" and st.name in ctx.bodies:
                self.attached.setdefault((st.attach[1], st.attach[2]), []).append(st)
        # tensor intrinsics read their operands' tiles whole, out-of-bounds corners included
        self.padded = {q.name for st in self.sch.stages if st.tensorized and st.name in ctx.bodies
                       for t in tensors_read(ctx.bodies[st.name])
                       if (q := self.sch.stage_of_uid(t.op.uid)).scope == "shared"}

    def buffer(self, st: Stage) -> ir.Buffer:
        b = self.bounds[st.name]
        shape = tuple(b.region_ext) if st.attach[0] == "at" else st.op.shape
        if st.align is not None:
            shape = shape[:-1] + (_aligned_row(st, shape[-1], *st.align),)
        if st.pipeline_stages > 1:
            shape = (E.const(st.pipeline_stages),) + shape  # one tile per stage
        buf = ir.Buffer(st.name, shape, st.op.dtype, st.scope)
        self.ctx.buffers[st.name] = buf
        return buf

    def _min(self, st: Stage) -> list[E.Expr]:
        b = self.bounds[st.name]
        if st.attach[0] == "at" and st.name not in {t.name for t in self.ctx.args}:
            return b.region_min
        return [E.const(0, s.dtype) for s in st.op.shape]

    def load(self, node: E.TensorRead) -> E.Expr:
        st = self.sch.stage_of_uid(node.tensor.op.uid)
        buf = self.ctx.buffers.get(st.name)
        if buf is None:
            raise LowerError(f"lower: {st.name} is read before it is computed (check compute_at targets)")
        mins: list[E.Expr]
        if st.is_placeholder:
            mins = [E.const(0, s.dtype) for s in st.op.shape]
        else:
            mins = self._min(st)
        idx = tuple(self.an.simplify(i - m) for i, m in zip(node.indices, mins))
        return ir.Load(buf, self._slot(st) + idx)

    def _slot(self, st: Stage) -> tuple[E.Expr, ...]:
        """The leading index of a pipelined stage's buffer: the tile of the current iteration
        of the loop it is computed at (none for other stages)."""
        if st.pipeline_stages == 1:
            return ()
        loop = self._pipelined_loop(st)
        return (E.binary(Op.FLOORMOD, loop.var, st.pipeline_stages),)

    def _pipelined_loop(self, st: Stage) -> E.IterVar:
        """The serial loop a pipelined stage is computed at (LowerError if there is none)."""
        if st.attach[0] != "at":
            raise LowerError(f"pipeline of {st.name}: it must be computed at a serial loop "
                             f"(compute_at), it is {st.attach[0]}")
        parent = self.sch.stage(st.attach[1])
        iv = parent.leaf_named(st.attach[2])
        marks = [m.get(iv.var.uid) for m in (parent.bindings, parent.annotations)]
        if any(marks):
            raise LowerError(f"pipeline of {st.name}: loop {iv.name} of {parent.name}, where it "
                             f"is computed, must be serial, not {next(filter(None, marks))}")
        for t in tensors_read(self.ctx.bodies[st.name]):
            src = self.sch.stage_of_uid(t.op.uid)
            if not src.is_placeholder and src.attach[0] != "root":
                raise LowerError(f"pipeline of {st.name}: it reads {src.name}, which is not "
                                 "computed before the loop, so it cannot be fetched ahead")
        return iv

    def lower_expr(self, e: E.Expr) -> E.Expr:
        return rewrite(e, lambda n: self.load(n) if isinstance(n, E.TensorRead) else None)

    # -- the nest of one stage ---------------------------------------------------------------
    def nest(self, st: Stage) -> ir.Stmt:
        op = st.op
        assert isinstance(op, ComputeOp)
        bound: StageBound = self.bounds[st.name]
        buf = self.ctx.buffers[st.name]
        mins = self._min(st)
        full = bound.full_value(st)
        store_idx = self._slot(st) + tuple(self.an.simplify(full[a.var] - m)
                                           for a, m in zip(op.axis, mins))
        pad = st.name in self.padded
        body = self.ctx.bodies[st.name]
        spill = self._overhang_computed(st, body)
        data_guard = self._guards(st, bound, op.axis, data=True, inside=not (pad or spill))
        if isinstance(body, E.Reduce):
            red = body
            source = red.source
            if spill:  # in the axes' own terms: substituted with the rest below
                source = _reads_zero_outside(source, {
                    a.var.uid: [own for own, placed in zip(
                        _in_extent(a.var, a), _inside_tensor(bound, d, a))
                        if self._unproven([placed])]
                    for d, a in enumerate(op.axis)})
            source = self.lower_expr(substitute(source, full))
            acc = ir.Load(buf, store_idx)
            comb = red.combiner
            update_value = substitute(comb.result, {comb.lhs: acc, comb.rhs: source})
            cond = self._guards(st, bound, op.reduce_axis, data=False)
            if red.condition is not None:
                cond = cond + [self.lower_expr(substitute(red.condition, full))]
            init_value = comb.identity if red.init is None else self.lower_expr(substitute(red.init, full))
            init = _guarded(ir.Store(buf, store_idx, init_value), data_guard)
            update = _guarded(ir.Store(buf, store_idx, update_value), data_guard + cond)
            return self._loops(st, init, update)
        value = self.lower_expr(substitute(body, full))
        inside = self._inside(bound, op.axis) if pad else []
        if inside:
            value = _zero_outside(value, _conjunction(inside))
        return self._loops(st, None, _guarded(ir.Store(buf, store_idx, value), data_guard))

    def _overhang_computed(self, st: Stage, body: E.Expr) -> bool:
        """Whether a tile's points outside the tensor are computed rather than skipped: a
        local accumulator (a reduction computed at a loop of its reader) whose tile overhangs
        the tensor (a split that does not divide) accumulates zeros there, its reads of
        other tensors masked to the points inside (``_reads_zero_outside``), instead of
        guarding every update. Its buffer holds the whole tile and its reader takes only the
        points inside, so the overhang is scratch; the updates stay unconditional, so a
        vectorized tail is one masked load and an accumulator that stays in registers (a
        guarded update became a masked store that keeps it in memory: a batched matmul over
        169 columns in tiles of 16 ran at 30 GFLOP/s)."""
        return (isinstance(body, E.Reduce) and body.condition is None and body.init is None
                and st.attach[0] == "at" and st.scope == "local"
                and st.name not in self.padded and st.pipeline_stages == 1
                and not _divides_by_data(body.source))

    def _guards(self, st: Stage, bound: StageBound, axes: Sequence[E.IterVar], data: bool,
                inside: bool = True) -> list[E.Expr]:
        """The conditions an iteration must meet to compute a point of ``axes`` (the data axes
        or the reduce axes) once: root indices in range (data: in the region, and with
        ``inside`` in the tensor), and no overhang of an inner split part; those the bounds
        prove are left out."""
        conds = []
        for d, a in enumerate(axes):
            value = bound.value[a.var.uid]
            ext = bound.region_ext[d] if data else a.dom.extent
            conds.append(value < ext)
            if data and inside:
                conds += _inside_tensor(bound, d, a)
        kind = "data" if data else "reduce"
        conds += [c for k, c in bound.inner_guards if k == kind]
        return self._unproven(conds)

    def _inside(self, bound: StageBound, axes: Sequence[E.IterVar]) -> list[E.Expr]:
        """The conditions that a point of a stage's region lies inside its tensor."""
        return self._unproven([c for d, a in enumerate(axes) for c in _inside_tensor(bound, d, a)])

    def _unproven(self, conds: list[E.Expr]) -> list[E.Expr]:
        out = []
        for c in conds:
            c = self.an.simplify(c)
            if self.an.prove(c) is not True:
                out.append(c)
        return out

    def _loops(self, st: Stage, init: ir.Stmt | None, update: ir.Stmt) -> ir.Stmt:
        leaves = st.leaf
        first_red = next((p for p, iv in enumerate(leaves) if iv.kind == "reduce"), len(leaves))
        if init is None:
            return self._wrap(st, leaves, update, attach=True)
        inner_data = [iv for iv in leaves[first_red:] if iv.kind == "data"]
        init_nest = self._wrap(st, inner_data, init, attach=False)
        update_nest = self._wrap(st, leaves[first_red:], update, attach=True)
        return self._wrap(st, leaves[:first_red], ir.seq(init_nest, update_nest), attach=True)

    def _wrap(self, st: Stage, leaves: Sequence[E.IterVar], inner: ir.Stmt, attach: bool) -> ir.Stmt:
        body = inner
        for iv in reversed(leaves):
            if attach:
                body = self._attach(st, iv, body)
            body = self._for(st, iv, body)
            if attach:
                body = self._prologue(st, iv, body)
        return body

    def _ahead(self, st: Stage, iv: E.IterVar) -> tuple[list[Stage], int]:
        """The pipelined stages computed at the loop ``iv`` of ``st`` and their one depth."""
        ahead = [p for p in self.attached.get((st.name, iv.name), []) if p.pipeline_stages > 1]
        depths = {p.pipeline_stages for p in ahead}
        if len(depths) > 1:
            raise LowerError(f"pipelines at loop {iv.name} of {st.name} differ in depth: "
                             + ", ".join(f"{p.name} {p.pipeline_stages}" for p in ahead))
        for p in ahead:
            self._pipelined_loop(p)
        return ahead, depths.pop() if depths else 1

    def _fetch(self, st: Stage, ahead: list[Stage], iv: E.IterVar, at: E.Expr) -> ir.Stmt:
        """The copies of the stages ``ahead`` for iteration ``at`` of the loop ``iv`` (none
        past its end), as one group of copies that may complete asynchronously: a loop of one
        iteration annotated ``async_copy`` (backends without asynchronous copies run it as
        it is)."""
        ext = self.bounds[st.name].extent[iv.var.uid]
        copies = ir.seq(*(substitute_stmt(self.nest(p), {iv.var: at}) for p in ahead))
        inside = self.an.simplify(at < ext)
        if self.an.prove(inside) is not True:
            copies = ir.IfThenElse(inside, copies)
        return ir.For(E.Var("fetch"), E.const(0), E.const(1), "serial", copies,
                      annotations=(("async_copy", True),))

    def _prologue(self, st: Stage, iv: E.IterVar, loop: ir.Stmt) -> ir.Stmt:
        """The loop ``iv`` with the buffers of its pipelined stages around it and the fetches
        of its first ``stages - 1`` iterations before it (Stage.pipeline)."""
        ahead, depth = self._ahead(st, iv)
        if not ahead:
            return loop
        first = [self._fetch(st, ahead, iv, E.const(k, iv.var.dtype)) for k in range(depth - 1)]
        out = ir.seq(ir.Barrier(), *first, loop)  # the buffers may hold the last tiles of a
        for p in reversed(ahead):                 # previous run of the loop
            out = ir.Allocate(self.ctx.buffers[p.name], out)
        return out

    def _attach(self, st: Stage, iv: E.IterVar, body: ir.Stmt) -> ir.Stmt:
        inner = self.attached.get((st.name, iv.name), [])
        if not inner:
            return body
        ahead, depth = self._ahead(st, iv)
        parts: list[ir.Stmt] = []
        if ahead:
            # the fetch of this iteration done (at most depth - 2 groups in flight) and seen
            # by every thread, which also finished the iteration before, whose buffer the
            # fetch of iteration iv + depth - 1 now overwrites
            wait = ir.For(E.Var("wait"), E.const(0), E.const(1), "serial", ir.Barrier(),
                          annotations=(("async_wait", depth - 2),))
            parts += [wait, self._fetch(st, ahead, iv, iv.var + (depth - 1))]
        bufs = []
        for p in inner:
            if p in ahead:
                continue
            bufs.append(self.ctx.buffers[p.name])
            nest = self.nest(p)
            if p.scope == "shared":
                parts += [ir.Barrier(), nest, ir.Barrier()]
            else:
                parts.append(nest)
        out = ir.seq(*parts, body)
        for b in reversed(bufs):
            out = ir.Allocate(b, out)
        return out

    def _for(self, st: Stage, iv: E.IterVar, body: ir.Stmt) -> ir.Stmt:
        ext = self.bounds[st.name].extent[iv.var.uid]
        uid = iv.var.uid
        tag = st.bindings.get(uid, "")
        kind = "thread" if tag else _KIND.get(st.annotations.get(uid, ""), "serial")
        if kind in ("vectorized", "unrolled") and not isinstance(ext, E.Const):
            raise LowerError(
                f"{st.annotations[uid]} needs a constant extent; axis {iv.name} of {st.name} has {ext}"
            )
        annotations = st.pragmas.get(uid, ())
        if uid in st.tensorized:
            annotations += (("tensorize", st.tensorized[uid]),)
        return ir.For(iv.var, E.const(0, iv.var.dtype), ext, kind, body, tag, annotations)


def _aligned_row(st: Stage, row: E.Expr, factor: int, offset: int) -> E.Expr:
    """The least length at least ``row`` that is ``offset`` modulo ``factor``."""
    n = const_int(row)
    if n is None:
        raise LowerError(f"storage_align of {st.name}: its rows have a symbolic length {row}")
    return E.const(n + (offset - n) % factor)


def _inside_tensor(bound: StageBound, d: int, a: E.IterVar) -> list[E.Expr]:
    return _in_extent(bound.region_min[d] + bound.value[a.var.uid], a)


def _in_extent(index: E.Expr, a: E.IterVar) -> list[E.Expr]:
    """That ``index`` along axis ``a`` lies in the tensor: below its extent, not negative."""
    return [index < a.dom.extent, index >= 0]


def _zero_outside(value: E.Expr, cond: E.Expr) -> E.Expr:
    """``value`` where ``cond`` holds, else 0; a storage type (bfloat16) is selected as the
    float32 that holds it exactly."""
    if value.dtype in dt.STORAGE_TYPES:
        wide = E.select(cond, E.cast("float32", value), E.const(0.0, "float32"))
        return E.cast(value.dtype, wide)
    return E.select(cond, value, E.const(0, value.dtype))


def _divides_by_data(e: E.Expr) -> bool:
    """Whether ``e`` divides integers by something not constant (a zero read outside the
    tensor would fault there)."""
    return any(isinstance(n, E.Binary) and n.op.divides and not dt.is_float(n.dtype)
               and not isinstance(n.b, E.Const) for n in post_order(e))


def _reads_zero_outside(value: E.Expr, inside: dict[int, list[E.Expr]]) -> E.Expr:
    """``value`` with each read that depends on an axis (by its variable's uid) read only
    where that axis's ``inside`` conditions hold, else 0."""
    def guard(n: E.Expr) -> E.Expr | None:
        if isinstance(n, E.Select) and isinstance(n.true_value, E.Select) and all(
                _is_zero(x) for x in (n.false_value, n.true_value.false_value)):
            # a padded read, select(in image, select(inside, x[...], 0), 0): one select,
            # which the code generators load masked (nested, it went lane by lane)
            inner = n.true_value
            return E.select(E.logical(Op.AND, n.cond, inner.cond), inner.true_value,
                            n.false_value)
        if not isinstance(n, E.TensorRead):
            return None
        used = {v.uid for i in n.indices for v in free_vars(i)}
        mine = [c for uid in sorted(used) for c in inside.get(uid, [])]
        return _zero_outside(n, _conjunction(mine)) if mine else None

    return rewrite(value, guard)


def _is_zero(e: E.Expr) -> bool:
    return isinstance(e, E.Const) and e.value == 0


def _conjunction(conds: list[E.Expr]) -> E.Expr:
    cond = conds[0]
    for c in conds[1:]:
        cond = E.logical(Op.AND, cond, c)
    return cond


def _guarded(s: ir.Stmt, conds: list[E.Expr]) -> ir.Stmt:
    return ir.IfThenElse(_conjunction(conds), s) if conds else s


# -- pass 4: simplify ---------------------------------------------------------------------------
def simplify_pass(ctx: LowerContext) -> None:
    assert ctx.body is not None
    ctx.body = simplify_stmt(ctx.body, Analyzer(ctx.bounds.var_bounds if ctx.bounds else {}))


def simplify_stmt(s: ir.Stmt, an: Analyzer) -> ir.Stmt:
    """Simplify every expression in ``s``; drop branches the bounds decide."""

    def settle(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Seq):
            return ir.seq(*st.stmts)  # without the branches that went empty
        if isinstance(st, ir.IfThenElse):
            known = an.prove(st.cond)
            if known is True:
                return st.then_body
            if known is False:
                return st.else_body if st.else_body is not None else ir.Seq(())
        return None

    return map_stmt(s, an.simplify, settle)


# -- pass 5: names --------------------------------------------------------------------------
def unique_names(ctx: LowerContext) -> None:
    """Give every loop variable a name of its own (after replacing '.' by '_'), so printed IR
    and generated C never shadow one variable with another of the same name."""
    assert ctx.body is not None
    taken: set[str] = {steps_ident(b.name) for b in ctx.params}
    rename: dict[E.Var, E.Var] = {}
    seen: set[int] = set()
    for v in loop_vars(ctx.body):
        if v.uid in seen:
            continue
        seen.add(v.uid)
        name, n = v.name, 1
        while steps_ident(name) in taken:
            name, n = f"{v.name}_{n}", n + 1
        taken.add(steps_ident(name))
        if name != v.name:
            rename[v] = E.Var(name, v.type)
    if not rename:
        return
    by_uid = {v.uid: new for v, new in rename.items()}

    def fstmt(s: ir.Stmt) -> ir.Stmt | None:
        if isinstance(s, (ir.For, ir.LetStmt)) and s.var.uid in by_uid:
            return dataclasses.replace(s, var=by_uid[s.var.uid])
        return None

    ctx.body = map_stmt(ctx.body, substituter(rename), fstmt)  # shared parts renamed once


PASSES: list[tuple[str, Callable[[LowerContext], None]]] = [
    ("expand_inline", expand_inline),  # inlined stages substituted into their readers
    ("infer_bounds", infer_bounds),    # regions and loop extents
    ("build_loops", build_loops),      # loop nests, attachments, buffers, loads
    ("simplify", simplify_pass),       # indices, guards, decided branches
    ("unique_names", unique_names),    # no two loop variables share a name
]


def lower(
    sch: Schedule | Any,
    args: Sequence[Tensor],
    name: str = "main",
    print_after: Sequence[str] = (),
) -> ir.PrimFunc:
    """Lower a schedule to a PrimFunc whose parameters are ``args`` in order.

    Example::

        s = te.create_schedule(C.op)
        print(aus.lower(s, [A, B, C]))
    """
    if not isinstance(sch, Schedule):
        sch = create_schedule(sch)
    ctx = LowerContext(sch, list(args), name)
    wanted = set(print_after) | set(filter(None, settings.PRINT_AFTER.value().split(",")))
    for pass_name, fn in PASSES:
        try:
            fn(ctx)
        except (ScheduleError, LowerError) as exc:
            raise type(exc)(f"{exc} [in lowering pass {pass_name}]") from exc
        except AutoschedError:
            raise
        except RecursionError as exc:
            raise LowerError(f"lowering pass {pass_name} recursed too deeply on {name}") from exc
        if pass_name in wanted or "all" in wanted:
            text = str(ctx.body) if ctx.body is not None else f"({len(ctx.bodies)} stage bodies)"
            print(f"# after {pass_name}\n{text}", file=sys.stderr)
    assert ctx.body is not None
    return ir.PrimFunc(name, ctx.params, ctx.body)
