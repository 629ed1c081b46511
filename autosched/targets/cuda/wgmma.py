"""Hopper's warpgroup matrix multiply (``wgmma.mma_async``, sm_90a): a block's GEMM main loop in
CUDA C, for a tensorized block tile (codegen, kind "gemm_block") and for standalone kernels
(``gemm_source``, benchmarks/gpu_wgmma.py).

The block computes a ``block_m`` x ``block_n`` tile of ``sum_k A[m, k] * B[k, n]`` in float32,
A and B float16 or bfloat16 (or float32 multiplied as tf32), each K-major (K its last axis) or
MN-major (transposed):

* ``warpgroups`` warpgroups of 128 threads (``threadIdx.x``); each owns ``block_m /
  warpgroups`` rows of the tile in slabs of 64 (one ``m64nNk`` instruction each, N =
  ``block_n``), its accumulators in registers (``block_n / 2`` floats a thread and slab)
* K in tiles of 128 bytes (64 halves, 32 floats), ``stages`` tiles of each operand in shared
  memory: every thread copies 16-byte chunks with ``cp.async`` (zero-filled past the
  operand's rows and K, so no shape needs padding), in the 128-byte swizzle the tensor cores
  read (chunk ``c`` of row ``r`` of an 8-row group stored at chunk ``c ^ r``: the 8 rows of a
  column of chunks sit on distinct banks)
* per K tile: wait for its copies, a proxy fence (the tensor cores read shared memory through
  the async proxy; cp.async writes through the generic one), one barrier, the copy of the tile
  ``stages - 2`` ahead, then the instructions of the tile's K steps (16 deep; tf32: 8),
  committed as one group; each warpgroup then waits for the group before (one group stays in
  flight across the barrier, so the tensor cores keep working while the next tile is
  awaited), and the barrier of the next K tile tells every thread that the slot its copy
  overwrites, read two tiles back, is free
* the accumulators stored through a caller's store (a shared staging tile that an epilogue
  reads, or the output)

With ``tma`` (tma.py) one thread copies each K tile by TMA ``stages - 1`` ahead, completing on
the stage's mbarrier that every thread waits for (the barrier per K tile remains: it frees
the slot); with ``producer`` too, the block's first warpgroup only copies (waiting on each
slot's "empty" mbarrier, which each computing warp arrives at once its instructions on the
slot are done) and the computing warpgroups never meet before their stores.

The shared operands are described to the instruction by 64-bit descriptors: the start address,
the byte distance between 8-row groups (SBO; 1,024 with 128-byte rows) and, for MN-major
operands, between 64-element atoms along M or N (LBO), and the swizzle mode. A K step moves the
start address 32 bytes along a K-major row (the hardware applies the swizzle to the address) or
``k_step`` rows down an MN-major atom.

The accumulator ``index`` of thread ``lane`` of warp ``w`` in a slab holds row ``16 w + lane / 4
+ 8 ((index / 2) % 2)``, column ``8 (index / 4) + 2 (lane % 4) + index % 2``
(``wgmma_fragment``).

Host emulation (host_prelude.py) runs the same text: the copies as copies, the instruction
as each thread's own dot products read through the descriptors and the swizzle.

Example::

    spec = WgmmaGemm(m=4096, n=4096, k=4096)
    src = gemm_source(spec)             # CUDA C; compile for sm_90a
    grid, block, shared = spec.launch() # dynamic shared memory bytes
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from autosched.errors import CompileError, ScheduleError
from autosched.targets.cuda.ir_util import known_divisor
from autosched.targets.cuda.tma import HELPERS as TMA_HELPERS
from autosched.targets.cuda.tma import PARAM_TYPE, TensorMap
from autosched.targets.cuda.wmma import Access, affine_access, tensorized, walk_nest
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import free_vars, rewrite, substitute
from autosched.tir import ir
from autosched.tir.evaluate import const_int
from autosched.tir.tensor_intrin import TensorIntrin
from autosched.tir.visit import linear_coeff, loads, map_stmt, walk

ARCH = 90  # the one compute capability with wgmma (sm_90a; Blackwell has other instructions)
WARPGROUP = 128
ROW_BYTES = 128  # a swizzled row: one K tile's bytes (K-major) or 64 halves of M / N
CHUNK = 16  # bytes per cp.async and per swizzled unit
MAX_SHARED = 227 * 1024  # sm_90's opt-in limit per block
ALIGN = 1024  # the swizzle's period: the operand tiles start at multiples of it
_TYPES = {"float16": ("half", "f16", 2), "bfloat16": ("__nv_bfloat16", "bf16", 2),
          "float32": ("float", "tf32", 4)}
INTRIN_DTYPES = tuple(_TYPES)


@dataclass(frozen=True)
class MainLoop:
    """A block's main loop: operand dtype and layouts, the block tile, warpgroups, stages."""

    dtype: str = "float16"
    block_m: int = 128
    block_n: int = 128
    warpgroups: int = 2
    stages: int = 4
    a_k_major: bool = True  # A is (M, K); else (K, M)
    b_k_major: bool = False  # B is (N, K); else (K, N)
    tma: bool = False  # one thread copies each K tile by TMA (tma.py); else every thread by cp.async
    producer: bool = False  # TMA only: the copies from a warpgroup of their own (the first)

    @property
    def itemsize(self) -> int:
        return _TYPES[self.dtype][2]

    @property
    def block_k(self) -> int:
        """K per tile: one swizzled row."""
        return ROW_BYTES // self.itemsize

    @property
    def k_step(self) -> int:
        """K per instruction."""
        return 32 // self.itemsize

    @property
    def slabs(self) -> int:
        """64-row slabs per warpgroup."""
        return self.block_m // (64 * self.warpgroups)

    @property
    def lanes(self) -> int:
        """Elements per 16-byte chunk."""
        return CHUNK // self.itemsize

    @property
    def threads(self) -> int:
        """Threads a block: the computing warpgroups, and the producer's."""
        return WARPGROUP * (self.warpgroups + self.producer)

    def stage_bytes(self) -> int:
        """Bytes of one K tile of both operands."""
        return (self.block_m + self.block_n) * ROW_BYTES

    def shared_bytes(self) -> int:
        """Shared memory of the operand stages (and with TMA, an 8-byte mbarrier a stage), plus
        ALIGN to align the first."""
        return self.stages * (self.stage_bytes() + 8 * (self.tma + self.producer)) + ALIGN

    def check(self) -> str | None:
        """Why the instruction cannot take this main loop, or None."""
        if self.dtype not in _TYPES:
            return f"no wgmma for {self.dtype}"
        if self.dtype == "float32" and not (self.a_k_major and self.b_k_major):
            return "tf32 operands must both be K-major"
        if self.warpgroups < 1 or self.block_m % (64 * self.warpgroups) or self.slabs < 1:
            return f"block_m {self.block_m} is no multiple of 64 x {self.warpgroups} warpgroups"
        if not 8 <= self.block_n <= 256 or self.block_n % (8 if self.b_k_major else 64):
            return (f"block_n {self.block_n}: 8 to 256, a multiple of "
                    f"{8 if self.b_k_major else 64} for a{'' if self.b_k_major else 'n MN'}"
                    f"-major B")
        if self.slabs * self.block_n // 2 > 128:
            return f"{self.slabs * self.block_n // 2} accumulators a thread exceed 128"
        if self.stages < 3:
            return "stages must be at least 3"
        if self.producer and not self.tma:
            return "a producer warpgroup copies by TMA only"
        if self.shared_bytes() > MAX_SHARED:
            return f"{self.shared_bytes()} bytes of shared memory exceed {MAX_SHARED}"
        return None

    def rows_fit(self, a_row: int, b_row: int) -> str | None:
        """Why operands whose rows (last axes) hold ``a_row`` and ``b_row`` elements cannot be
        copied in 16-byte chunks, or None."""
        for what, extent in (("A", a_row), ("B", b_row)):
            if extent % self.lanes:
                return (f"{what}'s rows of {extent} are no multiple of {self.lanes} elements "
                        "(16 bytes)")
        return None


