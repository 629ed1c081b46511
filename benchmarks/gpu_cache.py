"""Make the picks and cubins of GPU configurations ahead, on any machine with NVRTC (no GPU),
so that a device session does not spend its minutes searching and compiling: each model,
batch and precision compiled for target ``cuda`` with the cost model's picks (compile's
schedule "model") and with the untuned defaults (what a pick's check on the GPU runs
against), into one cache folder, then packed as ``.gpu-cache.tgz`` for the device's carry
(benchmarks/gpu_session.sh unpacks it).

    python benchmarks/gpu_cache.py --models resnet18 --batch 8 32 --precision fp16 \
        [--implicit both] [--cache DIR] [--out .gpu-cache.tgz]

With ``--corpus NAME... --logs DIR`` it builds corpus models instead (tests/support/corpus.py,
``AUTOSCHED_CORPUS_DIR``): each untuned and everything ``choose`` times with its log
``DIR/<name>.cuda.jsonl`` (the default and the best two records of each task), so that
``gpu_session.sh ctime:`` only times and chooses on the device.

Picks are keyed by workload, target, the shipped model and the search's settings: remake
the archive after a change to any of them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autosched import settings  # noqa: E402
from autosched.graph.compiler import compile  # noqa: E402
from autosched.testing.models import MODELS  # noqa: E402
from benchmarks.gpu_kernels import uses_tensor_cores  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18"], choices=sorted(MODELS))
    ap.add_argument("--batch", nargs="+", type=int, default=[1])
    ap.add_argument("--precision", nargs="+", default=["fp16"])
    ap.add_argument("--implicit", choices=("no", "yes", "both"), default="no",
                    help="implicit-GEMM convolutions (AUTOSCHED_CONV_GEMM=implicit) too")
    ap.add_argument("--cache", default=os.environ.get(settings.CACHE_DIR.name),
                    help="the cache folder (default: AUTOSCHED_CACHE_DIR)")
    ap.add_argument("--out", default=".gpu-cache.tgz")
    ap.add_argument("--corpus", nargs="+", default=[], metavar="NAME",
                    help="corpus models instead of --models, with their logs in --logs")
    ap.add_argument("--logs", help="the corpus models' cuda logs (<name>.cuda.jsonl)")
    args = ap.parse_args()
    if not args.cache:
        raise SystemExit(f"gpu_cache.py: give --cache or set {settings.CACHE_DIR.name}")
    os.environ[settings.CACHE_DIR.name] = args.cache
    if args.corpus:
        if not args.logs:
            raise SystemExit("gpu_cache.py: --corpus needs --logs")
        corpus_kernels(args.corpus, Path(args.logs))
        pack(Path(args.cache), args.out)
        return
    modes = {"no": ["explicit"], "yes": ["implicit"], "both": ["explicit", "implicit"]}
    for mode in modes[args.implicit]:
        os.environ[settings.CONV_GEMM.name] = mode
        for name in args.models:
            for batch in args.batch:
                graph = from_onnx(MODELS[name](batch=batch))
                for precision in args.precision:
                    t0 = time.perf_counter()
                    picked = compile(graph, "cuda", schedule="model", precision=precision,
                                     executor=False)
                    compile(graph, "cuda", schedule="default", precision=precision,
                            executor=False)
                    mma = sum(uses_tensor_cores(k.module.get_source()) for k in picked.kernels)
                    print(f"{name} batch {batch} {precision} {mode}: {len(picked.kernels)} "
                          f"kernels, {mma} on tensor cores, {time.perf_counter() - t0:.0f} s",
                          flush=True)
    pack(Path(args.cache), args.out)


def corpus_kernels(names: list[str], logs: Path) -> None:
    """Build each corpus model's untuned kernels and its choosing candidates for ``cuda``."""
    from autosched.graph.choose import candidates
    from tests.support import corpus

    entries = corpus.load_manifest()
    for name in names:
        t0 = time.perf_counter()
        e = entries[name]
        graph = from_onnx(corpus.prepared_model(e), shapes=e.shapes)
        compile(graph, "cuda", schedule="default", executor=False)
        log = logs / f"{name}.cuda.jsonl"
        built = 0
        if log.exists():
            _, cands = candidates(graph, "cuda", log, executor=False)
            built = sum(len(c) for c in cands.values())
        print(f"{name}: {built} candidates, {time.perf_counter() - t0:.0f} s", flush=True)


def pack(cache: Path, out: str) -> None:
    with tarfile.open(out, "w:gz") as tar:
        for entry in sorted(cache.iterdir()):
            tar.add(entry, arcname=entry.name)
    print(f"{out}: {Path(out).stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
