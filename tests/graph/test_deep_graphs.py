"""Graphs deeper or wider than Python's recursion limit: a chain of 3000 elementwise nodes,
variadic nodes with 1200 inputs (split into trees), and the TE traversals under them (a 3000-stage DAG, a
3000-operation expression). They compile and match onnxruntime / numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import autosched as aus
from autosched import te
from autosched.te.dag import ComputeDAG, topo_ops
from autosched.te.visit import free_vars, post_order, substitute
from autosched.testing.models import ort_session
from importers.onnx import from_onnx

ort = pytest.importorskip("onnxruntime")


def _model(nodes: list[Any], outputs: list[str]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                         [3, 7])],
                          [helper.make_empty_tensor_value_info(o) for o in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _check(m: onnx.ModelProto, rng: np.random.Generator, rtol: float) -> None:
    x = rng.standard_normal((3, 7)).astype("float32")
    got = aus.compile(from_onnx(m), "llvm").run({"x": x})
    sess = ort_session(m)
    for a, b in zip(got, sess.run(None, {"x": x}), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-5)


def test_chain_of_3000_elementwise_nodes(rng: np.random.Generator) -> None:
    kinds = ["Neg", "Abs", "Sigmoid", "Relu", "Tanh"]
    nodes, prev = [], "x"
    for k in range(3000):
        nodes.append(helper.make_node(kinds[k % len(kinds)], [prev], [f"v{k}"], name=f"n{k}"))
        prev = f"v{k}"
    _check(_model(nodes, [prev]), rng, 1e-5)


def _wide(ops: tuple[str, ...], width: int) -> onnx.ModelProto:
    """Each op over ``width`` inputs: three distinct producers, read in turn."""
    nodes = [helper.make_node(op, ["x"], [f"p{k}"], name=f"p{k}")
             for k, op in enumerate(["Sin", "Cos", "Tanh"])]
    ins = [f"p{k % 3}" for k in range(width)]
    for op in ops:
        attrs = {"axis": 1} if op == "Concat" else {}
        nodes.append(helper.make_node(op, ins, [op.lower()], name=op, **attrs))
    return _model(nodes, [op.lower() for op in ops])


def test_variadic_nodes_with_1200_inputs(rng: np.random.Generator) -> None:
    _check(_wide(("Sum", "Mean"), 1200), rng, 1e-4)


def test_wide_nodes_split_into_trees_of_the_same_op(monkeypatch: pytest.MonkeyPatch,
                                                    rng: np.random.Generator) -> None:
    from autosched.graph import passes

    monkeypatch.setattr(passes, "MAX_FAN_IN", 4)
    m = _wide(("Sum", "Max", "Min", "Mean", "Concat"), 40)
    g = from_onnx(m)
    assert max(len(n.inputs) for n in g.nodes) <= 4
    assert g.op_counts()["Concat"] == 10 + 3 + 1
    _check(m, rng, 1e-5)


def test_te_traversals_of_a_3000_stage_chain() -> None:
    a = te.placeholder((4,), name="A")
    t = a
    for k in range(3000):
        t = te.compute((4,), lambda i, s=t: s[i] + 1.0, name=f"s{k}")
    ops = topo_ops([t])
    assert len(ops) == 3001 and ops[0] is a.op and ops[-1] is t.op
    assert len(ComputeDAG([t]).workload_key) == 24


def _deep(a: Any, n: int, name: str) -> Any:
    def body(i: Any) -> Any:
        e = a[i]
        for _ in range(n):
            e = e * 0.5 + a[i]
        return e

    return te.compute((4,), body, name=name)  # checks the body: a full traversal


def test_te_traversals_of_a_3000_operation_expression() -> None:
    a = te.placeholder((4,), name="A")
    c = _deep(a, 3000, "C")
    assert sum(isinstance(n, te.expr.TensorRead) for n in post_order(c.op.body)) == 3001
    assert [v.name for v in free_vars(c.op.body)] == [c.op.axis[0].var.name]
    # the key hashes a JSON text as deep as the expression: names do not count, depth does
    key = ComputeDAG([c]).workload_key
    assert ComputeDAG([_deep(te.placeholder((4,), name="B"), 3000, "D")]).workload_key == key
    assert ComputeDAG([_deep(a, 2999, "C")]).workload_key != key


def test_te_rewrite_of_a_3000_operation_expression() -> None:
    a = te.placeholder((4,), name="A")
    c = _deep(a, 3000, "C")
    i = c.op.axis[0].var
    shifted = substitute(c.op.body, {i: (i + 1) % 4})
    def body(k: Any) -> Any:
        e = a[(k + 1) % 4]
        for _ in range(3000):
            e = e * 0.5 + a[(k + 1) % 4]
        return e

    want = body(i)  # built directly with a[(i + 1) % 4]
    assert hash(shifted) == hash(want)  # structural hashes: == on nodes would recurse
    assert hash(shifted) != hash(c.op.body)
