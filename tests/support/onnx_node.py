"""One-node (or small) ONNX models run by onnxruntime and by autosched's graph compiler, for the
converter tests: ``compare(node, inputs, consts, outputs)`` builds the model, runs both and
checks every output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

import autosched as aus
from autosched.testing.models import ort_session
from importers.onnx import from_onnx

RNG = np.random.default_rng()


def rand(shape: Sequence[int], dtype: str = "float32") -> np.ndarray:
    """Fresh random values: normal floats, or integers spread over the dtype (small ones)."""
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(tuple(shape)).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -100), min(info.max, 100) + 1, tuple(shape)).astype(dtype)


def model(nodes: list[Any], inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray],
          outputs: Sequence[str], opset: int = 21) -> onnx.ModelProto:
    feeds = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs.items()]
    outs = [onnx.ValueInfoProto(name=n) for n in outputs]  # types left to onnxruntime
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    graph = helper.make_graph(nodes, "g", feeds, outs, initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def run_ort(m: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort_session(m)
    return sess.run(None, inputs)


def run_autosched(m: onnx.ModelProto, inputs: dict[str, np.ndarray], target: str = "llvm"
                  ) -> list[np.ndarray]:
    graph = from_onnx(m, {n: a.shape for n, a in inputs.items()})
    return aus.compile(graph, target=target).run(inputs)


def compare(nodes: Any, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
            outputs: Sequence[str] = ("y",), opset: int = 21, rtol: float = 1e-4,
            atol: float = 1e-5) -> list[np.ndarray]:
    """Run ``nodes`` with onnxruntime and autosched (llvm) and check that every output agrees
    in shape, dtype and value. Returns autosched's outputs."""
    m = model(nodes if isinstance(nodes, list) else [nodes], inputs, consts or {}, outputs,
              opset)
    want = run_ort(m, inputs)
    got = run_autosched(m, inputs)
    assert len(got) == len(want)
    for name, g, w in zip(outputs, got, want):
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)
    return got
