"""MobileNetV2 (batch 1, 224x224, autosched.testing.models) untuned on this CPU next to
onnxruntime, timed in alternating rounds (benchmarks/baseline.py) on each thread count; with
``--kernels``, each kernel's time on one thread next to onnxruntime's per-node profile
(both taken in the same run, kernels paired in order: convolutions, pooling, the Gemm).

    python benchmarks/mobilenet_cpu.py [--threads 1 2] [--rounds 5] [--kernels]

Results go to benchmarks/results/mobilenet_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

# onnxruntime nodes with no kernel of ours: layout reorders and the Flatten view
_ORT_ONLY = {"ReorderInput", "ReorderOutput", "Flatten", "Reshape"}


def ort_profile(proto: object, feeds: dict, runs: int) -> list[tuple[str, float]]:
    """(op type, median seconds) per onnxruntime node in execution order, on one thread."""
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.enable_profiling = 1, True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    sess = ort.InferenceSession(proto.SerializeToString(), opts,  # type: ignore[attr-defined]
                                providers=["CPUExecutionProvider"])
    for _ in range(runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    times: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times.setdefault(e["name"], []).append(e["dur"] / 1e6)
            ops[e["name"]] = e["args"].get("op_name", "")
    return [(ops[n], float(np.median(t[runs // 4:]))) for n, t in times.items()
            if ops[n] not in _ORT_ONLY]


def kernel_table(graph: object, proto: object, feeds: dict, runs: int) -> list[dict]:
    import autosched as aus

    ours = aus.compile(graph, "llvm -num-cores=1").kernel_times(feeds, repeat=runs)
    theirs = ort_profile(proto, feeds, runs)
    if len(ours) != len(theirs):
        raise SystemExit(f"{len(ours)} kernels against {len(theirs)} onnxruntime nodes")
    rows = [{"kernel": k, "ort_op": op, "ms": t * 1e3, "ort_ms": o * 1e3}
            for (k, t), (op, o) in zip(ours, theirs)]
    print("| # | kernel | onnxruntime op | ms | onnxruntime ms | ratio |\n|---:|---|---|---:|---:|---:|")
    for i, r in enumerate(rows):
        print(f"| {i} | {r['kernel']} | {r['ort_op']} | {r['ms']:.3f} | {r['ort_ms']:.3f} | "
              f"{r['ms'] / r['ort_ms']:.2f} |")
    total, ort_total = sum(r["ms"] for r in rows), sum(r["ort_ms"] for r in rows)
    print(f"| | total | | {total:.2f} | {ort_total:.2f} | {total / ort_total:.2f} |", flush=True)
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kernels", action="store_true", help="per-kernel table on one thread")
    ap.add_argument("--out", default="benchmarks/results/mobilenet_cpu.json")
    args = ap.parse_args(argv)
    baseline.prepare()
    import numpy as np

    import autosched as aus
    from autosched.testing import models

    print(baseline.header(), flush=True)
    proto = models.mobilenet_v2()
    name = proto.graph.input[0].name
    feeds = {name: np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("float32")}
    graph = aus.from_onnx(proto)
    results: dict = {"machine": baseline.header(), "threads": {}}
    for threads in args.threads:
        model = aus.compile(graph, f"llvm -num-cores={threads}")
        sess = models.ort_session(proto, threads)
        got = baseline.alternate({
            "autosched": lambda m=model: m.time(feeds, min_s=1.0),
            "onnxruntime": lambda s=sess: baseline.median_seconds(
                lambda: s.run(None, feeds), min_s=1.0, min_runs=20)}, args.rounds)
        print(f"threads {threads}, ms, median of {args.rounds} alternating rounds (best round): "
              f"{baseline.rounds_line(got, digits=2)}", flush=True)
        results["threads"][threads] = {n: [t * 1e3 for t in r.seconds] for n, r in got.items()}
    if args.kernels:
        results["kernels"] = kernel_table(graph, proto, feeds, runs=30)
    baseline.save(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