@dataclass(frozen=True)
class TmaRead:
    """How a TMA main loop reads an operand: through the tensor map parameter ``param``
    (describing ``map``) from the tile's coordinates ``origin`` (C expressions, outermost
    first; K's from 0), dimension ``k_dim`` its K and ``row_dim`` its rows (M or N)."""

    param: str
    map: TensorMap
    origin: tuple[str, ...]
    k_dim: int
    row_dim: int


@dataclass(frozen=True)
class Operand:
    """Where a main loop reads an operand: ``buffer[origin + row * ld + k]`` (K-major) or
    ``buffer[origin + k * ld + row]`` (MN-major) for the tile's rows (M or N) ``row`` and K
    ``k`` from 0, C expressions; rows from ``rows`` on and K from ``depth`` on read as 0.
    A TMA main loop reads it through ``tma`` instead."""

    buffer: str
    origin: str
    ld: int
    rows: str
    depth: int
    tma: TmaRead | None = None


# how a gemm_block nest reads an operand: (access, K-major, row dimension, K dimension or -1)
_Read = tuple[Access, bool, int, int]


def tensor_map_param(name: str) -> str:
    """A kernel parameter declaration of a tensor map (passed by value, read in place)."""
    return f"const __grid_constant__ {PARAM_TYPE} {name}"


def tma_box(ml: MainLoop, rank: int, k_dim: int, row_dim: int, k_major: bool,
            rows: int) -> tuple[int, ...]:
    """The box (outermost first) one TMA copy of an operand moves: all of a K tile's ``rows``
    rows (K-major), or one 64-element atom of them (MN-major)."""
    box = [1] * rank
    box[k_dim] = ml.block_k
    box[row_dim] = rows if k_major else ROW_BYTES // ml.itemsize
    return tuple(box)


def wgmma_fragment(lane: int, warp: int, index: int) -> tuple[int, int]:
    """(row, column) in its 64-row slab of accumulator ``index`` of a thread."""
    j, r = divmod(index, 4)
    return 16 * warp + lane // 4 + 8 * (r // 2), 8 * j + 2 * (lane % 4) + r % 2


def _instruction(ml: MainLoop) -> str:
    """The name of the helper running one instruction of ``ml``'s shape, types and layouts."""
    return (f"as_wgmma_m64n{ml.block_n}k{ml.k_step}_{_TYPES[ml.dtype][1]}_"
            f"{int(not ml.a_k_major)}{int(not ml.b_k_major)}")


_COMMON = r"""#ifndef AS_WG_COMMON
#define AS_WG_COMMON
#ifndef AS_HOST_EMULATION
// the 1,024-aligned shared address of a main loop's operand region (given 1,024 bytes spare)
__device__ __forceinline__ unsigned as_wg_base(const void* p) {
  return ((unsigned)__cvta_generic_to_shared(p) + 1023u) & ~1023u; }
__device__ __forceinline__ void as_wg_cp16(unsigned dst, const uint4* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory"); }
__device__ __forceinline__ void as_wg_fence_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void as_wg_mma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void as_wg_mma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void as_wg_mma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
#endif
// a shared-memory matrix descriptor: 128-byte swizzle, address and strides in 16-byte units
__device__ __forceinline__ unsigned long long as_wg_desc(unsigned addr, unsigned lbo,
                                                         unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4)
       | ((unsigned long long)((lbo >> 4) & 0x3FFFu) << 16)
       | ((unsigned long long)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62); }
#endif
"""


