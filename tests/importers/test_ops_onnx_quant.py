"""Quantization converters against onnxruntime on fresh random inputs (llvm, through the graph
compiler): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger, ConvInteger,
QLinearMatMul, QLinearConv. Quantized outputs may differ by one step where the float product
lands on a rounding tie (onnxruntime and autosched order the float operations alike, but a
fused multiply-add can round once instead of twice)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from tests.support.onnx_node import RNG, model, rand, run_autosched, run_ort  # noqa: E402


def _q(shape: tuple, dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.asarray(RNG.integers(info.min, info.max + 1, shape), dtype=dtype)


def _scale(*shape: int) -> np.ndarray:
    return np.asarray(RNG.random(shape) * 0.05 + 0.01, dtype="float32")


def _both(nodes: list, inputs: dict, consts: dict, outputs: tuple = ("y",)) -> tuple:
    m = model(nodes, inputs, consts, outputs)
    return run_autosched(m, inputs), run_ort(m, inputs)


def _close_quantized(got: np.ndarray, want: np.ndarray, steps: int = 1) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.dtype, want.dtype)
    diff = np.abs(got.astype("int64") - want.astype("int64"))
    assert diff.max() <= steps, diff.max()
    assert (diff > 0).mean() < 0.01, (diff > 0).mean()


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_dequantize(dtype: str, per_axis: bool) -> None:
    x = rand((3, 5, 7)) * 2
    scale = _scale(5) if per_axis else _scale()
    zp = _q(scale.shape, dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)]
    (q, y), (q_ref, y_ref) = _both(nodes, {"x": x}, {"s": scale, "z": zp}, ("q", "y"))
    np.testing.assert_array_equal(q, q_ref)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6)


def test_quantize_blocked_and_default_zero_point() -> None:
    x = rand((4, 10)) * 3
    scale = _scale(4, 4)   # blocks of 3 along axis 1: ceil(10 / 3) = 4
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["y"], axis=1, block_size=3)]
    (q,), (q_ref,) = _both(nodes, {"x": x}, {"s": scale})
    np.testing.assert_array_equal(q, q_ref)


def test_dequantize_int32_runtime_scale() -> None:
    x = RNG.integers(-5000, 5000, (6, 4)).astype("int32")
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"])
    (y,), (y_ref,) = _both([node], {"x": x, "s": _scale()}, {})
    np.testing.assert_allclose(y, y_ref, rtol=1e-6)


def test_dynamic_quantize() -> None:
    x = rand((5, 9)) * 4 + 1
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    got, want = _both([node], {"x": x}, {}, ("y", "s", "z"))
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    assert got[1].shape == () and got[2].dtype == np.uint8
    np.testing.assert_array_equal(got[2], want[2])
    _close_quantized(got[0], want[0])


@pytest.mark.parametrize("per_channel", [False, True])
def test_matmul_integer(per_channel: bool) -> None:
    a, b = _q((2, 5, 7), "uint8"), _q((7, 3), "int8")
    azp = _q((), "uint8")
    bzp = _q((3,), "int8") if per_channel else _q((), "int8")
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    (y,), (y_ref,) = _both([node], {"a": a, "b": b}, {"az": azp, "bz": bzp})
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, y_ref)


def test_conv_integer() -> None:
    x, w = _q((1, 3, 7, 6), "uint8"), _q((4, 3, 3, 2), "uint8")
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 0, 1, 1],
                            strides=[2, 1])
    (y,), (y_ref,) = _both([node], {"x": x}, {"w": w, "xz": _q((), "uint8"),
                                              "wz": _q((), "uint8")})
    np.testing.assert_array_equal(y, y_ref)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("k, n", [(11, 6), (12, 32)])  # the second: int8 dot products on VNNI
def test_qlinear_matmul(dtype: str, k: int, n: int) -> None:
    a, b = _q((5, k), dtype), _q((k, n), dtype)
    consts = {"as": _scale(), "az": _q((), dtype), "b": b, "bs": _scale(n), "bz": _q((n,), dtype),
              "ys": _scale() * 20, "yz": _q((), dtype)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    (y,), (y_ref,) = _both([node], {"a": a}, consts)
    _close_quantized(y, y_ref)


@pytest.mark.parametrize("group", [2, 1])  # one group: int8 dot products on VNNI CPUs
def test_qlinear_conv(group: int) -> None:
    x, w = _q((1, 4, 9, 7), "uint8"), _q((6, 4 // group, 3, 3), "int8")
    consts = {"xs": _scale(), "xz": _q((), "uint8"), "w": w, "ws": _scale(6),
              "wz": np.zeros(6, "int8"), "ys": _scale() * 30, "yz": _q((), "uint8"),
              "bias": RNG.integers(-500, 500, 6).astype("int32")}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz",
                                            "bias"], ["y"], pads=[1, 1, 1, 1], group=group)
    (y,), (y_ref,) = _both([node], {"x": x}, consts)
    _close_quantized(y, y_ref)
