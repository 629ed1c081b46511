"""NaN in, NaN out: max and min (Relu, Clip, Max, Min, ReduceMax, ReduceMin, MaxPool) keep a NaN
of either operand, and Sign keeps NaN, as numpy and onnxruntime do, on llvm and on cuda (run on
the host); +-inf take part as ordinary values."""

from __future__ import annotations

import platform
from collections.abc import Callable

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.targets.cuda.host_emulate import run_on_host, unavailable
from autosched.te import ops
from tests.support.nvrtc import needs_nvrtc

SHAPE = (3, 5, 9, 11)


def _with_specials(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random values with NaN, +inf and -inf sprinkled in (about one element in eight)."""
    x = rng.uniform(-3, 3, shape).astype("float32")
    where = rng.random(shape)
    x[where < 0.06] = np.nan
    x[(where >= 0.06) & (where < 0.09)] = np.inf
    x[(where >= 0.09) & (where < 0.12)] = -np.inf
    return x


def _pool_ref(x: np.ndarray) -> np.ndarray:
    pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(pad, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    return win.max(axis=(-2, -1))


# name -> (build from placeholders, numpy reference, number of inputs)
CASES: dict[str, tuple[Callable, Callable, int]] = {
    "relu": (ops.relu, lambda x: np.maximum(x, 0), 1),
    "clip": (lambda x: ops.clip(x, -1.0, 2.0), lambda x: np.clip(x, -1.0, 2.0), 1),
    "hard_sigmoid": (ops.hard_sigmoid, lambda x: np.clip(0.2 * x + 0.5, 0, 1), 1),
    "sign": (ops.sign, np.sign, 1),
    "maximum": (ops.maximum, np.maximum, 2),
    "minimum": (ops.minimum, np.minimum, 2),
    "reduce_max": (lambda x: ops.max(x, axis=(1, 3)), lambda x: x.max(axis=(1, 3)), 1),
    "reduce_min": (lambda x: ops.min(x, axis=3), lambda x: x.min(axis=3), 1),
    "max_pool": (lambda x: ops.max_pool2d(x, 3, 2, 1), _pool_ref, 1),
}


def _case(name: str) -> tuple[list[te.Tensor], Callable]:
    make, ref, n = CASES[name]
    ins = [te.placeholder(SHAPE, name=f"x{i}") for i in range(n)]
    return ins + [make(*ins)], ref


def _check(got: np.ndarray, want: np.ndarray) -> None:
    assert np.isnan(want).any(), "the inputs should have put a NaN in the answer"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # NaN == NaN here


def _run(name: str, target: str, rng: np.random.Generator, vectorize: bool) -> None:
    args, ref = _case(name)
    out = args[-1]
    s = te.create_schedule(out.op)
    if vectorize:  # the last data axis in vectors, where max / min are vector instructions
        axis = s[out].op.axis[-1]
        _, inner = s[out].split(axis, factor=8)
        s[out].vectorize(inner)
    mod = aus.build(s, args, target=target, name=name)
    xs = [_with_specials(rng, SHAPE) for _ in args[:-1]]
    got = np.full(tuple(int(d) for d in out.shape), 7.0, "float32")
    if target.startswith("cuda"):
        run_on_host(mod, *xs, got)
    else:
        mod(*xs, got)
    _check(got, ref(*xs))


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("name", CASES)
def test_max_min_keep_nan_on_llvm(name: str, vectorize: bool, rng: np.random.Generator) -> None:
    _run(name, "llvm", rng, vectorize)


@needs_nvrtc
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
@pytest.mark.parametrize("name", CASES)
def test_max_min_keep_nan_on_cuda(name: str, rng: np.random.Generator) -> None:
    _run(name, "cuda -arch=sm_90", rng, vectorize=False)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="reads x86 assembly")
@pytest.mark.parametrize("case", ["relu", "bound_first", "clip"])
def test_relu_and_clip_stay_one_instruction_per_bound(case: str) -> None:
    # the bound is a constant, so keeping x's NaN costs nothing: vmaxps (and vminps), no
    # compare or blend, whichever side of max the bound is written on
    x = te.placeholder((4096,), name="x")
    y = {"relu": lambda: ops.relu(x), "clip": lambda: ops.clip(x, -1.0, 2.0),
         "bound_first": lambda: te.compute(x.shape, lambda i: te.max(te.const(0.0), x[i]))}[case]()
    s = te.create_schedule(y.op)
    _, inner = s[y].split(s[y].op.axis[0], factor=16)
    s[y].vectorize(inner)
    asm = aus.build(s, [x, y], target="llvm").get_assembly()
    ops_used = [line.split()[0] for line in asm.splitlines()
                if line.startswith("\t") and not line.strip().startswith((".", "#"))]
    assert any("maxps" in op for op in ops_used)
    assert any("minps" in op for op in ops_used) == (case == "clip")
    assert not [op for op in ops_used if "cmp" in op and "ps" in op or "blend" in op]


def _onnx_model() -> object:
    from onnx import TensorProto, helper

    node = helper.make_node
    nodes = [
        node("Relu", ["x"], ["relu"]),
        node("Clip", ["x", "lo", "hi"], ["clip"]),
        node("Max", ["x", "y"], ["max"]),
        node("Min", ["x", "y"], ["min"]),
        node("ReduceMax", ["x"], ["rmax"], axes=[2, 3], keepdims=0),
        node("ReduceMin", ["x"], ["rmin"], axes=[1], keepdims=1),
        node("MaxPool", ["x"], ["pool"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        node("Relu", ["pool"], ["pool_relu"]),
    ]
    outs = ["relu", "clip", "max", "min", "rmax", "rmin", "pool", "pool_relu"]
    graph = helper.make_graph(
        nodes, "nan", [helper.make_tensor_value_info(n, TensorProto.FLOAT, SHAPE) for n in "xy"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
        initializer=[helper.make_tensor("lo", TensorProto.FLOAT, [], [-1.0]),
                     helper.make_tensor("hi", TensorProto.FLOAT, [], [2.0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_model_keeps_nan_like_onnxruntime(rng: np.random.Generator) -> None:
    # onnxruntime's ReduceMax / ReduceMin / MaxPool drop a NaN in some lanes of their vector
    # kernels and keep it in others; those outputs are compared with numpy, which keeps it
    from autosched.testing.models import ort_run
    from importers.onnx import from_onnx

    model = _onnx_model()
    inputs = {n: _with_specials(rng, SHAPE) for n in "xy"}
    x = inputs["x"]
    got = aus.compile(from_onnx(model), target="llvm").run(inputs)
    want = ort_run(model, inputs)
    pool = _pool_ref(x)
    want[4:] = [x.max(axis=(2, 3)), x.min(axis=1, keepdims=True), pool, np.maximum(pool, 0)]
    for g, w in zip(got, want, strict=True):
        _check(g, w)


def test_horizontal_vector_reduction_keeps_nan(rng: np.random.Generator) -> None:
    # acc = max(acc, A[v]) in a loop vectorized over v: one vector reduction, then one combine
    from autosched.driver import build_func
    from autosched.targets.target import parse
    from autosched.te import expr as E
    from autosched.tir import ir

    A = ir.Buffer("A", (E.const(16),), "float32")
    C = ir.Buffer("C", (E.const(1),), "float32")
    v, zero = E.Var("v"), (E.const(0),)
    body = ir.For(v, E.const(0), E.const(16), "vectorized",
                  ir.Store(C, zero, E.binary("max", ir.Load(C, zero), ir.Load(A, (v,)))))
    a = rng.uniform(-1, 1, 16).astype("float32")
    a[rng.integers(16)] = np.nan
    c = np.array([-np.inf], "float32")
    build_func(ir.PrimFunc("hred", (A, C), body), parse("llvm"))(a, c)
    assert np.isnan(c[0])
