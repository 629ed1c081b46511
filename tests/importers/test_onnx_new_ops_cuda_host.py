"""The new ONNX operators on the CUDA target: each graph's kernels are compiled by NVRTC with
their default GPU schedules and run on the host (autosched/targets/cuda/host_emulate.py),
then compared with autosched's llvm results (tested against onnxruntime elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from autosched.graph.compiler import group_tasks, kernel_groups, prepare  # noqa: E402
from autosched.search.space import SearchSpace  # noqa: E402
from autosched.targets.cuda.host_emulate import run_on_host, unavailable  # noqa: E402
from autosched.targets.target import parse  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402
from tests.importers.test_ops_onnx_rnn import _case  # noqa: E402
from tests.support.nvrtc import needs_nvrtc  # noqa: E402
from tests.support.onnx_node import RNG, model, rand, run_autosched  # noqa: E402

pytestmark = [needs_nvrtc,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

TARGET = parse("cuda -arch=sm_90")


def _run_cuda_on_host(m: object, inputs: dict[str, np.ndarray],
                      outputs: tuple[str, ...]) -> list[np.ndarray]:
    """Every kernel of the graph in order, on the host, over a dict of values; reshapes that
    run as views of a kernel's output (the executor's aliases) are views here too."""
    graph = from_onnx(m, {k: v.shape for k, v in inputs.items()})
    prepared = prepare(graph, TARGET)
    env = {**prepared.constants, **inputs}
    aliases = kernel_groups(prepared)[1]
    for gt in group_tasks(graph, TARGET):
        for v, src in aliases.items():
            if src in env and v not in env:
                env[v] = env[src].reshape(prepared.values[v].shape)
        env.update(gt.constants)
        n_in = len(gt.task.args) - len(gt.task.outputs)
        outs = [np.zeros(tuple(int(d) for d in t.shape), t.dtype) for t in gt.task.outputs]
        mod = gt.task.build(SearchSpace(gt.task).default_schedule())
        run_on_host(mod, *[np.require(env[a], requirements="C") for a in gt.args[:n_in]], *outs)
        env.update(zip(gt.args[n_in:], outs))
    for v, src in aliases.items():
        env.setdefault(v, env[src].reshape(prepared.values[v].shape))
    return [env[o] for o in outputs]


def _u8(*shape: int) -> np.ndarray:
    return RNG.integers(0, 256, shape).astype("uint8")


S = np.array(0.02, "float32")
CASES = {
    "topk": ([helper.make_node("TopK", ["x", "k"], ["y", "i"])], {"x": rand((3, 11))},
             {"k": np.array([4], "int64")}, ("y", "i")),
    "scatter_elements": ([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1,
                                           reduction="add")],
                         {"x": rand((5, 7)), "i": RNG.integers(-7, 7, (3, 4)).astype("int64"),
                          "u": rand((3, 4))}, {}, ("y",)),
    "cumsum_trilu": ([helper.make_node("CumSum", ["x", "a"], ["c"], reverse=1),
                      helper.make_node("Trilu", ["c"], ["y"])], {"x": rand((3, 7, 5))},
                     {"a": np.array(1, "int64")}, ("y",)),
    "einsum": ([helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bkj->bik")],
               {"a": rand((2, 5, 7)), "b": rand((2, 3, 7))}, {}, ("y",)),
    "group_norm": ([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
                   {"x": rand((2, 6, 5, 3))}, {"s": rand((6,)), "b": rand((6,))}, ("y",)),
    "quantize": ([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                  helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
                 {"x": rand((3, 5))}, {"s": S, "z": np.array(7, "int8")}, ("q", "y")),
    "qlinear_conv": ([helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys",
                                                      "yz"], ["y"], pads=[1, 1, 1, 1])],
                     {"x": _u8(1, 3, 6, 5)},
                     {"xs": S, "xz": np.array(3, "uint8"), "w": _u8(4, 3, 3, 3), "ws": S,
                      "wz": np.array(9, "uint8"), "ys": S * 20, "yz": np.array(1, "uint8")},
                     ("y",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_kernels_match_llvm(name: str) -> None:
    nodes, inputs, consts, outputs = CASES[name]
    m = model(nodes, inputs, consts, outputs)
    for got, want in zip(_run_cuda_on_host(m, inputs, outputs),
                         run_autosched(m, inputs)):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_lstm_on_cuda() -> None:
    names, inputs, consts = _case("LSTM", steps=2, initial=True)
    outs = ("y", "yh", "yc")
    m = model([helper.make_node("LSTM", names, list(outs), hidden_size=7)], inputs, consts, outs)
    for got, want in zip(_run_cuda_on_host(m, inputs, outs), run_autosched(m, inputs)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
