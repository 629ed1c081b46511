"""The ConvTranspose converter against onnxruntime: padding from pads, auto_pad and
output_shape, output_padding, groups, dilation, 1-d inputs and a bias, node by node; and a
ConvTranspose with the batch norm and ReLU that follow it in a detection head, compiled as one
model (the phases' interleaving fused with the elementwise tail)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import autosched as aus
from autosched.testing.models import ort_session
from importers.onnx import from_onnx
from tests.importers.test_onnx_import import check, model, rand

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape,w,attrs", [
    ((1, 6, 5, 7), (6, 4, 2, 2), dict(strides=[2, 2])),
    ((2, 5, 6, 5), (5, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ((1, 4, 5, 6), (4, 3, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 4, 5, 6), (4, 3, 4, 3), dict(strides=[2, 3], auto_pad="SAME_LOWER")),
    ((1, 4, 5, 6), (4, 2, 3, 3), dict(strides=[2, 2], auto_pad="VALID")),
    ((1, 4, 5, 6), (4, 2, 3, 3), dict(strides=[2, 2], output_shape=[12, 14])),
    ((1, 4, 5, 6), (4, 2, 3, 4), dict(strides=[2, 3], output_shape=[10, 17])),
    ((1, 6, 7, 5), (6, 2, 3, 2), dict(strides=[3, 2], group=3, dilations=[2, 1],
                                      pads=[2, 0, 1, 1])),
    ((1, 4, 9), (4, 3, 3), dict(strides=[3], pads=[1, 2], output_padding=[2])),
])
def test_conv_transpose_attributes(shape: tuple, w: tuple, attrs: dict,
                                   rng: np.random.Generator) -> None:
    x, wv, b = rand(rng, *shape), rand(rng, *w), rand(rng, w[1] * attrs.get("group", 1))
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    check(model([node], {"x": x}, {"w": wv, "b": b}), {"x": x})


def test_conv_transpose_head_compiled(rng: np.random.Generator) -> None:
    x, w = rand(rng, 1, 8, 11, 13), rand(rng, 8, 6, 2, 2)
    scale, shift, mean = rand(rng, 6), rand(rng, 6), rand(rng, 6)
    var = rng.uniform(0.5, 2.0, 6).astype("float32")
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["t", "scale", "shift", "mean", "var"],
                              ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    m = model(nodes, {"x": x}, {"w": w, "scale": scale, "shift": shift, "mean": mean,
                                "var": var})
    (got,) = aus.compile(from_onnx(m, {"x": x.shape}), "llvm").run({"x": x})
    sess = ort_session(m)
    (want,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
