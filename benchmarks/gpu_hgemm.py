"""Half-precision GEMM on the GPU: autosched's tensor-core sketch and its SIMT sketch against
cuBLAS, in one run.

    python benchmarks/gpu_hgemm.py                       # 2048 and 4096, 64 trials each
    python benchmarks/gpu_hgemm.py --sizes 4096 --trials 200 --dtype bfloat16

C (float32) = A @ B with A and B in float16 (or bfloat16) and float32 accumulation: the
fp16 / bf16 precision's matmul task. The tuner searches both sketches together; the table
gives each sketch's untuned default, its best tuned candidate (re-timed here, same events as
cuBLAS) and cuBLAS (torch.matmul in the same dtype, reduced-precision reductions off, so it
also accumulates in float32; its output is half, ours float32). Every result is checked against
float64 before it is timed (relative Frobenius error).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import torch  # noqa: E402  before autosched, as in the other GPU benchmarks

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.search.record import RecordLog  # noqa: E402
from autosched.search.space import Candidate, SearchSpace  # noqa: E402
from autosched.search.task import Task  # noqa: E402
from autosched.te import ops  # noqa: E402

PRECISION = {"float16": "fp16", "bfloat16": "bf16"}
# fixed tensor-core tiles timed beside the defaults (knob values by suffix): the staged store
# against the direct one, at the default tile and at 128 x 128 (four warps of 64 x 64)
VARIANTS = {"default, direct store": {"direct": 1},
            "128x128": {"warps_m": 2, "warps_n": 2, "frags_m": 4, "frags_n": 4},
            "128x128, direct store": {"warps_m": 2, "warps_n": 2, "frags_m": 4, "frags_n": 4,
                                      "direct": 1}}


def uses_tensor_cores(sketch) -> bool:
    """Whether ``sketch`` is the tensor-core one (its order among the sketches depends on the
    shape: sketch_mma.fills_tiles puts it first for large outputs)."""
    return any(r.kind == "mma" for r in sketch.rules)


def _label(space: SearchSpace, idx: int) -> str:
    return "tensor cores" if uses_tensor_cores(space.sketches[idx]) else "SIMT"


def _task(n: int, dtype: str) -> Task:
    a = te.placeholder((n, n), dtype, name="A")
    b = te.placeholder((n, n), dtype, name="B")
    c = ops.matmul(a, b, out_dtype="float32")
    return Task([c], args=[a, b, c], target="cuda", precision=PRECISION[dtype])


def _timed(task: Task, schedule, a, b, ref, ref_norm, repeat: int) -> tuple[float, float]:
    """(median seconds, relative error) of ``schedule`` on the GPU."""
    mod = task.build(schedule)
    c = torch.full(tuple(ref.shape), float("nan"), device="cuda")
    mod(a, b, c)
    torch.cuda.synchronize()
    err = ((c.double() - ref).norm() / ref_norm).item()
    return mod.time(a, b, c, warmup=5, repeat=repeat).median, err


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[2048, 4096])
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(PRECISION), default="float16")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--log", help="tuning log (default: a temporary one)")
    args = p.parse_args()

    print(baseline.header())
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    print(f"# peer: cuBLAS via torch {torch.__version__} matmul in {args.dtype}, "
          "reduced-precision reductions off", flush=True)
    tdtype = getattr(torch, args.dtype)
    tmp = tempfile.TemporaryDirectory()
    rows = []
    for n in args.sizes:
        flops = 2.0 * n ** 3
        gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
        a = torch.randn(n, n, device="cuda", generator=gen).to(tdtype)
        b = torch.randn(n, n, device="cuda", generator=gen).to(tdtype)
        ref = a.double() @ b.double()
        ref_norm = ref.norm().item()
        c_blas = torch.empty(n, n, device="cuda", dtype=tdtype)
        blas_err = ((torch.matmul(a, b).double() - ref).norm() / ref_norm).item()
        def blas(a=a, b=b, c=c_blas):
            return torch.matmul(a, b, out=c)

        t_blas0 = baseline.cuda_median_seconds(blas, args.repeat)
        task = _task(n, args.dtype)
        space = SearchSpace(task)
        found = {}
        for idx in range(len(space.sketches)):
            knobs = space.sketches[idx].knobs
            variants = {"default": {}}
            if uses_tensor_cores(space.sketches[idx]):
                variants.update(VARIANTS)
            for label, values in variants.items():
                cand = Candidate(idx, tuple(
                    (k.name, values.get(k.name.rsplit(".", 1)[1], k.default())) for k in knobs))
                low = space.lower(cand)
                if low is not None and low.schedule is not None:
                    found[f"{_label(space, idx)} {label}"] = low.schedule
        log = args.log or str(Path(tmp.name) / f"hgemm{n}.jsonl")
        t0 = time.time()
        aus.tune(task, trials=args.trials, log=log)
        tune_s = time.time() - t0
        recs = [r for r in RecordLog(log).records_for(task.workload_key, task.target) if r.ok]
        for idx in range(len(space.sketches)):
            mine = [r for r in recs if r.extra.get("candidate", {}).get("sketch") == idx]
            if mine:
                best = min(mine, key=lambda r: r.cost)
                found[f"{_label(space, idx)} tuned ({len(mine)})"] = \
                    task.schedule(best.schedule_steps())
        timed = {name: _timed(task, s, a, b, ref, ref_norm, args.repeat)
                 for name, s in found.items()}
        t_blas1 = baseline.cuda_median_seconds(blas, args.repeat)
        t_blas = min(t_blas0, t_blas1)
        rows.append((n, "cuBLAS", t_blas, blas_err, flops, t_blas))
        for name, (t, err) in timed.items():
            rows.append((n, "autosched " + name, t, err, flops, t_blas))
        print(f"# {n}: tuned {args.trials} trials in {tune_s:.0f} s", flush=True)

    print(f"\n{args.dtype} GEMM, float32 accumulation, on {torch.cuda.get_device_name()}")
    print(f"{'n':>6}  {'kernel':<34}{'ms':>9}{'TFLOPS':>9}{'vs cuBLAS':>11}{'rel err':>10}")
    for n, name, t, err, flops, t_blas in rows:
        bad = "" if err < 1e-2 else "  WRONG"
        print(f"{n:6d}  {name:<34}{t * 1e3:9.3f}{flops / t / 1e12:9.1f}{t_blas / t:10.0%} "
              f"{err:9.1e}{bad}")


if __name__ == "__main__":
    main()
