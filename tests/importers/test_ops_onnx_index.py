"""Indexing and selection converters (GatherND, ScatterElements, ScatterND, OneHot, Trilu,
CumSum, DepthToSpace, SpaceToDepth, TopK) against onnxruntime on fresh random inputs, through
the graph compiler on llvm; shapes that tiles do not divide."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from autosched.errors import ModelImportError  # noqa: E402
from tests.support.onnx_node import RNG, compare, model, rand, run_autosched  # noqa: E402


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_cumsum(exclusive: int, reverse: int, dtype: str) -> None:
    x = rand((3, 7, 5), dtype)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    compare(node, {"x": x}, {"axis": np.array(-2, "int64")})


@pytest.mark.parametrize("upper,k", [(1, 0), (0, 0), (1, -2), (0, 3), (1, 9)])
def test_trilu(upper: int, k: int) -> None:
    node = helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)
    compare(node, {"x": rand((2, 5, 7))}, {"k": np.array(k, "int64")})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis: int) -> None:
    idx = RNG.integers(-6, 6, (3, 4)).astype("int64")
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=axis)
    compare(node, {"i": idx}, {"depth": np.array(6, "int64"),
                               "values": rand((2,))})


def test_one_hot_runtime_values() -> None:
    idx = RNG.integers(0, 5, (7,)).astype("int64")
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"])
    compare(node, {"i": idx, "values": rand((2,))}, {"depth": np.array(5, "int64")})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode: str) -> None:
    node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=3, mode=mode)
    compare(node, {"x": rand((2, 18, 5, 7))})


def test_space_to_depth() -> None:
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2)
    compare(node, {"x": rand((2, 3, 6, 10))})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space(mode: str) -> None:
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["s"], blocksize=3, mode=mode),
             helper.make_node("DepthToSpace", ["s"], ["y"], blocksize=3, mode=mode)]
    x = rand((1, 2, 6, 9))
    (y,) = run_autosched(model(nodes, {"x": x}, {}, ("y",), opset=25), {"x": x})
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("dshape,ishape,batch", [((5, 6, 7), (4, 2), 0), ((5, 6, 7), (3, 1, 3), 0),
                                                ((3, 6, 7), (3, 4, 1), 1)])
def test_gather_nd(dshape: tuple, ishape: tuple, batch: int) -> None:
    q = ishape[-1]
    bounds = dshape[batch:batch + q]
    idx = np.stack([RNG.integers(-n, n, ishape[:-1]) for n in bounds], axis=-1).astype("int64")
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch)
    compare(node, {"x": rand(dshape), "i": idx})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements(reduction: str, axis: int) -> None:
    data = rand((5, 7))
    ushape = (3, 4)
    # distinct indices along the axis for "none" (duplicates have no defined order there)
    n = data.shape[axis]
    cols = [RNG.permutation(n)[:ushape[axis]] for _ in range(ushape[1 - axis])]
    idx = np.stack(cols, axis=1 - axis) - (n if reduction == "add" else 0)
    if reduction != "none":
        idx = RNG.integers(-n, n, ushape)   # duplicates combine
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis,
                            reduction=reduction)
    compare(node, {"x": data, "i": idx.astype("int64"), "u": rand(ushape)}, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max"])
def test_scatter_nd(reduction: str) -> None:
    data = rand((6, 5, 3))
    flat = RNG.permutation(30)[:4] if reduction == "none" else RNG.integers(0, 30, 4)
    idx = np.stack([flat // 5, flat % 5], axis=-1).reshape(2, 2, 2).astype("int64")
    idx[0, 0] -= (6, 5)   # negative indices count from the end
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    compare(node, {"x": data, "i": idx, "u": rand((2, 2, 3))})


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis", [-1, 1])
def test_topk(largest: int, axis: int) -> None:
    x = rand((3, 11, 5))
    x[0, :4, 0] = 0.5  # ties: the lower index first
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    compare(node, {"x": x}, {"k": np.array([4], "int64")}, outputs=("v", "i"))


def test_topk_needs_constant_k() -> None:
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"])
    m = model([node], {"x": rand((3, 5)), "k": np.array([2], "int64")}, {}, ("v", "i"))
    with pytest.raises(ModelImportError, match="TopK.*input 1.*constant"):
        run_autosched(m, {"x": rand((3, 5)), "k": np.array([2], "int64")})
