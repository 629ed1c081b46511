"""A model compiled in fp16 / bf16 exports as a library like any other: its weights in half
(in the library or in its weights file), its inputs and outputs float32, its outputs within
the precision's tolerance of onnxruntime (the CPU here; the GPU library marked gpu)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import autosched as aus
from autosched.graph.deploy import export
from autosched.graph.executor import random_inputs
from autosched.testing import models
from importers.onnx import from_onnx
from tests.precision.conftest import HALF, assert_close


@pytest.mark.parametrize("weights_file", [False, True])
@pytest.mark.parametrize("target", ["llvm", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("precision", HALF)
def test_exported_half_model_matches_onnxruntime(precision: str, target: str,
                                                 weights_file: bool, tmp_path: Path,
                                                 rng: np.random.Generator) -> None:
    proto = models.small_cnn()
    graph = from_onnx(proto)
    built = {}
    for p in ("fp32", precision):
        model = aus.compile(graph, target, executor=False, precision=p)
        lib = export(model, tmp_path / p, name="net", weights_file=weights_file)
        built[p] = (lib.with_suffix(".weights") if weights_file else lib).stat().st_size
    assert built[precision] < built["fp32"]  # the weights take half the bytes
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    assert_close(aus.load(tmp_path / precision).run(feeds), models.ort_run(proto, feeds),
                 precision, f"small_cnn library in {precision} on {target}")
