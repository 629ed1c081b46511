"""Values at the edges of what the CPU executor takes: 0-d inputs, zero-size dims (compared with
onnxruntime), and sizes too large to allocate or even count (one-line errors naming the value)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autosched as aus
from autosched.errors import CompileError, ModelImportError, RuntimeError_
from autosched.testing.models import ort_run
from importers.onnx import from_onnx


def _model(nodes: list, inputs: dict[str, list[int]], outputs: list[str]) -> object:
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    graph = helper.make_graph(nodes, "edge", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _compare(model: object, inputs: dict[str, np.ndarray]) -> None:
    graph = from_onnx(model, shapes={k: v.shape for k, v in inputs.items()})
    got = aus.compile(graph, target="llvm").run(inputs)
    want = ort_run(model, inputs)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_scalar_inputs_stay_0d(rng):
    """np.ascontiguousarray made every 0-d input 1-d, so no scalar input could be passed."""
    nodes = [helper.make_node("Mul", ["s", "v"], ["y"]), helper.make_node("Neg", ["s"], ["z"])]
    model = _model(nodes, {"s": [], "v": [7]}, ["y", "z"])
    s = np.array(rng.uniform(-2, 2), "float32")
    _compare(model, {"s": s, "v": rng.uniform(-1, 1, 7).astype("float32")})
    compiled = aus.compile(from_onnx(model), target="llvm")
    (_, z) = compiled.run({"s": np.float32(s), "v": np.ones(7, "float32")})  # a numpy scalar
    assert z.shape == () and z == -s


@pytest.mark.parametrize("case", ["relu", "softmax", "broadcast_add", "reduce_max_kept_axis"])
def test_zero_size_dims_run_like_onnxruntime(case, rng):
    nodes, shapes = {
        "relu": ([helper.make_node("Relu", ["a"], ["y"])], {"a": [0, 4]}),
        "softmax": ([helper.make_node("Softmax", ["a"], ["y"])], {"a": [0, 5]}),
        "broadcast_add": ([helper.make_node("Add", ["a", "b"], ["y"])], {"a": [3, 0],
                                                                          "b": [1, 0]}),
        "reduce_max_kept_axis": ([helper.make_node("ReduceMax", ["a"], ["y"], axes=[0],
                                                   keepdims=0)], {"a": [3, 0, 2]}),
    }[case]
    inputs = {n: rng.uniform(-1, 1, s).astype("float32") for n, s in shapes.items()}
    _compare(_model(nodes, shapes, ["y"]), inputs)


def test_zero_size_intermediate_runs_in_a_deployed_build(tmp_path, rng):
    """The deployed loader viewed its planned bytes with its own copy of the executor's code,
    without the zero-size case: a [0, 4] intermediate failed with numpy's ValueError."""
    from autosched.graph.deploy import export
    from autosched.graph.loader import load

    nodes = [helper.make_node("Relu", ["a"], ["t"]), helper.make_node("Exp", ["t"], ["y"])]
    model = _model(nodes, {"a": [0, 4]}, ["y"])
    compiled = aus.compile(from_onnx(model, shapes={"a": (0, 4)}), target="llvm")
    export(compiled, tmp_path / "build")
    a = rng.uniform(-1, 1, (0, 4)).astype("float32")
    (y,) = load(tmp_path / "build").run({"a": a})
    assert y.shape == ort_run(model, {"a": a})[0].shape == (0, 4)


def _chain(shape: list[int]) -> object:
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Exp", ["t"], ["y"])]
    return _model(nodes, {"x": shape}, ["y"])


def test_byte_count_that_overflows_int64_names_the_value():
    """It wrapped, and numpy failed later with an unrelated ValueError."""
    from autosched.graph.graph import ValueInfo
    from autosched.graph.memory import nbytes

    with pytest.raises(ModelImportError, match=r"value big \(float32\[1099511627776, "
                                               r"1099511627776\]\) would need \d+ bytes"):
        nbytes(ValueInfo("big", (1 << 40, 1 << 40), "float32"))
    with pytest.raises(ModelImportError, match=r"value neg \(float32\[3, -1\]\) has a negative"):
        nbytes(ValueInfo("neg", (3, -1), "float32"))
    # compiling such a model stops earlier, at the first kernel that cannot count that far
    with pytest.raises(CompileError, match="too large"):
        aus.compile(from_onnx(_chain([1 << 40, 1 << 40])), target="llvm")


def test_shape_too_large_to_allocate_names_the_value():
    """2**58 bytes: more than any address space, so no overcommit setting lets it through."""
    with pytest.raises(RuntimeError_, match=r"out of memory allocating \d+ bytes for the "
                                            r"workspace of model \w+ \(its largest: value \w+ "
                                            r"\(float32\[268435456, 268435456\]\)\)"):
        aus.compile(from_onnx(_chain([1 << 28, 1 << 28])), target="llvm")


def test_gpu_out_of_memory_names_the_value(monkeypatch: pytest.MonkeyPatch):
    """The GPU executor on test_graph_executor_cuda's stand-in driver, whose device memory
    runs out: the driver's error becomes the same line naming the value."""
    from autosched.graph.executor_cuda import CudaModel
    from autosched.targets.cuda import runtime as rt
    from autosched.targets.target import parse
    from tests.graph.test_graph_executor_cuda import _FakeDriver, _FakeModule

    class Driver(_FakeDriver):
        class MemoryError(_FakeDriver.Error):  # noqa: A001  (pycuda's name)
            pass

        def mem_alloc(self, n: int) -> int:
            if n > 100:
                raise Driver.MemoryError("cuMemAlloc failed: out of memory")
            return super().mem_alloc(n)

    drv = Driver()
    monkeypatch.setattr(rt, "driver", lambda: drv)
    monkeypatch.setattr(rt, "context", lambda: None)
    cpu = aus.compile(from_onnx(_chain([3, 50])), target="llvm")
    kernels = [type(k)(k.group, k.task, k.args, _FakeModule(drv, k.module, k.task))
               for k in cpu.kernels]
    with pytest.raises(RuntimeError_, match=r"out of memory allocating \d+ bytes for the "
                                            r"workspace of model \w+ \(its largest: value \w+ "
                                            r"\(float32\[3, 50\]\)\)"):
        CudaModel(cpu.graph, kernels, parse("cuda"), cpu.constants, cpu.aliases)


def test_expand_of_a_0d_constant_to_no_dims_stays_0d(rng):
    """Folding Expand(c, []) made the 0-d constant 1-d (ascontiguousarray), so x + e came out
    with shape (1,) where onnxruntime gives ()."""
    c = numpy_helper.from_array(np.array(rng.uniform(-1, 1), np.float32), "c")
    s = helper.make_tensor("s", TensorProto.INT64, [0], [])
    graph = helper.make_graph(
        [helper.make_node("Expand", ["c", "s"], ["e"]), helper.make_node("Add", ["x", "e"], ["y"])],
        "expand0d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [c, s])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _compare(m, {"x": np.array(rng.uniform(-1, 1), np.float32)})
