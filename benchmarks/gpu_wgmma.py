"""The wgmma main loop (targets/cuda/wgmma.py) against cuBLAS: block tiles side by side on GEMM
shapes, in alternating rounds on one Hopper GPU; every kernel checked against float64 first.

    python benchmarks/gpu_wgmma.py                                   # every shape and tile
    python benchmarks/gpu_wgmma.py --shapes gemm4096 --tiles 128x256w2s3 --dtype bfloat16

Shapes are gpu_mma_tiles.py's (A @ B, B with N last: MN-major) and ``gemm4096_nt`` (A @ B.T,
both K-major, the only form tf32 takes: ``--dtype float32``). cuBLAS is torch.matmul on the same
operands (reduced-precision reductions off; TF32 on for float32).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import numpy as np  # noqa: E402
import torch  # noqa: E402  before autosched, as in the other GPU benchmarks

from autosched.targets.cuda import runtime  # noqa: E402
from autosched.targets.cuda.launch import TENSOR_MAP, DriverFunction  # noqa: E402
from autosched.targets.cuda.nvrtc import compile_cuda  # noqa: E402
from autosched.targets.cuda.tma import encode  # noqa: E402
from autosched.targets.cuda.wgmma import MainLoop, WgmmaGemm, gemm_source  # noqa: E402
from benchmarks.gpu_mma_tiles import SHAPES as TILE_SHAPES  # noqa: E402
from benchmarks.gpu_mma_tiles import Peer, print_peer, print_rows  # noqa: E402

SHAPES = {**TILE_SHAPES, "gemm4096_nt": ((4096, 4096), (4096, 4096))}
NT = {"gemm4096_nt"}
# name: (block_m, block_n, warpgroups, stages)
TILES = {
    "128x128w2s4": (128, 128, 2, 4),
    "128x128w2s6": (128, 128, 2, 6),
    "128x256w2s3": (128, 256, 2, 3),
    "128x256w2s4": (128, 256, 2, 4),
    "256x128w2s4": (256, 128, 2, 4),
    "128x192w2s5": (128, 192, 2, 5),
    "64x256w1s6": (64, 256, 1, 6),
    "128x64w2s8": (128, 64, 2, 8),
}


COPIES = {"cp.async": {}, "tma": {"tma": True}, "tma-ws": {"tma": True, "producer": True}}


def spec_for(shape: str, tile: str, dtype: str, copies: str = "cp.async") -> WgmmaGemm:
    a_shape, b_shape = SHAPES[shape]
    m, k = a_shape[-2:]
    n = b_shape[-2] if shape in NT else b_shape[-1]
    batch = max(a_shape[0] if len(a_shape) == 3 else 1, b_shape[0] if len(b_shape) == 3 else 1)
    bm, bn, wg, st = TILES[tile]
    loop = MainLoop(dtype=dtype, block_m=bm, block_n=bn, warpgroups=wg, stages=st,
                    b_k_major=shape in NT, **COPIES[copies])
    return WgmmaGemm(m=m, n=n, k=k, loop=loop, batch=batch,
                     a_batch_stride=m * k if len(a_shape) == 3 else 0,
                     b_batch_stride=k * n if len(b_shape) == 3 else 0,
                     name="wgmma_" + tile.replace("x", "_"))


class Kernel:
    """A compiled wgmma GEMM, launched with torch tensors' pointers."""

    def __init__(self, spec: WgmmaGemm) -> None:
        binary = compile_cuda(gemm_source(spec), "sm_90a",
                              needs_headers=spec.loop.dtype != "float32",
                              name=spec.name + ".cu")
        drv = runtime.driver()
        runtime.context()
        self.module = drv.module_from_buffer(binary.data)
        self.fn = (DriverFunction(binary.data, spec.name, (TENSOR_MAP,) * 2 + ("P",) * 3)
                   if spec.loop.tma else self.module.get_function(spec.name))
        self.grid, self.block, self.shared = spec.launch()
        self.fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.shared)
        self.regs = self.fn.get_attribute(drv.function_attribute.NUM_REGS)
        self.local = self.fn.get_attribute(drv.function_attribute.LOCAL_SIZE_BYTES)
        self.log = binary.log
        self.maps = [r.map for r in spec.reads()] if spec.loop.tma else []
        self._encoded: dict[tuple[int, int], list[bytes]] = {}

    def __call__(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        key = (a.data_ptr(), b.data_ptr())
        if self.maps and key not in self._encoded:
            self._encoded[key] = [encode(tm, p) for tm, p in zip(self.maps, key)]
        if self.maps:
            self.fn.prepared_call(self.grid, self.block, *self._encoded[key], a.data_ptr(),
                                  b.data_ptr(), c.data_ptr(), shared_size=self.shared)
        else:
            self.fn(_ptr(a), _ptr(b), _ptr(c), grid=self.grid, block=self.block,
                    shared=self.shared)


def _ptr(t: torch.Tensor) -> object:
    return np.uintp(t.data_ptr())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--tiles", nargs="*", default=list(TILES), choices=list(TILES))
    p.add_argument("--copies", nargs="*", default=["cp.async"], choices=list(COPIES),
                   help="how the main loop copies its K tiles (each tile once per choice): "
                        "every thread by cp.async, one thread by TMA, or a producer "
                        "warpgroup by TMA")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()

    print_peer(args.dtype)
    rows = []
    for shape in args.shapes:
        if args.dtype == "float32" and shape not in NT:
            continue
        rows += _shape(shape, args)
    print_rows(rows, "regs")


def _shape(shape: str, args: argparse.Namespace) -> list[str]:
    peer = Peer(*SHAPES[shape], args.dtype, transpose_b=shape in NT)
    regs = {"cuBLAS": ""}
    for tile, copies in [(t, c) for t in args.tiles for c in args.copies]:
        name = tile + ("" if copies == "cp.async" else f" {copies}")
        spec = spec_for(shape, tile, args.dtype, copies)
        why = spec.check()
        if why:
            print(f"# {shape} {name}: {why}", flush=True)
            continue
        try:
            kern = Kernel(spec)
        except Exception as exc:  # noqa: BLE001  a tile that fails is reported, not fatal
            print(f"# {shape} {name}: {str(exc)[:400]}", flush=True)
            continue
        peer.add(name, kern)
        regs[name] = f"{kern.regs}{'' if not kern.local else f' local {kern.local}'}"
        if kern.log.strip():
            print(f"# {name} NVRTC: {kern.log.strip()[:300]}")
    return peer.rows(shape, args, regs)


if __name__ == "__main__":
    main()
