"""End-to-end latency on the GPU (target "cuda"): ResNet-18, MobileNetV2 and the BERT-base
encoder layer of benchmarks/models.py, with default schedules (or a tuning log), next to torch
eager (torchvision's ResNet-18 / MobileNetV2 and nn.TransformerEncoderLayer, random weights,
same shapes) and torch.compile where it runs.

    python benchmarks/e2e_gpu.py [--log tuning_logs/models-cuda.jsonl] [--models resnet18 ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autosched.graph.compiler import compile, load_graph  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from benchmarks import models  # noqa: E402

BUILD = {"resnet18": lambda: models.resnet18(image=224),
         "mobilenet_v2": lambda: models.mobilenet_v2(image=224),
         "bert_layer": lambda: models.bert_layer(seq=128)}


def torch_module(name: str):  # noqa: ANN201
    import torch

    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(), torch.randn(1, 3, 224, 224)
    if name == "mobilenet_v2":
        import torchvision

        return torchvision.models.mobilenet_v2(), torch.randn(1, 3, 224, 224)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, activation="gelu", batch_first=True)
    return layer, torch.randn(1, 128, 768)


def torch_time(fn, x, repeat: int = 50) -> float:  # noqa: ANN001
    import torch

    with torch.no_grad():
        for _ in range(5):
            fn(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(repeat):
            start.record()
            fn(x)
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end) / 1e3)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", default=None)
    ap.add_argument("--models", nargs="+", default=list(BUILD))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args()
    results = {}
    for name in args.models:
        proto = BUILD[name]()
        graph = load_graph(proto)
        feeds = random_inputs(graph)
        t0 = time.perf_counter()
        model = compile(graph, target="cuda", log=args.log)
        build_s = time.perf_counter() - t0
        (y,) = model.run(feeds)
        (ref,) = models.ort_run(proto, feeds)
        ok = bool(np.allclose(y, ref, rtol=1e-4, atol=1e-4))
        ours = model.time(feeds, repeat=50)
        row = {"autosched_ms": ours * 1e3, "matches_ort": ok, "build_s": build_s,
               "kernels": len(model.kernels)}
        try:
            import torch

            mod, x = torch_module(name)
            mod, x = mod.cuda().eval(), x.cuda()
            row["torch_eager_ms"] = torch_time(mod, x) * 1e3
            if not args.no_compile:
                try:
                    row["torch_compile_ms"] = torch_time(torch.compile(mod), x) * 1e3
                except Exception as exc:  # noqa: BLE001  inductor may be unavailable
                    row["torch_compile"] = f"failed: {type(exc).__name__}: {exc}"[:200]
        except ImportError as exc:
            row["torch"] = f"not available: {exc}"
        results[name] = row
        print(name, json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
