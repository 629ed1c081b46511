"""Tensor-core tiles side by side: fixed knob settings of the tensor-core sketch on GEMM shapes,
against cuBLAS, in alternating rounds on one GPU (no tuning: what each tile can do).

    python benchmarks/gpu_mma_tiles.py                          # every shape, every tile
    python benchmarks/gpu_mma_tiles.py --shapes gemm4096 --tiles default 128x128w8

The shapes are the 4096^3 GEMM and the matmuls of ResNet-18's convolutions at batch 32 in the
two forms a convolution can take: per image (the kernel's (O, K) matrix times each image's
(K, P) patches, a batched product whose weight broadcasts, as graph.passes.gemm_convs builds
it) and as one GEMM over the batch's pixels ((O, K) times (K, N * P)). A and B are float16
(``--dtype bfloat16``), C float32 with float32 accumulation: the fp16 precision's task.
cuBLAS is torch.matmul on the same operands (reduced-precision reductions off). Every kernel
is checked against float64 before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import torch  # noqa: E402  before autosched, as in the other GPU benchmarks

from autosched import te  # noqa: E402
from autosched.search.space import Candidate, SearchSpace  # noqa: E402
from autosched.search.task import Task  # noqa: E402
from autosched.te import ops  # noqa: E402

PRECISION = {"float16": "fp16", "bfloat16": "bf16"}
# name: (A's shape, B's shape); A @ B with numpy's broadcasting
SHAPES = {
    "gemm4096": ((4096, 4096), (4096, 4096)),
    "l1_image": ((64, 576), (32, 576, 3136)),  # layer1's 3x3 convs, batch 32, per image
    "l1_batch": ((64, 576), (576, 32 * 3136)),  # the same as one GEMM over the batch's pixels
    "l3_image": ((256, 2304), (32, 2304, 196)),
    "l3_batch": ((256, 2304), (2304, 32 * 196)),
    "l4_image": ((512, 4608), (32, 4608, 49)),
    "l4_batch": ((512, 4608), (4608, 32 * 49)),
    # the batch forms with K split as passes.k_splits splits them at batch 32 (partial sums)
    "l2_split2": ((2, 128, 576), (2, 576, 32 * 784)),
    "l3_split4": ((4, 256, 576), (4, 576, 32 * 196)),
    "l4_split8": ((8, 512, 576), (8, 576, 32 * 49)),
}
# name: knob values by suffix (warps_m, warps_n, frags_m, frags_n, k_chunk, stages, ...);
# the rest at their defaults. Block tile: warps x frags x 16 on each side.
TILES = {
    "default": {},
    "64x128w4": {"frags_n": 4},
    "128x64w4": {"frags_m": 4},
    "128x128w4": {"frags_m": 4, "frags_n": 4},
    "128x128w8": {"warps_n": 4, "frags_m": 4, "stages": 3},
    "128x128w8s2": {"warps_n": 4, "frags_m": 4},
    "128x128w8k4": {"warps_n": 4, "frags_m": 4, "k_chunk": 4},
    "128x256w8": {"warps_n": 4, "frags_m": 4, "frags_n": 4, "stages": 3},
    "256x128w8": {"warps_m": 4, "frags_m": 4, "frags_n": 4, "stages": 3},
    # the warpgroup sketch (wgmma, sm_90): block_m, block_n, warpgroups, stages
    "wg128x128": {"block_m": 128, "block_n": 128, "warpgroups": 2, "stages": 4},
    "wg128x256s3": {"block_m": 128, "block_n": 256, "warpgroups": 2, "stages": 3},
    "wg128x256s4": {"block_m": 128, "block_n": 256, "warpgroups": 2, "stages": 4},
    "wg128x128w1": {"block_m": 128, "block_n": 128, "warpgroups": 1, "stages": 4},
    "wg64x128": {"block_m": 64, "block_n": 128, "warpgroups": 1, "stages": 6},
    "wg128x64": {"block_m": 128, "block_n": 64, "warpgroups": 2, "stages": 6},
}


def tile_task(a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: str) -> Task:
    """The fp16 / bf16 precision's matmul task of A @ B, float32 out."""
    a = te.placeholder(a_shape, dtype, name="A")
    b = te.placeholder(b_shape, dtype, name="B")
    c = ops.matmul(a, b, out_dtype="float32")
    return Task([c], args=[a, b, c], target="cuda", precision=PRECISION[dtype])


