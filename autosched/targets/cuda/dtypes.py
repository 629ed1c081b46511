"""CUDA C spellings of autosched dtypes and constants."""

from __future__ import annotations

import math
import struct

import numpy as np

from autosched.errors import CompileError
from autosched.te import dtype as dt

C_TYPES = {
    "bool": "bool",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "float16": "half",
    "bfloat16": "__nv_bfloat16",
    "float32": "float",
    "float64": "double",
}

# Half types: the header that declares each (NVRTC finds them in nvidia-cuda-runtime's include
# directory; host emulation defines them in host_prelude) and its conversions to and from
# float (round to nearest even). Arithmetic on them computes in float and rounds once.
HALF_HEADERS = {"float16": "cuda_fp16.h", "bfloat16": "cuda_bf16.h"}
FROM_FLOAT = {"float16": "__float2half", "bfloat16": "__float2bfloat16"}
TO_FLOAT = {"float16": "__half2float", "bfloat16": "__bfloat162float"}

# Types narrower than int: C promotes them to int, so results are cast back to keep numpy's
# wrap-around semantics.
NARROW_INTS = ("int8", "int16", "uint8", "uint16")

# Four-byte element types that float2 / float4 style vector accesses may carry.
VECTOR_TYPES = {
    "float32": ("float2", "float4"),
    "int32": ("int2", "int4"),
    "uint32": ("uint2", "uint4"),
}


def c_type(dtype: str) -> str:
    try:
        return C_TYPES[dtype]
    except KeyError:
        raise CompileError(f"the CUDA backend has no C type for dtype {dtype!r}") from None


def c_const(value: int | float | bool, dtype: str) -> str:
    """A C literal of ``dtype`` that reads back exactly (floats round-trip, inf/nan by bits)."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "float32":
        f = float(value)
        if not math.isfinite(f):
            bits = struct.unpack("<I", struct.pack("<f", f))[0]
            return f"__int_as_float(0x{bits:08x})"
        return f"{f!r}f" if "e" in repr(f) or "." in repr(f) else f"{f!r}.0f"
    if dtype == "float64":
        f = float(value)
        if not math.isfinite(f):
            bits = struct.unpack("<Q", struct.pack("<d", f))[0]
            return f"__longlong_as_double(0x{bits:016x}LL)"
        return repr(f)
    if dtype in FROM_FLOAT:
        return f"{FROM_FLOAT[dtype]}({c_const(value, 'float32')})"
    v = int(value)
    if dtype == "int32":
        return "(-2147483647 - 1)" if v == -(2**31) else (f"({v})" if v < 0 else str(v))
    if dtype == "int64":
        return "(-9223372036854775807LL - 1)" if v == -(2**63) else f"({v}LL)" if v < 0 else f"{v}LL"
    if dtype == "uint32":
        return f"{v}U"
    if dtype == "uint64":
        return f"{v}ULL"
    return f"(({c_type(dtype)}){v})"


def host_bits(a: np.ndarray) -> np.ndarray:
    """``a`` as pycuda can copy it: a bfloat16 array (ml_dtypes' type has no buffer protocol)
    as a view of its uint16 bits, any other array as it is."""
    return a.view(np.uint16) if a.dtype.name in dt.STORAGE_TYPES else a
