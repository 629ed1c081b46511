"""Data types and the promotion rules between them.

Rules, applied by every binary expression:

* Two expressions of the same dtype combine to that dtype.
* int32 and int64 combine to int64 (index arithmetic widens); no other pair of distinct dtypes
  combines: mixing float32 with float16, or int32 with float32, needs an explicit ``te.cast``.
* A Python ``int`` takes the dtype of the other operand (any dtype). A Python ``float`` takes
  the dtype of a float operand; with an integer operand it is an error. A Python ``bool`` is
  ``bool``.
* Arithmetic on ``bool`` is an error; comparisons give ``bool``.
* ``bfloat16`` is a storage type: buffers hold it and ``te.cast`` converts it to and from
  other types (float32 <-> bfloat16 rounds to nearest even), but arithmetic on it is an error:
  cast to float32 first. numpy spells it through ``ml_dtypes``.

Precisions (``PRECISIONS``) are how a model or task computes: ``fp32`` (the default), ``tf32``,
``fp16`` and ``bf16``, each with the tolerance that measured candidates and tests are checked
with.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  registers numpy's "bfloat16"
import numpy as np

from autosched.errors import TEError

FLOAT_TYPES = ("float16", "float32", "float64")
INT_TYPES = ("int8", "int16", "int32", "int64")
UINT_TYPES = ("uint8", "uint16", "uint32", "uint64")
ALL_TYPES = FLOAT_TYPES + INT_TYPES + UINT_TYPES + ("bool",)  # the types computed on
STORAGE_TYPES = ("bfloat16",)  # held in buffers and cast, never computed on
HALF_TYPES = ("float16", "bfloat16")

INDEX = "int32"


def check(dtype: str) -> str:
    if dtype not in ALL_TYPES and dtype not in STORAGE_TYPES:
        raise TEError(f"unknown dtype {dtype!r}; expected one of "
                      f"{', '.join(ALL_TYPES + STORAGE_TYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_TYPES


def is_int(dtype: str) -> bool:
    """Signed or unsigned integer (not bool)."""
    return dtype in INT_TYPES or dtype in UINT_TYPES


def is_signed(dtype: str) -> bool:
    return dtype in INT_TYPES or dtype in FLOAT_TYPES or dtype in STORAGE_TYPES


def bits(dtype: str) -> int:
    return 1 if dtype == "bool" else np.dtype(dtype).itemsize * 8


def nbytes(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def to_numpy(dtype: str) -> np.dtype:
    return np.dtype(dtype)


def promote(a: str, b: str, what: object = "expression") -> str:
    """The dtype of a binary op on dtypes ``a`` and ``b``, or TEError."""
    if a in STORAGE_TYPES or b in STORAGE_TYPES:
        raise TEError(f"{a if a in STORAGE_TYPES else b} is a storage type: te.cast it to "
                      f"float32 before {what}")
    if a == b:
        return a
    if {a, b} == {"int32", "int64"}:
        return "int64"
    raise TEError(f"cannot mix {a} and {b} in {what} without te.cast")


def min_value(dtype: str) -> float | int | bool:
    if dtype == "bool":
        return False
    if is_float(dtype) or dtype in STORAGE_TYPES:
        return -float("inf")
    return int(np.iinfo(dtype).min)


def max_value(dtype: str) -> float | int | bool:
    if dtype == "bool":
        return True
    if is_float(dtype) or dtype in STORAGE_TYPES:
        return float("inf")
    return int(np.iinfo(dtype).max)


@dataclass(frozen=True)
class Precision:
    """How a model computes: ``storage`` is the dtype its activations and weights are kept in
    (float32 values are rewritten to it by autosched.graph.precision); arithmetic and
    accumulation are float32 in every mode (but tf32's tensor-core multiplies). ``rtol`` /
    ``atol`` (atol relative to the largest reference magnitude) bound the difference from an
    fp32 reference that correctness checks accept."""

    name: str
    storage: str
    rtol: float
    atol: float
    doc: str


# One table for the measured candidates' check (search/measure_worker.compare) and the tests;
# README's precision table states it. Half tolerances hold for a whole model against an fp32
# reference: ResNet-18's logits (32x32 images, random weights) in fp16 strayed up to 0.45% of
# the largest logit (1 seed in 6), in bf16 (3 mantissa bits fewer: 8x coarser) up to 1.3% in
# 6 seeds; the bounds are about twice the worst seen (fp16) and its 8x (bf16), so that a
# fresh random model does not fail by chance.
PRECISIONS = {p.name: p for p in (
    Precision("fp32", "float32", 1e-3, 1e-4, "float32 storage and arithmetic (exact fp32)"),
    Precision("tf32", "float32", 1e-2, 1e-3, "float32 storage, TF32 tensor-core multiplies, "
              "float32 accumulation; without tensor cores it computes as fp32"),
    Precision("fp16", "float16", 2e-2, 1e-2, "float16 storage, float32 arithmetic and "
              "accumulation"),
    Precision("bf16", "bfloat16", 5e-2, 6e-2, "bfloat16 storage, float32 arithmetic and "
              "accumulation"),
)}
DEFAULT_PRECISION = "fp32"


def precision(name: str) -> Precision:
    """The Precision called ``name``; TEError naming the choices otherwise.

    Example::

        precision("fp16").storage    # "float16"
    """
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise TEError(f"unknown precision {name!r}; expected one of "
                      f"{', '.join(PRECISIONS)}") from None
