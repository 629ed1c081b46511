"""Auto-scheduler on the GPU: tuned SGEMM 4096 and the batch-1 ResNet-18 3x3 convolutions next
to cuBLAS / cuDNN (torch, TF32 off) in the same run. Run on the device machine:

    python3 benchmarks/tune_gpu.py --trials 64

Best latencies come from the tuning log (the Measurer times with CUDA events, median of its
repeats); torch is timed with CUDA events too (median of 50 after warm-up).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import torch  # noqa: E402  before autosched, as in the other GPU benchmarks

import autosched as aus  # noqa: E402
from autosched.search.record import RecordLog  # noqa: E402
from autosched.search.workloads import make  # noqa: E402

WORKLOADS = {
    "sgemm_4096": ("gemm", [4096, 4096, 4096]),
    "conv3x3_64": ("conv2d", [1, 64, 56, 56, 64, 3, 3, 1, 1]),
    "conv3x3_128": ("conv2d", [1, 128, 28, 28, 128, 3, 3, 1, 1]),
    "conv3x3_256": ("conv2d", [1, 256, 14, 14, 256, 3, 3, 1, 1]),
    "conv3x3_512": ("conv2d", [1, 512, 7, 7, 512, 3, 3, 1, 1]),
}


def torch_ms(op: str, shape: list[int]) -> float:
    """cuBLAS / cuDNN through torch (TF32 off, like our float32 kernels): median ms."""
    dev = torch.device("cuda")
    if op == "gemm":
        m, n, k = shape
        a, b = torch.rand(m, k, device=dev), torch.rand(k, n, device=dev)
        fn = lambda: torch.matmul(a, b)  # noqa: E731
    else:
        nb, c, h, w, o, kh, kw, s, p = shape
        x, wt = torch.rand(nb, c, h, w, device=dev), torch.rand(o, c, kh, kw, device=dev)
        fn = lambda: torch.nn.functional.conv2d(x, wt, stride=s, padding=p)  # noqa: E731
    return baseline.cuda_median_seconds(fn, repeat=50, warmup=10) * 1e3


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "tune_gpu.json")
    args = p.parse_args()
    print(baseline.header())
    print(f"# peer: {baseline.set_torch(tf32=False)}", flush=True)
    rows = []
    for name in args.workloads:
        op, shape = WORKLOADS[name]
        tensors = make(op, shape)
        task = aus.Task(lambda t=tensors: t, target="cuda", name=name)
        log = Path("/tmp/tune_gpu") / f"{name}.jsonl"
        log.unlink(missing_ok=True)
        t0 = time.perf_counter()
        aus.tune(task, trials=args.trials, log=log,
                 options=aus.TuneOptions(batch_size=args.batch_size, seed=0, verbose=False),
                 build_workers=12, repeat=5, min_repeat_ms=20)
        wall = time.perf_counter() - t0
        recs = RecordLog(log).records_for(task.workload_key, task.target)
        ok = [r for r in recs if r.ok]
        best = min((r.cost for r in ok), default=math.inf)
        ref = torch_ms(op, shape)
        row = {"workload": name, "trials": len(recs), "valid": len(ok), "autosched_ms": best * 1e3,
               "tflops": task.flop_count / best / 1e12 if ok else 0.0, "torch_ms": ref,
               "ratio": ref / (best * 1e3) if ok else 0.0, "tune_wall_s": wall}
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print("| workload | trials | valid | autosched ms | TFLOPS | torch ms | autosched/torch speed | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['workload']} | {r['trials']} | {r['valid']} | {r['autosched_ms']:.3f} | "
              f"{r['tflops']:.2f} | {r['torch_ms']:.3f} | {r['ratio']:.2f} | {r['tune_wall_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
