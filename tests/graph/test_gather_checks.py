"""Gather / GatherElements with ONNX's index semantics: negative indices count from the end,
int64 indices are compared as int64, and an index out of range fails the run with one line
naming the node (the kernel reports it), never a silent clamp."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autosched as aus
from autosched import te
from autosched.errors import ModelImportError, RuntimeError_
from autosched.te import ops
from autosched.testing.models import ort_run
from importers.onnx import from_onnx

N = 23  # rows of the table: the axis indices point into


def _model(op: str, table: np.ndarray, idx_shape: tuple, axis: int, shift: bool,
           const_idx: np.ndarray | None = None) -> object:
    """``op`` over a constant table and int64 indices (a graph input, or ``const_idx``), with
    ``shift`` an Add before (fused into the gather's kernel) and a Relu after."""
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    inputs = []
    if const_idx is None:
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, idx_shape))
    else:
        inits.append(numpy_helper.from_array(const_idx, "ids"))
    nodes = [helper.make_node("Add", ["ids", "one"], ["j"], name="shift")] if shift else []
    nodes += [helper.make_node(op, ["table", "j" if shift else "ids"], ["g"], axis=axis,
                               name="lookup"),
              helper.make_node("Relu", ["g"], ["y"], name="relu")]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "gather", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = {  # name: (op, table shape, indices shape, axis)
    "gather_rows": ("Gather", (N, 33), (6, 40), 0),  # big enough for a parallel, vector kernel
    "gather_cols": ("Gather", (5, N), (3,), 1),
    "gather_elements": ("GatherElements", (N, 9), (17, 9), 0),
}


@pytest.fixture(scope="module", params=[(c, s) for c in CASES for s in (False, True)],
                ids=lambda p: f"{p[0]}{'_shifted' if p[1] else ''}")
def compiled(request: pytest.FixtureRequest) -> tuple:
    name, shift = request.param
    op, tshape, ishape, axis = CASES[name]
    table = np.random.default_rng().uniform(-1, 1, tshape).astype("float32")
    onnx_model = _model(op, table, ishape, axis, shift)
    return onnx_model, aus.compile(from_onnx(onnx_model), target="llvm"), ishape, shift


def _indices(rng: np.random.Generator, shape: tuple, shift: bool) -> np.ndarray:
    """Valid indices (after the shift), one of them negative."""
    ids = rng.integers(-N, N, shape).astype(np.int64) - int(shift)
    ids.flat[int(rng.integers(ids.size))] = -int(rng.integers(1, N + 1)) - int(shift)
    return ids


def test_in_range_indices_match_onnxruntime(compiled, rng):
    onnx_model, model, ishape, shift = compiled
    ids = _indices(rng, ishape, shift)
    (got,) = model.run({"ids": ids})
    np.testing.assert_array_equal(got, ort_run(onnx_model, {"ids": ids})[0])


@pytest.mark.parametrize("bad", [N, -N - 1, 2**32, 2**32 + 3, -(2**40)])
def test_out_of_range_index_fails_the_run(compiled, bad, rng):
    """2**32 + 3 truncated to 32 bits is 3 (a valid row): it read row 3 before."""
    onnx_model, model, ishape, shift = compiled
    ids = _indices(rng, ishape, shift)
    where = tuple(int(rng.integers(d)) for d in ishape)
    ids[where] = bad - shift
    with pytest.raises(RuntimeError_, match=r"node lookup: an index read from the indices "
                                            r"tensor is out of range"):
        model.run({"ids": ids})
    good = _indices(rng, ishape, shift)  # the next call starts from a clean status
    np.testing.assert_array_equal(model.run({"ids": good})[0],
                                  ort_run(onnx_model, {"ids": good})[0])


@pytest.mark.parametrize("op", ["Gather", "GatherElements"])
def test_constant_indices_out_of_range_fail_at_import(op):
    table = np.random.default_rng().uniform(-1, 1, (N, 4)).astype("float32")
    ids = np.array([[1, N, 2, 0]], np.int64) if op == "GatherElements" else np.array([1, N])
    with pytest.raises(ModelImportError, match=rf"lookup.*indices \[{N}\] are out of range"):
        from_onnx(_model(op, table, ids.shape, 0, False, const_idx=ids))


def test_take_strict_reports_int64_index_beyond_int32(rng):
    """The operator itself, built alone for llvm: an int64 index is never truncated."""
    x = te.placeholder((N, 3), name="x")
    i = te.placeholder((5,), dtype="int64", name="i")
    y = ops.take(x, i, 0, mode="strict")
    mod = aus.build(te.create_schedule(y.op), [x, i, y], target="llvm", name="take_strict")
    a = rng.uniform(-1, 1, (N, 3)).astype("float32")
    iv = rng.integers(-N, N, 5).astype(np.int64)
    out = np.empty((5, 3), "float32")
    mod(a, iv, out)
    np.testing.assert_array_equal(out, np.take(a, iv, 0))
    call = mod.bind(a, iv, out)  # bound once, checked on every call
    iv[2] = 2**32 + 1
    for run in (lambda: mod(a, iv, out), call, lambda: mod.time(a, iv, out, warmup=0)):
        with pytest.raises(RuntimeError_, match="take_strict: an index .* out of range"):
            run()


def test_take_on_an_empty_axis_is_an_error():
    x = te.placeholder((0, 3), name="x")
    i = te.placeholder((2,), dtype="int64", name="i")
    with pytest.raises(aus.TEError, match="axis 0 of x is empty"):
        ops.take(x, i, 0, mode="strict")


