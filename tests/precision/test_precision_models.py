"""Models compiled in fp16 and bf16 (half storage, float32 arithmetic) match onnxruntime's
fp32 outputs within the precision's tolerance, on the CPU, the CUDA C run on the host and the
GPU (marked gpu); fp32 and tf32 compute exactly as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched.graph.compiler import extract_tasks, prepare
from autosched.graph.executor import random_inputs
from autosched.graph.precision import KEEP_FP32, apply_precision
from autosched.testing import models
from tests.precision.conftest import HALF, MODELS, TARGETS, assert_close
from tests.support.helpers import imported


def _model(name: str) -> tuple[Any, Any]:
    return imported(MODELS[name])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("name", list(MODELS))
def test_half_precision_model_matches_onnxruntime_fp32(name: str, precision: str, target: str,
                                                       rng: np.random.Generator) -> None:
    proto, graph = _model(name)
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    model = aus.compile(graph, target=target, precision=precision)
    assert_close(model.run(feeds), models.ort_run(proto, feeds), precision,
                 f"{name} in {precision} on {target}")


def test_half_storage_where_the_pass_puts_it() -> None:
    """Activations (softmax and layernorm outputs too: bounded values that attention's P x V
    and the projections read as half operands) and matmul weights in half; reductions' outputs,
    layernorm's weights, the model's inputs and outputs in float32."""
    _, graph = _model("encoder_layer")
    g = prepare(graph, None)
    half = apply_precision(g, "fp16")
    assert {v.dtype for v in half.inputs} == {"float32"}
    assert {half.values[o].dtype for o in half.outputs} == {"float32"}
    half_weights = 0
    for n in half.nodes:
        outs = [o for o in n.outputs if o and o not in half.outputs]
        want = "float32" if n.op_type in KEEP_FP32 else "float16"
        assert all(half.values[o].dtype == want for o in outs if g.values[o].dtype == "float32"), n
        weights = [i for i in n.inputs if i in half.constants and half.constants[i].size > 1
                   and g.constants[i].dtype == np.float32]
        if n.op_type == "MatMul":  # the projections' weights; attention's two have none
            assert all(half.constants[w].dtype == np.float16 for w in weights), n
            half_weights += len(weights)
        if n.op_type == "LayerNormalization":
            assert weights and all(half.constants[w].dtype == np.float32 for w in weights), n
    assert half_weights >= 4
    normalized = [o for n in half.nodes if n.op_type in ("Softmax", "LayerNormalization")
                  for o in n.outputs if o not in half.outputs]
    assert normalized and {half.values[o].dtype for o in normalized} == {"float16"}
    kinds = {o.dtype for t in extract_tasks(graph, "llvm", "bf16")[0] for o in t.args}
    assert "bfloat16" in kinds and "float32" in kinds


@pytest.mark.parametrize("target", ["llvm", TARGETS[1]])
def test_fp32_and_tf32_leave_the_model_as_it_was(target: str, rng: np.random.Generator) -> None:
    """tf32 differs only in tensor-core multiplies; the SIMT code computes it as fp32, bit for
    bit, and the graph keeps its float32 values."""
    proto, graph = _model("small_cnn")
    g = prepare(graph, None)
    assert apply_precision(g, "tf32") is g and apply_precision(g, "fp32") is g
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    fp32 = aus.compile(graph, target=target).run(feeds)
    tf32 = aus.compile(graph, target=target, precision="tf32").run(feeds)
    for a, b in zip(fp32, tf32):
        np.testing.assert_array_equal(a, b)
    assert_close(fp32, models.ort_run(proto, feeds), "fp32", "fp32 small_cnn")
