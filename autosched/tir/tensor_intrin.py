"""Tensor intrinsics: loop nests that a schedule's ``tensorize`` step hands to one hardware
instruction (CUDA's warp-level ``nvcuda::wmma``), described once for the schedule's pattern
check and for the code generators.

Two kinds:

* ``mma``    the innermost (i, j, k) nest of a sum ``C[i, j] += A[i, k] * B[k, j]`` of shape
             ``m x n x k`` whose accumulator ``C`` lives in a ``wmma.accumulator`` buffer (a
             warp's fragments) and whose operands are read as ``in_dtype`` (the multiply may
             cast them to float32); the nest's init (``C = 0``) becomes a fill of the fragment
* ``store``  the innermost (i, j) nest of an ``m x n`` copy out of a ``wmma.accumulator``
             buffer, into shared memory (where an epilogue reads it element by element)

The accumulator is float32 for every intrinsic. The operands of a tensorized nest are read
whole (16 x 16 tiles); a shared-memory stage read by one is therefore zero-filled where its
tile overhangs the tensor (schedule/lower.py), so the bound checks of the nest are moot.

Example::

    s[C_acc].tensorize(ii, "wmma_16x16x16_f16")   # ii, ji, ki the innermost loops of C_acc
    s[C_sh].tensorize(si, "wmma_store_16x16")
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorIntrin:
    """One intrinsic: its kind, tile shape, operand dtype and the oldest GPU arch with it."""

    name: str
    kind: str  # "mma" or "store"
    m: int
    n: int
    k: int  # 0 for a store
    in_dtype: str  # operand dtype of an mma; "" for a store
    min_arch: int

    @property
    def extents(self) -> tuple[int, ...]:
        """The extents of the loops it replaces, outermost first."""
        return (self.m, self.n, self.k) if self.kind == "mma" else (self.m, self.n)


ACCUMULATOR_SCOPE = "wmma.accumulator"

TENSOR_INTRINS: dict[str, TensorIntrin] = {
    t.name: t
    for t in (
        TensorIntrin("wmma_16x16x16_f16", "mma", 16, 16, 16, "float16", 70),
        TensorIntrin("wmma_16x16x16_bf16", "mma", 16, 16, 16, "bfloat16", 80),
        TensorIntrin("wmma_16x16x8_tf32", "mma", 16, 16, 8, "float32", 80),
        TensorIntrin("wmma_store_16x16", "store", 16, 16, 0, "", 70),
    )
}

# the mma intrinsic that multiplies operands stored as each dtype
MMA_FOR_DTYPE = {t.in_dtype: t.name for t in TENSOR_INTRINS.values() if t.kind == "mma"}
