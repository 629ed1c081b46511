"""Tensor intrinsics: loop nests that a schedule's ``tensorize`` step hands to one hardware
instruction (CUDA's warp-level ``nvcuda::wmma``, x86's int8 dot products), described once for
the schedule's pattern check and for the code generators.

Kinds:

* ``mma``    the innermost (i, j, k) nest of a sum ``C[i, j] += A[i, k] * B[k, j]`` of shape
             ``m x n x k`` whose accumulator ``C`` lives in a ``wmma.accumulator`` buffer (a
             warp's fragments) and whose operands are read as ``in_dtype`` (the multiply may
             cast them to float32) from shared memory or from fragments the load intrinsics
             filled; the nest's init (``C = 0``) becomes a fill of the fragment
* ``load_a`` the innermost (i, k) nest of an ``m x k`` copy into a ``wmma.matrix_a`` buffer
* ``load_b`` the innermost (k, j) nest of a ``k x n`` copy into a ``wmma.matrix_b`` buffer
             (loaded once per k step, an operand fragment serves every mma of its row or
             column of accumulators)
* ``store``  the innermost (i, j) nest of an ``m x n`` copy out of a ``wmma.accumulator``
             buffer, into shared memory (where an epilogue reads it element by element) or
             into a global output whose tiles are whole (no guard)
* ``gemm_block`` a whole block tile of a matmul on Hopper's warpgroup instruction (wgmma,
             sm_90a; targets/cuda/wgmma.py): the (i, j, k) nest of ``C[i, j] += A[i, k] *
             B[k, j]`` over the tile's ``bm`` rows (a multiple of 64), ``bn`` columns (8 to
             256) and all of K, C a shared tile (an epilogue reads it), A and B read from global
             memory by the main loop it becomes (``m``, ``n``: the granules of the tile; ``k``:
             K per instruction)
* ``dot``    a CPU's 8-bit dot product (x86's ``vpdpbusd``, AVX-512 VNNI or AVX-VNNI;
             aarch64's ``udot`` (dotprod) and ``usdot`` (i8mm)): the innermost (j, q) nest of
             ``C[.., j] += int32(A[.., q]) * int32(B[.., j, q])`` with ``n`` lanes of j and
             ``k`` = 4 taps of q, A of ``in_dtype`` (uint8) and the same for every j (4 bytes,
             broadcast), B of ``b_dtype`` (int8, or uint8 for ``udot``) with the taps of a
             lane adjacent (``n * k`` bytes), C int32 contiguous in j (te.ops.quant.matmul_dot4
             builds such sums; the sketch tiles them so)

The accumulator is float32 for every intrinsic. The operands of a tensorized nest are read
whole (16 x 16 tiles); a shared-memory stage read by one is therefore zero-filled where its
tile overhangs the tensor (schedule/lower.py), so the bound checks of the nest are moot.

Example::

    s[C_acc].tensorize(ii, "wmma_16x16x16_f16")   # ii, ji, ki the innermost loops of C_acc
    s[A_frag].tensorize(ai, "wmma_load_a_16x16x16_f16")
    s[C_sh].tensorize(si, "wmma_store_16x16")
"""

from __future__ import annotations

from dataclasses import dataclass

from autosched.te import expr as E
from autosched.te.opcodes import Op


@dataclass(frozen=True)
class TensorIntrin:
    """One intrinsic: its kind, tile shape, operand dtype and the oldest GPU arch with it (a
    CPU's: the LLVM feature it needs; a dot product's: the dtype of its per-lane operand)."""

    name: str
    kind: str  # "mma", "load_a", "load_b", "store" or "dot"
    m: int
    n: int
    k: int  # 0 for a store
    in_dtype: str  # operand dtype of an mma or load (a dot's broadcast one); "" for a store
    min_arch: int
    feature: str = ""
    b_dtype: str = ""

    @property
    def extents(self) -> tuple[int, ...]:
        """The extents of the loops it replaces, outermost first."""
        return {"mma": (self.m, self.n, self.k), "load_a": (self.m, self.k),
                "load_b": (self.k, self.n), "store": (self.m, self.n),
                "dot": (self.n, self.k), "gemm_block": ()}[self.kind]

    @property
    def scope(self) -> str:
        """The scope of the fragments it writes (a store: of those it reads; a gemm_block:
        its shared tile)."""
        return FRAGMENT_SCOPES.get(self.kind, "shared")


