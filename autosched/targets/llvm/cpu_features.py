"""The CPU check a model library runs at create: the extensions its code may use; and the key
features of a target, the vector ISA that tuning records are keyed by (``key_features``).

Code compiled with ``+avx2`` on a CPU without AVX2 dies of SIGILL; the library answers a status
instead. ``required(target)`` lists the vector and bit-manipulation features the target enables
(those named in its feature string, and the vector ISA a named CPU implies); ``emit_cpu_check`` emits
the tests as LLVM IR: on x86 cpuid (and, for AVX / AVX-512, xgetbv: the OS must save the wider
registers), on aarch64 Linux the kernel's HWCAP / HWCAP2 bits (getauxval; NEON is baseline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import llvmlite.binding as llvm
import llvmlite.ir as ir

from autosched.targets.llvm import types as T
from autosched.targets.target import Target
from autosched.tir.tensor_intrin import DOT_8X4, DOT_16X4, TENSOR_INTRINS, UDOT_4X4, USDOT_4X4

# LLVM feature -> (cpuid leaf, subleaf, register 0..3 = eax, ebx, ecx, edx, bit)
CPUID = {
    "ssse3": (1, 0, 2, 9), "fma": (1, 0, 2, 12), "sse4.1": (1, 0, 2, 19),
    "sse4.2": (1, 0, 2, 20), "avx": (1, 0, 2, 28), "f16c": (1, 0, 2, 29),
    "bmi": (7, 0, 1, 3), "avx2": (7, 0, 1, 5), "bmi2": (7, 0, 1, 8), "avx512f": (7, 0, 1, 16),
    "avx512dq": (7, 0, 1, 17), "avx512ifma": (7, 0, 1, 21), "avx512cd": (7, 0, 1, 28),
    "avx512bw": (7, 0, 1, 30), "avx512vl": (7, 0, 1, 31), "avx512vbmi": (7, 0, 2, 1),
    "avx512vbmi2": (7, 0, 2, 6), "avx512vnni": (7, 0, 2, 11), "avx512bitalg": (7, 0, 2, 12),
    "avx512vpopcntdq": (7, 0, 2, 14), "avx512fp16": (7, 0, 3, 23), "avx512bf16": (7, 1, 0, 5),
}
OSXSAVE = (1, 0, 2, 27)
# LLVM feature -> (auxiliary vector entry: AT_HWCAP 16 or AT_HWCAP2 26, bit), arm64 Linux
HWCAP = {"fullfp16": (16, 10), "dotprod": (16, 20), "sve": (16, 22), "fp16fml": (16, 23),
         "sve2": (26, 1), "i8mm": (26, 13), "bf16": (26, 14)}
XCR0_AVX = 0x6  # the OS saves SSE and AVX state
XCR0_AVX512 = 0xE6  # ... and the opmask and upper ZMM state


def _table(target: Target) -> Mapping[str, tuple[int, ...]]:
    if target.triple.startswith(("x86_64", "i686", "i386")):
        return CPUID
    return HWCAP if target.triple.startswith(("aarch64", "arm64")) else {}


def required(target: Target) -> list[str]:
    """The checked features that ``target`` enables (its feature string's, and the vector ISA
    its CPU implies: a bare ``-mcpu=znver5`` emits AVX-512), sorted."""
    enabled = {f[1:] for f in target.features.split(",") if f.startswith("+")}
    enabled |= set(key_features(target.triple, target.cpu, target.features) or ())
    return sorted(enabled & set(_table(target)))


def emit_cpu_check(b: ir.IRBuilder, target: Target) -> ir.Value | None:
    """An i1 at ``b``: whether this CPU has every feature ``required(target)``; None when
    nothing is required."""
    features = required(target)
    if not features:
        return None
    if _table(target) is HWCAP:
        return _hwcap_check(b, features)
    return _cpuid_check(b, features)


def _hwcap_check(b: ir.IRBuilder, features: list[str]) -> ir.Value:
    getauxval = b.module.globals.get("getauxval") or ir.Function(
        b.module, ir.FunctionType(T.I64, [T.I64]), "getauxval")
    words = {at: b.call(getauxval, [ir.Constant(T.I64, at)]) for at in {HWCAP[f][0]
                                                                         for f in features}}
    ok = ir.Constant(T.I1, 1)
    for f in features:
        at, bit = HWCAP[f]
        has = b.and_(words[at], ir.Constant(T.I64, 1 << bit))
        ok = b.and_(ok, b.icmp_unsigned("!=", has, ir.Constant(T.I64, 0)))
    return ok


def _cpuid_check(b: ir.IRBuilder, features: list[str]) -> ir.Value:
    llvm.initialize_native_asmparser()  # emitting inline assembly parses it
    max_leaf = _cpuid(b, 0, 0)[0]
    ok = ir.Constant(T.I1, 1)
    leaves: dict[tuple[int, int], list[ir.Value]] = {}
    for f in features:
        leaf, sub, reg, bit = CPUID[f]
        if (leaf, sub) not in leaves:  # what a leaf past max_leaf answers is not zeros: guarded
            leaves[(leaf, sub)] = _cpuid(b, leaf, sub)
        ok = b.and_(ok, _bit(b, leaves[(leaf, sub)][reg], bit))
        if leaf == 7:
            ok = b.and_(ok, b.icmp_unsigned(">=", max_leaf, ir.Constant(T.I32, 7)))
    wide = [f for f in features if f.startswith("avx") or f in ("fma", "f16c")]
    if wide:
        leaf1 = leaves.get((1, 0)) or _cpuid(b, 1, 0)
        mask = XCR0_AVX512 if any(f.startswith("avx512") for f in wide) else XCR0_AVX
        osxsave = _bit(b, leaf1[OSXSAVE[2]], OSXSAVE[3])  # xgetbv exists: branch, not select
        before = b.block
        query = b.append_basic_block("xgetbv")
        after = b.append_basic_block("xsave_checked")
        b.cbranch(osxsave, query, after)
        b.position_at_end(query)
        xcr0 = b.and_(_xgetbv(b), ir.Constant(T.I32, mask))
        saved = b.icmp_unsigned("==", xcr0, ir.Constant(T.I32, mask))
        b.branch(after)
        b.position_at_end(after)
        phi = b.phi(T.I1)
        phi.add_incoming(saved, query)
        phi.add_incoming(ir.Constant(T.I1, 0), before)
        ok = b.and_(ok, phi)
    return ok


def _cpuid(b: ir.IRBuilder, leaf: int, sub: int) -> list[ir.Value]:
    regs = ir.LiteralStructType([T.I32] * 4)
    fn = ir.FunctionType(regs, [T.I32, T.I32])
    asm = ir.InlineAsm(fn, "cpuid", "={ax},={bx},={cx},={dx},{ax},{cx}", side_effect=True)
    out = b.call(asm, [ir.Constant(T.I32, leaf), ir.Constant(T.I32, sub)])
    return [b.extract_value(out, k) for k in range(4)]


def _xgetbv(b: ir.IRBuilder) -> ir.Value:
    regs = ir.LiteralStructType([T.I32] * 2)
    asm = ir.InlineAsm(ir.FunctionType(regs, [T.I32]), "xgetbv", "={ax},={dx},{cx}",
                       side_effect=True)
    return b.extract_value(b.call(asm, [ir.Constant(T.I32, 0)]), 0)


def _bit(b: ir.IRBuilder, reg: ir.Value, bit: int) -> ir.Value:
    return b.icmp_unsigned("!=", b.and_(reg, ir.Constant(T.I32, 1 << bit)),
                           ir.Constant(T.I32, 0))


# -- the vector ISA a target's code is generated for -----------------------------------------
#
# A tuning record applies wherever the code generator would emit the same instructions, so its
# key holds the features that change which vector instructions LLVM selects for tensor loops,
# not the CPU's name or its whole feature list (crypto, bit manipulation, cache control and
# the rest leave a loop nest's code unchanged). x86: the vector width (avx, avx512f), fused
# multiply-add contraction (fma), half-precision conversions (f16c), AVX-512's byte / word ops
# (bw), 64-bit integer multiplies and float <-> int64 conversions (dq), AVX-512 ops on 128- and
# 256-bit registers with masks (vl), int8 dot products (avx512vnni; avxvnni where AVX-512 has
# none), bf16 and fp16 arithmetic. aarch64: NEON, fp16 arithmetic, int8 dot products (dotprod,
# i8mm), bf16, SVE and SVE2.
KEY_FEATURES = {
    "x86": ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq",
            "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni"),
    "aarch64": ("neon", "fullfp16", "dotprod", "i8mm", "bf16", "sve", "sve2"),
}

# What enabling a key feature brings with it (LLVM enables these too); disabling one disables
# every feature that implies it.
_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
IMPLIES = {
    "avx": ("sse4.2",), "avx2": ("avx",), "fma": ("avx",), "f16c": ("avx",),
    "avx512f": ("avx2", "fma", "f16c"), "avx512bw": ("avx512f",), "avx512dq": ("avx512f",),
    "avx512vl": ("avx512f",), "avx512vnni": ("avx512f",), "avx512bf16": ("avx512bw",),
    "avx512fp16": ("avx512bw", "avx512dq", "avx512vl"), "avxvnni": ("avx2",),
    "avx10.1": (*_AVX512, "avx512vnni", "avx512bf16", "avx512fp16"),
    "avx10.2": ("avx10.1",),
    "fullfp16": ("neon",), "dotprod": ("neon",), "i8mm": ("neon",), "bf16": ("neon",),
    "sve": ("fullfp16",), "sve2": ("sve",),
}

# The key features a bare ``-mcpu=NAME`` enables (LLVM's CPU definitions, reduced to the key
# features), for targets that name a CPU and no feature string.
_V3 = ("avx2", "fma", "f16c")
_V4_VNNI = (*_AVX512, "avx512vnni")
_NEON_DOT = ("neon", "fullfp16", "dotprod")
_ARMV9 = (*_NEON_DOT, "i8mm", "bf16", "sve2")
CPU_FEATURES: dict[str, dict[str, tuple[str, ...]]] = {
    "x86": {
        **dict.fromkeys(("generic", "x86-64", "core2", "penryn", "k8", "btver1"), ()),
        **dict.fromkeys(("x86-64-v2", "nehalem", "corei7", "westmere", "silvermont", "slm",
                         "goldmont", "goldmont-plus", "tremont"), ("sse4.2",)),
        **dict.fromkeys(("sandybridge", "corei7-avx", "ivybridge", "core-avx-i", "btver2",
                         "bdver1"), ("avx",)),
        **dict.fromkeys(("bdver2", "bdver3"), ("avx", "fma", "f16c")),
        **dict.fromkeys(("x86-64-v3", "haswell", "core-avx2", "broadwell", "skylake", "bdver4",
                         "znver1", "znver2", "znver3"), _V3),
        **dict.fromkeys(("alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s",
                         "lunarlake", "pantherlake", "gracemont", "sierraforest", "grandridge",
                         "clearwaterforest"), (*_V3, "avxvnni")),
        **dict.fromkeys(("knl", "knm"), ("avx512f",)),
        **dict.fromkeys(("x86-64-v4", "skylake-avx512", "skx", "cannonlake"), _AVX512),
        **dict.fromkeys(("cascadelake", "icelake-client", "icelake-server", "rocketlake",
                         "tigerlake"), _V4_VNNI),
        "cooperlake": (*_V4_VNNI, "avx512bf16"),
        "znver4": (*_V4_VNNI, "avx512bf16"),
        "znver5": (*_V4_VNNI, "avx512bf16", "avxvnni"),
        **dict.fromkeys(("sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
                         "diamondrapids"), (*_V4_VNNI, "avx512bf16", "avx512fp16", "avxvnni")),
    },
    "aarch64": {
        **dict.fromkeys(("generic", "cortex-a35", "cortex-a53", "cortex-a57", "cortex-a72",
                         "cortex-a73", "thunderx2t99"), ("neon",)),
        **dict.fromkeys(("cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a77",
                         "cortex-a78", "cortex-x1", "neoverse-n1", "neoverse-e1", "apple-a13",
                         "apple-a14", "apple-m1"), _NEON_DOT),
        **dict.fromkeys(("apple-a15", "apple-a16", "apple-a17", "apple-m2", "apple-m3",
                         "apple-m4", "ampere1", "ampere1a", "ampere1b"),
                        (*_NEON_DOT, "i8mm", "bf16")),
        "a64fx": ("neon", "fullfp16", "sve"),
        "neoverse-v1": (*_NEON_DOT, "i8mm", "bf16", "sve"),
        **dict.fromkeys(("neoverse-n2", "neoverse-n3", "neoverse-v2", "neoverse-v3", "grace",
                         "cortex-a510", "cortex-a710", "cortex-a715", "cortex-a720",
                         "cortex-x2", "cortex-x3", "cortex-x4"), _ARMV9),
    },
}


def isa_family(triple: str) -> str:
    """The instruction-set family of a triple's architecture ("x86", "aarch64"), or the
    architecture itself for others."""
    arch = triple.split("-", 1)[0]
    if arch in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    return "aarch64" if arch in ("aarch64", "arm64") else arch


def key_features(triple: str, cpu: str, features: str) -> tuple[str, ...] | None:
    """The key features of a target, sorted: those its CPU enables, with the feature string's
    ``+f`` / ``-f`` applied and implications followed. None when they are unknown (a CPU this
    table does not know, named without a feature string). For architectures without a table,
    every feature the string enables.

    Example::

        key_features("x86_64-linux-gnu", "znver5", "")   # (..., "avx512f", ..., "fma", ...)
    """
    family = isa_family(triple)
    on = {f[1:] for f in features.split(",") if f.startswith("+")}
    off = {f[1:] for f in features.split(",") if f.startswith("-")}
    if family not in KEY_FEATURES:  # no table: what the string enables says it all
        named = cpu not in ("", "generic")
        return None if named and not on else tuple(sorted(on - off))
    implied = CPU_FEATURES[family].get(cpu)
    if implied is None and not features:
        return None
    enabled = _closure(set(implied or ()) | on)
    disabled = {f for f in enabled if _closure({f}) & off}
    out = (enabled - disabled) & set(KEY_FEATURES[family])
    if {"avx512vnni", "avx512vl"} <= out:
        out.discard("avxvnni")  # the VEX form of what AVX-512 VNNI already encodes
    return tuple(sorted(out))


def _closure(features: set[str]) -> set[str]:
    out, todo = set(), list(features)
    while todo:
        f = todo.pop()
        if f not in out:
            out.add(f)
            todo.extend(IMPLIES.get(f, ()))
    return out


def dot_allowed(name: str, features: Sequence[str]) -> bool:
    """Whether code for a CPU of these key features may use the dot intrinsic ``name``: its
    own feature, or for the 8-lane form AVX-512 VNNI with VL (which encodes it too)."""
    intrin = TENSOR_INTRINS[name]
    return intrin.feature in features or (
        name == DOT_8X4 and {"avx512vnni", "avx512vl"} <= set(features))


def dot_intrin(target: Target) -> str | None:
    """The widest 8-bit dot-product tensor intrinsic (tir/tensor_intrin.py, kind "dot") that
    code for ``target`` may use (on aarch64 usdot, whose operands are x86's, before udot): None
    but for an LLVM target with the feature."""
    if target.kind != "llvm":
        return None
    feats = key_features(target.triple, target.cpu, target.features) or ()
    return next((d for d in (DOT_16X4, DOT_8X4, USDOT_4X4, UDOT_4X4) if dot_allowed(d, feats)),
                None)
