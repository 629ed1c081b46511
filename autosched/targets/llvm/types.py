"""autosched dtypes as LLVM types: in registers (bool is i1) and in memory (bool is i8)."""

from __future__ import annotations

import llvmlite.ir as ir

from autosched.errors import CompileError
from autosched.te import dtype as dt

_FLOATS = {"float16": ir.HalfType(), "float32": ir.FloatType(), "float64": ir.DoubleType()}

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
I8P = I8.as_pointer()
VOID = ir.VoidType()


def scalar(dtype: str) -> ir.Type:
    """The register type of ``dtype``."""
    if dtype in _FLOATS:
        return _FLOATS[dtype]
    if dtype == "bool":
        return I1
    if dtype == "bfloat16":  # its bits: targets/llvm/bfloat16.py converts
        return ir.IntType(16)
    if dt.is_int(dtype):
        return ir.IntType(dt.bits(dtype))
    raise CompileError(f"the LLVM backend has no type for dtype {dtype!r}")


def memory(dtype: str) -> ir.Type:
    """The in-memory element type (numpy stores bool as one byte)."""
    return I8 if dtype == "bool" else scalar(dtype)


def of(dtype: str, lanes: int = 1) -> ir.Type:
    t = scalar(dtype)
    return t if lanes == 1 else ir.VectorType(t, lanes)


def lanes_of(value: ir.Value) -> int:
    t = value.type
    return t.count if isinstance(t, ir.VectorType) else 1
