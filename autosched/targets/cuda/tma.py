"""Hopper's tensor memory accelerator (TMA): bulk tensor copies from global into shared memory,
issued by one thread and counted on an mbarrier, for the wgmma main loop (wgmma.py).

A ``TensorMap`` says how a copy reads a buffer: its dtype, its (C-contiguous, static) shape and
the box a copy moves, both outermost first, and the 128-byte swizzle the tensor cores read
(chunk ``c`` of row ``r`` of an 8-row group stored at chunk ``c ^ r``, the layout the cp.async
main loop writes). The host encodes it into the driver's 128-byte descriptor
(``cuTensorMapEncodeTiled``) once it knows the buffer's address, and passes the descriptor as a
``const __grid_constant__ as_tensor_map`` kernel parameter, before the buffers: the runtime
(runtime.py) at each launch, the deployed library (library.py) when it records its launches,
host emulation (host_prelude.py) as the copy's own description. Elements past the shape read
as zero, so no operand is padded.

The device side (``HELPERS``): ``as_mbar_init`` / ``as_mbar_fence_init`` / ``as_mbar_expect``
(arrive, expecting so many bytes) / ``as_mbar_try_wait`` (whether the phase of a parity has
completed) / ``as_mbar_inval`` on 8-byte mbarriers in shared memory, and ``as_tma_load<R>``
(a rank-R box at coordinates given innermost first, into a 1,024-aligned shared address,
completing its bytes on an mbarrier).

Example::

    tm = TensorMap("float16", (4096, 4096), (128, 64))   # rows of 64 halves: 128 bytes
    param = encode(tm, a_device_pointer)                  # 128 bytes for the launch
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

from autosched.errors import RuntimeError_

DESCRIPTOR_BYTES = 128
MAX_RANK = 5
MAX_BOX = 256
SWIZZLE_BYTES = 128  # the inner box dimension's bytes: one swizzled row
DATA_TYPES = {"float16": 6, "bfloat16": 9, "float32": 7}  # CUtensorMapDataType
# cuTensorMapEncodeTiled's last four arguments, for every descriptor (the runtime's and the
# CUDA library's): no interleave, the 128-byte swizzle, L2 promotion of 256 bytes, zeros past
# the edges
ENCODE_OPTIONS = (0, 3, 3, 0)
PARAM_TYPE = "as_tensor_map"


@dataclass(frozen=True)
class TensorMap:
    """Boxes of ``box`` elements (outermost first) of a C-contiguous ``dtype`` tensor of
    ``shape``; the innermost box dimension is 128 bytes (one swizzled row)."""

    dtype: str
    shape: tuple[int, ...]
    box: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype in ("float16", "bfloat16") else 4

    @property
    def box_bytes(self) -> int:
        n = self.itemsize
        for b in self.box:
            n *= b
        return n

    def check(self) -> str | None:
        """Why the TMA cannot copy such boxes, or None."""
        if self.dtype not in DATA_TYPES:
            return f"no tensor map for {self.dtype}"
        if not 1 <= len(self.shape) <= MAX_RANK or len(self.box) != len(self.shape):
            return f"rank {len(self.shape)} (box rank {len(self.box)}): 1 to {MAX_RANK}"
        if any(not 1 <= b <= MAX_BOX for b in self.box):
            return f"box {self.box}: each dimension 1 to {MAX_BOX}"
        if self.box[-1] * self.itemsize != SWIZZLE_BYTES:
            return f"the box's rows are {self.box[-1] * self.itemsize} bytes, not 128"
        if (self.shape[-1] * self.itemsize) % 16:
            return f"rows of {self.shape[-1]} elements are no multiple of 16 bytes"
        if any(d < 1 or d >= 1 << 32 for d in self.shape):
            return f"shape {self.shape}: each dimension 1 to 2^32 - 1"
        return None

    def strides(self) -> list[int]:
        """Byte strides of the dimensions outside the innermost, innermost first."""
        out, acc = [], self.itemsize
        for d in reversed(self.shape[1:]):
            acc *= d
            out.append(acc)
        return out


@functools.cache
def _encoder() -> Any:
    from autosched.targets.cuda.launch import driver_functions

    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    signature = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                 u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)
    return driver_functions({"cuTensorMapEncodeTiled": signature},
                            "TMA copies need libcuda.so.1 from CUDA 12 or newer"
                            )["cuTensorMapEncodeTiled"]


def encode(tm: TensorMap, address: int) -> bytes:
    """The driver's descriptor of ``tm`` over the device buffer at ``address`` (16-byte
    aligned); RuntimeError_ naming the map when the driver refuses it."""
    why = tm.check()
    if why:
        raise RuntimeError_(f"tensor map {tm}: {why}")
    rank = len(tm.shape)
    dims = (ctypes.c_uint64 * rank)(*reversed(tm.shape))
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(*tm.strides())
    box = (ctypes.c_uint32 * rank)(*reversed(tm.box))
    ones = (ctypes.c_uint32 * rank)(*[1] * rank)
    raw = ctypes.create_string_buffer(DESCRIPTOR_BYTES + 64)  # the descriptor is 64-aligned
    at = ctypes.addressof(raw) + (-ctypes.addressof(raw) % 64)
    code = _encoder()(at, DATA_TYPES[tm.dtype], rank, ctypes.c_void_p(address), dims, strides,
                      box, ones, *ENCODE_OPTIONS)
    if code:
        raise RuntimeError_(f"cuTensorMapEncodeTiled refused tensor map {tm} at address "
                            f"{address:#x}: CUDA error {code}")
    return ctypes.string_at(at, DESCRIPTOR_BYTES)


def _load(rank: int) -> str:
    coords = ", ".join(f"%{3 + i}" for i in range(rank))
    args = ", ".join(f"int c{i}" for i in range(rank))
    ins = ", ".join(f'"r"(c{i})' for i in range(rank))
    return (
        f"__device__ __forceinline__ void as_tma_load{rank}(unsigned dst, const {PARAM_TYPE}& "
        f"tm, unsigned bar, {args}) {{\n"
        f'  asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::'
        f'complete_tx::bytes [%0], [%1, {{{coords}}}], [%2];\\n"\n'
        f'               :: "r"(dst), "l"((unsigned long long)&tm), "r"(bar), {ins} '
        ': "memory"); }\n')


HELPERS = (
    "#ifndef AS_TMA\n#define AS_TMA\n#ifndef AS_HOST_EMULATION\n"
    f"struct __align__(64) {PARAM_TYPE} {{ unsigned long long v[16]; }};\n"
    r"""__device__ __forceinline__ void as_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory"); }
__device__ __forceinline__ void as_mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void as_mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(bar), "r"(bytes) : "memory"); }
__device__ __forceinline__ bool as_mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0; }
__device__ __forceinline__ void as_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory"); }
template <int N> __device__ __forceinline__ void as_wg_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(N)); }
template <int N> __device__ __forceinline__ void as_wg_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(N)); }
__device__ __forceinline__ void as_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory"); }
__device__ __forceinline__ void as_mbar_inval(unsigned bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory"); }
"""
    + "".join(_load(r) for r in range(1, MAX_RANK + 1))
    + "#endif\n#endif\n"
)
