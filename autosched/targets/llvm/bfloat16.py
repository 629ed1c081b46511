"""bfloat16 in LLVM IR: stored as i16 (the upper half of a float32's bits) and converted by
shifts, so no CPU feature or compiler-rt routine is needed (LLVM's ``bfloat`` type would call
``__truncsfbf2``, which the JIT does not link). Values are scalars or vectors alike."""

from __future__ import annotations

import llvmlite.ir as ir

from autosched.targets.llvm import types as T


def _like(value: ir.Value, elem: ir.Type) -> ir.Type:
    t = value.type
    return ir.VectorType(elem, t.count) if isinstance(t, ir.VectorType) else elem


def _splat(value: ir.Value, n: int) -> ir.Constant:
    """The i32 constant ``n`` shaped like ``value``."""
    ty = _like(value, T.I32)
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(T.I32, n)] * ty.count)
    return ir.Constant(ty, n)


def to_float(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """float32 of the bfloat16 ``bits`` (exact: the bits become a float32's upper half)."""
    wide = b.shl(b.zext(bits, _like(bits, T.I32)), _splat(bits, 16))
    return b.bitcast(wide, _like(bits, ir.FloatType()))


def from_float(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The bfloat16 bits nearest to float32 ``x`` (round to nearest even; NaN stays a quiet
    NaN, overflow becomes inf)."""
    bits = b.bitcast(x, _like(x, T.I32))
    odd = b.and_(b.lshr(bits, _splat(x, 16)), _splat(x, 1))
    rounded = b.lshr(b.add(bits, b.add(_splat(x, 0x7FFF), odd)), _splat(x, 16))
    nan = b.fcmp_unordered("uno", x, x)
    out = b.select(nan, _splat(x, 0x7FC0), rounded)
    return b.trunc(out, _like(x, ir.IntType(16)))