def helpers(ml: MainLoop) -> str:
    """File-scope definitions a main loop of ``ml`` calls (each defined once per file), besides
    codegen's PRELUDE_ASYNC (cp.async's commit and wait)."""
    name = _instruction(ml)
    n, regs = ml.block_n, ml.block_n // 2
    ctype, ptx, _ = _TYPES[ml.dtype]
    outs = ", ".join(f"%{i}" for i in range(regs))
    trans = "" if ml.dtype == "float32" else f", {int(not ml.a_k_major)}, {int(not ml.b_k_major)}"
    constraints = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    sig = f"void {name}(float (&d)[{regs}], unsigned long long da, unsigned long long db)"
    return "\n".join([
        _COMMON,
        TMA_HELPERS if ml.tma else "",
        f"#ifndef {name.upper()}",
        f"#define {name.upper()}",
        "#ifndef AS_HOST_EMULATION",
        f"__device__ __forceinline__ {sig} {{",
        '  asm volatile("{\\n.reg .pred p;\\n"',
        f'    "setp.ne.b32 p, %{regs + 2}, 0;\\n"',
        f'    "wgmma.mma_async.sync.aligned.m64n{n}k{ml.k_step}.f32.{ptx}.{ptx} '
        f'{{{outs}}}, %{regs}, %{regs + 1}, p, 1, 1{trans};\\n}}\\n"',
        f"    : {constraints}",
        '    : "l"(da), "l"(db), "r"(1));',
        "}",
        "#else",
        f"inline {sig} {{",
        f"  as_emu::wgmma<{n}, {ml.k_step}, {ctype}, {str(not ml.a_k_major).lower()}, "
        f"{str(not ml.b_k_major).lower()}>(d, da, db);",
        "}",
        "#endif",
        "#endif",
        "",
    ])


