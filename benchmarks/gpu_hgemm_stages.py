"""The tensor-core GEMM's untuned default per pipeline depth (sketch_mma's ``stages`` knob)
against cuBLAS, in alternating rounds on one GPU.

    python benchmarks/gpu_hgemm_stages.py                    # 4096, stages 1 2 3
    python benchmarks/gpu_hgemm_stages.py --sizes 2048 4096 --stages 1 2 --rounds 7

C (float32) = A @ B with A and B in float16 (or bfloat16), the fp16 / bf16 precision's
matmul task, as benchmarks/gpu_hgemm.py builds it. stages 1 copies each K chunk in its own
iteration (16-byte loads and stores, a barrier before and after); 2 and 3 fetch chunks ahead
with cp.async. Every kernel is checked against float64 before it is timed; each round times
every side once (CUDA events, median of ``--repeat`` calls), the side that goes first
rotating.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import torch  # noqa: E402  before autosched, as in the other GPU benchmarks

from autosched.search.space import Candidate, SearchSpace  # noqa: E402
from benchmarks.gpu_hgemm import PRECISION, _task, uses_tensor_cores  # noqa: E402


def _candidate(space: SearchSpace, stages: int) -> Candidate:
    """The tensor-core sketch's default with ``stages``."""
    index = next(n for n, sk in enumerate(space.sketches) if uses_tensor_cores(sk))
    knobs = tuple((k.name, stages if k.name.endswith(".stages") else k.default())
                  for k in space.sketches[index].knobs)
    return Candidate(index, knobs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[4096])
    p.add_argument("--stages", type=int, nargs="*", default=[1, 2, 3])
    p.add_argument("--dtype", choices=sorted(PRECISION), default="float16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()

    for half in ("fp16", "bf16"):  # cuBLAS accumulates in float32, as the kernels do
        setattr(torch.backends.cuda.matmul, f"allow_{half}_reduced_precision_reduction", False)
    print(baseline.header())
    print(f"# peer: cuBLAS (torch {torch.__version__}), no reduced-precision reductions")
    print(f"\n{args.dtype} GEMM, float32 accumulation, on {torch.cuda.get_device_name()}")
    print(f"{'n':>6}  {'kernel':<28}{'median ms':>10}{'best ms':>9}{'TFLOPS':>8}"
          f"{'vs cuBLAS':>11}{'rel err':>10}")
    for n in args.sizes:
        _size(n, args, getattr(torch, args.dtype))


def _size(n: int, args: argparse.Namespace, tdtype: torch.dtype) -> None:
    """The table rows of one size."""
    a = torch.randn(n, n, device="cuda").to(tdtype)
    b = torch.randn(n, n, device="cuda").to(tdtype)
    ref = a.double() @ b.double()
    task = _task(n, args.dtype)
    space = SearchSpace(task)
    c_blas = torch.empty(n, n, device="cuda", dtype=tdtype)
    sides = {"cuBLAS": lambda: torch.matmul(a, b, out=c_blas)}
    errors = {"cuBLAS": ((torch.matmul(a, b).double() - ref).norm() / ref.norm()).item()}
    for stages in args.stages:
        low = space.lower(_candidate(space, stages))
        if low is None or low.schedule is None:
            print(f"# {n}: stages {stages} does not fit this tile, left out", flush=True)
            continue
        mod = task.build(low.schedule)
        c = torch.full((n, n), float("nan"), device="cuda")
        mod(a, b, c)
        torch.cuda.synchronize()
        name = f"autosched tc default stages={stages}"
        errors[name] = ((c.double() - ref).norm() / ref.norm()).item()
        sides[name] = lambda mod=mod, c=c: mod(a, b, c)
    timers = {name: (lambda fn=fn: baseline.cuda_median_seconds(fn, args.repeat))
              for name, fn in sides.items()}
    results = baseline.alternate(timers, args.rounds)
    blas = results["cuBLAS"].median
    for name, r in results.items():
        bad = "" if errors[name] < 1e-2 else "  WRONG"
        print(f"{n:6d}  {name:<28}{r.median * 1e3:10.3f}{r.best * 1e3:9.3f}"
              f"{2.0 * n ** 3 / r.median / 1e12:8.1f}{blas / r.median:10.0%} "
              f"{errors[name]:9.1e}{bad}", flush=True)

if __name__ == "__main__":
    main()
