"""Math calls: LLVM intrinsics where LLVM has one, libm otherwise, derived forms for the rest.

Vector operands use the vector form of an LLVM intrinsic (LLVM lowers it, scalarising where the
CPU has no instruction); libm functions have no vector form, so each lane is called in turn.
float16 goes through the float32 libm function (numpy computes float16 math the same way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llvmlite.ir as ir

from autosched.errors import CompileError
from autosched.targets.llvm import types as T
from autosched.te import dtype as dt

if TYPE_CHECKING:
    from autosched.targets.llvm.exprs import ExprGen

LLVM_UNARY = {
    "exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt", "floor": "llvm.floor",
    "ceil": "llvm.ceil", "round": "llvm.roundeven", "sin": "llvm.sin", "cos": "llvm.cos",
    "log2": "llvm.log2", "exp2": "llvm.exp2", "abs": "llvm.fabs",
}
LIBM_UNARY = ("tanh", "erf", "log1p", "expm1")
_SUFFIX = {"float16": "f16", "float32": "f32", "float64": "f64"}


def _function(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    fn = ir.Function(module, fnty, name)
    fn.attributes.add("nounwind")
    return fn


def llvm_intrinsic(gen: ExprGen, base: str, args: list[ir.Value], dtype: str) -> ir.Value:
    """Call ``base`` (e.g. "llvm.exp") overloaded on the type of the first argument."""
    ty = args[0].type
    lanes = T.lanes_of(args[0])
    suffix = _SUFFIX[dtype] if lanes == 1 else f"v{lanes}{_SUFFIX[dtype]}"
    fn = _function(gen.module, f"{base}.{suffix}", ir.FunctionType(ty, [a.type for a in args]))
    return gen.b.call(fn, args)


def _libm(gen: ExprGen, name: str, x: ir.Value, dtype: str) -> ir.Value:
    b = gen.b
    if dtype == "float16":
        wide = b.fpext(x, T.of("float32", T.lanes_of(x)))
        return b.fptrunc(_libm(gen, name, wide, "float32"), x.type)
    if T.lanes_of(x) > 1:
        out = ir.Constant(x.type, ir.Undefined)
        for k in range(T.lanes_of(x)):
            lane = ir.Constant(T.I32, k)
            out = b.insert_element(out, _libm(gen, name, b.extract_element(x, lane), dtype), lane)
        return out
    sym = name + ("f" if dtype == "float32" else "")
    ty = T.scalar(dtype)
    return b.call(_function(gen.module, sym, ir.FunctionType(ty, [ty])), [x])


def emit_call(gen: ExprGen, name: str, args: list[ir.Value], dtype: str) -> ir.Value:
    b = gen.b
    if name == "abs" and not dt.is_float(dtype):
        x = args[0]
        if not dt.is_signed(dtype):
            return x
        zero = gen.splat(gen.const(0, dtype), T.lanes_of(x))
        return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
    if not dt.is_float(dtype):
        raise CompileError(f"intrinsic {name} needs a float operand, got {dtype}")
    x = args[0]
    one = gen.splat(gen.const(1.0, dtype), T.lanes_of(x))
    if name in LLVM_UNARY:
        return llvm_intrinsic(gen, LLVM_UNARY[name], [x], dtype)
    if name in LIBM_UNARY:
        return _libm(gen, name, x, dtype)
    if name == "rsqrt":
        return b.fdiv(one, llvm_intrinsic(gen, "llvm.sqrt", [x], dtype))
    if name == "sigmoid":
        e = llvm_intrinsic(gen, "llvm.exp", [b.fneg(x)], dtype)
        return b.fdiv(one, b.fadd(one, e))
    raise CompileError(f"the LLVM backend has no intrinsic {name!r} (args {len(args)})")


def emit_pow(gen: ExprGen, a: ir.Value, b_: ir.Value, dtype: str) -> ir.Value:
    """a ** b; integer powers go through float64 (exact for the results that fit)."""
    b = gen.b
    if dt.is_float(dtype):
        return llvm_intrinsic(gen, "llvm.pow", [a, b_], dtype)
    lanes = T.lanes_of(a)
    f64 = T.of("float64", lanes)
    conv = b.sitofp if dt.is_signed(dtype) else b.uitofp
    r = llvm_intrinsic(gen, "llvm.pow", [conv(a, f64), conv(b_, f64)], "float64")
    return (b.fptosi if dt.is_signed(dtype) else b.fptoui)(r, a.type)
