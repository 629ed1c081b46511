"""What a deployed model library is: for each model and target, the file size, the dynamic
libraries it needs (``readelf -d``: NEEDED) and the symbols it exports (``nm -D
--defined-only``); for a library of this machine also ``ldd``.

    python benchmarks/deploy_artifacts.py [--models demo_cnn resnet18 ...] [--targets host ...]

Targets: ``host`` (llvm for this CPU, parallel), ``serial`` (llvm -num-cores=1: no thread
pool), ``aarch64`` (cross-compiled, cortex-a72) and ``cuda`` (sm_90 cubins over the CUDA driver
API; built with NVRTC, no GPU needed). Models: the demo CNN, ResNet-18 and MobileNetV2
(autosched.testing.models, 224) and corpus models by name (tests/support/corpus.toml, from the
corpus cache). Default schedules (the artifacts' make-up does not depend on the tuning).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import autosched as aus  # noqa: E402
from autosched.graph.deploy import export  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402

TARGETS = {"host": "llvm", "serial": "llvm -num-cores=1",
           "aarch64": "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72",
           "cuda": "cuda -arch=sm_90"}


def model(name: str) -> tuple[object, dict]:
    if name == "demo_cnn":
        from autosched.demo import small_cnn

        return small_cnn(), {}
    if name in ("resnet18", "mobilenet_v2"):
        return getattr(models, name)(), {}
    from tests.support import corpus

    e = corpus.load_manifest()[name]
    return corpus.prepared_model(e), e.shapes


def tool(*cmd: str) -> str:
    if shutil.which(cmd[0]) is None:
        return f"({cmd[0]} not installed)"
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return (proc.stdout or proc.stderr).strip()


def describe(lib: Path, host: bool) -> str:
    needed = [line.split("[")[-1].rstrip("]") for line in
              tool("readelf", "-d", str(lib)).splitlines() if "(NEEDED)" in line]
    symbols = [line.split()[-1] for line in
               tool("nm", "-D", "--defined-only", str(lib)).splitlines() if line.strip()]
    out = [f"    size {lib.stat().st_size / 1e6:.2f} MB; NEEDED: {', '.join(needed) or 'none'}",
           f"    nm -D --defined-only ({len(symbols)}): {' '.join(symbols)}"]
    if host:
        out.append("    ldd: " + "; ".join(" ".join(line.split()[:3])
                                           for line in tool("ldd", str(lib)).splitlines()))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["demo_cnn", "resnet18", "mobilenet_v2",
                                                    "magika", "ppocr_cls", "orientation"])
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            proto, shapes = model(name)
            graph = from_onnx(proto, shapes=shapes)
            for where in args.targets:
                compiled = aus.compile(graph, target=TARGETS[where], executor=False)
                lib = export(compiled, Path(tmp) / f"{name}_{where}", name=name)
                print(f"{name} on {where} ({TARGETS[where]}): {lib.name}", flush=True)
                print(describe(lib, host=where in ("host", "serial")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
