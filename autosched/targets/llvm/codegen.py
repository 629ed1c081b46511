"""Loop IR to llvmlite IR: one LLVM function per PrimFunc (see abi.py for its signature).

Loops are basic blocks with a phi for the index; LLVM's O3 pipeline does the rest (strength
reduction, LICM, SROA of small allocas into registers). ``vectorized`` loops run their body once
on vectors of ``extent`` lanes (exprs.py), cut into pieces of the CPU's vector width; a
lane-dependent guard around contiguous accesses (a tile's tail) becomes masked loads / stores;
``acc[i] = acc[i] op f(v)`` becomes a vector reduction. ``unrolled`` loops are replicated
(``auto_unroll_max_step`` pragmas too), ``parallel`` loops are outlined and run by the thread
pool (parallel.py, threadpool.py). What has no vector form (a lane-dependent loop bound,
allocation, gather under a guard) is emitted lane by lane. A failure the kernel can only see at run time (an allocation
that overflows or fails, an index out of range) is or-ed into the status the kernel returns
(targets/status.py); the kernel then skips what it cannot do safely and goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from autosched.errors import CompileError
from autosched.targets.llvm import types as T
from autosched.targets.llvm.abi import ALLOC_ALIGN, PARAM_ALIGN, Signature, signature
from autosched.targets.llvm.exprs import FP_FLAGS, ExprGen, VectorContext, may_trap
from autosched.targets.llvm.walk import inline_lets_on
from autosched.targets.rounding import accumulated
from autosched.targets.status import STATUS_ALLOC
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import post_order
from autosched.tir import ir as lir
from autosched.tir.tensor_intrin import TENSOR_INTRINS
from autosched.tir.visit import loads, stmt_exprs, sub_stmts
from autosched.tir.visit import walk as all_stmts

MAX_UNROLL = 1024  # replicate an unrolled loop up to this many times, beyond: a hinted loop
MAX_LANES = 64  # the longest vector emitted as one LLVM vector
MAX_UNROLL_PIECES = 8  # a vectorized loop of more native-width pieces becomes a loop over them
STACK_BYTES = {"local": 64 * 1024, "shared": 32 * 1024, "global": 32 * 1024}
MAX_BYTES = 2**63 - 1 - ALLOC_ALIGN  # an allocation's byte count, rounded up, must fit in int64

_REDUCE = {  # op -> (integer reduction, float reduction)
    Op.ADD: ("llvm.vector.reduce.add", "llvm.vector.reduce.fadd"),
    Op.MUL: ("llvm.vector.reduce.mul", "llvm.vector.reduce.fmul"),
    # fminimum / fmaximum: a NaN lane makes the result NaN (fmin / fmax would drop it)
    Op.MIN: (None, "llvm.vector.reduce.fminimum"),
    Op.MAX: (None, "llvm.vector.reduce.fmaximum"),
}


@dataclass
class ModuleState:
    """What the functions of one module share."""

    module: ir.Module
    sig: Signature
    vector_bits: int = 128
    features: tuple[str, ...] = ()  # the target's key features (cpu_features.key_features)
    num_threads: ir.GlobalVariable | None = None
    threads_ran: ir.GlobalVariable | None = None
    outlined: int = 0

    def function(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args), name)
        return fn


class FuncGen(ExprGen):
    """Emits the statements of one LLVM function (the kernel or an outlined parallel body)."""

    def __init__(self, state: ModuleState, fn: ir.Function, in_parallel: bool = False) -> None:
        self.entry = fn.append_basic_block("entry")
        self.start = fn.append_basic_block("start")
        super().__init__(state.module, ir.IRBuilder(self.start))
        self.state = state
        self.fn = fn
        self.allocas = ir.IRBuilder(self.entry)
        self.in_parallel = in_parallel
        self.auto_unroll: tuple[int, bool] = (0, True)  # (max step, explicit) of a pragma
        # the i32 that failures are or-ed into (targets/status.py's STATUS_* bits): the
        # kernel's own slot, or in an outlined parallel body a pointer to the kernel's slot
        self.status: ir.Value | None = None

    def finish(self) -> None:
        self.allocas.branch(self.start)
        if isinstance(self.fn.function_type.return_type, ir.VoidType):
            self.b.ret_void()  # an outlined parallel body: the kernel returns the status
        else:
            assert self.status is not None
            self.b.ret(self.b.load(self.status, align=4))

    def fail(self, code: int) -> None:
        """Record a failure for the caller; the kernel goes on (its results are void)."""
        assert self.status is not None
        self.b.atomic_rmw("or", self.status, ir.Constant(T.I32, code), "monotonic")

    # --- statements --------------------------------------------------------------------------

    def stmt(self, s: lir.Stmt) -> None:
        method = getattr(self, "_" + type(s).__name__, None)
        if method is None:
            raise CompileError(f"the LLVM backend cannot emit statement {type(s).__name__}")
        method(s)

    def _Seq(self, s: lir.Seq) -> None:
        for c in s.stmts:
            self.stmt(c)

    def _Barrier(self, s: lir.Barrier) -> None:
        pass  # a GPU block barrier; CPU code runs a block's threads one after another

    def _LetStmt(self, s: lir.LetStmt) -> None:
        if self.lanes(s.value) > 1:  # vectorized lets were inlined; this one is in a branch
            return self.scalarize(s)
        self.env[s.var.uid] = self.expr(s.value)
        self.stmt(s.body)
        self.env.pop(s.var.uid, None)

    def _IfThenElse(self, s: lir.IfThenElse) -> None:
        if self.lanes(s.cond) > 1:
            if s.else_body is None and self._maskable(s.then_body):
                return self._masked_if(s)
            return self.scalarize(s)
        cond = self.expr(s.cond)
        then_bb, end_bb = self.new_block("if.then"), self.new_block("if.end")
        else_bb = self.new_block("if.else") if s.else_body is not None else end_bb
        self.b.cbranch(cond, then_bb, else_bb)
        self.b.position_at_end(then_bb)
        self.stmt(s.then_body)
        self.b.branch(end_bb)
        if s.else_body is not None:
            self.b.position_at_end(else_bb)
            self.stmt(s.else_body)
            self.b.branch(end_bb)
        self.b.position_at_end(end_bb)

    def _maskable(self, body: lir.Stmt) -> bool:
        """The body of a lane-dependent ``if`` can run as masked vector code: straight-line
        contiguous stores whose lane-dependent loads are vector loads too (contiguous,
        strided or a lane pattern), guarded ones under a padding select included (the tail
        of a tile that its loop does not divide)."""
        for st in all_stmts(body):
            if isinstance(st, lir.Seq):
                continue
            if not isinstance(st, lir.Store) or st.buffer.dtype == "bool":
                return False
            if max((self.lanes(i) for i in st.indices), default=1) == 1:
                return False
            if not self.is_contiguous(st.buffer, st.indices):
                return False
            for e in stmt_exprs(st):
                for n in post_order(e):
                    if isinstance(n, lir.Load) and self.lanes(n) > 1 and (
                            self.vector_offsets(n) is None):
                        return False
                    if isinstance(n, E.Select) and self.lanes(n.cond) > 1 and (
                            may_trap(n.true_value) or may_trap(n.false_value)) and (
                            self.masked_select_load(n) is None):
                        return False
        return True

    def _masked_if(self, s: lir.IfThenElse) -> None:
        """Masked loads and stores under the lanes where ``s.cond`` holds, skipped when none
        does. Loads that do not depend on the lane run unmasked: some lane's guard holds, so
        the scalar loop would have read them too."""
        assert self.vec is not None
        mask = self.expr(s.cond)
        if self.mask is not None:
            mask = self.b.and_(mask, self.mask)
        lanes = self.vec.lanes
        any_fn = self.state.function(f"llvm.vector.reduce.or.v{lanes}i1", T.I1,
                                     [ir.VectorType(T.I1, lanes)])
        then_bb, end_bb = self.new_block("mask.then"), self.new_block("mask.end")
        self.b.cbranch(self.b.call(any_fn, [mask]), then_bb, end_bb)
        self.b.position_at_end(then_bb)
        saved, self.mask = self.mask, mask
        try:
            self.stmt(s.then_body)
        finally:
            self.mask = saved
        self.b.branch(end_bb)
        self.b.position_at_end(end_bb)

    def scalarize(self, s: lir.Stmt) -> None:
        """Run ``s`` once per lane of the enclosing vectorized loop: replicated when it is
        straight-line code, as a loop over the lanes when it holds loops or allocations (which
        would otherwise multiply the code by the lane count)."""
        ctx = self.vec
        assert ctx is not None
        if not any(isinstance(x, (lir.For, lir.Allocate)) for x in all_stmts(s)):
            for k in range(ctx.lanes):
                with self.at_lane(k):
                    self.stmt(s)
            return

        def lane(k: ir.Value) -> None:
            with self.at_lane(k):
                self.stmt(s)

        ty = ctx.lane0.type
        self.loop(ir.Constant(ty, 0), ir.Constant(ty, ctx.lanes), lane)

    # --- stores ------------------------------------------------------------------------------

    def _Store(self, s: lir.Store) -> None:
        contract, self.contract = self.contract, accumulated(s) is not None
        try:
            self._store(s)
        finally:
            self.contract = contract

    def _store(self, s: lir.Store) -> None:
        buf, align = s.buffer, s.buffer.itemsize
        if self.vec is None:
            value = self.to_memory(self.expr(s.value), buf.dtype)
            self.b.store(value, self.element_ptr(buf, s.indices), align=align)
            return
        index_lanes = max((self.lanes(i) for i in s.indices), default=1)
        reads_self = any(ld.buffer == buf for ld in loads(s))
        if index_lanes == 1:
            if self._vector_reduction(s):
                return
            if reads_self:
                return self.scalarize(s)
            with self.at_lane(self.vec.lanes - 1):  # the last lane's store is the one that stays
                self._store(s)
            return
        value = self.to_memory(self.splat(self.expr(s.value), self.vec.lanes), buf.dtype)
        if self.is_contiguous(buf, s.indices):
            if self.mask is not None:
                ptr = self.vector_ptr(buf, s.indices, masked=True)
                return self.masked_store(value, ptr, self.mask, align)
            self.b.store(value, self.vector_ptr(buf, s.indices), align=align)
            return
        for k in range(self.vec.lanes):  # scatter
            lane = self.b.extract_element(value, ir.Constant(T.I32, k))
            with self.at_lane(k):
                self.b.store(lane, self.element_ptr(buf, s.indices), align=align)

    def _vector_reduction(self, s: lir.Store) -> bool:
        """``acc[i] = acc[i] op f(v)`` inside a loop vectorized over ``v`` with ``i`` not
        depending on ``v``: reduce the vector of ``f`` and combine it once."""
        assert self.vec is not None
        v = s.value
        rest = accumulated(s)
        if rest is None or s.buffer.dtype == "bool":
            return False
        assert isinstance(v, E.Binary)
        dtype = s.buffer.dtype
        is_float = dt.is_float(dtype)
        name = _REDUCE[v.op][1 if is_float else 0]
        if name is None:
            signed = dt.is_signed(dtype)
            name = f"llvm.vector.reduce.{'s' if signed else 'u'}{v.op}"
        vec = self.splat(self.expr(rest), self.vec.lanes)
        ptr = self.element_ptr(s.buffer, s.indices)
        old = self.b.load(ptr, align=s.buffer.itemsize)
        suffix = f"v{self.vec.lanes}{_type_suffix(dtype)}"
        if is_float and v.op in (Op.ADD, Op.MUL):  # these take the start value
            fn = self.state.function(f"{name}.{suffix}", old.type, [old.type, vec.type])
            new = self.b.call(fn, [old, vec], fastmath=("reassoc",) + FP_FLAGS)
        else:
            fn = self.state.function(f"{name}.{suffix}", old.type, [vec.type])
            new = self.binop(v.op, old, self.b.call(fn, [vec]), dtype)
        self.b.store(new, ptr, align=s.buffer.itemsize)
        return True

    # --- loops -------------------------------------------------------------------------------

    def _For(self, s: lir.For) -> None:
        if s.kind == "thread":
            raise CompileError(
                f"loop {s.var.name} is bound to {s.thread_tag}; GPU thread bindings need the "
                "cuda target, the LLVM backend runs on CPUs"
            )
        if self.vec is not None and (self.lanes(s.min) > 1 or self.lanes(s.extent) > 1):
            return self.scalarize(s)
        extent = int(s.extent.value) if isinstance(s.extent, E.Const) else None
        self._check_range(s)
        pragmas = dict(s.annotations)
        if "auto_unroll_max_step" in pragmas:
            saved = self.auto_unroll
            self.auto_unroll = (int(pragmas["auto_unroll_max_step"]),
                                bool(pragmas.get("unroll_explicit", True)))
            try:
                return self._For_kind(s, extent)
            finally:
                self.auto_unroll = saved
        return self._For_kind(s, extent)

    def _check_range(self, s: lir.For) -> None:
        """A loop whose constant bounds its variable's dtype cannot count would wrap (and run
        no iteration, or the wrong ones): a tensor too large for int32 indices."""
        if not isinstance(s.extent, E.Const) or not dt.is_int(s.var.dtype):
            return
        lo = s.min.value if isinstance(s.min, E.Const) else 0
        top = int(np.iinfo(s.var.dtype).max)
        if lo + s.extent.value - 1 > top:
            raise CompileError(
                f"{self.fn.name}: loop {s.var.name} runs to {lo + s.extent.value - 1}, beyond "
                f"what its {s.var.dtype} variable counts ({top}); the tensor is too large")

    def _For_kind(self, s: lir.For, extent: int | None) -> None:
        kind = s.kind
        tensorized = dict(s.annotations).get("tensorize")
        if tensorized is not None:
            return self._tensorized(s, str(tensorized))
        if kind == "serial" and extent is not None and self.auto_unroll[0] > 0:
            # TVM's auto_unroll_max_step: unroll loops whose whole nest runs at most that often
            if extent * _trip_count(s.body) <= self.auto_unroll[0]:
                if not self.auto_unroll[1]:
                    return self._serial_for(s, "llvm.loop.unroll.full")
                kind = "unrolled"
        if kind == "parallel" and not self.in_parallel and self.vec is None:
            from autosched.targets.llvm.parallel import emit_parallel_for

            return emit_parallel_for(self, s)
        if kind == "vectorized" and self.vec is None and extent is not None:
            return self._vector_for(s, extent)
        if kind == "unrolled" and extent is not None and extent <= MAX_UNROLL:
            lo = self._loop_value(s.min, s.var)
            for k in range(extent):
                self.env[s.var.uid] = lo if k == 0 else self.b.add(lo, ir.Constant(lo.type, k))
                self.stmt(s.body)
            self.env.pop(s.var.uid, None)
            return
        hint = {"unrolled": "llvm.loop.unroll.full", "vectorized": "llvm.loop.vectorize.enable"}
        self._serial_for(s, hint.get(kind))

    def _tensorized(self, s: lir.For, name: str) -> None:
        from autosched.targets.llvm.dot import emit_dot

        intrin = TENSOR_INTRINS.get(name)
        if intrin is None or intrin.kind != "dot":
            raise CompileError(f"{self.fn.name}: loop {s.var.name} is tensorized with {name}, "
                               "which has no CPU form")
        emit_dot(self, s, intrin)

    def _loop_value(self, e: E.Expr, var: E.Var) -> ir.Value:
        v = self.expr(e)
        ty = T.scalar(var.dtype)
        if v.type == ty:
            return v
        if v.type.width > ty.width:
            return self.b.trunc(v, ty)
        return self.b.sext(v, ty) if dt.is_signed(e.dtype) else self.b.zext(v, ty)

    def _serial_for(self, s: lir.For, hint: str | None) -> None:
        lo = self._loop_value(s.min, s.var)
        if isinstance(s.extent, E.Const) and s.extent.value == 1:
            self.env[s.var.uid] = lo
            self.stmt(s.body)
            self.env.pop(s.var.uid, None)
            return
        ext = self._loop_value(s.extent, s.var)

        def body(i: ir.Value) -> None:
            self.env[s.var.uid] = i
            self.stmt(s.body)

        self.loop(lo, ext, body, hint)
        self.env.pop(s.var.uid, None)

    def loop(self, lo: ir.Value, extent: ir.Value, body: Callable[[ir.Value], None],
             hint: str | None = None, signed: bool = True) -> None:
        """``for i in range(lo, lo + extent): body(i)`` as a header with a phi."""
        if isinstance(extent, ir.Constant) and extent.constant == 0:
            return
        hi = self.b.add(lo, extent)
        pre = self.b.block
        head, loop_body, end = (self.new_block(x) for x in ("for.head", "for.body", "for.end"))
        self.b.branch(head)
        self.b.position_at_end(head)
        i = self.b.phi(lo.type, name="i")
        i.add_incoming(lo, pre)
        cmp = self.b.icmp_signed if signed else self.b.icmp_unsigned
        self.b.cbranch(cmp("<", i, hi), loop_body, end)
        self.b.position_at_end(loop_body)
        body(i)
        nxt = self.b.add(i, ir.Constant(lo.type, 1), flags=["nsw"] if signed else [])
        back = self.b.branch(head)
        i.add_incoming(nxt, self.b.block)
        if hint is not None:
            back.set_metadata("llvm.loop", self._loop_md(hint))
        self.b.position_at_end(end)

    def _loop_md(self, hint: str) -> ir.MDValue:
        m = self.module
        flag = m.add_metadata([ir.MetaDataString(m, hint), ir.Constant(T.I1, 1)]
                              if hint.endswith("enable") else [ir.MetaDataString(m, hint)])
        node = m.add_metadata([ir.MetaDataString(m, f"loop.{m.get_unique_name()}"), flag])
        node.operands = (node,) + tuple(node.operands[1:])  # a loop id refers to itself
        return node

    def _vector_for(self, s: lir.For, extent: int) -> None:
        """Vectors of the CPU's width: a power of two up to it, or a power-of-two multiple of
        it (up to MAX_LANES), stays one LLVM vector, which LLVM splits evenly; other extents
        are cut into full-width pieces and a remainder in powers of two. LLVM handles other
        widths badly: it widens <48 x float> (3 AVX-512 vectors) to 64 lanes element by element
        (a 1x1 conv whose register tile was 48 channels ran 20x slower than with 32), and its
        SLP vectorizer (LLVM 22, 512-bit registers) miscompiled a Winograd input transform
        whose 15-lane loops gathered in a parallel body: lanes 7-14 of a third of its tiles
        wrong, for some transform matrices and not others (a tuning run's WRONG_ANSWER on
        dnsmos_sig_bak_ovr)."""
        body = inline_lets_on(s.body, s.var)
        lo = self._loop_value(s.min, s.var)
        native = self._native_lanes(body)
        pieces = extent // native
        if (extent <= native and extent & (extent - 1) == 0) or (
                extent % native == 0 and extent <= MAX_LANES and pieces & (pieces - 1) == 0):
            return self._vector_piece(body, s.var, lo, 0, extent)
        full, rest = divmod(extent, native)
        if full <= MAX_UNROLL_PIECES:
            for c in range(full):
                self._vector_piece(body, s.var, lo, c * native, native)
        else:
            width = ir.Constant(lo.type, native)

            def piece(c: ir.Value) -> None:
                start = self.b.add(lo, self.b.mul(c, width))
                with self.vector(VectorContext(s.var, native, start)):
                    self.stmt(body)

            self.loop(ir.Constant(lo.type, 0), ir.Constant(lo.type, full), piece)
        offset = full * native
        while rest:
            width = 1 << (rest.bit_length() - 1)
            self._vector_piece(body, s.var, lo, offset, width)
            offset, rest = offset + width, rest - width

    def _vector_piece(self, body: lir.Stmt, var: E.Var, lo: ir.Value, offset: int,
                      lanes: int) -> None:
        start = lo if offset == 0 else self.b.add(lo, ir.Constant(lo.type, offset))
        if lanes == 1:
            self.env[var.uid] = start
            self.stmt(body)
            self.env.pop(var.uid, None)
            return
        first = lo.constant + offset if isinstance(lo, ir.Constant) else None
        with self.vector(VectorContext(var, lanes, start, first)):
            self.stmt(body)

    def _native_lanes(self, body: lir.Stmt) -> int:
        bits = [dt.bits(ld.buffer.dtype) for ld in loads(body)]
        bits += [dt.bits(st.buffer.dtype) for st in all_stmts(body) if isinstance(st, lir.Store)]
        widest = max([b for b in bits if b >= 8] or [32])
        return max(self.state.vector_bits // widest, 2)

    # --- storage -----------------------------------------------------------------------------

    def _Allocate(self, s: lir.Allocate) -> None:
        buf = s.buffer
        if self.vec is not None:
            return self.scalarize(s)  # each lane needs its own copy
        elem = T.memory(buf.dtype)
        count: int | None = 1
        for d in buf.shape:
            count = count * int(d.value) if isinstance(d, E.Const) and count is not None else None
        limit = STACK_BYTES.get(buf.scope, STACK_BYTES["global"])
        if count is not None and count * buf.itemsize <= limit:
            slot = self.allocas.alloca(ir.ArrayType(elem, max(count, 1)), name=buf.name)
            slot.align = ALLOC_ALIGN
            self.ptrs[buf.uid] = self.allocas.bitcast(slot, elem.as_pointer())
            self.stmt(s.body)
            self.ptrs.pop(buf.uid)
            return
        if count is not None and count * buf.itemsize > MAX_BYTES:
            shape = ", ".join(str(d) for d in buf.shape)
            raise CompileError(f"buffer {buf.name} of shape ({shape}) and dtype {buf.dtype} "
                               f"needs {count * buf.itemsize} bytes, more than int64 can count")
        nbytes, too_big = self._alloc_bytes(buf)
        fail_bb, try_bb, body_bb, end_bb = (self.new_block(f"alloc.{x}")
                                            for x in ("fail", "try", "body", "end"))
        self.b.cbranch(too_big, fail_bb, try_bb)
        self.b.position_at_end(try_bb)
        alloc = self.state.function("aligned_alloc", T.I8P, [T.I64, T.I64])
        raw = self.b.call(alloc, [ir.Constant(T.I64, ALLOC_ALIGN), nbytes])
        self.b.cbranch(self.b.icmp_unsigned("==", raw, ir.Constant(T.I8P, None)), fail_bb,
                       body_bb)
        self.b.position_at_end(fail_bb)  # out of memory: report it, skip what needs the buffer
        self.fail(STATUS_ALLOC)
        self.b.branch(end_bb)
        self.b.position_at_end(body_bb)
        self.ptrs[buf.uid] = self.b.bitcast(raw, elem.as_pointer())
        self.stmt(s.body)
        self.ptrs.pop(buf.uid)
        self.b.call(self.state.function("free", T.VOID, [T.I8P]), [raw])
        self.b.branch(end_bb)
        self.b.position_at_end(end_bb)

    def _alloc_bytes(self, buf: lir.Buffer) -> tuple[ir.Value, ir.Value]:
        """The byte count of ``buf``, rounded up to a multiple of the alignment (aligned_alloc
        wants one), and an i1 that holds when a dim is negative or the count overflows."""
        mul = self.state.function("llvm.smul.with.overflow.i64",
                                  ir.LiteralStructType([T.I64, T.I1]), [T.I64, T.I64])
        nbytes: ir.Value = ir.Constant(T.I64, buf.itemsize)
        bad: ir.Value = ir.Constant(T.I1, 0)
        for d in buf.shape:
            n = self.index(d)
            bad = self.b.or_(bad, self.b.icmp_signed("<", n, ir.Constant(T.I64, 0)))
            prod = self.b.call(mul, [nbytes, n])
            nbytes = self.b.extract_value(prod, 0)
            bad = self.b.or_(bad, self.b.extract_value(prod, 1))
        bad = self.b.or_(bad, self.b.icmp_signed(">", nbytes, ir.Constant(T.I64, MAX_BYTES)))
        mask = ir.Constant(T.I64, ALLOC_ALIGN - 1)
        return self.b.and_(self.b.add(nbytes, mask), self.b.not_(mask)), bad


def _trip_count(s: lir.Stmt) -> float:
    """How often the innermost statement of the deepest nest under ``s`` runs (inf when a loop
    extent is not a constant)."""
    if isinstance(s, lir.For):
        if not isinstance(s.extent, E.Const):
            return float("inf")
        return s.extent.value * _trip_count(s.body)
    return max((_trip_count(c) for c in sub_stmts(s)), default=1)


def _type_suffix(dtype: str) -> str:
    return {"float16": "f16", "float32": "f32", "float64": "f64"}.get(dtype, f"i{dt.bits(dtype)}")


def build_ir(func: lir.PrimFunc, triple: str = "", data_layout: str = "",
             vector_bits: int = 128, features: tuple[str, ...] = ()
             ) -> tuple[ir.Module, Signature]:
    """The LLVM module for ``func`` and the signature of its exported function; ``features``
    the target's key features (cpu_features.key_features: what tensorized nests may use)."""
    sig = signature(func)
    module = ir.Module(name=func.name)
    if triple:
        module.triple = triple
    if data_layout:
        module.data_layout = data_layout
    state = ModuleState(module, sig, vector_bits, features=features)
    arg_types = [T.memory(b.dtype).as_pointer() for b in sig.params] + [T.I64] * len(sig.sym_vars)
    fn = ir.Function(module, ir.FunctionType(T.I32, arg_types), sig.symbol)
    fn.attributes.add("nounwind")
    gen = FuncGen(state, fn)
    gen.status = gen.allocas.alloca(T.I32, name="status")
    gen.allocas.store(ir.Constant(T.I32, 0), gen.status, align=4)
    for buf, arg in zip(sig.params, fn.args):
        arg.name = buf.name
        arg.add_attribute("noalias")
        arg.add_attribute("nonnull")
        arg.attributes.align = PARAM_ALIGN
        gen.ptrs[buf.uid] = arg
    for var, arg in zip(sig.sym_vars, fn.args[len(sig.params):]):
        arg.name = var.name
        ty = T.scalar(var.dtype)
        gen.env[var.uid] = arg if ty == T.I64 else gen.b.trunc(arg, ty)
    gen.stmt(func.body)
    gen.finish()
    return module, sig


__all__ = ["FuncGen", "ModuleState", "build_ir"]
