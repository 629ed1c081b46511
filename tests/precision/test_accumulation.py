"""Reductions accumulate in float32 under fp16 and bf16: a sum of 4096 half values near 3.0
(ReduceSum) and a MatMul over K = 4096 reach about 12300, where a half accumulator stalls
(float16 adds nothing below 4 to 8192, bfloat16 nothing below 4 to 1024). Values near 1.0
would not tell: a float16 sum of them stalls at 4096, about where the true sum is."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autosched as aus
from autosched.graph.compiler import extract_tasks
from autosched.testing.models import ort_run
from importers.onnx import from_onnx
from tests.precision.conftest import HALF, TARGETS, assert_close

K = 4096


def _long_reductions(rng: np.random.Generator) -> object:
    """y = Relu(x) (stored in half: it is no model output), then ReduceSum over its 4096
    values and MatMul of it with a (4096, 3) weight near 1, both model outputs (float32)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, K])
    outs = [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 1]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 3])]
    w = numpy_helper.from_array(rng.uniform(0.9, 1.1, (K, 3)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("Relu", ["x"], ["y"]),
             helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=1),
             helper.make_node("MatMul", ["y", "w"], ["m"])]
    graph = helper.make_graph(nodes, "long_reductions", [x], outs, [w, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", HALF)
def test_long_reductions_accumulate_in_float32(precision: str, target: str,
                                               rng: np.random.Generator) -> None:
    proto = _long_reductions(rng)
    graph = from_onnx(proto)
    # the reductions read half: the test is about their accumulator, not their input
    half = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    tasks, _ = extract_tasks(graph, target, precision)
    readers = [t for t in tasks if any(a.dtype == half for a in t.args[:-1])]
    names = {t.name for t in readers}  # a split matmul may hold the views of its input
    assert "reducesum" in names and any(n.endswith("matmul") for n in names), names
    feeds = {"x": rng.uniform(2.9, 3.1, (2, K)).astype(np.float32)}
    got = aus.compile(graph, target=target, precision=precision).run(feeds)
    want = ort_run(proto, feeds)
    assert float(want[0].min()) > 11000  # far past where a half accumulator stalls
    assert_close(got, want, precision, f"long reductions in {precision} on {target}")
