"""End-to-end latency against tuning wall time: tuned from scratch, tuned starting from the
pretrained cost model, and at zero measurements (``schedule="model"``), next to the untuned
defaults and onnxruntime, in one run on this machine.

    python benchmarks/tuning_efficiency.py                              # small budgets, minutes
    python benchmarks/tuning_efficiency.py --budgets 300 1000 --image 224 --rounds 3
    python benchmarks/tuning_efficiency.py --models resnet18 --image 32 --budgets 8   # smoke
    python benchmarks/tuning_efficiency.py --onnx model.onnx --shape input=1,3,224,224

Models: ResNet-18 and MobileNetV2 of autosched.testing.models, and any ``--onnx`` file (the
corpus models). For each model and each budget (cumulative: the log of the smaller budget is
resumed) both tuning modes run from an empty log of their own, in a temporary directory unless
``--logs DIR`` keeps them; tuning wall time includes search, model training and measurement.
"scratch" is an XGBoost model refit from the job's records only (the behaviour before the
pretrained model); "pretrained" starts from the shipped model and boosts on top of it. Every
compiled model is checked against onnxruntime's output before it is timed; autosched and
onnxruntime are timed in alternation over ``--rounds`` rounds (benchmarks/baseline.py).
Results go to ``--out`` as JSON. On a machine busy with other jobs run it with
``OMP_WAIT_POLICY=passive`` (README: libgomp's spinning makes a compiled model of many parallel
kernels up to 100x slower there, tuned or not).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.cost_model.xgb_model import XGBModel  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.search.tune import TuneOptions  # noqa: E402
from autosched.testing import models  # noqa: E402


def _models(args: argparse.Namespace) -> list[tuple[str, Any, Any]]:
    """(name, ONNX proto or path, graph) of every model asked for."""
    import onnx

    out = []
    for name in args.models:
        proto = models.MODELS[name](image=args.image)
        out.append((name, proto, aus.from_onnx(proto)))
    shapes = dict(s.split("=", 1) for s in args.shape or [])
    binds = {k: tuple(int(d) for d in v.split(",")) for k, v in shapes.items()}
    for path in args.onnx or []:
        out.append((Path(path).stem, onnx.load(path), aus.from_onnx(path, binds)))
    return out


def _timed(compiled: Any, proto: Any, feeds: dict, rounds: int) -> dict[str, float]:
    """Check ``compiled`` against onnxruntime, then time both in alternation (ms)."""
    (want, *_) = models.ort_run(proto, feeds)
    (got, *_) = compiled.run(feeds)
    scale = float(np.abs(want).max()) or 1.0
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * scale):
        raise AssertionError("the compiled model does not match onnxruntime")
    sess = models.ort_session(proto, None)
    got_rounds = baseline.alternate({
        "autosched": lambda: compiled.time(feeds, min_s=1.0),
        "onnxruntime": lambda: baseline.median_seconds(lambda: sess.run(None, feeds),
                                                       min_s=1.0, min_runs=10)}, rounds)
    return {"ms": got_rounds["autosched"].median * 1e3,
            "ort_ms": got_rounds["onnxruntime"].median * 1e3}


def _compile(graph: Any, **kwargs: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tasks without records: said in the table instead
        compiled = aus.compile(graph, "llvm", **kwargs)
    return compiled, time.perf_counter() - t0


def run_model(name: str, proto: Any, graph: Any, args: argparse.Namespace,
              log_dir: Path) -> list[dict[str, Any]]:
    feeds = random_inputs(graph, seed=0)
    rows = []

    def row(mode: str, trials: int, tune_s: float, compiled: Any) -> None:
        r = {"model": name, "mode": mode, "trials": trials, "tune_s": tune_s,
             **_timed(compiled, proto, feeds, args.rounds)}
        rows.append(r)
        print(f"{name:14s} {mode:11s} {trials:6d} {tune_s:9.1f} {r['ms']:10.3f} "
              f"{r['ort_ms']:10.3f} {r['ort_ms'] / r['ms']:8.2f}x", flush=True)

    compiled, secs = _compile(graph, schedule="default")
    row("default", 0, 0.0, compiled)
    compiled, secs = _compile(graph, schedule="model")
    row("model", 0, secs, compiled)  # choosing by the model: its compile time is the cost
    for mode in args.modes:
        log = log_dir / f"{name}-{mode}.jsonl"
        spent = 0.0
        for budget in args.budgets:
            t0 = time.perf_counter()
            aus.tune_graph(graph, "llvm", trials=budget, log=log,
                           model=XGBModel() if mode == "scratch" else None,
                           options=TuneOptions(batch_size=args.batch_size, seed=0,
                                               verbose=False),
                           min_repeat_ms=args.min_repeat_ms)
            spent += time.perf_counter() - t0
            compiled, _ = _compile(graph, log=str(log))
            row(mode, budget, spent, compiled)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["resnet18", "mobilenet_v2"],
                    choices=sorted(models.MODELS))
    ap.add_argument("--onnx", action="append", help="another model (a corpus model)")
    ap.add_argument("--shape", action="append", metavar="NAME=D0,D1,...")
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--budgets", type=int, nargs="+", default=[32, 64],
                    help="trial budgets, cumulative")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--min-repeat-ms", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1, help="alternating timing rounds")
    ap.add_argument("--modes", nargs="+", choices=["scratch", "pretrained"],
                    default=["scratch", "pretrained"], help="the tuning modes to run")
    ap.add_argument("--logs", default=None, help="keep the tuning logs in this directory")
    ap.add_argument("--out", default="benchmarks/results/tuning_efficiency.json")
    args = ap.parse_args()
    os.environ["AUTOSCHED_PICK_CACHE"] = "0"  # the zero-measurement search is timed: no cached picks
    print(baseline.header())
    print(f"# {baseline.ort_peer(None)}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'model':14s} {'mode':11s} {'trials':>6s} {'tune s':>9s} {'ms':>10s} "
          f"{'ort ms':>10s} {'vs ort':>9s}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(args.logs or tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        for name, proto, graph in _models(args):
            rows += run_model(name, proto, graph, args, log_dir)
    result = {"machine": baseline.header(), "load_average": os.getloadavg(),
              "image": args.image, "budgets": args.budgets, "rows": rows}
    baseline.save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
