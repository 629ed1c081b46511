"""Data types and the promotion rules between them.

Rules, applied by every binary expression:

* Two expressions of the same dtype combine to that dtype.
* int32 and int64 combine to int64 (index arithmetic widens); no other pair of distinct dtypes
  combines: mixing float32 with float16, or int32 with float32, needs an explicit ``te.cast``.
* A Python ``int`` takes the dtype of the other operand (any dtype). A Python ``float`` takes
  the dtype of a float operand; with an integer operand it is an error. A Python ``bool`` is
  ``bool``.
* Arithmetic on ``bool`` is an error; comparisons give ``bool``.
"""

from __future__ import annotations

import numpy as np

from autosched.errors import TEError

FLOAT_TYPES = ("float16", "float32", "float64")
INT_TYPES = ("int8", "int16", "int32", "int64")
UINT_TYPES = ("uint8", "uint16", "uint32", "uint64")
ALL_TYPES = FLOAT_TYPES + INT_TYPES + UINT_TYPES + ("bool",)

INDEX = "int32"


def check(dtype: str) -> str:
    if dtype not in ALL_TYPES:
        raise TEError(f"unknown dtype {dtype!r}; expected one of {', '.join(ALL_TYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_TYPES


def is_int(dtype: str) -> bool:
    """Signed or unsigned integer (not bool)."""
    return dtype in INT_TYPES or dtype in UINT_TYPES


def is_signed(dtype: str) -> bool:
    return dtype in INT_TYPES or dtype in FLOAT_TYPES


def bits(dtype: str) -> int:
    return 1 if dtype == "bool" else np.dtype(dtype).itemsize * 8


def nbytes(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def to_numpy(dtype: str) -> np.dtype:
    return np.dtype(dtype)


def promote(a: str, b: str, what: object = "expression") -> str:
    """The dtype of a binary op on dtypes ``a`` and ``b``, or TEError."""
    if a == b:
        return a
    if {a, b} == {"int32", "int64"}:
        return "int64"
    raise TEError(f"cannot mix {a} and {b} in {what} without te.cast")


def min_value(dtype: str) -> float | int | bool:
    if dtype == "bool":
        return False
    if is_float(dtype):
        return -float("inf")
    return int(np.iinfo(dtype).min)


def max_value(dtype: str) -> float | int | bool:
    if dtype == "bool":
        return True
    if is_float(dtype):
        return float("inf")
    return int(np.iinfo(dtype).max)
