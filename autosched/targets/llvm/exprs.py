"""Expressions of the loop IR as LLVM values, scalar or vector.

Inside a vectorized loop over ``v`` (``self.vec``), an expression that depends on ``v`` becomes a
vector of ``lanes`` values and one that does not stays scalar; mixing the two broadcasts the
scalar. Loads whose flattened index is ``v`` plus terms without ``v`` become one vector load;
loads ``s`` elements apart per lane (a stride-2 convolution's row: ``x * 2 + rx``) one load of
``s`` times the lanes and a shuffle, for ``s`` up to STRIDED_LOAD_MAX; so do loads whose lanes
sit at other constant offsets from lane 0's (``lane_pattern``: ``x // 4``, ``x % 4 * 6``;
``pattern_load`` serves both); other lane-dependent loads are done lane by lane (``at_lane``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import llvmlite.ir as ir
import numpy as np

from autosched.errors import CompileError
from autosched.targets.llvm import bfloat16, intrinsics
from autosched.targets.llvm import types as T
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import post_order
from autosched.tir import ir as lir
from autosched.tir.arith import simplify
from autosched.tir.arith.linear import Key
from autosched.tir.visit import linear_coeff, uses_var

# Let LLVM fuse a*b+c into an FMA in a reduction's update, acc + a*b (numpy's BLAS and
# onnxruntime's GEMM and convolution kernels do too), and nowhere else: onnxruntime rounds the
# result of every op, so a fused elementwise chain (an LSTM cell's f*c + i*g) must round each
# product as it does, or a dynamically quantized model flips roundings. No other fast-math
# freedom.
FP_FLAGS = ("contract",)

# The LLVM instructions of the ops that map to one (integer division: signed, unsigned).
_LOGICAL = {Op.AND: ir.IRBuilder.and_, Op.OR: ir.IRBuilder.or_}
_INT_ARITH = {Op.ADD: ir.IRBuilder.add, Op.SUB: ir.IRBuilder.sub, Op.MUL: ir.IRBuilder.mul}
_FLOAT_ARITH = {Op.ADD: ir.IRBuilder.fadd, Op.SUB: ir.IRBuilder.fsub, Op.MUL: ir.IRBuilder.fmul}
_INT_DIVIDE = {
    Op.TRUNCDIV: (ir.IRBuilder.sdiv, ir.IRBuilder.udiv),
    Op.TRUNCMOD: (ir.IRBuilder.srem, ir.IRBuilder.urem),
}
_MIN_MAX = {Op.MIN: "<", Op.MAX: ">"}  # the comparison that picks the first operand

# Lane strides read as one wide load and a shuffle: s vectors and a shuffle beat a gather of
# one scalar load per lane up to a few vectors per result.
STRIDED_LOAD_MAX = 4


@dataclass
class VectorContext:
    var: E.Var  # the vectorized loop variable
    lanes: int
    lane0: ir.Value  # its scalar value in lane 0
    first: int | None = None  # that value when it is a constant (a tile's inner loop: 0, 16)
    # vector_offsets of each load asked (by structure), since deciding how to vectorize a
    # loop and emitting it ask the same loads
    offsets: dict[Key, list[int] | None] = field(default_factory=dict)


def may_trap(e: E.Expr) -> bool:
    """Evaluating ``e`` where its guard is false could fault (a load out of bounds, a division
    by zero), so it must stay behind a branch."""
    for n in post_order(e):
        if isinstance(n, lir.Load):
            return True
        if isinstance(n, E.Binary) and n.op.divides and not isinstance(n.b, E.Const):
            return True
    return False


class ExprGen:
    """Emits expressions with ``self.b``; ``env`` maps variable uids to values and ``ptrs``
    maps buffer uids to element pointers."""

    def __init__(self, module: ir.Module, builder: ir.IRBuilder) -> None:
        self.module = module
        self.b = builder
        self.env: dict[int, ir.Value] = {}
        self.ptrs: dict[int, ir.Value] = {}
        self.vec: VectorContext | None = None
        self._lanes: dict[int, tuple[E.Expr, int]] = {}
        self._index_mode = False
        # Inside a lane-dependent ``if`` (codegen's masked branch): the lanes where it holds.
        # Contiguous loads and stores then touch only those lanes.
        self.mask: ir.Value | None = None
        # Whether float + - * may fuse (FP_FLAGS): codegen sets it for accumulating stores.
        self.contract = False

    # --- helpers -----------------------------------------------------------------------------

    def const(self, value: int | float | bool, dtype: str) -> ir.Constant:
        ty = T.scalar(dtype)
        if dtype == "bool":
            return ir.Constant(ty, int(bool(value)))
        if dtype == "bfloat16":
            return ir.Constant(ty, int(np.array(value, dt.to_numpy(dtype)).view(np.int16)))
        if dt.is_float(dtype):
            return ir.Constant(ty, float(value))
        v, bits = int(value), dt.bits(dtype)
        if v >= 1 << (bits - 1):  # unsigned constants are written in two's complement
            v -= 1 << bits
        return ir.Constant(ty, v)

    def splat(self, value: ir.Value, lanes: int) -> ir.Value:
        if lanes == 1 or isinstance(value.type, ir.VectorType):
            return value
        vty = ir.VectorType(value.type, lanes)
        if isinstance(value, ir.Constant):
            return ir.Constant(vty, [value] * lanes)
        one = self.b.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(T.I32, 0))
        mask = ir.Constant(ir.VectorType(T.I32, lanes), [0] * lanes)
        return self.b.shuffle_vector(one, ir.Constant(vty, ir.Undefined), mask)

    def unify(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        n = max(T.lanes_of(a), T.lanes_of(b))
        return self.splat(a, n), self.splat(b, n)

    def lanes(self, e: E.Expr) -> int:
        """How many lanes ``e`` has in the current context (1 unless it depends on ``v``)."""
        if self.vec is None:
            return 1
        hit = self._lanes.get(id(e))
        if hit is None or hit[0] is not e:  # the node is kept in the entry so its id stays its own
            hit = (e, self.vec.lanes if uses_var(e, self.vec.var) else 1)
            self._lanes[id(e)] = hit
        return hit[1]

    @contextlib.contextmanager
    def vector(self, ctx: VectorContext | None) -> Iterator[None]:
        """Emit inside a vectorized loop (``ctx``) or, with None, as plain scalar code."""
        saved = (self.vec, self._lanes, self.env.get(ctx.var.uid) if ctx else None)
        self.vec, self._lanes = ctx, {}
        if ctx is not None:
            lane0 = self.splat(ctx.lane0, ctx.lanes)
            ty = ctx.lane0.type
            iota = ir.Constant(ir.VectorType(ty, ctx.lanes), [ir.Constant(ty, k)
                                                             for k in range(ctx.lanes)])
            self.env[ctx.var.uid] = self.b.add(lane0, iota)
        try:
            yield
        finally:
            self.vec, self._lanes = saved[0], saved[1]
            if ctx is not None:
                if saved[2] is None:
                    self.env.pop(ctx.var.uid, None)
                else:
                    self.env[ctx.var.uid] = saved[2]

    @contextlib.contextmanager
    def at_lane(self, k: int | ir.Value) -> Iterator[None]:
        """Emit scalar code for lane ``k`` (a number, or a value of the loop variable's type)
        of the current vectorized loop."""
        ctx = self.vec
        assert ctx is not None
        saved = (self._lanes, self.env[ctx.var.uid])
        self.vec, self._lanes = None, {}
        if isinstance(k, int):
            kc = ir.Constant(ctx.lane0.type, k)
            self.env[ctx.var.uid] = ctx.lane0 if k == 0 else self.b.add(ctx.lane0, kc)
        else:
            self.env[ctx.var.uid] = self.b.add(ctx.lane0, k)
        try:
            yield
        finally:
            self.vec, self._lanes = ctx, saved[0]
            self.env[ctx.var.uid] = saved[1]

    def per_lane(self, e: E.Expr) -> ir.Value:
        """``e`` evaluated lane by lane and gathered into a vector."""
        assert self.vec is not None
        out: ir.Value = ir.Constant(T.of(e.dtype, self.vec.lanes), ir.Undefined)
        for k in range(self.vec.lanes):
            with self.at_lane(k):
                x = self.expr(e)
            out = self.b.insert_element(out, x, ir.Constant(T.I32, k))
        return out

    def new_block(self, name: str) -> ir.Block:
        return self.b.append_basic_block(name)

    # --- memory ------------------------------------------------------------------------------

    def pointer(self, buf: lir.Buffer) -> ir.Value:
        ptr = self.ptrs.get(buf.uid)
        if ptr is None:
            raise CompileError(
                f"buffer {buf.name} is used but is neither a parameter nor allocated here"
            )
        return ptr

    def index(self, e: E.Expr) -> ir.Value:
        """An index expression as i64 (scalar or vector); index arithmetic cannot wrap."""
        saved, self._index_mode = self._index_mode, True
        try:
            v = self.expr(e)
        finally:
            self._index_mode = saved
        target = T.of("int64", T.lanes_of(v))
        if v.type == target:
            return v
        return self.b.sext(v, target) if dt.is_signed(e.dtype) else self.b.zext(v, target)

    def offset(self, buf: lir.Buffer, indices: tuple[E.Expr, ...]) -> ir.Value:
        """Row-major element offset of ``buf[indices]`` (Horner form over the shape)."""
        if len(indices) != len(buf.shape):
            raise CompileError(
                f"buffer {buf.name} has {len(buf.shape)} dims but is indexed with {len(indices)}"
            )
        if not indices:
            return ir.Constant(T.I64, 0)
        merged, was_merged = lir.access_offset(buf, indices)
        if was_merged:  # a reshape's divisions merged away
            return self.index(merged)
        off = self.index(indices[0])
        for dim, idx in zip(buf.shape[1:], indices[1:]):
            d = self.index(dim)
            i = self.index(idx)
            off, d = self.unify(off, d)
            off, i = self.unify(self.b.mul(off, d, flags=["nsw"]), i)
            off = self.b.add(off, i, flags=["nsw"])
        return off

    def is_contiguous(self, buf: lir.Buffer, indices: tuple[E.Expr, ...]) -> bool:
        """In the vectorized loop, the access moves by one element per lane."""
        return self.lane_stride(buf, indices) == 1

    def lane_stride(self, buf: lir.Buffer, indices: tuple[E.Expr, ...]) -> int | None:
        """How many elements the access moves per lane of the vectorized loop: the last
        index's coefficient when no other index depends on the lane, or (when some index is
        not affine in the lane: a reshape's floordiv / floormod) the simplified row-major
        offset's, e.g. 1 for ``A[p // 14, p % 14]``; None when it is no constant."""
        assert self.vec is not None
        coeffs = [linear_coeff(i, self.vec.var) for i in indices]
        if None not in coeffs:
            return coeffs[-1] if coeffs and all(c == 0 for c in coeffs[:-1]) else None
        if len(indices) != len(buf.shape):
            return None
        return linear_coeff(simplify(lir.flat_offset(buf, indices)), self.vec.var)

    def element_ptr(self, buf: lir.Buffer, indices: tuple[E.Expr, ...],
                    inbounds: bool = True) -> ir.Value:
        return self.b.gep(self.pointer(buf), [self.offset(buf, indices)], inbounds=inbounds)

    def vector_ptr(self, buf: lir.Buffer, indices: tuple[E.Expr, ...],
                   masked: bool = False) -> ir.Value:
        """Pointer to the ``lanes`` contiguous elements starting at lane 0 of ``buf[indices]``.
        Under a mask lane 0 may lie outside the buffer, so the address is not ``inbounds``."""
        assert self.vec is not None
        with self.at_lane(0):
            p = self.element_ptr(buf, indices, inbounds=not masked)
        return self.b.bitcast(p, ir.VectorType(T.memory(buf.dtype), self.vec.lanes).as_pointer())

    def from_memory(self, v: ir.Value, dtype: str) -> ir.Value:
        if dtype != "bool":
            return v
        return self.b.icmp_unsigned("!=", v, ir.Constant(v.type, None))

    def to_memory(self, v: ir.Value, dtype: str) -> ir.Value:
        if dtype != "bool":
            return v
        return self.b.zext(v, T.of("uint8", T.lanes_of(v)))

    # --- expressions -------------------------------------------------------------------------

    def expr(self, e: E.Expr) -> ir.Value:
        method = getattr(self, "_" + type(e).__name__, None)
        if method is None:
            raise CompileError(
                f"the LLVM backend cannot emit {type(e).__name__} ({e}); lower the schedule first"
            )
        return method(e)

    def _Const(self, e: E.Const) -> ir.Value:
        return self.const(e.value, e.type)

    def _Var(self, e: E.Var) -> ir.Value:
        v = self.env.get(e.uid)
        if v is None:
            raise CompileError(
                f"variable {e.name} is not bound here (a loop variable used outside its loop, "
                "or a symbolic size that no parameter's shape mentions)"
            )
        return v

    def _Load(self, e: lir.Load) -> ir.Value:
        n = self.lanes(e)
        align = e.buffer.itemsize
        if n == 1:
            return self.from_memory(self.b.load(self.element_ptr(e.buffer, e.indices),
                                                align=align), e.dtype)
        if self.is_contiguous(e.buffer, e.indices):
            ptr = self.vector_ptr(e.buffer, e.indices, masked=self.mask is not None)
            if self.mask is not None:
                zero = ir.Constant(ptr.type.pointee, None)
                return self.masked_load(ptr, self.mask, zero, e.buffer.itemsize)
            return self.from_memory(self.b.load(ptr, align=align), e.dtype)
        offsets = self.vector_offsets(e)
        return self.per_lane(e) if offsets is None else self.pattern_load(e, offsets, self.mask)

    def vector_stride(self, e: lir.Load) -> int | None:
        """The lane stride of a lane-dependent load that loads as vectors: 1 (contiguous) up
        to STRIDED_LOAD_MAX; None for a gather (or bool, whose vectors are no bytes)."""
        stride = None if e.dtype == "bool" else self.lane_stride(e.buffer, e.indices)
        return stride if stride is not None and 1 <= stride <= STRIDED_LOAD_MAX else None

    def vector_offsets(self, e: lir.Load) -> list[int] | None:
        """Each lane's element offset from lane 0's where a lane-dependent load runs as one
        vector load and a shuffle: ``k * s`` for a stride ``s`` (vector_stride), else its
        lane_pattern; None for a load done lane by lane."""
        ctx = self.vec
        assert ctx is not None
        key = Key(e)
        if key not in ctx.offsets:
            stride = self.vector_stride(e)
            ctx.offsets[key] = (self.lane_pattern(e) if stride is None
                                else [k * stride for k in range(ctx.lanes)])
        return ctx.offsets[key]

    def lane_pattern(self, e: lir.Load) -> list[int] | None:
        """Where a lane-dependent load moves no constant stride, the offsets of its lanes
        from lane 0's when they are constants: its offset's terms that depend on the lane
        depend on nothing else and the lanes' values are constants (``first``), as in a
        Winograd output transform's ``rows[.., x.o * 4 + x.i // 4]`` (0, 0, 0, 0, 1, ...) and
        ``at[x.i % 4, r]`` (0, 6, 12, 18, 0, ...); spanning at most STRIDED_LOAD_MAX vectors.
        None otherwise (bool, whose vectors are no bytes, included)."""
        from autosched.tir.evaluate import eval_int

        ctx = self.vec
        if ctx is None or ctx.first is None or e.dtype == "bool":
            return None
        terms = _sum_terms(simplify(lir.flat_offset(e.buffer, e.indices)))
        lane = [(t, sign) for t, sign in terms if uses_var(t, ctx.var)]
        if not lane or any(isinstance(n, lir.Load) or (isinstance(n, E.Var)
                                                       and n.uid != ctx.var.uid)
                           for t, _ in lane for n in post_order(t)):
            return None
        try:
            at = [sum(sign * eval_int(t, {ctx.var.uid: ctx.first + k}) for t, sign in lane)
                  for k in range(ctx.lanes)]
        except Exception:  # a term the integer evaluator cannot fold
            return None
        pattern = [a - at[0] for a in at]
        if max(pattern) - min(pattern) >= ctx.lanes * STRIDED_LOAD_MAX:
            return None
        return pattern

    def pattern_load(self, e: lir.Load, pattern: list[int], mask: ir.Value | None) -> ir.Value:
        """The lanes of ``e`` at ``pattern`` (vector_offsets) from lane 0's element: the span
        they cover loaded as whole vectors (masked past the span, which may end the buffer,
        and, under ``mask``, to the elements from one a lane on ``mask`` reads up to the next
        read one) and shuffled into place; lanes off ``mask`` read zero."""
        assert self.vec is not None
        n, lo = self.vec.lanes, min(pattern)
        span = max(pattern) - lo + 1
        wide = n * -(-span // n)
        readers: list[list[int]] = [[] for _ in range(span)]
        for k, at in enumerate(pattern):
            readers[at - lo].append(k)
        for j in range(1, span):  # an element between two read ones goes with the first
            readers[j] = readers[j] or readers[j - 1]
        read: ir.Value = ir.Constant(ir.VectorType(T.I1, wide), [j < span for j in range(wide)])
        if mask is not None:  # an element is read when one of its lanes is on
            on: ir.Value | None = None
            for level in range(max(len(r) for r in readers)):
                pick = ir.Constant(ir.VectorType(T.I32, wide),
                                   [readers[j][min(level, len(readers[j]) - 1)] if j < span
                                    else 0 for j in range(wide)])
                spread = self.b.shuffle_vector(mask, ir.Constant(mask.type, ir.Undefined), pick)
                on = spread if on is None else self.b.or_(on, spread)
            assert on is not None
            read = self.b.and_(read, on)
        with self.at_lane(0):
            p = self.element_ptr(e.buffer, e.indices, inbounds=False)
        if lo:
            p = self.b.gep(p, [ir.Constant(T.I64, lo)], inbounds=False)
        ptr = self.b.bitcast(p, ir.VectorType(T.memory(e.dtype), wide).as_pointer())
        v = self.masked_load(ptr, read, ir.Constant(ptr.type.pointee, None), e.buffer.itemsize)
        place = ir.Constant(ir.VectorType(T.I32, n), [at - lo for at in pattern])
        return self.b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), place)

    def masked_load(self, ptr: ir.Value, mask: ir.Value, passthru: ir.Value,
                    align: int) -> ir.Value:
        vty = passthru.type
        name = f"llvm.masked.load.{_vector_suffix(vty)}.p0"
        fn = self.module.globals.get(name) or ir.Function(
            self.module, ir.FunctionType(vty, [ptr.type, T.I32, mask.type, vty]), name)
        return self.b.call(fn, [ptr, ir.Constant(T.I32, align), mask, passthru])

    def masked_store(self, value: ir.Value, ptr: ir.Value, mask: ir.Value, align: int) -> None:
        name = f"llvm.masked.store.{_vector_suffix(value.type)}.p0"
        fn = self.module.globals.get(name) or ir.Function(
            self.module, ir.FunctionType(T.VOID, [value.type, ptr.type, T.I32, mask.type]), name)
        self.b.call(fn, [value, ptr, ir.Constant(T.I32, align), mask])

    def _Binary(self, e: E.Binary) -> ir.Value:
        return self.binop(e.op, self.expr(e.a), self.expr(e.b), e.a.dtype)

    def binop(self, op: Op, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
        """``a op b`` on values of ``dtype`` (see expr.Binary for the semantics of ``op``)."""
        a, b = self.unify(a, b)
        bld = self.b
        if op in _LOGICAL:
            return _LOGICAL[op](bld, a, b)
        if op is Op.POW:
            return intrinsics.emit_pow(self, a, b, dtype)
        if dt.is_float(dtype):
            return self._float_binary(op, a, b, dtype)
        signed = dt.is_signed(dtype)
        if op in _INT_ARITH:
            return _INT_ARITH[op](bld, a, b, flags=["nsw"] if self._index_mode and signed else [])
        if op in _MIN_MAX:
            cmp = bld.icmp_signed if signed else bld.icmp_unsigned
            return bld.select(cmp(_MIN_MAX[op], a, b), a, b)
        if op in (Op.FLOORDIV, Op.FLOORMOD) and signed:
            return self._floor_divmod(op, a, b)
        if op.truncating in _INT_DIVIDE:  # unsigned operands: floor and truncation agree
            return _INT_DIVIDE[op.truncating][0 if signed else 1](bld, a, b)
        raise CompileError(f"integer operation {op} on {dtype} has no LLVM form")

    def _float_binary(self, op: Op, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
        bld = self.b
        if op in _FLOAT_ARITH:
            return _FLOAT_ARITH[op](bld, a, b, flags=FP_FLAGS if self.contract else ())
        if op is Op.DIV:
            return bld.fdiv(a, b)
        if op in _MIN_MAX:
            return self._float_minmax(op, a, b)
        if op in (Op.FLOORDIV, Op.FLOORMOD):
            q = intrinsics.llvm_intrinsic(self, "llvm.floor", [bld.fdiv(a, b)], dtype)
            return q if op is Op.FLOORDIV else bld.fsub(a, bld.fmul(q, b))
        raise CompileError(f"float operation {op} on {dtype} has no LLVM form")

    def _float_minmax(self, op: Op, a: ir.Value, b: ir.Value) -> ir.Value:
        """max / min that keep a NaN of either operand (ONNX and numpy do; C's fmax does not).
        ``c > x ? c : x`` is one x86 maxps, which returns its second operand, ``x``, when either
        is NaN; so the operand that may be NaN goes second, and only when both may be NaN does
        a test of the other one follow (Relu, Clip: a constant bound, one instruction)."""
        bld = self.b
        if _nan_free(a):
            a, b = b, a
        out = bld.select(bld.fcmp_ordered(_MIN_MAX[op], b, a), b, a)
        if _nan_free(b):
            return out
        return bld.select(bld.fcmp_unordered("uno", b, b), b, out)

    def _floor_divmod(self, op: Op, a: ir.Value, b: ir.Value) -> ir.Value:
        """Round toward negative infinity: C's quotient is one too big when the remainder is
        non-zero and its sign differs from the divisor's. LLVM folds this for b > 0."""
        bld = self.b
        q, r = bld.sdiv(a, b), bld.srem(a, b)
        zero = ir.Constant(a.type, None)
        fix = bld.and_(bld.icmp_signed("!=", r, zero),
                       bld.icmp_signed("<", bld.xor(r, b), zero))
        if op == Op.FLOORDIV:
            one = self.splat(ir.Constant(a.type.element if T.lanes_of(a) > 1 else a.type, 1),
                             T.lanes_of(a))
            return bld.select(fix, bld.sub(q, one), q)
        return bld.select(fix, bld.add(r, b), r)

    def _Compare(self, e: E.Compare) -> ir.Value:
        a, b = self.unify(self.expr(e.a), self.expr(e.b))
        dtype = e.a.dtype
        if dt.is_float(dtype):
            if e.op is Op.NE:  # NaN != x is true, as in numpy
                return self.b.fcmp_unordered("!=", a, b)
            return self.b.fcmp_ordered(e.op.symbol, a, b)
        if dt.is_signed(dtype):
            return self.b.icmp_signed(e.op.symbol, a, b)
        return self.b.icmp_unsigned(e.op.symbol, a, b)

    def _Not(self, e: E.Not) -> ir.Value:
        return self.b.not_(self.expr(e.a))

    def _Cast(self, e: E.Cast) -> ir.Value:
        return self.convert(self.expr(e.value), e.value.dtype, e.type)

    def convert(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        """``v`` of dtype ``src`` as ``dst``."""
        bld = self.b
        ty = T.of(dst, T.lanes_of(v))
        if src == dst:
            return v
        if src == "bfloat16":  # bfloat16 converts only to and from float32 (by shifts)
            return self.convert(bfloat16.to_float(bld, v), "float32", dst)
        if dst == "bfloat16":
            return bfloat16.from_float(bld, self.convert(v, src, "float32"))
        if dst == "bool":
            zero = ir.Constant(v.type, None)
            if dt.is_float(src):
                return bld.fcmp_unordered("!=", v, zero)
            return bld.icmp_unsigned("!=", v, zero)
        if src == "bool":
            return bld.uitofp(v, ty) if dt.is_float(dst) else bld.zext(v, ty)
        if dt.is_float(src) and dt.is_float(dst):
            return bld.fpext(v, ty) if dt.bits(dst) > dt.bits(src) else bld.fptrunc(v, ty)
        if dt.is_float(src):
            return bld.fptosi(v, ty) if dt.is_signed(dst) else bld.fptoui(v, ty)
        if dt.is_float(dst):
            return bld.sitofp(v, ty) if dt.is_signed(src) else bld.uitofp(v, ty)
        sb, db = dt.bits(src), dt.bits(dst)
        if db < sb:
            return bld.trunc(v, ty)
        if db > sb:
            return bld.sext(v, ty) if dt.is_signed(src) else bld.zext(v, ty)
        return v  # same width, other signedness: the bits stay

    def _Call(self, e: E.Call) -> ir.Value:
        args = [self.expr(a) for a in e.args]
        n = max(T.lanes_of(a) for a in args) if args else 1
        return intrinsics.emit_call(self, e.name, [self.splat(a, n) for a in args], e.type)

    def _Select(self, e: E.Select) -> ir.Value:
        n = self.lanes(e)
        guarded = may_trap(e.true_value) or may_trap(e.false_value)
        if self.lanes(e.cond) == 1:
            cond = self.expr(e.cond)
            if guarded:
                return self._branchy_select(cond, e.true_value, e.false_value, n)
            t, f = self.expr(e.true_value), self.expr(e.false_value)
            return self.b.select(cond, self.splat(t, n), self.splat(f, n))
        if not guarded:
            c, t, f = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
            return self.b.select(c, self.splat(t, n), self.splat(f, n))
        masked = self._masked_load_select(e)
        return masked if masked is not None else self.per_lane(e)

    def _branchy_select(self, cond: ir.Value, tv: E.Expr, fv: E.Expr, n: int) -> ir.Value:
        then_bb, else_bb, merge = (self.new_block(x) for x in ("sel.t", "sel.f", "sel.end"))
        self.b.cbranch(cond, then_bb, else_bb)
        incoming = []
        for bb, side in ((then_bb, tv), (else_bb, fv)):
            self.b.position_at_end(bb)
            value = self.splat(self.expr(side), n)
            incoming.append((value, self.b.block))
            self.b.branch(merge)
        self.b.position_at_end(merge)
        phi = self.b.phi(incoming[0][0].type)
        for value, bb in incoming:
            phi.add_incoming(value, bb)
        return phi

    def masked_select_load(self, e: E.Select) -> lir.Load | None:
        """The load in ``select(c, A[i], x)`` when the select can run as a masked vector load
        of it, strided or a lane pattern (see _masked_load_select), else None."""
        load = e.true_value
        if not (isinstance(load, lir.Load) and not may_trap(e.false_value)
                and self.lanes(load) > 1 and not any(may_trap(i) for i in load.indices)):
            return None
        return None if self.vector_offsets(load) is None else load

    def _masked_load_select(self, e: E.Select) -> ir.Value | None:
        """``select(c, A[i], x)`` with a lane-dependent ``c`` (padding) and ``i`` contiguous,
        strided or a lane pattern: a masked vector load reads only the lanes where ``c``
        holds."""
        assert self.vec is not None
        load = self.masked_select_load(e)
        if load is None:
            return None
        mask = self.expr(e.cond)
        if self.mask is not None:
            mask = self.b.and_(mask, self.mask)
        passthru = self.splat(self.expr(e.false_value), self.vec.lanes)
        offsets = self.vector_offsets(load)
        assert offsets is not None
        if offsets != list(range(self.vec.lanes)):
            return self.b.select(mask, self.pattern_load(load, offsets, mask), passthru)
        ptr = self.vector_ptr(load.buffer, load.indices, masked=True)
        return self.masked_load(ptr, mask, passthru, load.buffer.itemsize)


def _sum_terms(e: E.Expr, sign: int = 1) -> list[tuple[E.Expr, int]]:
    """The terms of a sum (``a + b - c``: a, b and c with their signs)."""
    if isinstance(e, E.Binary) and e.op in (Op.ADD, Op.SUB):
        return _sum_terms(e.a, sign) + _sum_terms(e.b, -sign if e.op is Op.SUB else sign)
    return [(e, sign)]


def _vector_suffix(vty: ir.VectorType) -> str:
    el = vty.element
    kind = {ir.HalfType: "f16", ir.FloatType: "f32", ir.DoubleType: "f64"}.get(type(el))
    return f"v{vty.count}{kind or 'i' + str(el.width)}"


def _nan_free(v: ir.Value) -> bool:
    """True for a float constant (or vector of them) that is not NaN."""
    if not isinstance(v, ir.Constant):
        return False
    values = v.constant if isinstance(v.constant, list) else [v]
    return all(isinstance(c.constant, (int, float)) and not math.isnan(c.constant) for c in values)