def test_random_inputs_stay_within_the_axis_they_index():
    """``autosched run`` / ``bench`` feed random inputs: indices into a 4-row table must be
    valid ones, not the [0, 10) drawn for other integers."""
    from autosched.graph.executor import random_inputs

    table = np.random.default_rng().uniform(-1, 1, (4, 6)).astype("float32")
    onnx_model = _model("Gather", table, (50,), 0, False)
    graph = from_onnx(onnx_model)
    feeds = random_inputs(graph, seed=int(np.random.default_rng().integers(2**31)))
    assert 0 <= feeds["ids"].min() and feeds["ids"].max() < 4
    (got,) = aus.compile(graph, target="llvm").run(feeds)
    np.testing.assert_array_equal(got, ort_run(onnx_model, feeds)[0])


def test_ignored_index_status_reads_the_clamped_element(rng):
    """Measurement runs kernels on random integers: with STATUS_INDEX ignored, an index out of
    range reads the nearest valid element, the same for every schedule."""
    from autosched.targets.status import STATUS_INDEX

    x = te.placeholder((N, 3), name="x")
    i = te.placeholder((6,), dtype="int64", name="i")
    y = ops.take(x, i, 0, mode="strict")
    mod = aus.build(te.create_schedule(y.op), [x, i, y], target="llvm", name="take_quiet")
    a = rng.uniform(-1, 1, (N, 3)).astype("float32")
    iv = np.array([N, -N - 5, 2**33, 1, -1, 0], np.int64)
    out = np.empty((6, 3), "float32")
    with pytest.raises(RuntimeError_, match="take_quiet"):
        mod(a, iv, out)
    mod.ignored_status = STATUS_INDEX
    mod(a, iv, out)
    np.testing.assert_array_equal(out, a[np.clip(np.where(iv < 0, iv + N, iv), 0, N - 1)])


def _index_checks(onnx_model: object) -> int:
    """How many index_check calls the model's tasks compute."""
    from autosched.graph.compiler import extract_tasks
    from autosched.te.dag import topo_ops
    from autosched.te.expr import Call
    from autosched.te.ops.transform import INDEX_CHECK
    from autosched.te.tensor import ComputeOp
    from autosched.te.visit import post_order

    tasks, _ = extract_tasks(from_onnx(onnx_model), "llvm")
    return sum(isinstance(e, Call) and e.name == INDEX_CHECK
               for t in tasks for op in topo_ops(t.outputs) if isinstance(op, ComputeOp)
               for e in post_order(op.body))


def test_only_runtime_indices_are_checked_in_the_kernel():
    """Constant indices were checked at import, so their kernel has no check to run."""
    rng = np.random.default_rng()
    table = rng.uniform(-1, 1, (N, 4)).astype("float32")
    runtime = _model("Gather", table, (7,), 0, False)
    assert _index_checks(runtime) == 1
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, 4])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    ids = numpy_helper.from_array(rng.integers(-N, N, 7).astype(np.int64), "ids")
    node = helper.make_node("Gather", ["x", "ids"], ["y"], axis=0, name="lookup")
    const = helper.make_model(helper.make_graph([node], "g", [x], [out], [ids]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert _index_checks(const) == 0


@pytest.mark.parametrize("target", ["ref", "cuda"])
def test_take_strict_on_the_other_targets(target, rng):
    """The reference evaluator fails the run like the CPU kernel; CUDA kernels report no status
    yet, so there the strict check reads the clamped element (memory stays safe)."""
    x = te.placeholder((N, 3), name="x")
    i = te.placeholder((5,), dtype="int64", name="i")
    y = ops.take(x, i, 0, mode="strict")
    s = te.create_schedule(y.op)
    a = rng.uniform(-1, 1, (N, 3)).astype("float32")
    iv = rng.integers(-N, N, 5).astype(np.int64)
    out = np.empty((5, 3), "float32")
    if target == "ref":
        mod = aus.build(s, [x, i, y], target="ref")
        mod(a, iv, out)
        np.testing.assert_array_equal(out, np.take(a, iv, 0))
        iv[1] = N
        with pytest.raises(RuntimeError_, match="out of range"):
            mod(a, iv, out)
        return
    from tests.support.nvrtc import NVRTC_SKIP

    if NVRTC_SKIP is not None:
        pytest.skip(f"NVRTC unavailable: {NVRTC_SKIP}")
    from autosched.targets.cuda.host_emulate import run_on_host, unavailable

    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    from autosched.search.space import SearchSpace

    task = aus.Task([y], args=[x, i, y], target="cuda -arch=sm_90")
    mod = task.build(SearchSpace(task).default_schedule())
    run_on_host(mod, a, iv, out)
    np.testing.assert_array_equal(out, np.take(a, iv, 0))


@pytest.mark.parametrize("shapes", [((2, 0), (0, 3)), ((0, 5), (5, 3))])
def test_zero_size_matmul_runs_like_onnxruntime(shapes, rng):
    """The tile knobs of an extent-0 axis took max() of no divisors."""
    a_shape, b_shape = shapes
    a = rng.uniform(-1, 1, a_shape).astype("float32")
    b = rng.uniform(-1, 1, b_shape).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
         for n, s in (("a", a_shape), ("b", b_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    got = aus.compile(from_onnx(model, shapes={"a": a_shape, "b": b_shape}),
                      target="llvm").run({"a": a, "b": b})
    np.testing.assert_allclose(got[0], ort_run(model, {"a": a, "b": b})[0], atol=1e-6)
