"""Hostile sizes never reach memory: byte counts that overflow int64 are compile errors when
static, allocations the kernel makes are checked at run time (a status, never a segfault)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import autosched as aus
from autosched.errors import CompileError, ModelImportError, RuntimeError_
from autosched.te import expr as E
from autosched.tir import ir
from importers.onnx import from_onnx
from tests.support.backends import garbage
from tests.support.llvm_ir import buf, build, loop, rand


def _conv_model(pad: int, stride: int) -> object:
    """A Conv with hostile pads / strides and no declared output shape (about 1 KB)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3],
                           np.random.default_rng().uniform(-1, 1, 108).astype("float32"))
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4, strides=[stride] * 2,
                            name="conv0")
    graph = helper.make_graph([node], "hostile_conv", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _te_conv(pad: int, stride: int):  # noqa: ANN202
    """The same Conv built from the operator library, past the importer's bounds."""
    from autosched import te
    from autosched.te.ops.conv import conv2d_nchw

    x = te.placeholder((1, 3, 8, 8), name="x")
    w = te.placeholder((4, 3, 3, 3), name="w")
    y = conv2d_nchw(x, w, stride=stride, padding=pad)
    return aus.build(te.create_schedule(y.op), [x, w, y], target="llvm", name="conv"), y


def test_conv_whose_padded_input_cannot_be_allocated_reports_it(rng):
    """pads 1e5: the padded input needs 480 GB; the run raises instead of writing through the
    null pointer aligned_alloc returned (it segfaulted)."""
    mod, y = _te_conv(100_000, 200_000)
    x = rng.uniform(-1, 1, (1, 3, 8, 8)).astype("float32")
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype("float32")
    with pytest.raises(RuntimeError_, match="could not allocate"):
        mod(x, w, np.empty([int(d) for d in y.shape], "float32"))


def test_conv_whose_padded_input_overflows_int64_is_a_compile_error():
    """pads 2147483640: the padded input's byte count wrapped to 0 and the model returned
    garbage; now the build names the buffer and its shape."""
    with pytest.raises(CompileError, match=r"pad_temp of shape \(1, 3, 4294967288"):
        _te_conv(2147483640, 4294967295)


@pytest.mark.parametrize("pad, stride", [(100_000, 200_000), (2147483640, 4294967295)])
def test_onnx_conv_pads_beyond_the_input_name_the_node(pad, stride):
    with pytest.raises(ModelImportError, match=r"node 'conv0' \(Conv\): pads .* must lie in \[0, 10\]"):
        from_onnx(_conv_model(pad, stride))


@pytest.mark.parametrize("stride", [9, 4294967295])
def test_onnx_conv_stride_past_the_input_runs_like_onnxruntime(stride, rng):
    from autosched.testing.models import ort_run

    model = _conv_model(1, stride)
    x = rng.uniform(-1, 1, (1, 3, 8, 8)).astype("float32")
    got = aus.compile(from_onnx(model), target="llvm").run({"x": x})
    np.testing.assert_allclose(got[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def _cube_kernel(kind: str):
    """C[i] = sum over a heap buffer T of shape (n, n, n) filled from A: its byte count is
    known only at run time."""
    n = E.Var("n", "int64")
    A, C = buf("A", (n,)), buf("C", (n,))
    T = buf("T", (n, n, n))
    i, j, k, r = (E.Var(v, "int64") for v in "ijkr")
    fill = loop(j, n, loop(k, n, loop(r, n, ir.Store(T, (j, k, r), ir.Load(A, (r,))))))
    zero = ir.Store(C, (i,), E.const(0.0, "float32"))
    acc = loop(j, n, loop(k, n, loop(r, n, ir.Store(
        C, (i,), ir.Load(C, (i,)) + ir.Load(T, (j, k, r)) * ir.Load(A, (i,))))))
    body = ir.Allocate(T, ir.seq(fill, zero, acc))
    return build(loop(i, n, body, kind), [A, C], name=f"cube_{kind}")


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_runtime_allocation_size_is_checked(kind, rng):
    mod = _cube_kernel(kind)
    n = 7
    a = rand(rng, (n,), "float32")
    out = garbage((n,), "float32")
    mod(a, out)
    np.testing.assert_allclose(out, a * a.sum() * n * n, rtol=1e-4)
    big = 2**21 + 1  # n**3 * 4 bytes overflows int64
    a = rand(rng, (big,), "float32")
    with pytest.raises(RuntimeError_, match="cube_.*could not allocate"):
        mod(a, np.empty(big, "float32"))


def test_loop_beyond_int32_is_a_compile_error():
    """2**31 + 64 elements: the loop's int32 bound wrapped negative and the kernel silently
    wrote nothing."""
    n = 2**31 + 64
    A = aus.te.placeholder((n,), dtype="uint8", name="A")
    B = aus.te.compute((n,), lambda i: A[i] + E.const(1, "uint8"), name="B")
    with pytest.raises(CompileError, match=r"loop \S+ runs to 2147483711, beyond what its "
                                           r"int32 variable counts"):
        aus.build(aus.te.create_schedule(B.op), [A, B], target="llvm")


@pytest.mark.parametrize("name", ["exp", "expf", "main"])
def test_kernel_named_like_a_function_it_calls(name, rng):
    """A float64 kernel named exp defined the symbol its own exp() call resolved to, and
    recursed until the stack overflowed."""
    A = aus.te.placeholder((37,), dtype="float64", name="A")
    B = aus.te.compute((37,), lambda i: aus.te.exp(A[i]), name="B")
    mod = aus.build(aus.te.create_schedule(B.op), [A, B], target="llvm", name=name)
    assert mod.entry_name == f"autosched_{name}"
    a = rng.uniform(-3, 3, 37)
    b = np.empty(37)
    mod(a, b)
    np.testing.assert_allclose(b, np.exp(a), rtol=1e-14)
