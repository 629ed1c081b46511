"""Operators against onnxruntime, one ONNX node each: the importer maps ONNX nodes onto these
operators, so their semantics (ceil-mode pooling, ConvTranspose padding, Resize coordinates,
negative Gather indices, Slice clamping ...) must be ONNX's, not only numpy's."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.te import ops
from autosched.testing.models import ort_session
from tests.support.helpers import check, run_te

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

_TYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32}


def run_onnx(op_type: str, inputs: dict[str, np.ndarray], consts: dict | None = None,
             out: str = "float32", **attrs) -> np.ndarray:  # noqa: ANN003
    """One node ``op_type`` over named inputs (and constant initialisers), run by onnxruntime."""
    consts = consts or {}
    feeds = [helper.make_tensor_value_info(n, _TYPES[str(a.dtype)], a.shape)
             for n, a in inputs.items()]
    inits = [helper.make_tensor(n, _TYPES[str(a.dtype)], a.shape, a.flatten().tolist())
             if a is not None else None for n, a in consts.items()]
    names = [*inputs, *consts]
    node = helper.make_node(op_type, [n if n in inputs or consts[n] is not None else ""
                                      for n in names], ["out_"], **attrs)
    graph = helper.make_graph([node], "g", feeds, [helper.make_tensor_value_info(
        "out_", _TYPES[out], None)], initializer=[i for i in inits if i is not None])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    sess = ort_session(model)
    return sess.run(None, inputs)[0]


def _rand(shape: tuple) -> np.ndarray:
    return np.random.default_rng().standard_normal(shape).astype("float32")


@pytest.mark.parametrize("k,s,p,d,ceil", [((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
                                          ((2, 3), (2, 1), (0, 1, 1, 0), (1, 1), 1),
                                          ((3, 2), (1, 2), (2, 0, 1, 1), (2, 2), 0)])
def test_pools(k, s, p, d, ceil: int, target: str) -> None:  # noqa: ANN001
    a = _rand((1, 2, 9, 8))
    x = te.placeholder(a.shape, name="x")
    outs = [ops.max_pool2d(x, k, s, p, d, ceil_mode=bool(ceil)),
            ops.avg_pool2d(x, k, s, p, 1, ceil_mode=bool(ceil), count_include_pad=True),
            ops.avg_pool2d(x, k, s, p, 1, ceil_mode=bool(ceil))]
    got = run_te(outs, {x: a}, target)
    common = dict(kernel_shape=k, strides=s, pads=p, ceil_mode=ceil)
    check(got[0], run_onnx("MaxPool", {"x": a}, dilations=d, **common))
    check(got[1], run_onnx("AveragePool", {"x": a}, count_include_pad=1, **common))
    check(got[2], run_onnx("AveragePool", {"x": a}, count_include_pad=0, **common))


@pytest.mark.parametrize("s,p,op,g,d", [((2, 2), (1, 1, 1, 1), (1, 1), 1, (1, 1)),
                                        ((3, 2), (0, 1, 2, 0), (2, 0), 2, (1, 1)),
                                        ((1, 2), (1, 0, 0, 1), (0, 1), 1, (2, 1))])
def test_conv_and_transpose(s, p, op, g, d, target: str) -> None:  # noqa: ANN001
    a, w, wt = _rand((1, 4, 5, 6)), _rand((6, 4 // g, 3, 2)), _rand((4, 3, 3, 2))
    x = te.placeholder(a.shape, name="x")
    wk, wtk = te.placeholder(w.shape, name="w"), te.placeholder(wt.shape, name="wt")
    outs = [ops.conv2d_nchw(x, wk, s, p, d, g),
            ops.conv2d_transpose_nchw(x, wtk, s, p, op, g, d)]
    got = run_te(outs, {x: a, wk: w, wtk: wt}, target)
    check(got[0], run_onnx("Conv", {"x": a, "w": w}, strides=s, pads=p, dilations=d, group=g),
          atol=1e-4)
    check(got[1], run_onnx("ConvTranspose", {"x": a, "w": wt}, strides=s, pads=p,
                           output_padding=op, dilations=d, group=g), atol=1e-4)


@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "align_corners",
                                  "asymmetric"])
@pytest.mark.parametrize("method", ["nearest", "linear", "cubic"])
def test_resize(mode: str, method: str, target: str) -> None:
    a = _rand((1, 2, 5, 7))
    x = te.placeholder(a.shape, name="x")
    (got,) = run_te(ops.resize2d(x, (8, 4), method=method, coordinate_transformation_mode=mode),
                    {x: a}, target)
    want = run_onnx("Resize", {"x": a}, {"roi": None, "scales": None,
                                         "sizes": np.array([1, 2, 8, 4], dtype="int64")},
                    mode=method, coordinate_transformation_mode=mode)
    check(got, want, atol=1e-5)


def test_gather_slice_softmax_norm(target: str) -> None:
    rng = np.random.default_rng()
    a = _rand((3, 5, 4))
    idx = rng.integers(-5, 5, (2, 3)).astype("int64")
    eidx = rng.integers(-5, 5, (3, 2, 4)).astype("int64")
    g, b = _rand((4,)), _rand((4,))
    x = te.placeholder(a.shape, name="x")
    i, e = te.placeholder(idx.shape, dtype="int64", name="i"), \
        te.placeholder(eidx.shape, dtype="int64", name="e")
    gt, bt = te.placeholder((4,), name="g"), te.placeholder((4,), name="b")
    outs = [ops.take(x, i, 1), ops.gather(x, 1, e),
            ops.strided_slice(x, (4, -1), (-100, 0), (-2, -1), (1, 2)),
            ops.softmax(x, 1), ops.log_softmax(x, -1), ops.layer_norm(x, gt, bt, -1, 1e-5),
            ops.gelu(x), ops.gelu(x, "tanh"), ops.hard_swish(x), ops.hard_sigmoid(x)]
    got = run_te(outs, {x: a, i: idx, e: eidx, gt: g, bt: b}, target)
    wants = [
        run_onnx("Gather", {"x": a, "i": idx}, axis=1),
        run_onnx("GatherElements", {"x": a, "e": eidx}, axis=1),
        run_onnx("Slice", {"x": a}, {"starts": np.array([4, -1]), "ends": np.array([-100, 0]),
                                     "axes": np.array([1, 2]), "steps": np.array([-2, -1])}),
        run_onnx("Softmax", {"x": a}, axis=1),
        run_onnx("LogSoftmax", {"x": a}, axis=-1),
        run_onnx("LayerNormalization", {"x": a, "g": g, "b": b}, axis=-1, epsilon=1e-5),
        run_onnx("Gelu", {"x": a}),
        run_onnx("Gelu", {"x": a}, approximate="tanh"),
        run_onnx("HardSwish", {"x": a}),
        run_onnx("HardSigmoid", {"x": a}),
    ]
    for gv, wv in zip(got, wants):
        check(gv, wv, atol=1e-5)


def test_integer_div_mod(target: str) -> None:
    rng = np.random.default_rng()
    a = rng.integers(-50, 50, (4, 5)).astype("int32")
    b = rng.integers(1, 9, (5,)).astype("int32") * rng.choice([-1, 1], 5).astype("int32")
    x, y = te.placeholder(a.shape, dtype="int32", name="x"), \
        te.placeholder(b.shape, dtype="int32", name="y")
    got = run_te([ops.divide(x, y), ops.floor_mod(x, y), ops.mod(x, y)], {x: a, y: b}, target)
    check(got[0], run_onnx("Div", {"x": a, "y": b}, out="int32"), "int32")
    check(got[1], run_onnx("Mod", {"x": a, "y": b}, out="int32"), "int32")
    check(got[2], run_onnx("Mod", {"x": a, "y": b}, out="int32", fmod=1), "int32")
