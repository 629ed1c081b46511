"""Conv on 5-d inputs whose kernel has depth 1 (RivaGAN's (1, k, k) kernels): every depth
slice is a 2-d Conv, folded into the batch; other 3-d kernels are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autosched as aus
from autosched.errors import ModelImportError
from autosched.testing.models import ort_run
from importers.onnx import from_onnx


def _model(x_shape: tuple, w: np.ndarray, b: np.ndarray, **attrs: object) -> object:
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv3d", **attrs)
    graph = helper.make_graph(
        [node, helper.make_node("Relu", ["y"], ["z"])], "conv3d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("d, k, s, p, c, o, h, g", [
    (1, 3, 1, 1, 3, 8, 16, 1), (2, 11, 1, 5, 4, 6, 20, 1), (3, 3, 2, 1, 6, 6, 13, 3),
    (1, 1, 1, 0, 5, 7, 9, 1)])
def test_depth1_conv_matches_onnxruntime(d, k, s, p, c, o, h, g, rng):
    w = rng.uniform(-1, 1, (o, c // g, 1, k, k)).astype("float32")
    b = rng.uniform(-1, 1, o).astype("float32")
    m = _model((1, c, d, h, h), w, b, kernel_shape=[1, k, k], strides=[1, s, s],
               pads=[0, p, p, 0, p, p], group=g)
    x = rng.uniform(-1, 1, (1, c, d, h, h)).astype("float32")
    got = aus.compile(from_onnx(m), target="llvm").run({"x": x})[0]
    np.testing.assert_allclose(got, ort_run(m, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_deeper_kernels_are_refused_by_name(rng):
    w = rng.uniform(-1, 1, (4, 3, 3, 3, 3)).astype("float32")
    m = _model((1, 3, 5, 8, 8), w, rng.uniform(-1, 1, 4).astype("float32"))
    with pytest.raises(ModelImportError, match=r"conv3d.*kernels of depth 1"):
        from_onnx(m)
