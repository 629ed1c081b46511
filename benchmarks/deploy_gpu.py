"""A deployed CUDA model library next to the in-process CUDA executor, in one process: ResNet-18
(autosched.testing.models, batch 1, ``--image``), untuned or with ``--log``.

    python benchmarks/deploy_gpu.py --rounds 5 [--log tuning_logs/resnet18-cuda.jsonl]

The model is compiled once for the GPU's arch, exported to a temporary build dir
(graph/deploy.py: one .so over the CUDA driver API) and loaded with ``autosched.load``; both
are checked against onnxruntime. Both replay a run's launches as one CUDA graph; a second
library built with ``-DCUDA_GRAPHS=0`` launches each kernel, as the executor does with
``time(graphs=False)``. Six sides are timed in ``--rounds`` alternating rounds:

* kernels: the in-process executor's graph replayed, CUDA events around it (``model.time``);
  and its kernels launched one by one ("no graph");
* run_device: the library's device-pointer entry through ctypes, CUDA events around the call
  (inputs and outputs already on the GPU, as the in-process side); and the same entry of the
  library without graphs ("no graph");
* run, in-process: ``model.run`` on numpy arrays (copies in and out, wall clock);
* run, library: the library's host-pointer entry (copies in and out, wall clock).

Needs a GPU and pycuda (the in-process executor's); torch is not imported. Prints the machine
(date, commit, GPU, load average) and a short table; results go to --out as JSON.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.graph.deploy import export, library_spec  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.targets.cuda.library import build_library  # noqa: E402
from autosched.targets.host import detect_cuda_arch  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402


def event_seconds(call: Any, repeat: int, warmup: int = 3) -> float:
    """Median seconds of ``call`` on the default stream, CUDA events around each call."""
    import pycuda.driver as drv

    for _ in range(warmup):
        call()
    drv.Context.synchronize()
    start, end = drv.Event(), drv.Event()
    samples = []
    for _ in range(repeat):
        start.record()
        call()
        end.record()
        end.synchronize()
        samples.append(start.time_till(end) / 1e3)
    return statistics.median(samples)


def device_call(deployed: Any, feeds: dict[str, np.ndarray]) -> Any:
    """The library's run_device on copies of ``feeds`` on the GPU, the pointers bound once:
    one C call through ctypes, as a C program calls it."""
    import pycuda.gpuarray as gpuarray

    ins = {name: gpuarray.to_gpu(np.ascontiguousarray(a)) for name, a in feeds.items()}
    g = deployed.graph
    outs = [gpuarray.empty(g.values[o].shape, g.values[o].dtype) for o in g.outputs]
    return deployed.device_call(ins, outs)


def without_graphs(model: Any, build: Path, name: str) -> Any:
    """``model`` exported to ``build`` as a library that launches each kernel on every run
    (built with -DCUDA_GRAPHS=0), loaded."""
    lib = export(model, build, name=name)
    build_library(library_spec(model, name, static=False), lib, flags=("-DCUDA_GRAPHS=0",))
    lib.chmod(0o755)  # as export leaves it: only its owner writes
    return aus.load(build)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", type=int, default=224, help="ResNet-18's image size")
    ap.add_argument("--log", default=None, help="tuning log (cuda records)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=50, help="CUDA-event timings per round")
    ap.add_argument("--min-s", type=float, default=0.5, help="wall-clock seconds per round")
    ap.add_argument("--out", default="benchmarks/results/deploy_gpu.json")
    args = ap.parse_args()
    print(baseline.header(), flush=True)
    arch = detect_cuda_arch()
    proto = models.resnet18(image=args.image)
    graph = from_onnx(proto)
    feeds = random_inputs(graph)
    model = aus.compile(graph, target=f"cuda -arch={arch}", log=args.log)
    with tempfile.TemporaryDirectory() as tmp:
        lib = export(model, Path(tmp) / "graphs", name="resnet18")
        deployed = aus.load(lib.parent)
        plain = without_graphs(model, Path(tmp) / "plain", "resnet18")
        want = models.ort_run(proto, feeds)
        for got in (model.run(feeds), deployed.run(feeds), plain.run(feeds)):
            np.testing.assert_allclose(got[0], want[0], rtol=2e-3, atol=2e-3)
        on_device, plain_on_device = device_call(deployed, feeds), device_call(plain, feeds)
        timers = {
            "kernels, in-process": lambda: model.time(feeds, repeat=args.repeat),
            "kernels, no graph": lambda: model.time(feeds, repeat=args.repeat, graphs=False),
            "run_device, library": lambda: event_seconds(on_device, args.repeat),
            "run_device, no graph": lambda: event_seconds(plain_on_device, args.repeat),
            "run, in-process": lambda: baseline.median_seconds(lambda: model.run(feeds),
                                                               min_s=args.min_s),
            "run, library": lambda: deployed.time(feeds, min_s=args.min_s),
        }
        got = baseline.alternate(timers, args.rounds)
        size = lib.stat().st_size
    print(f"resnet18 image {args.image}, {arch}, {len(model.kernels)} kernels, "
          f"{'log ' + args.log if args.log else 'default schedules'}; library "
          f"{size / 1e6:.1f} MB; ms, median of {args.rounds} alternating rounds:")
    print(f"  {'side':<22} {'median':>9} {'best':>9}")
    for side, r in got.items():
        print(f"  {side:<22} {r.median * 1e3:9.3f} {r.best * 1e3:9.3f}")
    kernels, device = got["kernels, in-process"].median, got["run_device, library"].median
    print(f"  library / in-process (device pointers): {device / kernels:.3f}")
    print(f"  with graphs / without: in-process "
          f"{kernels / got['kernels, no graph'].median:.3f}, library "
          f"{device / got['run_device, no graph'].median:.3f}; executor: {model.summary()}")
    rows = {"machine": baseline.header(), "arch": arch, "image": args.image, "log": args.log,
            "kernels": len(model.kernels), "library_bytes": size,
            **{f"{side}_rounds_ms": [t * 1e3 for t in r.seconds] for side, r in got.items()}}
    baseline.save(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
