"""End-to-end latency on the GPU (target "cuda"): ResNet-18, MobileNetV2 and the BERT-base
encoder layer of autosched.testing.models, with default schedules (or a tuning log), next to torch
at its best: eager, torch.compile and torch.compile(mode="reduce-overhead") (CUDA graphs), each
with TF32 on and with TF32 off (torchvision's ResNet-18 / MobileNetV2 and
nn.TransformerEncoderLayer, random weights, same shapes).

    python benchmarks/e2e_gpu.py --models resnet18 mobilenet_v2 --log models-cuda.jsonl
    python benchmarks/e2e_gpu.py --batch 1 8 32 --precision fp32 tf32 fp16 --log LOG

Each precision is timed against torch where it is like for like: fp32 (strict float32) against
torch with TF32 on and off (``--tf32``), tf32 (our tensor-core TF32 multiplies) against torch
with its default TF32 settings, fp16 (half storage, float32 accumulation) against
``model.half()``; each is checked against onnxruntime's float32 outputs within the
precision's tolerance as measured candidates are (strict fp32: 1e-4).

autosched replays each run's launches as one CUDA graph (as reduce-overhead does); the row
"autosched, no graph" launches each kernel instead (``model.time(graphs=False)``).

For each model and TF32 setting, autosched (both ways) and the three torch variants are timed in
``--rounds`` alternating rounds (each the median of ``--repeat`` CUDA-event timings after a
warm-up; benchmarks/baseline.py); the median round and the best round are printed. In fp32
autosched computes in plain float32 (no tensor cores), so "TF32 off" is the like-for-like
comparison and "TF32 on" is torch's fastest. Results go to --out as JSON (a model at batch 1
in fp32 under its name, others as NAME_bBATCH_PRECISION).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

# torch before anything of autosched: its CUDA libraries load first, as in a torch program
try:
    import torch  # noqa: E402
    import torchvision  # noqa: E402
except ImportError as exc:
    raise SystemExit(f"e2e_gpu.py: the peers need torch and torchvision ({exc})") from None

import numpy as np  # noqa: E402

from autosched.graph.compiler import compile  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.search.measure_worker import compare  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402

BUILD = {"resnet18": lambda batch: models.resnet18(image=224, batch=batch),
         "mobilenet_v2": lambda batch: models.mobilenet_v2(image=224, batch=batch),
         "bert_layer": lambda batch: models.bert_layer(seq=128, batch=batch)}


def torch_module(name: str, batch: int = 1, half: bool = False) -> tuple[Any, Any]:
    """The torch model with the same shapes as BUILD[name], and a random input, on the GPU
    (``half``: both in float16)."""
    if name == "resnet18":
        mod, x = torchvision.models.resnet18(), torch.randn(batch, 3, 224, 224)
    elif name == "mobilenet_v2":
        mod, x = torchvision.models.mobilenet_v2(), torch.randn(batch, 3, 224, 224)
    else:
        mod = torch.nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", batch_first=True)
        x = torch.randn(batch, 128, 768)
    mod, x = mod.cuda().eval(), x.cuda()
    return (mod.half(), x.half()) if half else (mod, x)


def warm_up(fn: Callable[[Any], Any], x: Any) -> float:
    """Call ``fn`` three times (torch.compile compiles, reduce-overhead records its CUDA
    graph); the seconds it took."""
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            fn(x)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def torch_timers(mod: Any, x: Any, repeat: int, compiled: bool, row: dict) -> dict:
    """Round timers for eager and (with ``compiled``) both torch.compile modes; a variant that
    fails to compile is recorded in ``row`` and left out."""
    variants = baseline.torch_variants(mod)
    if not compiled:
        variants = {"torch eager": variants["torch eager"]}
    timers = {}
    for name, fn in variants.items():
        try:
            row[f"{name} warm-up s"] = warm_up(fn, x)
        except Exception as exc:  # noqa: BLE001  inductor or CUDA graphs may be unavailable
            row[name] = f"failed: {type(exc).__name__}: {exc}"[:300]
            continue
        timers[name] = lambda fn=fn: baseline.cuda_median_seconds(lambda: fn(x), repeat)
    return timers


def matches(got: np.ndarray, ref: np.ndarray, precision: str) -> bool:
    """Whether ``got`` matches onnxruntime's float32 output: fp32 within 1e-4 / 1e-4, other
    precisions within their tolerance as measured candidates are checked (compare)."""
    if precision == "fp32":
        return bool(np.allclose(got, ref, rtol=1e-4, atol=1e-4))
    return compare("output", got, ref, precision) is None


def torch_settings(precision: str, tf32: list[str]) -> list[bool | None]:
    """The TF32 settings torch runs with next to ``precision``: ours in strict float32 against
    torch with TF32 on and off as asked, in tf32 against torch's defaults, in fp16 against a
    half model (TF32 does not apply; left at the defaults)."""
    return [t == "on" for t in tf32] if precision == "fp32" else [None]


def run_model(name: str, args: argparse.Namespace, batch: int = 1,
              precision: str = "fp32") -> dict:
    proto = BUILD[name](batch)
    graph = from_onnx(proto)
    feeds = random_inputs(graph)
    t0 = time.perf_counter()
    model = compile(graph, target="cuda", log=args.log, precision=precision)
    row: dict[str, Any] = {"batch": batch, "precision": precision,
                           "build_s": time.perf_counter() - t0, "kernels": len(model.kernels)}
    (y,) = model.run(feeds)
    (ref,) = models.ort_run(proto, feeds)
    row["matches_ort"] = matches(y, ref, precision)
    row["graph"] = model.graph_failure or "replayed"
    others = {}
    for label, env in args.variants.items():
        t0 = time.perf_counter()
        others[f"autosched, {label}"] = compiled_under(env, graph, target="cuda", log=args.log,
                                                       precision=precision)
        row[f"autosched, {label} build_s"] = time.perf_counter() - t0
        (y2,) = others[f"autosched, {label}"].run(feeds)
        row[f"autosched, {label} matches_ort"] = matches(y2, ref, precision)
    if args.zero:  # issue 21's zero-measurement row: untuned, and chosen by the cost model
        t0 = time.perf_counter()
        others["autosched, model-chosen"] = compile(graph, target="cuda", schedule="model",
                                                    precision=precision)
        row["model_choose_s"] = time.perf_counter() - t0
        others["autosched, untuned"] = compile(graph, target="cuda", schedule="default",
                                               precision=precision)
        for label, other in others.items():
            (y2,) = other.run(feeds)
            row[f"{label} matches_ort"] = matches(y2, ref, precision)
    mod, x = torch_module(name, batch, half=precision == "fp16")
    for tf32 in torch_settings(precision, args.tf32):
        said = baseline.set_torch(tf32)
        if precision == "fp16":
            said += ", model.half()"
        got: dict[str, Any] = {"torch": said}
        timers = {"autosched": lambda: model.time(feeds, repeat=args.repeat),
                  "autosched, no graph": lambda: model.time(feeds, repeat=args.repeat,
                                                            graphs=False)}
        timers.update({label: lambda m=other: m.time(feeds, repeat=args.repeat)
                       for label, other in others.items()})
        timers.update(torch_timers(mod, x, args.repeat, not args.no_compile, got))
        rounds = baseline.alternate(timers, args.rounds)
        got.update({n: r.as_dict() for n, r in rounds.items()})
        row[{True: "tf32_on", False: "tf32_off", None: "torch_default"}[tf32]] = got
        print(f"{name}, batch {batch}, ours {precision}, {said}, ms, median of {args.rounds} "
              f"alternating rounds (best round): {baseline.rounds_line(rounds)}", flush=True)
    return row


def _variant(text: str) -> tuple[str, dict[str, str]]:
    """'LABEL:VAR=V,VAR=V' as (label, {VAR: V})."""
    label, _, assigns = text.partition(":")
    pairs = [a.partition("=") for a in assigns.split(",") if a]
    if not label or not pairs or any(not k or not eq for k, eq, _ in pairs):
        raise SystemExit(f"e2e_gpu.py: --variant {text!r}: expected LABEL:VAR=VALUE[,VAR=VALUE]")
    return label, {k: v for k, _, v in pairs}


def compiled_under(env: dict[str, str], *args: Any, **kwargs: Any) -> Any:
    """compile(...) with the environment variables ``env`` set for its duration."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return compile(*args, **kwargs)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", default=None, help="tuning log (default schedules without one)")
    ap.add_argument("--models", nargs="+", default=list(BUILD), choices=list(BUILD))
    ap.add_argument("--tf32", nargs="+", default=["on", "off"], choices=["on", "off"],
                    help="torch's TF32 settings next to our fp32")
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--precision", nargs="+", default=["fp32"],
                    choices=["fp32", "tf32", "fp16"], help="ours (compile's precision)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    ap.add_argument("--repeat", type=int, default=50, help="timed runs per round")
    ap.add_argument("--no-compile", action="store_true", help="torch eager only")
    ap.add_argument("--zero", action="store_true",
                    help="also untuned and with schedules the cost model chooses unmeasured")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:VAR=V,VAR=V",
                    help="also autosched compiled under these settings (say, "
                         "image:AUTOSCHED_CONV_COLUMNS=image), timed in the same rounds")
    ap.add_argument("--cached-picks", action="store_true",
                    help="read zero-measurement picks from the cache (benchmarks/gpu_cache.py) "
                         "instead of searching them again")
    ap.add_argument("--out", type=Path,
                    default=Path(os.environ.get("OUT", "/tmp")) / "e2e_gpu.json")
    args = ap.parse_args()
    args.variants = dict(_variant(v) for v in args.variant)
    if not args.cached_picks:  # the zero-measurement search is timed: no cached picks
        os.environ["AUTOSCHED_PICK_CACHE"] = "0"
    if not torch.cuda.is_available():
        raise SystemExit("e2e_gpu.py: no CUDA device visible to torch")
    print(baseline.header(), flush=True)
    results = {"machine": baseline.header()}
    for name in args.models:
        for batch in args.batch:
            for precision in args.precision:
                key = name if (batch, precision) == (1, "fp32") else f"{name}_b{batch}_{precision}"
                results[key] = run_model(name, args, batch, precision)
                print(key, json.dumps(results[key]), flush=True)
                args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