def main_loop(ml: MainLoop, a: Operand, b: Operand, region: str,
              store: Callable[[str, str, str, str], list[str]],
              shared_store: bool = True) -> list[str]:
    """The lines of one block's main loop (a ``{ }`` scope, every name in it prefixed ``wg_``):
    ``region`` the C expression of its shared operand region (``ml.shared_bytes()``), ``store``
    the lines storing two accumulators (row and column in the block tile, C expressions; the
    values: the second is the next column's), into shared memory unless ``shared_store`` is
    false (then the threads store without waiting for each other)."""
    why = ml.check()
    if why:
        raise ScheduleError(f"wgmma main loop: {why}")
    if ml.tma and (a.tma is None or b.tma is None):
        raise ScheduleError("a TMA main loop needs both operands' tensor maps")
    bm, bn, st = ml.block_m, ml.block_n, ml.stages
    kt_count = -(-a.depth // ml.block_k)
    a_tile, b_tile = bm * ROW_BYTES, bn * ROW_BYTES
    head = [
        "{",
        f"  const unsigned wg_a = as_wg_base({region}), wg_b = wg_a + {st * a_tile}u;",
        f"  const int wg_tid = threadIdx.x, wg_group = wg_tid / 128 - {int(ml.producer)}, "
        "wg_warp = (wg_tid / 32) % 4, wg_lane = wg_tid % 32;",
        f"  float wg_acc[{ml.slabs}][{bn // 2}];",
        *([] if ml.producer else _zero_lines(ml)),
        "  auto wg_load = [&](int wg_kt, int wg_slot) {",
        f"    const int wg_k0 = wg_kt * {ml.block_k};",
    ]
    if ml.producer:
        body = _producer_lines(ml, a, b, kt_count, f"wg_b + {st * b_tile}u", store)
    elif ml.tma:
        bar = f"wg_b + {st * b_tile}u"  # the stages' mbarriers, 8 bytes each
        body = [
            *_tma_load_lines(ml, a, b, bar),
            "  };",
            "  if (wg_tid == 0) {",
            f"    for (int wg_s = 0; wg_s < {st}; ++wg_s) as_mbar_init({bar} + 8 * wg_s, 1);",
            "    as_mbar_fence_init();",
            "  }",
            "  __syncthreads();",
            "  if (wg_tid == 0)",
            f"    for (int wg_s = 0; wg_s < {min(st - 1, kt_count)}; ++wg_s) wg_load(wg_s, wg_s);",
            f"  for (int wg_kt = 0; wg_kt < {kt_count}; ++wg_kt) {{",
            f"    const int wg_slot = wg_kt % {st};",
            f"    while (!as_mbar_try_wait({bar} + 8 * wg_slot, (wg_kt / {st}) & 1)) {{}}",
            *_mma_lines(ml, a_tile, b_tile),
            # every warpgroup is done with the tile before: its slot takes the tile st - 1 on
            "    __syncthreads();",
            f"    if (wg_tid == 0 && wg_kt + {st - 1} < {kt_count}) "
            f"wg_load(wg_kt + {st - 1}, (wg_kt + {st - 1}) % {st});",
            "  }",
            "  as_wg_mma_wait<0>();",
            "  __syncthreads();",
            f"  if (wg_tid == 0)\n    for (int wg_s = 0; wg_s < {st}; ++wg_s) "
            f"as_mbar_inval({bar} + 8 * wg_s);",
        ]
    else:
        body = [
            *_copy_lines(ml, a, ml.a_k_major, bm, f"wg_a + wg_slot * {a_tile}u"),
            *_copy_lines(ml, b, ml.b_k_major, bn, f"wg_b + wg_slot * {b_tile}u"),
            "  };",
            f"  #pragma unroll\n  for (int wg_s = 0; wg_s < {st - 2}; ++wg_s) {{",
            f"    if (wg_s < {kt_count}) wg_load(wg_s, wg_s);",
            "    as_cp_async_commit();",
            "  }",
            f"  for (int wg_kt = 0; wg_kt < {kt_count}; ++wg_kt) {{",
            f"    as_cp_async_wait<{st - 3}>();",
            "    as_wg_fence_proxy();",
            "    __syncthreads();",
            f"    if (wg_kt + {st - 2} < {kt_count}) wg_load(wg_kt + {st - 2}, "
            f"(wg_kt + {st - 2}) % {st});",
            "    as_cp_async_commit();",
            f"    const int wg_slot = wg_kt % {st};",
            *_mma_lines(ml, a_tile, b_tile),
            "  }",
            "  as_wg_mma_wait<0>();",
        ]
    if ml.producer:  # the computing warpgroups store
        return head + body + ["}"]
    wait = ["  __syncthreads();  // the stores may reuse the operands' shared memory"]
    return head + body + wait * shared_store + [*_store_lines(ml, store), "}"]


def _store_lines(ml: MainLoop, store: Callable[[str, str, str, str], list[str]]) -> list[str]:
    """Every accumulator stored (two at a time) through ``store``."""
    return [
        f"  #pragma unroll\n  for (int wg_s = 0; wg_s < {ml.slabs}; ++wg_s) {{",
        f"    #pragma unroll\n    for (int wg_i = 0; wg_i < {ml.block_n // 2}; wg_i += 2) {{",
        f"      const int wg_r = (wg_group * {ml.slabs} + wg_s) * 64 + 16 * wg_warp "
        "+ wg_lane / 4 + 8 * ((wg_i / 2) % 2);",
        "      const int wg_c = 8 * (wg_i / 4) + 2 * (wg_lane % 4);",
        *("      " + ln for ln in store("wg_r", "wg_c", "wg_acc[wg_s][wg_i]",
                                       "wg_acc[wg_s][wg_i + 1]")),
        "    }",
        "  }",
    ]


PRODUCER_REGISTERS = 40  # what the producer warpgroup keeps (setmaxnreg)
CONSUMER_REGISTERS = 232  # what each computing warpgroup may grow to


def _producer_lines(ml: MainLoop, a: Operand, b: Operand, kt_count: int, bar: str,
                    store: Callable[[str, str, str, str], list[str]]) -> list[str]:
    """The loop of a main loop whose first warpgroup copies: its first thread waits for a
    stage's slot to be released (mbarrier ``empty``: one arrival per computing warp),
    then copies the K tile into it (mbarrier ``full``); each computing warpgroup waits for
    ``full``, runs the tile and releases the slot of the tile before (its instructions done)."""
    st = ml.stages
    a_tile, b_tile = ml.block_m * ROW_BYTES, ml.block_n * ROW_BYTES
    full, empty = f"{bar} + 8 * wg_slot", f"{bar} + {8 * st} + 8 * wg_slot"
    return [
        *_tma_load_lines(ml, a, b, bar),
        "  };",
        "  if (wg_tid == 0) {",
        f"    for (int wg_s = 0; wg_s < {st}; ++wg_s) {{",
        f"      as_mbar_init({bar} + 8 * wg_s, 1);",
        f"      as_mbar_init({bar} + {8 * st} + 8 * wg_s, {4 * ml.warpgroups});",
        "    }",
        "    as_mbar_fence_init();",
        "  }",
        "  __syncthreads();",
        "  if (wg_group < 0) {",
        f"    as_wg_setmaxnreg_dec<{PRODUCER_REGISTERS}>();",
        "    if (wg_tid == 0)",
        f"      for (int wg_kt = 0; wg_kt < {kt_count}; ++wg_kt) {{",
        f"        const int wg_slot = wg_kt % {st};",
        f"        if (wg_kt >= {st})",
        f"          while (!as_mbar_try_wait({empty}, (wg_kt / {st} - 1) & 1)) {{}}",
        "        wg_load(wg_kt, wg_slot);",
        "      }",
        "  } else {",
        f"    as_wg_setmaxnreg_inc<{CONSUMER_REGISTERS}>();",
        *("  " + ln for ln in _zero_lines(ml)),
        f"    for (int wg_kt = 0; wg_kt < {kt_count}; ++wg_kt) {{",
        f"      const int wg_slot = wg_kt % {st};",
        f"      while (!as_mbar_try_wait({full}, (wg_kt / {st}) & 1)) {{}}",
        *("  " + ln for ln in _mma_lines(ml, a_tile, b_tile)),
        "      if (wg_kt > 0 && wg_lane == 0)",
        f"        as_mbar_arrive({bar} + {8 * st} + 8 * ((wg_kt + {st - 1}) % {st}));",
        "    }",
        "    as_wg_mma_wait<0>();",
        # the producer's waits ended before the last tile arrived; the stores may reuse the
        # operands' shared memory once every computing warpgroup is done with it
        f"    as_bar_sync(1, {ml.warpgroups * WARPGROUP});",
        f"    if (wg_tid == {WARPGROUP})",
        f"      for (int wg_s = 0; wg_s < {2 * st}; ++wg_s) as_mbar_inval({bar} + 8 * wg_s);",
        f"    as_bar_sync(1, {ml.warpgroups * WARPGROUP});",
        *("  " + ln for ln in _store_lines(ml, store)),
        "  }",
        # the producer waits here: a main loop after this one (an enclosing loop's next
        # iteration) initializes the mbarriers again
        "  __syncthreads();",
    ]


def _zero_lines(ml: MainLoop) -> list[str]:
    return [f"  #pragma unroll\n  for (int wg_s = 0; wg_s < {ml.slabs}; ++wg_s)",
            f"    #pragma unroll\n    for (int wg_i = 0; wg_i < {ml.block_n // 2}; ++wg_i) "
            "wg_acc[wg_s][wg_i] = 0.f;"]


def _mma_lines(ml: MainLoop, a_tile: int, b_tile: int) -> list[str]:
    """A K tile's instructions (slot wg_slot), committed as one group; the group before
    waited for."""
    return [
        "    as_wg_mma_fence();",
        f"    #pragma unroll\n    for (int wg_ks = 0; wg_ks < {ml.block_k // ml.k_step}; "
        "++wg_ks) {",
        f"      #pragma unroll\n      for (int wg_s = 0; wg_s < {ml.slabs}; ++wg_s) {{",
        f"        const int wg_row0 = (wg_group * {ml.slabs} + wg_s) * 64;",
        f"        {_instruction(ml)}(wg_acc[wg_s], "
        + _desc(ml, ml.a_k_major, "wg_row0", f"wg_a + wg_slot * {a_tile}u") + ", "
        + _desc(ml, ml.b_k_major, "0", f"wg_b + wg_slot * {b_tile}u") + ");",
        "      }",
        "    }",
        "    as_wg_mma_commit();",
        "    as_wg_mma_wait<1>();",
    ]


def _tma_load_lines(ml: MainLoop, a: Operand, b: Operand, bar: str) -> list[str]:
    """The body of wg_load in a TMA main loop: the K tile wg_kt of both operands copied into
    slot wg_slot, its bytes expected on the slot's mbarrier (the stages' mbarriers from
    ``bar``)."""
    a_tile, b_tile = ml.block_m * ROW_BYTES, ml.block_n * ROW_BYTES
    return [
        f"    const unsigned wg_full = {bar} + 8 * wg_slot;",
        f"    as_mbar_expect(wg_full, {ml.stage_bytes()}u);",
        *_tma_lines(ml, a, ml.a_k_major, ml.block_m, f"wg_a + wg_slot * {a_tile}u"),
        *_tma_lines(ml, b, ml.b_k_major, ml.block_n, f"wg_b + wg_slot * {b_tile}u"),
    ]


def _tma_lines(ml: MainLoop, op: Operand, k_major: bool, rows: int, smem: str) -> list[str]:
    """The TMA copies of one operand's K tile (``rows`` rows of M or N) into its slot at
    ``smem``, completing on the mbarrier wg_full: one box (K-major) or one a 64-element atom
    (MN-major)."""
    t = op.tma
    assert t is not None
    rank = len(t.map.shape)
    atom = ROW_BYTES // ml.itemsize
    out = []
    for n in range(1 if k_major else rows // atom):
        coords = list(t.origin)
        coords[t.k_dim] = f"({coords[t.k_dim]}) + wg_k0"
        if n:
            coords[t.row_dim] = f"({coords[t.row_dim]}) + {n * atom}"
        dst = smem if not n else f"{smem} + {n * ml.block_k * ROW_BYTES}u"
        out.append(f"    as_tma_load{rank}({dst}, {t.param}, wg_full, "
                   f"{', '.join(reversed(coords))});")
    return out


def _copy_lines(ml: MainLoop, op: Operand, k_major: bool, rows: int, smem: str) -> list[str]:
    """The cp.async copies of one operand's K tile (``rows`` rows of M or N) into its swizzled
    slot at ``smem``."""
    lanes, bk = ml.lanes, ml.block_k
    chunks = rows * bk // lanes
    per_row = ROW_BYTES // CHUNK  # chunks per swizzled row (8)
    out = [f"    #pragma unroll\n    for (int wg_q = wg_tid; wg_q < {chunks}; "
           f"wg_q += {ml.threads}) {{"]
    if k_major:  # tile row r: 8 chunks of K
        out += [
            f"      const int wg_r = wg_q / {per_row}, wg_ch = wg_q % {per_row};",
            f"      const int wg_kk = wg_k0 + wg_ch * {lanes};",
            f"      const bool wg_ok = wg_r < ({op.rows}) && wg_kk < {op.depth};",
            f"      as_wg_cp16({smem} + wg_r * {ROW_BYTES} + ((wg_ch ^ (wg_r & 7)) << 4), "
            f"(const uint4*)&{op.buffer}[wg_ok ? ({op.origin}) + (long long)wg_r * {op.ld} "
            f"+ wg_kk : 0], wg_ok);",
        ]
    else:  # tile row kr: K row k0 + kr, its columns in atoms of 64 halves (128 bytes)
        cols = rows // lanes  # chunks per K row
        out += [
            f"      const int wg_kr = wg_q / {cols}, wg_cc = wg_q % {cols};",
            f"      const int wg_atom = wg_cc / {per_row}, wg_ch = wg_cc % {per_row};",
            f"      const int wg_col = wg_cc * {lanes}, wg_kk = wg_k0 + wg_kr;",
            f"      const bool wg_ok = wg_col < ({op.rows}) && wg_kk < {op.depth};",
            f"      as_wg_cp16({smem} + wg_atom * {bk * ROW_BYTES} + wg_kr * {ROW_BYTES} "
            f"+ ((wg_ch ^ (wg_kr & 7)) << 4), (const uint4*)&{op.buffer}[wg_ok ? "
            f"({op.origin}) + (long long)wg_kk * {op.ld} + wg_col : 0], wg_ok);",
        ]
    out.append("    }")
    return out


def _desc(ml: MainLoop, k_major: bool, row0: str, smem: str) -> str:
    """The descriptor of an operand's slab from tile row (M or N) ``row0`` at K step wg_ks."""
    if k_major:  # rows of 128 bytes; a K step is 32 bytes along them
        return f"as_wg_desc({smem} + {row0} * {ROW_BYTES} + wg_ks * 32, 16, 1024)"
    atom = ml.block_k * ROW_BYTES  # one 64-element atom: every K row of the tile
    step = ml.k_step * ROW_BYTES  # a K step: k_step rows down the atom
    return f"as_wg_desc({smem} + ({row0} / 64) * {atom} + wg_ks * {step}, {atom}, 1024)"


@dataclass(frozen=True)
class WgmmaGemm:
    """A standalone GEMM kernel ``C[b] = A[b] @ B[b]`` (C float32 (batch, M, N)): shapes,
    batch strides (elements; 0 broadcasts an operand) and the main loop."""

    m: int
    n: int
    k: int
    loop: MainLoop = MainLoop()
    batch: int = 1
    a_batch_stride: int | None = None  # None: m * k
    b_batch_stride: int | None = None  # None: k * n
    name: str = "wgmma_gemm"

    def launch(self) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
        """(grid, block, dynamic shared bytes)."""
        ml = self.loop
        grid = (-(-self.n // ml.block_n), -(-self.m // ml.block_m), self.batch)
        return grid, (ml.threads, 1, 1), ml.shared_bytes()

    def check(self) -> str | None:
        ml = self.loop
        return ml.check() or ml.rows_fit(self.k if ml.a_k_major else self.m,
                                         self.k if ml.b_k_major else self.n)

    def reads(self) -> tuple[TmaRead, TmaRead]:
        """How a TMA main loop reads A and B (tensor map parameters tmA and tmB)."""
        ml = self.loop
        out = []
        for what, k_major, rows, rows_at, batched in (
                ("A", ml.a_k_major, self.m, f"blockIdx.y * {ml.block_m}",
                 self.a_batch_stride != 0),
                ("B", ml.b_k_major, self.n, f"blockIdx.x * {ml.block_n}",
                 self.b_batch_stride != 0)):
            shape = (self.batch if batched else 1,) + ((rows, self.k) if k_major
                                                       else (self.k, rows))
            k_dim, row_dim = (2, 1) if k_major else (1, 2)
            origin = ["blockIdx.z" if batched else "0", "0", "0"]
            origin[row_dim] = rows_at
            box = tma_box(ml, 3, k_dim, row_dim, k_major,
                          ml.block_m if what == "A" else ml.block_n)
            out.append(TmaRead("tm" + what, TensorMap(ml.dtype, shape, box), tuple(origin),
                               k_dim, row_dim))
        return out[0], out[1]


def gemm_source(spec: WgmmaGemm) -> str:
    """The CUDA C of the kernel ``spec.name`` (arguments A, B, C; with TMA first the tensor
    maps of A and B: ``spec.reads()``)."""
    why = spec.check()
    if why:
        raise ScheduleError(f"wgmma GEMM {spec.name}: {why}")
    ml = spec.loop
    ctype = _TYPES[ml.dtype][0]
    m, n, k = spec.m, spec.n, spec.k
    a_bs = m * k if spec.a_batch_stride is None else spec.a_batch_stride
    b_bs = k * n if spec.b_batch_stride is None else spec.b_batch_stride
    reads = spec.reads() if ml.tma else (None, None)
    a = Operand("A", f"(long long)blockIdx.z * {a_bs}LL + "
                     + ("blockIdx.y * " + str(ml.block_m * k) if ml.a_k_major
                        else "blockIdx.y * " + str(ml.block_m)),
                k if ml.a_k_major else m, f"{m} - (int)blockIdx.y * {ml.block_m}", k,
                reads[0])
    b = Operand("B", f"(long long)blockIdx.z * {b_bs}LL + "
                     + ("blockIdx.x * " + str(ml.block_n * k) if ml.b_k_major
                        else "blockIdx.x * " + str(ml.block_n)),
                k if ml.b_k_major else n, f"{n} - (int)blockIdx.x * {ml.block_n}", k,
                reads[1])

    def store(r: str, c: str, v0: str, v1: str) -> list[str]:
        row = f"(int)blockIdx.y * {ml.block_m} + {r}"
        col = f"(int)blockIdx.x * {ml.block_n} + {c}"
        at = f"(long long)blockIdx.z * {m * n}LL + (long long)({row}) * {n} + ({col})"
        return [f"if ({row} < {m}) {{",
                f"  if ({col} < {n}) C[{at}] = {v0};",
                f"  if ({col} + 1 < {n}) C[{at} + 1] = {v1};",
                "}"]

    header = {"float16": "#include <cuda_fp16.h>", "bfloat16": "#include <cuda_bf16.h>",
              "float32": ""}[ml.dtype]
    from autosched.targets.cuda.codegen import PRELUDE_ASYNC

    maps = "".join(f"{tensor_map_param(r.param)}, " for r in reads if r is not None)
    return "\n".join([
        header,
        PRELUDE_ASYNC,
        helpers(ml),
        f'extern "C" __global__ void __launch_bounds__({ml.threads}, 1)',
        f"{spec.name}({maps}const {ctype}* __restrict__ A, const {ctype}* __restrict__ B, "
        "float* __restrict__ C) {",
        "  extern __shared__ __align__(1024) unsigned char as_wg_smem[];",
        *("  " + ln for ln in main_loop(ml, a, b, "as_wg_smem", store)),
        "}",
        "",
    ])


# -- a tensorized block tile (tensor intrinsic kind "gemm_block") ------------------------------

STAGES_PRAGMA = "wgmma_stages"  # the tensorized loop's pragma: the main loop's stages
PRODUCER_PRAGMA = "wgmma_producer"  # 1: a warpgroup of its own copies (the block's first)
# on the row loop of the nest that reads a block tile: the block's thread count; the nest
# (rows, then columns, then statements without loops reading the tile at [row, column]) runs
# in the main loop's store, for each pair of accumulators a thread holds, and nowhere else
EPILOGUE_PRAGMA = "wgmma_epilogue"


@dataclass(frozen=True)
class _BlockNest:
    """The (i, j, k) loops of a gemm_block nest (what wmma.affine_access needs) and its update."""

    loops: tuple[ir.For, ...]
    update: ir.Store
    where: str

    @property
    def vars(self) -> list[E.Var]:
        return [lp.var for lp in self.loops]


def block_nests(s: ir.Stmt) -> list[tuple[ir.For, TensorIntrin]]:
    """The gemm_block nests inside ``s``."""
    return [(loop, t) for loop, t in tensorized(s) if t.kind == "gemm_block"]


def block_output(loop: ir.For) -> ir.Buffer:
    """The shared tile a gemm_block nest computes."""
    return _parse(loop, "").update.buffer


def block_loop(loop: ir.For, intrin: TensorIntrin, threads: int) -> MainLoop:
    """The main loop of the gemm_block nest ``loop`` run by ``threads`` threads a block: with
    TMA copies where both operands take them (when AUTOSCHED_TMA is on)."""
    from autosched import settings

    nest = _parse(loop, "")
    a, b = _operands(nest)
    pragmas = dict(loop.annotations)
    stages, producer = int(pragmas.get(STAGES_PRAGMA, 4)), bool(pragmas.get(PRODUCER_PRAGMA))
    ml = MainLoop(intrin.in_dtype, const_int(nest.loops[0].extent) or 0,
                  const_int(nest.loops[1].extent) or 0, threads // WARPGROUP - producer,
                  stages, a[1], b[1])
    if settings.flag(settings.TMA) and _tma_map(nest, ml, a, ml.block_m) \
            and _tma_map(nest, ml, b, ml.block_n):
        return replace(ml, tma=True, producer=producer)
    if producer:
        raise CompileError(f"loop {loop.var.name}: a producer warpgroup copies by TMA, which "
                           "AUTOSCHED_TMA=0 turns off or the operands do not take (a static "
                           "C-contiguous shape, rank 5 at most)")
    return ml


def _tma_map(nest: _BlockNest, ml: MainLoop, read: _Read, rows: int) -> TensorMap | None:
    """The tensor map a TMA main loop reads an operand (tiles of ``rows`` rows) through;
    None unless the operand is a C-contiguous buffer of static shape (rank 5 at most) with
    one dimension moving by one with the tile's rows and one with K, the K-major operand's
    K or the MN-major's rows innermost, K read from 0 to its end or in whole tiles."""
    acc, k_major, row_dim, k_dim = read
    shape = [const_int(d) for d in acc.buffer.shape]
    if None in shape or acc.buffer.dtype != ml.dtype or k_dim < 0 or k_dim == row_dim:
        return None
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]  # type: ignore[operator]
    depth = const_int(nest.loops[2].extent) or 0
    if strides[row_dim] != (acc.strides[0] or acc.strides[1]) \
            or strides[k_dim] != acc.strides[2] \
            or (k_dim == len(shape) - 1) != k_major or const_int(acc.origin[k_dim]) != 0 \
            or not (depth == shape[k_dim] or depth % ml.block_k == 0):
        return None
    box = tma_box(ml, len(shape), k_dim, row_dim, k_major, rows)
    tm = TensorMap(ml.dtype, tuple(shape), box)  # type: ignore[arg-type]
    return tm if tm.check() is None else None


def _parse(loop: ir.For, where: str) -> _BlockNest:
    """The nest headed by ``loop``: three loops (guards and the init store between them
    allowed) and one update ``acc = acc + x * y``."""
    loops, stores, _ = walk_nest(loop, where)
    updates = [st for st in stores if not isinstance(st.value, E.Const)]
    if len(loops) != 3 or len(updates) != 1:
        raise CompileError(f"{where}: a gemm_block nest is 3 loops and one update; found "
                           f"{len(loops)} loops and {len(updates)} updates")
    return _BlockNest(tuple(loops), updates[0], where)


def _operands(nest: _BlockNest) -> tuple[_Read, _Read]:
    """((access, K-major, row dimension, K dimension or -1 when K moves several) of A, the
    same of B) of the nest's update."""
    v = nest.update.value
    if not (isinstance(v, E.Binary) and v.op is Op.ADD and isinstance(v.a, ir.Load)
            and v.a.buffer == nest.update.buffer and isinstance(v.b, E.Binary)
            and v.b.op is Op.MUL):
        raise CompileError(f"{nest.where}: {nest.update.buffer.name}[...] = {v} is not "
                           "acc = acc + a * b")
    loads = [f.value if isinstance(f, E.Cast) else f for f in (v.b.a, v.b.b)]
    if not all(isinstance(ld, ir.Load) and ld.buffer.scope == "global" for ld in loads):
        raise CompileError(f"{nest.where}: the factors of {v.b} must be loads of global "
                           "operands")
    found: dict[int, _Read] = {}
    for ld in loads:
        assert isinstance(ld, ir.Load)
        acc = affine_access(nest, ld.buffer, ld.indices)
        si, sj, sk = acc.strides
        row = 0 if sj == 0 else 1
        moved = si if row == 0 else sj
        if (si != 0) == (sj != 0) or sorted((moved, sk)) != sorted((1, max(moved, sk))):
            raise CompileError(f"{nest.where}: {ld.buffer.name} is read along neither rows "
                               f"nor columns of K (strides {acc.strides})")
        dims = [d for d, ix in enumerate(ld.indices)
                if any(x.uid == nest.vars[row].uid for x in free_vars(ix))]
        if len(dims) != 1:
            raise CompileError(f"{nest.where}: {ld.buffer.name}'s rows move along {len(dims)} "
                               "dimensions")
        k_dims = [d for d, ix in enumerate(ld.indices)
                  if any(x.uid == nest.vars[2].uid for x in free_vars(ix))]
        found[row] = (acc, sk == 1, dims[0], k_dims[0] if len(k_dims) == 1 else -1)
    if sorted(found) != [0, 1]:
        raise CompileError(f"{nest.where}: one factor must move with i and one with j")
    return found[0], found[1]


@dataclass(frozen=True)
class Epilogue:
    """A nest marked EPILOGUE_PRAGMA: its loops over the rows and the columns of ``tile``,
    whose element [row, column] its statements read."""

    rows: ir.For
    cols: ir.For
    tile: ir.Buffer

    @property
    def threads(self) -> int:
        return int(dict(self.rows.annotations)[EPILOGUE_PRAGMA])


def epilogue_threads(s: ir.For) -> int | None:
    """The thread count of the block whose epilogue nest ``s`` heads (None: it heads none)."""
    threads = dict(s.annotations).get(EPILOGUE_PRAGMA)
    return None if threads is None else int(threads)


def epilogues(s: ir.Stmt, tiles: set[ir.Buffer], where: str) -> dict[ir.Buffer, Epilogue]:
    """The epilogue nests in ``s`` by the block tile (one of ``tiles``) each reads."""
    out: dict[ir.Buffer, Epilogue] = {}
    for rows in walk(s):
        if not isinstance(rows, ir.For) or epilogue_threads(rows) is None:
            continue
        at = f"{where}: the epilogue nest of loop {rows.var.name}"
        cols = rows.body
        if not isinstance(cols, ir.For) or rows.kind != "serial" or cols.kind != "serial" \
                or not (_zero(rows.min) and _zero(cols.min)):
            raise CompileError(f"{at} must be two plain loops from 0, rows then columns")
        if any(isinstance(st, (ir.For, ir.Barrier)) for st in walk(cols.body)):
            raise CompileError(f"{at} holds loops or barriers inside its column loop")
        reads = [ld for ld in loads(cols.body) if ld.buffer in tiles]
        found = {ld.buffer for ld in reads}
        if len(found) != 1:
            raise CompileError(f"{at} reads {len(found)} block tiles; it must read one")
        (tile,) = found
        stride = const_int(tile.shape[-1])
        for ld in reads:
            offset = ir.flat_offset(tile, ld.indices)
            rest = substitute(offset, {rows.var: E.const(0, rows.var.dtype),
                                       cols.var: E.const(0, cols.var.dtype)})
            if linear_coeff(offset, rows.var) != stride or linear_coeff(offset, cols.var) != 1 \
                    or const_int(rest) != 0:
                raise CompileError(f"{at} reads {tile.name} other than at [row, column]")
        if tile in out:
            raise CompileError(f"{at}: {tile.name} has another epilogue nest")
        out[tile] = Epilogue(rows, cols, tile)
    return out


def _zero(e: E.Expr) -> bool:
    return const_int(e) == 0


def _epilogue_store(w: Any, epi: Epilogue) -> Callable[[str, str, str, str], list[str]]:
    """The main loop's store of a tile with an epilogue nest: the nest's statements for the
    two accumulators' elements (consecutive columns from an even one) as a loop of two
    vector lanes (stored as one float2 / half2 access where they fit), each read of the tile
    replaced by the lane's accumulator."""
    def store(r: str, c: str, v0: str, v1: str) -> list[str]:
        lane = E.Var("wg_pair", "int32")
        row, pair = w.raw_var(f"({r})"), w.raw_var(f"(({c}) >> 1)")
        col = E.binary(Op.ADD, E.binary(Op.MUL, pair, E.const(2)), lane)
        value = E.select(E.compare(Op.EQ, lane, E.const(0)), w.raw_var(v0, epi.tile.dtype),
                         w.raw_var(v1, epi.tile.dtype))
        at = {epi.rows.var: row, epi.cols.var: col}
        body = map_stmt(epi.cols.body, lambda e: rewrite(
            substitute(e, at), lambda n: value
            if isinstance(n, ir.Load) and n.buffer is epi.tile else None))
        return w.captured(ir.For(lane, E.const(0), E.const(2), "vectorized", body))
    return store


def emit_block(w: Any, s: ir.For, intrin: TensorIntrin) -> None:
    """The main loop of the gemm_block nest headed by ``s``: its operands read from global
    memory, its accumulators stored into the nest's shared tile (whose allocation the
    operand region shares: w.wg_regions)."""
    where = f"kernel {w.name}: loop {s.var.name} tensorized as {intrin.name}"
    nest = _parse(s, where)
    threads = [const_int(e) for e in w.launch["threadIdx"]]
    if threads[1:] != [1, 1] or not threads[0] or threads[0] % WARPGROUP:
        raise CompileError(f"{where}: the block must be whole warpgroups along threadIdx.x; "
                           f"it is {threads}")
    out = nest.update.buffer
    ml = w.wg_loops[out]  # block_loop's, derived when the kernel's shared memory was sized
    why = ml.check()
    if why:
        raise CompileError(f"{where}: {why}")
    depth = const_int(nest.loops[2].extent)
    ops = []
    for read, what, tile_rows in zip(_operands(nest), "AB", (ml.block_m, ml.block_n)):
        acc, k_major, row_dim, k_dim = read
        ld = (acc.strides[0] or acc.strides[1]) if k_major else acc.strides[2]
        extent = const_int(acc.buffer.shape[-1])
        if extent is None or extent % ml.lanes or (ld * ml.itemsize) % CHUNK \
                or known_divisor(acc.base) % ml.lanes:
            raise CompileError(f"{where}: operand {what} ({acc.buffer.name}) needs rows of "
                               f"16-byte multiples from 16-byte aligned tiles (rows of "
                               f"{extent}, leading dimension {ld}, offset {acc.base})")
        rows = (f"{w._expr(acc.buffer.shape[row_dim])} - "
                f"({w._expr(acc.origin[row_dim])})")
        tma = None
        if ml.tma:
            tm = _tma_map(nest, ml, read, tile_rows)
            assert tm is not None, "block_loop checked the operand"
            param = f"as_tm{len(w.tensor_maps)}"
            w.tensor_maps.append((param, acc.buffer, tm))
            tma = TmaRead(param, tm, tuple(w._expr(o) for o in acc.origin), k_dim, row_dim)
        ops.append(Operand(w.names.get(acc.buffer.uid, acc.buffer.name), w._expr(acc.base),
                           int(ld), rows, int(depth or 0), tma))
    dst = affine_access(nest, out, nest.update.indices)
    if dst.strides[1] != 1 or dst.strides[2] != 0:
        raise CompileError(f"{where}: the tile {out.name} must be row-major along (i, j)")
    name = w.names.get(out.uid, out.name)
    base, stride = w._expr(dst.base), dst.strides[0]
    region = w.wg_regions.get(out)
    if region is None:
        raise CompileError(f"{where}: the tile {out.name} is not allocated for a main loop")

    def staged(r: str, c: str, v0: str, v1: str) -> list[str]:
        at = f"{base} + ({r}) * {stride} + ({c})"
        return [f"{name}[{at}] = {v0};", f"{name}[{at} + 1] = {v1};"]

    store: Callable[[str, str, str, str], list[str]] = staged
    epi = w.wg_epilogues.get(out)
    if epi is not None:
        if epi.threads != threads[0]:
            raise CompileError(f"{where}: its epilogue nest is marked for {epi.threads} "
                               f"threads; the block has {threads[0]}")
        store = _epilogue_store(w, epi)
        w.wg_done.add(out)
    w.fw.helpers[_instruction(ml)] = helpers(ml)
    for line in main_loop(ml, ops[0], ops[1], region, store, shared_store=epi is None):
        w.emit(line)