def tile_candidate(space: SearchSpace, values: dict[str, int],
                   kind: str = "mma") -> Candidate | None:
    """The tensor-core sketch (rule ``kind``: "mma", or "wgmma" for the warpgroup one) with
    ``values`` (knob suffix -> value), or None without one."""
    for idx, sk in enumerate(space.sketches):
        if any(r.kind == kind for r in sk.rules):
            return Candidate(idx, tuple((k.name, values.get(k.name.rsplit(".", 1)[1],
                                                             k.default())) for k in sk.knobs))
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--tiles", nargs="*", default=list(TILES), choices=list(TILES))
    p.add_argument("--dtype", choices=sorted(PRECISION), default="float16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()

    print_peer(args.dtype)
    rows = []
    for shape in args.shapes:
        rows += _shape(shape, args)
    print_rows(rows)


def print_peer(dtype: str) -> None:
    """cuBLAS without reduced-precision reductions (TF32 on for float32 operands), said with
    the machine's header."""
    for half in ("fp16", "bf16"):
        setattr(torch.backends.cuda.matmul, f"allow_{half}_reduced_precision_reduction", False)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "float32"
    print(baseline.header())
    print(f"# peer: cuBLAS (torch {torch.__version__} matmul), no reduced-precision reductions")
    print(f"# {dtype} operands, float32 accumulation, on {torch.cuda.get_device_name()}",
          flush=True)


def print_rows(rows: list[str], notes: str = "") -> None:
    """The table of every shape's rows (``notes``: the heading of a last column)."""
    print(f"\n{'shape':<12}{'kernel':<16}{'median ms':>10}{'best ms':>9}{'TFLOPS':>8}"
          f"{'vs cuBLAS':>11}{'rel err':>10}{'  ' + notes if notes else ''}")
    for row in rows:
        print(row)


class Peer:
    """Random operands of ``A @ B`` (B given as (N, K) with ``transpose_b``), their float64
    product, and the sides timed against it: cuBLAS (torch.matmul) first, then each added
    kernel, all checked against the product."""

    def __init__(self, a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: str,
                 transpose_b: bool = False) -> None:
        tdtype = getattr(torch, dtype)
        self.a = torch.randn(*a_shape, device="cuda").to(tdtype)
        self.b = torch.randn(*b_shape, device="cuda").to(tdtype)
        bt = self.b.transpose(-1, -2) if transpose_b else self.b
        self.ref = torch.matmul(self.a.double(), bt.double())
        self.flops = 2.0 * a_shape[-1] * self.ref.numel()
        out = torch.empty(self.ref.shape, device="cuda", dtype=tdtype)
        self.sides: dict[str, Callable[[], object]] = {
            "cuBLAS": lambda: torch.matmul(self.a, bt, out=out)}
        self.errors = {"cuBLAS": self.error(torch.matmul(self.a, bt))}

    def error(self, c: torch.Tensor) -> float:
        return ((c.double() - self.ref).norm() / self.ref.norm()).item()

    def add(self, name: str, run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]
            ) -> None:
        """The kernel ``run(a, b, c)`` (c float32), checked once, then a side."""
        c = torch.full(tuple(self.ref.shape), float("nan"), device="cuda")
        run(self.a, self.b, c)
        torch.cuda.synchronize()
        self.errors[name] = self.error(c)
        self.sides[name] = lambda: run(self.a, self.b, c)

    def rows(self, shape: str, args: argparse.Namespace,
             notes: dict[str, str] | None = None) -> list[str]:
        return time_rows(shape, self.sides, self.errors, self.flops, args.rounds, args.repeat,
                         notes)


def _shape(shape: str, args: argparse.Namespace) -> list[str]:
    """The table rows of one shape."""
    a_shape, b_shape = SHAPES[shape]
    peer = Peer(a_shape, b_shape, args.dtype)
    task = tile_task(a_shape, b_shape, args.dtype)
    space = SearchSpace(task)
    for name in args.tiles:
        cand = tile_candidate(space, TILES[name], "wgmma" if name.startswith("wg") else "mma")
        low = space.lower(cand) if cand is not None else None
        if low is None or low.schedule is None:
            print(f"# {shape}: tile {name} does not apply, left out", flush=True)
            continue
        peer.add(name, task.build(low.schedule))
    return peer.rows(shape, args)


def time_rows(shape: str, sides: dict[str, Callable[[], object]], errors: dict[str, float],
              flops: float, rounds: int, repeat: int,
              notes: dict[str, str] | None = None) -> list[str]:
    """The table rows of one shape: each side (cuBLAS first) timed in alternating rounds,
    its TFLOP/s, its speed against cuBLAS and its relative error (WRONG from 1e-2)."""
    timers = {n: (lambda fn=fn: baseline.cuda_median_seconds(fn, repeat))
              for n, fn in sides.items()}
    results = baseline.alternate(timers, rounds)
    blas = results["cuBLAS"].median
    out = []
    for name, r in results.items():
        bad = "" if errors[name] < 1e-2 else "  WRONG"
        out.append(f"{shape:<12}{name:<16}{r.median * 1e3:10.3f}{r.best * 1e3:9.3f}"
                   f"{flops / r.median / 1e12:8.1f}{blas / r.median:10.0%} "
                   f"{errors[name]:9.1e}  {(notes or {}).get(name, '')}{bad}")
        print(out[-1], flush=True)
    return out


if __name__ == "__main__":
    main()