ACCUMULATOR_SCOPE = "wmma.accumulator"
FRAGMENT_SCOPES = {"mma": ACCUMULATOR_SCOPE, "store": ACCUMULATOR_SCOPE,
                   "load_a": "wmma.matrix_a", "load_b": "wmma.matrix_b"}
# the fragments of each scope: its wmma use and (rows, columns) of a tile as (m, n, k) names
FRAGMENT_TILES = {ACCUMULATOR_SCOPE: ("accumulator", "m", "n"),
                  "wmma.matrix_a": ("matrix_a", "m", "k"), "wmma.matrix_b": ("matrix_b", "k", "n")}

_MMAS = (
    TensorIntrin("wmma_16x16x16_f16", "mma", 16, 16, 16, "float16", 70),
    TensorIntrin("wmma_16x16x16_bf16", "mma", 16, 16, 16, "bfloat16", 80),
    TensorIntrin("wmma_16x16x8_tf32", "mma", 16, 16, 8, "float32", 80),
)


# the block tiles of Hopper's warpgroup instruction (wgmma): rows in slabs of 64, K per
# instruction 16 (tf32: 8)
_BLOCKS = (
    TensorIntrin("wgmma_block_f16", "gemm_block", 64, 8, 16, "float16", 90),
    TensorIntrin("wgmma_block_bf16", "gemm_block", 64, 8, 16, "bfloat16", 90),
    TensorIntrin("wgmma_block_tf32", "gemm_block", 64, 8, 8, "float32", 90),
)
# the gemm_block intrinsic that multiplies operands stored as each dtype
BLOCK_FOR_DTYPE = {t.in_dtype: t.name for t in _BLOCKS}


# x86's vpdpbusd: 16 int32 lanes (AVX-512 VNNI) or 8 (AVX-VNNI, CPUs without AVX-512), each
# += 4 products of uint8 and int8; aarch64's usdot (i8mm) the same in 4 lanes, udot (dotprod:
# Cortex-A55 / A76 / A78, Neoverse N1) 4 lanes of products of uint8 and uint8
DOT_16X4 = "vnni_dot_16x4_u8s8"
DOT_8X4 = "vnni_dot_8x4_u8s8"
USDOT_4X4 = "neon_usdot_4x4_u8s8"
UDOT_4X4 = "neon_udot_4x4_u8u8"


def load_intrin(mma: str, kind: str) -> str:
    """The intrinsic that loads the ``kind`` ("load_a" or "load_b") operands of ``mma``."""
    return mma.replace("wmma_", f"wmma_{kind}_")


TENSOR_INTRINS: dict[str, TensorIntrin] = {
    t.name: t
    for t in (
        *_MMAS,
        *_BLOCKS,
        *(TensorIntrin(load_intrin(t.name, kind), kind, t.m, t.n, t.k, t.in_dtype, t.min_arch)
          for t in _MMAS for kind in ("load_a", "load_b")),
        TensorIntrin("wmma_store_16x16", "store", 16, 16, 0, "", 70),
        TensorIntrin(DOT_16X4, "dot", 1, 16, 4, "uint8", 0, "avx512vnni", "int8"),
        TensorIntrin(DOT_8X4, "dot", 1, 8, 4, "uint8", 0, "avxvnni", "int8"),
        TensorIntrin(USDOT_4X4, "dot", 1, 4, 4, "uint8", 0, "i8mm", "int8"),
        TensorIntrin(UDOT_4X4, "dot", 1, 4, 4, "uint8", 0, "dotprod", "uint8"),
    )
}

# the mma intrinsic that multiplies operands stored as each dtype
MMA_FOR_DTYPE = {t.in_dtype: t.name for t in _MMAS}


def dot_mismatch(body: E.Expr, dot: str) -> str:
    """Why ``body`` is no sum that the 8-bit dot product ``dot`` (tensor intrinsic kind "dot")
    computes, or ""."""
    intrin = TENSOR_INTRINS[dot]
    if not (isinstance(body, E.Reduce) and body.combiner.name == "sum"
            and body.dtype == "int32" and body.condition is None and body.init is None):
        return f"the body is {body}"
    prod = body.source
    casts = [x for x in (prod.a, prod.b) if isinstance(x, E.Cast) and x.dtype == "int32"] if (
        isinstance(prod, E.Binary) and prod.op is Op.MUL) else []
    if len(casts) != 2:
        return f"the summand is {prod}"
    got = sorted(x.value.dtype for x in casts)
    want = sorted((intrin.in_dtype, intrin.b_dtype))
    return "" if got == want else (f"the operands are {' and '.join(got)}, not "
                                   f"{' and '.join(want)}")
