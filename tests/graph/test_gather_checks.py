"""Gather / GatherElements with ONNX's index semantics: negative indices count from the end,
int64 indices are compared as int64, and an index out of range fails the run with one line
naming the node (the kernel reports it), never a silent clamp: on the CPU, the reference
evaluator, the CUDA C run on the host and on the IR, and the GPU (marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autosched as aus
from autosched import te
from autosched.errors import ModelImportError, RuntimeError_
from autosched.targets.status import STATUS_INDEX, KernelFailure
from autosched.te import ops
from autosched.testing.models import ort_run
from importers.onnx import from_onnx
from tests.support.nvrtc import NVRTC_SKIP

N = 23  # rows of the table: the axis indices point into


def _host_emulation_skip() -> str | None:
    from autosched.targets.cuda.host_emulate import unavailable

    return NVRTC_SKIP or unavailable()


HOST_SKIP = _host_emulation_skip()
# where a run-time index is checked: the CPU, the CUDA C on the host and on the GPU, the IR
RUNTIME_TARGETS = ["llvm", "cuda -emulate=host", "cuda -emulate=ir", "cuda"]


def _marks(target: str) -> list[pytest.MarkDecorator]:
    """The GPU marker, or a skip where this machine cannot build or run ``target``."""
    if target == "cuda":
        return [pytest.mark.gpu]
    skip = {"cuda -emulate=host": HOST_SKIP, "cuda -emulate=ir": NVRTC_SKIP}.get(target)
    return [pytest.mark.skipif(skip is not None, reason=str(skip))]


LOOKUP_FAILED = r"^task \w+, node lookup: an index read from the indices tensor is out of range$"


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


@pytest.fixture(scope="module", params=[
    pytest.param((c, s, t), marks=_marks(t), id=f"{c}{'_shifted' if s else ''}-{t}")
    for t in RUNTIME_TARGETS for c in CASES for s in (False, True)])
def compiled(request: pytest.FixtureRequest) -> tuple:
    name, shift, target = request.param
    op, tshape, ishape, axis = CASES[name]
    table = np.random.default_rng().uniform(-1, 1, tshape).astype("float32")
    onnx_model = _model(op, table, ishape, axis, shift)
    return onnx_model, aus.compile(from_onnx(onnx_model), target=target), ishape, shift


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
    with pytest.raises(RuntimeError_, match=LOOKUP_FAILED):
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


@pytest.mark.parametrize("target", [pytest.param(t, marks=_marks(t))
                                    for t in ["ref", *RUNTIME_TARGETS]])
def test_take_strict_reports_indices_out_of_range(target, rng):
    """The operator itself, built alone: negative indices count from the end; an index out of
    range, int64 ones beyond int32 included (2**32 + 1 truncated is 1, a valid row), fails a
    call, a bound call and a timing with the kernel's status, and the next call is clean."""
    x = te.placeholder((N, 3), name="x")
    i = te.placeholder((5,), dtype="int64", name="i")
    y = ops.take(x, i, 0, mode="strict")
    mod = aus.build(te.create_schedule(y.op), [x, i, y], target=target, name="take_strict")
    a = rng.uniform(-1, 1, (N, 3)).astype("float32")
    iv = rng.integers(-N, N, 5).astype(np.int64)
    iv[0] = -int(rng.integers(1, N + 1))
    out = np.empty((5, 3), "float32")
    mod(a, iv, out)
    np.testing.assert_array_equal(out, np.take(a, iv, 0))
    call = mod.bind(a, iv, out)  # bound once, checked on every call
    for bad in (N, -N - 1, 2**32 + 1):
        good = iv[2]
        iv[2] = bad
        for run in (lambda: mod(a, iv, out), call, lambda: mod.time(a, iv, out, warmup=0)):
            with pytest.raises(KernelFailure, match="^take_strict: an index .* out of range") \
                    as failure:
                run()
            assert failure.value.status == STATUS_INDEX
        iv[2] = good
        out[...] = np.nan
        mod(a, iv, out)
        np.testing.assert_array_equal(out, np.take(a, iv, 0))


@pytest.mark.parametrize("target", [pytest.param(t, marks=_marks(t)) for t in RUNTIME_TARGETS])
def test_measurement_records_a_failed_index_check_as_a_runtime_error(target):
    """Measurement feeds random integers in [-8, 9) to a 5-row table, some out of range: the
    candidate (timed unchecked) is a RUNTIME_ERROR that names the check, on every target."""
    from autosched.search.error_codes import ErrorCode
    from autosched.search.measure import Measurer
    from autosched.search.task import Task
    from autosched.targets.target import parse

    x = te.placeholder((5, 3), name="x")
    i = te.placeholder((40,), dtype="int64", name="i")
    y = ops.take(x, i, 0, mode="strict")
    task = Task(y, args=[x, i, y], target=target)
    with Measurer(parse(target), build_workers=1, repeat=1, min_repeat_ms=1, strict=True,
                  check=False) as measurer:
        (result,) = measurer.measure(task, [[]])
    assert result.error_code == ErrorCode.RUNTIME_ERROR
    assert "an index read from the indices tensor is out of range" in result.error_msg


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
