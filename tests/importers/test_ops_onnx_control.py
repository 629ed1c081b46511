"""If with a constant condition (its branch inlined) or a run-time one (both branches, the
output selected), Loop with a static trip count (unrolled at import) and
NonMaxSuppression on constant boxes, against onnxruntime on fresh random inputs (llvm,
through the graph compiler)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import importers.onnx as importer  # noqa: E402
from autosched.errors import ModelImportError  # noqa: E402
from tests.support.onnx_node import RNG, compare, model, rand, run_autosched  # noqa: E402

# the importer expands control flow through importers.control_flow.expand
hooked = pytest.mark.skipif("expand(" not in inspect.getsource(importer.from_onnx),
                            reason="importers/onnx.py does not call control_flow.expand")


def _graph(name: str, nodes: list, inputs: list, outputs: list, inits: tuple = ()) -> object:
    return helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))


def _vi(name: str, elem: int = TensorProto.FLOAT, shape: list | None = None) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


def _if_model_nodes(w: np.ndarray) -> list:
    """y = If(sum(c) > 0): then x @ w + 1, else relu(x) * outer value x."""
    then = _graph("then", [helper.make_node("MatMul", ["x", "w_in"], ["mm"]),
                           helper.make_node("Add", ["mm", "one"], ["t_out"])],
                  [], [_vi("t_out")], (numpy_helper.from_array(w, "w_in"),
                                       numpy_helper.from_array(np.float32(1.0), "one")))
    other = _graph("else", [helper.make_node("Relu", ["x"], ["r"]),
                            helper.make_node("Mul", ["r", "x"], ["e_out"])], [], [_vi("e_out")])
    return [helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]


@hooked
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_with_constant_condition(sign: float) -> None:
    w = rand((5, 5))
    c = np.abs(rand((3,))) * sign
    got = compare(_if_model_nodes(w), {"x": rand((4, 5))},
                  {"c": c, "zero": np.array(0.0, "float32")}, atol=1e-5)
    assert got[0].shape == (4, 5)


@hooked
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_if_with_runtime_condition_computes_both_branches_and_selects(sign: float) -> None:
    """The condition is an input (a verifier head that runs when a score passes a
    threshold, as in openwakeword's classifiers): both branches run, the output is chosen."""
    c = np.abs(rand((3,))) * sign
    got = compare(_if_model_nodes(rand((5, 5))), {"x": rand((4, 5)), "c": c},
                  {"zero": np.array(0.0, "float32")}, atol=1e-5)
    assert got[0].shape == (4, 5)


@hooked
def test_if_with_runtime_condition_and_branches_of_other_shapes_is_refused_by_name() -> None:
    then = _graph("then", [helper.make_node("ReduceSum", ["x"], ["t_out"], keepdims=0)], [],
                  [_vi("t_out")])
    other = _graph("else", [helper.make_node("Relu", ["x"], ["e_out"])], [], [_vi("e_out")])
    nodes = [helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    inputs = {"x": rand((4, 5)), "c": rand((3,))}
    m = model(nodes, inputs, {"zero": np.array(0.0, "float32")}, ("y",))
    with pytest.raises(ModelImportError, match=r"IfSelect.*float32\[\] and float32\[4, 5\]"):
        run_autosched(m, inputs)


def _loop_body() -> object:
    """acc_out = acc * 0.5 + x[i] (an outer value sliced by the iteration number), scan out
    acc_out * i; the condition stays true."""
    nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
             helper.make_node("Mul", ["acc", "half"], ["scaled"]),
             helper.make_node("Add", ["scaled", "row"], ["acc_out"]),
             helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["acc_out", "fi"], ["scan"])]
    return _graph("body", nodes,
                  [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []),
                   _vi("acc", TensorProto.FLOAT, [6])],
                  [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out", TensorProto.FLOAT, [6]),
                   _vi("scan", TensorProto.FLOAT, [6])],
                  (numpy_helper.from_array(np.float32(0.5), "half"),))


@hooked
@pytest.mark.parametrize("trips", [1, 4])
def test_loop_with_static_trip_count(trips: int) -> None:
    node = helper.make_node("Loop", ["m", "", "a0"], ["acc", "scans"], body=_loop_body())
    compare(node, {"x": rand((5, 6)), "a0": rand((6,))}, {"m": np.array(trips, "int64")},
            outputs=("acc", "scans"))


@hooked
def test_loop_stops_on_a_constant_condition() -> None:
    """A body whose condition turns false (i < 2) stops after 3 iterations of 10."""
    body = _loop_body()
    body.node[0].CopyFrom(helper.make_node("Less", ["i", "two"], ["cond_out"]))
    body.initializer.append(numpy_helper.from_array(np.array(2, "int64"), "two"))
    node = helper.make_node("Loop", ["m", "c", "a0"], ["acc", "scans"], body=body)
    got = compare(node, {"x": rand((5, 6)), "a0": rand((6,))},
                  {"m": np.array(10, "int64"), "c": np.array(True)}, outputs=("acc", "scans"))
    assert got[1].shape == (3, 6)


def _boxes(batch: int, n: int, center: bool) -> np.ndarray:
    xy = RNG.random((batch, n, 2)) * 10
    wh = RNG.random((batch, n, 2)) * 4 + 0.5
    if center:
        return np.concatenate([xy, wh], -1).astype("float32")
    return np.concatenate([xy, xy + wh], -1).astype("float32")[..., [1, 0, 3, 2]]


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression(center: int) -> None:
    boxes, scores = _boxes(2, 30, bool(center)), RNG.random((2, 3, 30)).astype("float32")
    node = helper.make_node("NonMaxSuppression", ["b", "s", "m", "iou", "st"], ["y"],
                            center_point_box=center)
    consts = {"b": boxes, "s": scores, "m": np.array([5], "int64"),
              "iou": np.array([0.3], "float32"), "st": np.array([0.2], "float32")}
    m = model([node], {}, consts, ("y",))
    from tests.support.onnx_node import run_ort

    (want,) = run_ort(m, {})
    got = importer.from_onnx(m).constants["y"]
    np.testing.assert_array_equal(got, want)


@hooked
def test_if_nested_in_loop_reads_the_iteration_values() -> None:
    """An If inside a Loop body reads the body's carried value: each unrolled iteration's
    branch must read that iteration's value (renames reach nested subgraphs)."""
    then = _graph("then", [helper.make_node("Mul", ["acc", "acc"], ["sq"]),
                           helper.make_node("Add", ["sq", "row"], ["t_out"])], [], [_vi("t_out")])
    other = _graph("else", [helper.make_node("Neg", ["acc"], ["e_out"])], [], [_vi("e_out")])
    body = _loop_body()
    body.node[3].CopyFrom(helper.make_node("If", ["flag"], ["acc_out"], then_branch=then,
                                           else_branch=other))
    node = helper.make_node("Loop", ["m", "", "a0"], ["acc", "scans"], body=body)
    compare(node, {"x": rand((5, 6)) * 0.3, "a0": rand((6,)) * 0.3},
            {"m": np.array(3, "int64"), "flag": np.array(True)}, outputs=("acc", "scans"))
