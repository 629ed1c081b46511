"""Tensorized 8-bit dot products (tensor intrinsic kind "dot", tir/tensor_intrin.py).

The nest ``for j in n: for q in 4: C[.., j] += int32(A[.., q]) * int32(B[.., j, q])`` is one
instruction: C's n int32 accumulators, A's 4 uint8 bytes broadcast to every lane, B's 4n
bytes (each lane's 4 taps adjacent); each lane adds its 4 products (no saturation). x86:
``vpdpbusd`` (AVX-512 VNNI, 16 lanes; AVX-VNNI, 8), B int8. aarch64 (4 lanes): ``usdot``
(i8mm), B int8; ``udot`` (dotprod), B uint8. The same loop's reduction init (``C[.., j] =
0``, the nest without its q loop) runs as an ordinary vectorized loop. A nest whose accesses
are not laid out so (a guard, a stride other than the intrinsic's) runs as plain loops, as
it would untensorized: slow, never wrong.

Example (what the sketch does to te.ops.quant.matmul_dot4's stage)::

    s[C].reorder(..., ji, q)
    s[C].tensorize(ji, "vnni_dot_16x4_u8s8")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llvmlite.ir as ir

from autosched.errors import CompileError
from autosched.targets.llvm.cpu_features import dot_allowed
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.tir import ir as lir
from autosched.tir.arith import simplify
from autosched.tir.tensor_intrin import DOT_8X4, DOT_16X4, UDOT_4X4, USDOT_4X4, TensorIntrin
from autosched.tir.visit import linear_coeff

if TYPE_CHECKING:
    from autosched.targets.llvm.codegen import FuncGen

# the LLVM intrinsic of each (AVX-VNNI's VEX form is selected from the 256-bit vpdpbusd); x86's
# take their bytes as int32 vectors, aarch64's as 16 x i8 (the unsigned operand first)
LLVM_DOT = {DOT_16X4: "llvm.x86.avx512.vpdpbusd.512", DOT_8X4: "llvm.x86.avx512.vpdpbusd.256",
            USDOT_4X4: "llvm.aarch64.neon.usdot.v4i32.v16i8",
            UDOT_4X4: "llvm.aarch64.neon.udot.v4i32.v16i8"}


def emit_dot(w: FuncGen, s: lir.For, intrin: TensorIntrin) -> None:
    """Emit the loop ``s`` tensorized with the dot intrinsic ``intrin`` (see the module)."""
    lanes, taps = intrin.extents
    if not dot_allowed(intrin.name, w.state.features):
        raise CompileError(f"{w.fn.name}: {intrin.name} needs the CPU feature {intrin.feature}, "
                           "which the target lacks")
    extent = s.extent.value if isinstance(s.extent, E.Const) else None
    if extent != lanes:
        raise CompileError(f"{w.fn.name}: {intrin.name} tensorizes a loop of {lanes}, not "
                           f"{s.var.name} of {s.extent}")
    if not isinstance(s.body, lir.For):  # the reduction's init: a plain vector store
        return w._vector_for(s, lanes)
    parts = _parts(s, s.body, intrin)
    if parts is None:
        return w._serial_for(s, None)
    store, a, b = parts
    q = s.body
    w.env[s.var.uid] = w._loop_value(s.min, s.var)
    w.env[q.var.uid] = w._loop_value(q.min, q.var)
    i32 = ir.IntType(32)
    vec = ir.VectorType(i32, lanes)
    c_ptr = w.b.bitcast(w.element_ptr(store.buffer, store.indices), vec.as_pointer())
    acc = w.b.load(c_ptr, align=4)
    word = w.b.load(w.b.bitcast(w.element_ptr(a.buffer, a.indices), i32.as_pointer()), align=1)
    spread = w.splat(word, lanes)
    weights = w.b.load(w.b.bitcast(w.element_ptr(b.buffer, b.indices), vec.as_pointer()),
                       align=1)
    operand = vec
    if intrin.name in (USDOT_4X4, UDOT_4X4):  # NEON's take bytes
        operand = ir.VectorType(ir.IntType(8), 4 * lanes)
        spread, weights = w.b.bitcast(spread, operand), w.b.bitcast(weights, operand)
    name = LLVM_DOT[intrin.name]
    fn = w.module.globals.get(name)
    if fn is None:
        fn = ir.Function(w.module, ir.FunctionType(vec, [vec, operand, operand]), name)
    w.b.store(w.b.call(fn, [acc, spread, weights]), c_ptr, align=4)
    w.env.pop(s.var.uid, None)
    w.env.pop(q.var.uid, None)


def _parts(lane: lir.For, tap: lir.For, intrin: TensorIntrin
           ) -> tuple[lir.Store, lir.Load, lir.Load] | None:
    """The update's store and its broadcast and per-lane loads, when the nest is the
    intrinsic's: ``lane`` of its lanes around ``tap`` of its 4 taps holding ``C[..] = C[..] +
    int32(A) * int32(B)`` with C contiguous in the lane, A (``in_dtype``) moving with the tap
    alone, B (``b_dtype``) four bytes a lane and one a tap."""
    lanes, taps = intrin.extents
    st = tap.body
    starts = [x.min for x in (lane, tap)]
    if not all(isinstance(m, E.Const) and m.value == 0 for m in starts):
        return None
    if not (isinstance(tap.extent, E.Const) and tap.extent.value == taps
            and isinstance(st, lir.Store) and isinstance(st.value, E.Binary)
            and st.value.op is Op.ADD):
        return None
    summands = (st.value.a, st.value.b)
    acc = [x for x in summands if isinstance(x, lir.Load) and x.buffer is st.buffer]
    prod = [x for x in summands if isinstance(x, E.Binary) and x.op is Op.MUL]
    if len(acc) != 1 or len(prod) != 1 or st.buffer.dtype != "int32":
        return None
    loads = []
    for x in (prod[0].a, prod[0].b):
        if not (isinstance(x, E.Cast) and x.dtype == "int32" and isinstance(x.value, lir.Load)):
            return None
        loads.append(x.value)

    bounds: dict[E.Var, tuple[int | None, int | None]] = {
        lane.var: (0, lanes - 1), tap.var: (0, taps - 1)}  # both loops start at 0

    def moves(buf: lir.Buffer, indices: tuple[E.Expr, ...], var: E.Var) -> int | None:
        """The constant stride of the flat offset in ``var`` (its panels' divisions by a
        multiple of the lanes resolved by the loops' bounds), or None."""
        return linear_coeff(simplify(lir.flat_offset(buf, indices), bounds, lanes=True), var)

    if moves(loads[1].buffer, loads[1].indices, lane.var) == 0:
        loads.reverse()  # the broadcast operand first
    a, b = loads
    if (a.buffer.dtype, b.buffer.dtype) != (intrin.in_dtype, intrin.b_dtype):
        return None
    want = ((st.buffer, st.indices, 1, 0), (a.buffer, a.indices, 0, 1),
            (b.buffer, b.indices, taps, 1))
    for buf, indices, per_lane, per_tap in want:
        if (len(indices) != len(buf.shape) or moves(buf, indices, lane.var) != per_lane
                or moves(buf, indices, tap.var) != per_tap):
            return None
    if len(acc[0].indices) != len(st.indices) or not all(
            E.structural_equal(x, y) for x, y in zip(acc[0].indices, st.indices)):
        return None
    return st, a, b
