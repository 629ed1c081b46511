"""Math calls: LLVM intrinsics where LLVM has one, libm otherwise, derived forms for the rest.

Vector operands use the vector form of an LLVM intrinsic (LLVM lowers it, scalarising where the
CPU has no instruction); libm functions have no vector form, so each lane is called in turn.
float32 erf is computed inline in every lane count (``_erf``; float16 through it), so that
GELU epilogues vectorize and a vectorized schedule and a scalar one give the same bits.
float16 goes through the float32 libm function (numpy computes float16 math the same way).
float32 exp on vectors (softmax) is computed inline (``vector_exp``): LLVM would scalarise it
into one libm call per lane. float32 sigmoid and tanh are onnxruntime's rational functions,
inline too, so that their results are onnxruntime's to the bit (``_rational``, with the table
of autosched/targets/rounding.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llvmlite.ir as ir

from autosched.errors import CompileError
from autosched.targets.llvm import types as T
from autosched.targets.rounding import RATIONAL
from autosched.targets.status import STATUS_INDEX
from autosched.te import dtype as dt
from autosched.te.ops.transform import INDEX_CHECK

if TYPE_CHECKING:
    from autosched.targets.llvm.exprs import ExprGen

LLVM_UNARY = {
    "log": "llvm.log", "sqrt": "llvm.sqrt", "floor": "llvm.floor",
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


# exp(x) = 2^n * exp(r), n = rint(x / ln 2), r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2] (ln 2 split in
# a part exact in float32 and the rest); exp(r) = 1 + r + r^2 p(r), p the minimax polynomial of
# Cephes' expf (about 1 ulp). 2^n is applied in two halves so that n in [-150, 128] (denormal
# results, and the top of the range) stays exact.
_EXP_HI = 88.72283905206835         # ln(FLT_MAX): above it, inf
_EXP_LO = -104.0                    # below ln(smallest denormal): 0
_LOG2E = 1.4426950408889634
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)


def vector_exp(gen: ExprGen, x: ir.Value) -> ir.Value:
    """exp of a float32 vector, inline: NaN stays NaN, over ln(FLT_MAX) is inf."""
    b = gen.b
    lanes = T.lanes_of(x)

    def c(v: float) -> ir.Value:
        return gen.splat(gen.const(v, "float32"), lanes)

    def ci(v: int) -> ir.Value:
        return gen.splat(gen.const(v, "int32"), lanes)

    over = b.fcmp_ordered(">", x, c(_EXP_HI))
    xc = b.select(over, c(_EXP_HI), x)
    xc = b.select(b.fcmp_ordered("<", xc, c(_EXP_LO)), c(_EXP_LO), xc)
    n = llvm_intrinsic(gen, "llvm.rint", [b.fmul(xc, c(_LOG2E))], "float32")
    r = b.fsub(b.fsub(xc, b.fmul(n, c(_LN2_HI))), b.fmul(n, c(_LN2_LO)))
    p = c(_EXP_POLY[0])
    for k in _EXP_POLY[1:]:
        p = b.fadd(b.fmul(p, r), c(k))
    y = b.fadd(b.fadd(b.fmul(p, b.fmul(r, r)), r), c(1.0))
    ni = b.fptosi(n, T.of("int32", lanes))
    half = b.ashr(ni, ci(1))
    for k in (half, b.sub(ni, half)):  # 2^k from its exponent bits, k in [-75, 64]
        y = b.fmul(y, b.bitcast(b.shl(b.add(k, ci(127)), ci(23)), x.type))
    y = b.select(over, c(float("inf")), y)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


# erf(x) for |x| <= 0.875 is x p(x^2); above it, 1 - exp(-x^2 + q(|x|)), q approximating
# log(erfc(x)) + x^2 on [0.875, 3.925] (erf rounds to 1 in float32 beyond). p and q are least
# squares fits in float64 (p weighted by 1 / p, Chebyshev nodes), rounded to float32: within
# 2.4 ulp of erf in float32 on [-6, 6] (tests/targets/llvm/test_llvm_codegen.py).
_ERF_SPLIT, _ERF_TOP = 0.875, 3.925
_ERF_P = (-6.199346971698105e-4, 5.031426437199116e-3, -2.6790950447320938e-2,
          1.1282441020011902e-1, -3.761254847049713e-1, 1.1283791065216064)
_ERF_Q = (1.6231698509727721e-6, -4.574465856421739e-5, 5.938464892096817e-4,
          -4.7442237846553326e-3, 2.63731200248003e-2, -1.0998784750699997e-1,
          3.680676817893982e-1, -1.1301664113998413, 3.0241720378398895e-4)


def _horner(gen: ExprGen, coefs: tuple[float, ...], v: ir.Value) -> ir.Value:
    """The float32 polynomial with ``coefs`` (highest power first) at ``v``, by fused steps."""
    lanes = T.lanes_of(v)
    acc = gen.splat(gen.const(coefs[0], "float32"), lanes)
    for k in coefs[1:]:
        acc = llvm_intrinsic(gen, "llvm.fma", [acc, v, gen.splat(gen.const(k, "float32"), lanes)],
                             "float32")
    return acc


def _erf(gen: ExprGen, x: ir.Value) -> ir.Value:
    """float32 erf, inline (NaN stays NaN, erf(+-inf) = +-1)."""
    b = gen.b
    lanes = T.lanes_of(x)

    def c(v: float) -> ir.Value:
        return gen.splat(gen.const(v, "float32"), lanes)

    a = llvm_intrinsic(gen, "llvm.fabs", [x], "float32")
    small = b.fmul(x, _horner(gen, _ERF_P, b.fmul(a, a)))
    big = b.fcmp_ordered(">=", a, c(_ERF_TOP))
    ac = b.select(big, c(_ERF_TOP), a)
    tail = vector_exp(gen, b.fadd(b.fneg(b.fmul(ac, ac)), _horner(gen, _ERF_Q, ac)))
    large = llvm_intrinsic(gen, "llvm.copysign", [b.select(big, c(1.0), b.fsub(c(1.0), tail)), x],
                           "float32")
    y = b.select(b.fcmp_ordered("<=", a, c(_ERF_SPLIT)), small, large)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


def _exp(gen: ExprGen, x: ir.Value, dtype: str) -> ir.Value:
    if dtype == "float32" and T.lanes_of(x) > 1:
        return vector_exp(gen, x)
    return llvm_intrinsic(gen, "llvm.exp", [x], dtype)


def _rational(gen: ExprGen, x: ir.Value, name: str) -> ir.Value:
    """float32 sigmoid or tanh as onnxruntime computes them (targets/rounding.py)."""
    b = gen.b
    lanes = T.lanes_of(x)
    r = RATIONAL[name]

    def c(v: float) -> ir.Value:
        return gen.splat(gen.const(v, "float32"), lanes)

    def floor(v: ir.Value, lo: float) -> ir.Value:  # NaN passes through
        return b.select(b.fcmp_ordered("<", v, c(lo)), c(lo), v)

    def clamp(v: ir.Value, lo: float, hi: float) -> ir.Value:
        v = floor(v, lo)
        return b.select(b.fcmp_ordered(">", v, c(hi)), c(hi), v)

    v = clamp(x, -r.bound, r.bound)
    v2 = b.fmul(v, v)
    y = b.fdiv(b.fmul(_horner(gen, r.p, v2), v), _horner(gen, r.q, v2))
    if r.offset:
        y = b.fadd(y, c(r.offset))
    return y if r.floor is None else floor(y, r.floor)


def _any(gen: ExprGen, bits: ir.Value) -> ir.Value:
    """An i1 that holds when some lane of ``bits`` (i1 or a vector of i1) does."""
    if T.lanes_of(bits) == 1:
        return bits
    fn = _function(gen.module, f"llvm.vector.reduce.or.v{T.lanes_of(bits)}i1",
                   ir.FunctionType(T.I1, [bits.type]))
    return gen.b.call(fn, [bits])


def _index_check(gen: ExprGen, i: ir.Value, n: ir.Value) -> ir.Value:
    """``i``, after recording STATUS_INDEX when some active lane is outside [0, n)."""
    b = gen.b
    zero = ir.Constant(n.type, None)
    bad = b.or_(b.icmp_signed("<", i, zero), b.icmp_signed(">=", i, n))
    if gen.mask is not None:  # lanes a tail's mask turns off hold no real index
        bad = b.and_(bad, gen.mask) if T.lanes_of(bad) > 1 else b.and_(bad, _any(gen, gen.mask))
    fail_bb, ok_bb = gen.new_block("index.bad"), gen.new_block("index.ok")
    b.cbranch(_any(gen, bad), fail_bb, ok_bb)
    b.position_at_end(fail_bb)
    gen.fail(STATUS_INDEX)  # type: ignore[attr-defined]  # a FuncGen: emit_call checks
    b.branch(ok_bb)
    b.position_at_end(ok_bb)
    return i


def emit_call(gen: ExprGen, name: str, args: list[ir.Value], dtype: str) -> ir.Value:
    b = gen.b
    if name == INDEX_CHECK:
        if not hasattr(gen, "fail"):
            raise CompileError(f"{INDEX_CHECK} needs a kernel that can report a failure")
        return _index_check(gen, args[0], args[1])
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
    if name in ("sigmoid", "tanh") and dtype == "float32":
        return _rational(gen, x, name)
    if name == "exp":
        return _exp(gen, x, dtype)
    if name == "erf" and dtype == "float32":
        return _erf(gen, x)
    if name == "erf" and dtype == "float16":  # through float32, as numpy computes it
        wide = b.fpext(x, T.of("float32", T.lanes_of(x)))
        return b.fptrunc(_erf(gen, wide), x.type)
    if name in LLVM_UNARY:
        return llvm_intrinsic(gen, LLVM_UNARY[name], [x], dtype)
    if name in LIBM_UNARY:
        return _libm(gen, name, x, dtype)
    if name == "rsqrt":
        return b.fdiv(one, llvm_intrinsic(gen, "llvm.sqrt", [x], dtype))
    if name == "sigmoid":
        e = _exp(gen, b.fneg(x), dtype)
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
