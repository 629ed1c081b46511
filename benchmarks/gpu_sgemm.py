"""SGEMM on the GPU: the hand-written autosched schedule against cuBLAS, in one run.

    python benchmarks/gpu_sgemm.py            # 4096^3, a few tile configurations
    python benchmarks/gpu_sgemm.py --size 2048 --configs 128x8x8

cuBLAS is torch.matmul with TF32 off (plain float32 FMA, as our kernel). Each result is checked
against float64 (relative Frobenius error) before it is timed; times are medians of CUDA-event
timings after warm-up, cuBLAS timed before and after our kernels.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import torch  # noqa: E402  before autosched, as in the other GPU benchmarks

import autosched as aus  # noqa: E402
from autosched.testing.gpu_sgemm_schedule import sgemm_schedule  # noqa: E402

CONFIGS = ("128x8x8", "128x8x16", "128x8x32", "64x8x16", "64x4x8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--configs", nargs="*", default=list(CONFIGS), help="TILExREGxBK")
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()

    print(baseline.header())
    print(f"# peer: cuBLAS via {baseline.set_torch(tf32=False)}", flush=True)
    M = N = K = args.size
    flops = 2.0 * M * N * K
    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
    a = torch.randn(M, K, device="cuda", generator=gen)
    b = torch.randn(K, N, device="cuda", generator=gen)
    ref = a.double() @ b.double()
    ref_norm = ref.norm().item()
    c_blas = torch.empty(M, N, device="cuda")
    blas_err = ((torch.matmul(a, b) - ref).norm() / ref_norm).item()
    t_blas0 = baseline.cuda_median_seconds(lambda: torch.matmul(a, b, out=c_blas), args.repeat)

    rows = []
    for cfg in args.configs:
        tile, reg, bk = (int(x) for x in cfg.split("x"))
        t0 = time.time()
        s, targs = sgemm_schedule(M, N, K, tile=tile, reg=reg, bk=bk)
        mod = aus.build(s, targs, target="cuda")
        build_s = time.time() - t0
        c = torch.full((M, N), float("nan"), device="cuda")
        mod(a, b, c)
        torch.cuda.synchronize()
        err = ((c.double() - ref).norm() / ref_norm).item()
        t = mod.time(a, b, c, warmup=5, repeat=args.repeat).median
        fn = mod.launches(a, b, c).calls[0].function
        import pycuda.driver as drv

        regs = fn.get_attribute(drv.function_attribute.NUM_REGS)
        rows.append((cfg, t, err, regs, build_s))

    t_blas1 = baseline.cuda_median_seconds(lambda: torch.matmul(a, b, out=c_blas), args.repeat)
    t_blas = min(t_blas0, t_blas1)
    print(f"\nSGEMM {M}x{N}x{K} float32 on {torch.cuda.get_device_name()} "
          f"(cuBLAS via torch {torch.__version__}, TF32 off)")
    print(f"{'kernel':<22}{'ms':>9}{'TFLOPS':>9}{'vs cuBLAS':>11}{'rel err':>10}{'regs':>6}"
          f"{'build s':>9}")
    print(f"{'cuBLAS (torch.matmul)':<22}{t_blas * 1e3:9.3f}{flops / t_blas / 1e12:9.2f}"
          f"{1.0:10.0%} {blas_err:9.1e}{'':>6}{'':>9}   (before {t_blas0 * 1e3:.3f} ms, "
          f"after {t_blas1 * 1e3:.3f} ms)")
    for cfg, t, err, regs, build_s in rows:
        ok = "" if err < 1e-4 else "  WRONG"
        print(f"{'autosched ' + cfg:<22}{t * 1e3:9.3f}{flops / t / 1e12:9.2f}"
              f"{t_blas / t:10.0%} {err:9.1e}{regs:6d}{build_s:9.2f}{ok}")
    best = min((r for r in rows if r[2] < 1e-4), key=lambda r: r[1], default=None)
    if best is not None:
        print(f"best: {best[0]} at {flops / best[1] / 1e12:.2f} TFLOPS = "
              f"{t_blas / best[1]:.0%} of cuBLAS")


if __name__ == "__main__":
    main()
