"""RNN, GRU and LSTM against onnxruntime on fresh random inputs (llvm, through the graph
compiler): directions, biases, initial states, peepholes, batch-first layout, activations."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import importers.onnx as importer  # noqa: E402
from autosched.errors import ModelImportError  # noqa: E402
from tests.support.onnx_node import compare, model, rand, run_autosched, run_ort  # noqa: E402

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _case(op: str, steps: int = 3, batch: int = 2, inp: int = 5, hidden: int = 7,
          dirs: int = 1, bias: bool = True, initial: bool = False, peep: bool = False,
          layout: int = 0) -> tuple[list[str], dict, dict]:
    g = GATES[op]
    xs = (batch, steps, inp) if layout else (steps, batch, inp)
    inputs = {"x": rand(xs) * 0.5}
    consts = {"w": rand((dirs, g * hidden, inp)) * 0.3, "r": rand((dirs, g * hidden, hidden)) * 0.3}
    names = ["x", "w", "r", "", "", "", "", ""]
    if bias:
        consts["b"] = rand((dirs, 2 * g * hidden)) * 0.2
        names[3] = "b"
    hs = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    if initial:
        inputs["h0"] = rand(hs)
        names[5] = "h0"
        if op == "LSTM":
            inputs["c0"] = rand(hs)
            names[6] = "c0"
    if peep:
        consts["p"] = rand((dirs, 3 * hidden)) * 0.3
        names[7] = "p"
    while names[-1] == "":
        names.pop()
    return names, inputs, consts


def _outputs(op: str) -> tuple[str, ...]:
    return ("y", "yh", "yc") if op == "LSTM" else ("y", "yh")


@pytest.mark.parametrize("op,direction", [("RNN", "reverse"), ("GRU", "bidirectional"),
                                          ("LSTM", "forward"), ("LSTM", "bidirectional")])
def test_recurrent_directions(op: str, direction: str) -> None:
    dirs = 2 if direction == "bidirectional" else 1
    names, inputs, consts = _case(op, dirs=dirs, initial=True)
    node = helper.make_node(op, names, list(_outputs(op)), hidden_size=7, direction=direction)
    compare(node, inputs, consts, outputs=_outputs(op), atol=1e-5)


def test_lstm_peepholes_layout_clip() -> None:
    """onnxruntime has no batch-first layout: the reference runs the time-major model on
    transposed inputs."""
    names, inputs, consts = _case("LSTM", steps=4, batch=3, peep=True, initial=True, layout=1)
    outs = ["y", "yh", "yc"]
    batch_first = model([helper.make_node("LSTM", names, outs, hidden_size=7, layout=1,
                                          clip=0.7)], inputs, consts, outs)
    got = run_autosched(batch_first, inputs)
    time_major = {k: np.ascontiguousarray(v.swapaxes(0, 1)) for k, v in inputs.items()}
    ref = model([helper.make_node("LSTM", names, outs, hidden_size=7, clip=0.7)], time_major,
                consts, outs)
    y, yh, yc = run_ort(ref, time_major)
    for g, w in zip(got, [y.transpose(2, 0, 1, 3), yh.swapaxes(0, 1), yc.swapaxes(0, 1)]):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden", [7, 16])  # on a CPU, 48 gate columns: R in panels
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr: int, hidden: int) -> None:
    names, inputs, consts = _case("GRU", bias=True, initial=True, hidden=hidden)
    node = helper.make_node("GRU", names, ["y", "yh"], hidden_size=hidden,
                            linear_before_reset=lbr)
    compare(node, inputs, consts, outputs=("y", "yh"), atol=1e-5)


def test_rnn_activations_without_bias() -> None:
    names, inputs, consts = _case("RNN", bias=False)
    node = helper.make_node("RNN", names, ["y", "yh"], hidden_size=7,
                            activations=["LeakyRelu"], activation_alpha=[0.3])
    compare(node, inputs, consts, outputs=("y", "yh"), atol=1e-5)


def test_partial_sequence_lengths_are_refused_by_name() -> None:
    names, inputs, consts = _case("LSTM")
    names = names[:3] + ["b", "lens"]
    consts["lens"] = np.array([3, 2], "int32")
    node = helper.make_node("LSTM", names, ["y"], hidden_size=7)
    m = model([node], inputs, consts, ("y",))
    with pytest.raises(ModelImportError, match=r"sequence_lens \[3, 2\] differ"):
        run_autosched(m, inputs)


@pytest.mark.skipif("expand(" not in inspect.getsource(importer.from_onnx),
                    reason="importers/onnx.py does not call control_flow.expand")
def test_steps_become_one_cell_task() -> None:
    """Imported, an LSTM is one RecurrentCell node per step and direction; the graph
    compiler makes them one task, weighted by the step count."""
    from autosched.graph.compiler import extract_tasks

    names, inputs, consts = _case("LSTM", steps=5, dirs=2, initial=True)
    m = model([helper.make_node("LSTM", names, ["y", "yh", "yc"], hidden_size=7,
                                direction="bidirectional")], inputs, consts, ("y", "yh", "yc"))
    graph = importer.from_onnx(m, {k: v.shape for k, v in inputs.items()})
    assert sum(n.op_type == "RecurrentCell" for n in graph.nodes) == 10
    tasks, weights = extract_tasks(graph, "llvm")
    assert [w for t, w in zip(tasks, weights) if t.name == "recurrentcell"] == [10]


def test_cpu_cells_read_r_transposed() -> None:
    """On a CPU each cell reads its constant R transposed, gate columns contiguous (read
    (4H, H), the vectorized columns are a gather: 2.3 ms against 0.16 ms a step of a 2048 x
    512 LSTM), in column panels of whole vectors where they pad it by at most an eighth (a
    (H, 4H) row strides a parallel chunk of columns across pages), else plain; a GPU keeps
    R as ONNX stores it. All match onnxruntime."""
    from autosched.graph.compiler import prepare
    from autosched.graph.graph import R_LAYOUT
    from autosched.graph.passes import panel_columns
    from autosched.targets.target import parse

    for hidden in (9, 16):
        names, inputs, consts = _case("LSTM", steps=4, hidden=hidden, initial=True)
        m = model([helper.make_node("LSTM", names, ["y", "yh", "yc"], hidden_size=hidden)],
                  inputs, consts, ("y", "yh", "yc"))
        graph = importer.from_onnx(m, {k: v.shape for k, v in inputs.items()})
        host = parse("llvm")
        width = panel_columns(4 * hidden, max(host.vector_bits // 32, 1))
        cpu = ("panels", (-(-4 * hidden // width), hidden, width)) if width else (
            "kn", (hidden, 4 * hidden))
        for target, (layout, r_shape) in ((host, cpu), (parse("cuda"), (None, (4 * hidden,
                                                                               hidden)))):
            g = prepare(graph, target)
            cells = [n for n in g.nodes if n.op_type == "RecurrentCell"]
            assert len(cells) == 4 and {n.attrs.get(R_LAYOUT) for n in cells} == {layout}
            assert {g.values[n.inputs[3]].shape for n in cells} == {r_shape}
        compare(helper.make_node("LSTM", names, ["y", "yh", "yc"], hidden_size=hidden),
                inputs, consts, outputs=("y", "yh", "yc"), atol=1e-5)
