"""Whole models (autosched.testing.models, built with onnx.helper, random weights) import, compile
with default schedules and match onnxruntime at rtol 1e-4, atol 1e-4 on random float32 inputs.

Sizes: ResNet-18 and MobileNetV2 at batch 1 and 224x224 (the real input size) and the BERT-base
encoder layer at sequence 128, hidden 768, 12 heads. The ``gpu`` variants run the same models
on target "cuda" (skipped without a GPU).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched.graph.executor import random_inputs
from autosched.testing import models
from tests.support.helpers import imported

MODELS = {
    "resnet18": lambda: models.resnet18(image=224),
    "mobilenet_v2": lambda: models.mobilenet_v2(image=224),
    "bert_layer": lambda: models.bert_layer(seq=128),
}

def _model(name: str) -> tuple[Any, Any]:
    return imported(MODELS[name])


def _check(name: str, target: str) -> None:
    proto, graph = _model(name)
    seed = int(np.random.default_rng().integers(1 << 30))
    feeds = random_inputs(graph, seed=seed)
    ours = aus.compile(graph, target=target).run(feeds)
    ref = models.ort_run(proto, feeds)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"{name} seed {seed}")


@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_onnxruntime(name: str) -> None:
    _check(name, "llvm")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_model_matches_onnxruntime_on_gpu(name: str) -> None:
    _check(name, "cuda")


def test_onnxruntime_reads_a_model_stamped_with_a_newer_ir_version(rng):
    """helper.make_model stamps the installed onnx's IR version, which an older onnxruntime
    refuses ("Unsupported model IR version"); the reference runs it at its opsets' version."""
    from onnx import TensorProto, helper

    from autosched.testing.models import ort_run

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 99  # newer than any onnxruntime
    x = rng.uniform(-1, 1, (3, 5)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(model, {"x": x})[0], np.maximum(x, 0))
    assert model.ir_version == 99  # the caller's model is left as it was
