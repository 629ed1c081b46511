"""ONNX import: tiny models built with onnx.helper, imported with from_onnx, run node by node
through the TE path (default schedules, LLVM) and compared with onnxruntime on fresh random
inputs; malformed models must fail with a clear ModelImportError."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autosched.errors import ModelImportError
from autosched.graph.ops import supported
from autosched.testing.models import ort_session
from importers.onnx import from_onnx
from importers.reference import run_nodes

ort = pytest.importorskip("onnxruntime")

F32 = "float32"


def model(nodes: list[Any], inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray] | None = None,
          outputs: list[str] | None = None, opset: int = 17, dims: dict[str, list[Any]] | None = None
          ) -> onnx.ModelProto:
    """A model whose runtime inputs have the shapes of ``inputs`` (or ``dims``)."""
    seen: set[str] = set()
    for k, n in enumerate(nodes):  # node names must be unique
        if n.name in seen:
            n.name = f"{n.name}_{k}"
        seen.add(n.name)
    ins = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(a.dtype), (dims or {}).get(n, list(a.shape)))
        for n, a in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in (outputs or [nodes[-1].output[0]])]
    inits_ = [numpy_helper.from_array(a, n) for n, a in (inits or {}).items()]
    g = helper.make_graph(nodes, "test", ins, outs, inits_)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def check(m: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4,
          atol: float = 1e-4) -> list[np.ndarray]:
    g = from_onnx(m, {n: a.shape for n, a in feeds.items()})
    got = run_nodes(g, feeds)
    sess = ort_session(m)
    want = sess.run(None, feeds)
    assert len(got) == len(want)
    for name, a, b in zip(g.outputs, got, want):
        assert a.shape == b.shape, f"{name}: shape {a.shape} vs onnxruntime {b.shape}"
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype} vs onnxruntime {b.dtype}"
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)
    return got


def rand(rng: np.random.Generator, *shape: int, dtype: str = F32, lo: float = -1.0,
         hi: float = 1.0) -> np.ndarray:
    if dtype.startswith("float"):
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    return rng.integers(int(lo), int(hi), size=shape).astype(dtype)


def node(op: str, ins: list[str], outs: list[str] | None = None, **attrs: Any) -> Any:
    return helper.make_node(op, ins, outs or ["y"], name=f"{op.lower()}_node", **attrs)


# --- numerics ---------------------------------------------------------------------------------

CONV_CASES = [
    dict(w=(4, 3, 3, 3), attrs=dict(pads=[1, 1, 1, 1])),
    dict(w=(4, 3, 3, 2), attrs=dict(strides=[2, 1], pads=[1, 0, 0, 1], dilations=[1, 2])),
    dict(w=(6, 1, 3, 3), attrs=dict(group=3, auto_pad="SAME_UPPER", strides=[2, 2])),
    dict(w=(6, 3, 2, 2), attrs=dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    dict(w=(2, 1, 3, 3), attrs=dict(group=1, auto_pad="VALID"), cin=1),
    dict(w=(4, 3, 3), attrs=dict(pads=[1, 2], strides=[2]), one_d=True),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(n) for n in range(len(CONV_CASES))])
def test_conv(case: dict, rng: np.random.Generator) -> None:
    cin = case.get("cin", 3)
    shape = (2, cin, 9) if case.get("one_d") else (2, cin, 9, 7)
    x = rand(rng, *shape)
    w = rand(rng, *case["w"])
    b = rand(rng, case["w"][0])
    check(model([node("Conv", ["x", "w", "b"], **case["attrs"])], {"x": x}, {"w": w, "b": b}),
          {"x": x})


@pytest.mark.parametrize("attrs", [dict(strides=[2, 2]), dict(strides=[2, 1], pads=[1, 0, 0, 1],
                                                                output_padding=[1, 0]),
                                   dict(group=2, dilations=[2, 1])])
def test_conv_transpose(attrs: dict, rng: np.random.Generator) -> None:
    x = rand(rng, 1, 4, 5, 6)
    w = rand(rng, 4, 3, 3, 3)
    check(model([node("ConvTranspose", ["x", "w"], **attrs)], {"x": x}, {"w": w}), {"x": x})


@pytest.mark.parametrize("attrs,c_shape", [(dict(), (5,)), (dict(transA=1, alpha=0.5), (3, 5)),
                                           (dict(transB=1, beta=2.0), (1, 5)),
                                           (dict(transA=1, transB=1), None)])
def test_gemm(attrs: dict, c_shape: tuple | None, rng: np.random.Generator) -> None:
    a = rand(rng, *((4, 3) if attrs.get("transA") else (3, 4)))
    b = rand(rng, *((5, 4) if attrs.get("transB") else (4, 5)))
    inits = {"b": b}
    ins = ["a", "b"]
    if c_shape is not None:
        inits["c"] = rand(rng, *c_shape)
        ins.append("c")
    check(model([node("Gemm", ins, **attrs)], {"a": a}, inits), {"a": a})


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((4,), (2, 4, 3)),
                                   ((2, 3, 4), (4,))])
def test_matmul(sa: tuple, sb: tuple, rng: np.random.Generator) -> None:
    a, b = rand(rng, *sa), rand(rng, *sb)
    check(model([node("MatMul", ["a", "b"])], {"a": a, "b": b}), {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater",
                                "LessOrEqual", "GreaterOrEqual"])
def test_binary_broadcast(op: str, rng: np.random.Generator) -> None:
    a = rand(rng, 2, 1, 4, lo=0.5, hi=2.0)
    b = rand(rng, 3, 1, lo=0.5, hi=2.0)
    if op in ("Equal",):
        b[0, 0] = a[0, 0, 0]
    check(model([node(op, ["a", "b"])], {"a": a, "b": b}), {"a": a, "b": b})


def test_binary_with_constant_scalar(rng: np.random.Generator) -> None:
    a = rand(rng, 3, 4)
    m = model([node("Mul", ["a", "k"], ["t"]), node("Add", ["t", "one"])], {"a": a},
              {"k": np.array(3.0, F32), "one": np.array([1.5], F32)})
    check(m, {"a": a})


def test_integer_div_truncates(rng: np.random.Generator) -> None:
    a = rng.integers(-50, 50, size=(4, 5)).astype("int32")
    b = rng.choice([-7, -3, -2, 2, 3, 7], size=(5,)).astype("int32")
    got = check(model([node("Div", ["a", "b"])], {"a": a, "b": b}), {"a": a, "b": b})
    assert (got[0] == np.trunc(a / b)).all()


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op: str, rng: np.random.Generator) -> None:
    xs = {"a": rand(rng, 2, 3, 4), "b": rand(rng, 3, 1), "c": rand(rng, 4)}
    check(model([node(op, list(xs))], xs), xs)


UNARY = ["Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs",
         "Floor", "Ceil", "HardSwish", "Softplus", "Softsign", "Sign"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op: str, rng: np.random.Generator) -> None:
    positive = op in ("Log", "Sqrt", "Reciprocal")
    x = rand(rng, 3, 5, lo=0.2 if positive else -3.0, hi=3.0)
    check(model([node(op, ["x"])], {"x": x}), {"x": x})


@pytest.mark.parametrize("op,attrs,opset", [
    ("LeakyRelu", dict(alpha=0.3), 17), ("HardSigmoid", dict(alpha=0.3, beta=0.4), 17),
    ("Gelu", dict(), 20), ("Gelu", dict(approximate="tanh"), 20), ("Elu", dict(alpha=0.7), 17),
    ("Clip", dict(min=-0.5, max=0.7), 6)])
def test_activation_attrs(op: str, attrs: dict, opset: int, rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3, 4, lo=-3, hi=3)
    check(model([node(op, ["x"], **attrs)], {"x": x}, opset=opset), {"x": x})


def test_prelu_and_clip_inputs(rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3, 4, 5, lo=-2, hi=2)
    slope = rand(rng, 3, 1, 1)
    m = model([node("PRelu", ["x", "s"], ["p"]), node("Clip", ["p", "lo", "hi"])], {"x": x},
              {"s": slope, "lo": np.array(-0.3, F32), "hi": np.array(1.1, F32)})
    check(m, {"x": x})
    lo = np.array(rng.uniform(-1, 0), F32)  # a runtime bound
    check(model([node("Clip", ["x", "lo", ""])], {"x": x, "lo": lo}), {"x": x, "lo": lo})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset,axis", [(11, 1), (13, 1), (13, -1), (11, -1)])
def test_softmax(op: str, opset: int, axis: int, rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3, 5, lo=-4, hi=4)
    check(model([node(op, ["x"], axis=axis)], {"x": x}, opset=opset), {"x": x})


def test_norms(rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3, 4, 5)
    c = 3
    params = {"g": rand(rng, c), "b": rand(rng, c), "m": rand(rng, c),
              "v": rand(rng, c, lo=0.5, hi=2.0)}
    check(model([node("BatchNormalization", ["x", "g", "b", "m", "v"], epsilon=1e-3)],
                {"x": x}, params), {"x": x})
    check(model([node("InstanceNormalization", ["x", "g", "b"], epsilon=1e-4)], {"x": x},
                {k: params[k] for k in ("g", "b")}), {"x": x})
    ln = {"s": rand(rng, 4, 5), "bb": rand(rng, 4, 5)}
    check(model([node("LayerNormalization", ["x", "s", "bb"], axis=2)], {"x": x}, ln), {"x": x})
    check(model([node("LayerNormalization", ["x", "s1"], epsilon=1e-3)], {"x": x},
                {"s1": rand(rng, 5)}), {"x": x})


POOLS = [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[2, 3], ceil_mode=1, strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3], strides=[2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 2],
                         count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], ceil_mode=1, strides=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 2], auto_pad="SAME_LOWER")),
    ("MaxPool", dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[1, 1, 0, 0, 1, 1],
                     ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3, 2, 2], strides=[2, 2, 1], pads=[1, 0, 1, 1, 1, 0])),
    ("AveragePool", dict(kernel_shape=[3, 2, 2], strides=[2, 2, 1], pads=[1, 0, 1, 1, 1, 0],
                         count_include_pad=1)),
]


@pytest.mark.parametrize("op,attrs", POOLS, ids=[f"{o}{n}" for n, (o, _) in enumerate(POOLS)])
def test_pool(op: str, attrs: dict, rng: np.random.Generator) -> None:
    spatial = {1: (9,), 2: (9, 8), 3: (5, 6, 7)}[len(attrs["kernel_shape"])]
    x = rand(rng, 2, 3, *spatial)
    check(model([node(op, ["x"], **attrs)], {"x": x}), {"x": x})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 7)])
def test_global_pool(op: str, shape: tuple, rng: np.random.Generator) -> None:
    x = rand(rng, *shape)
    check(model([node(op, ["x"])], {"x": x}), {"x": x})


def test_shape_ops(rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3, 4, 5)
    i64 = np.int64
    m = model([
        node("Flatten", ["x"], ["f"], axis=2),                                     # (6, 20)
        node("Reshape", ["f", "shp"], ["r"]),                                      # (6, 4, 5)
        node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),                           # (5, 6, 4)
        node("Unsqueeze", ["t", "ax0"], ["u"]),                                    # (1, 5, 6, 4)
        node("Squeeze", ["u", "ax0"], ["s"]),                                      # (5, 6, 4)
        node("Slice", ["s", "st", "en", "axs", "stp"], ["sl"]),                    # (5, 3, 3)
        node("Concat", ["sl", "sl"], ["c"], axis=-1),                              # (5, 3, 6)
        node("Split", ["c", "spl"], ["p0", "p1"], axis=2),                         # (5,3,2) (5,3,4)
        node("Tile", ["p0", "reps"], ["tl"]),                                      # (5, 6, 4)
        node("Expand", ["p1", "eshape"], ["e"]),                                   # (2, 5, 3, 4)
    ], {"x": x}, {"shp": np.array([0, -1, 5], i64), "ax0": np.array([0], i64),
                  "st": np.array([-1, 1], i64), "en": np.array([-100, 99], i64),
                  "axs": np.array([1, 2], i64), "stp": np.array([-2, 1], i64),
                  "spl": np.array([2, 4], i64), "reps": np.array([1, 2, 2], i64),
                  "eshape": np.array([2, 1, 1, 1], i64)},
        outputs=["tl", "e", "p1"], opset=13)
    check(m, {"x": x})


def test_squeeze_unsqueeze_split_by_attribute(rng: np.random.Generator) -> None:
    x = rand(rng, 3, 1, 6)
    m = model([node("Squeeze", ["x"], ["s"], axes=[1]), node("Unsqueeze", ["s"], ["u"], axes=[0, 3]),
               node("Split", ["u"], ["a", "b", "c"], axis=2, split=[1, 1, 4])], {"x": x},
              outputs=["a", "b", "c"], opset=11)
    check(m, {"x": x})
    m = model([node("Split", ["x"], ["a", "b", "c"], axis=2, num_outputs=3)], {"x": x},
              outputs=["a", "b", "c"], opset=18)
    check(m, {"x": x})


def test_shape_subgraph_folds(rng: np.random.Generator) -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: the shape arithmetic becomes a
    constant and only the runtime nodes are left in the graph."""
    x = rand(rng, 4, 3, 5)
    i64 = np.int64
    m = model([
        node("Shape", ["x"], ["s"]),
        node("Gather", ["s", "zero"], ["n"], axis=0),
        node("Unsqueeze", ["n", "ax"], ["n1"]),
        node("Concat", ["n1", "m1"], ["shape"], axis=0),
        node("Relu", ["x"], ["r"]),
        node("Reshape", ["r", "shape"]),
    ], {"x": x}, {"zero": np.array(0, i64), "ax": np.array([0], i64),
                  "m1": np.array([-1], i64)}, opset=13)
    g = from_onnx(m)
    assert [n.op_type for n in g.nodes] == ["Relu", "Reshape"]
    assert g.constants["shape"].tolist() == [4, -1]
    assert g.values["y"].shape == (4, 15)
    check(m, {"x": x})


def test_gather(rng: np.random.Generator) -> None:
    x = rand(rng, 5, 4, 3)
    idx = np.array([[0, -1], [3, 2]], np.int64)
    check(model([node("Gather", ["x", "i"], axis=1)], {"x": x}, {"i": idx}), {"x": x})
    ri = rng.integers(-5, 5, size=(3,)).astype(np.int64)  # runtime indices
    check(model([node("Gather", ["x", "i"], axis=0)], {"x": x, "i": ri}), {"x": x, "i": ri})
    check(model([node("Gather", ["x", "i"], axis=2)], {"x": x}, {"i": np.array(1, np.int64)}),
          {"x": x})


def test_where_logic_cast(rng: np.random.Generator) -> None:
    a, b = rand(rng, 3, 4), rand(rng, 4)
    m = model([
        node("Greater", ["a", "b"], ["gt"]),
        node("Less", ["a", "zero"], ["lt"]),
        node("Not", ["lt"], ["nl"]),
        node("And", ["gt", "nl"], ["both"]),
        node("Or", ["both", "lt"], ["either"]),
        node("Where", ["both", "a", "b"], ["w"]),
        node("Cast", ["either"], ["ci"], to=TensorProto.INT32),
        node("Cast", ["w"], ["wi"], to=TensorProto.INT64),
    ], {"a": a, "b": b}, {"zero": np.array(0.0, F32)}, outputs=["w", "ci", "wi"])
    check(m, {"a": a * 3, "b": b * 3})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp"])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, -1], 0), (None, 1)])
def test_reduce(op: str, opset: int, axes: list | None, keepdims: int,
                rng: np.random.Generator) -> None:
    x = rand(rng, 3, 4, 5, lo=0.5, hi=1.5)
    as_input = axes is not None and (opset >= 18 or (op == "ReduceSum" and opset >= 13))
    if as_input:
        n = node(op, ["x", "axes"], keepdims=keepdims)
        inits = {"axes": np.array(axes, np.int64)}
    else:
        n = node(op, ["x"], keepdims=keepdims, **({"axes": axes} if axes is not None else {}))
        inits = {}
    check(model([n], {"x": x}, inits, opset=opset), {"x": x})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad(mode: str, rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3, 4)
    pads = np.array([0, 1, 2, 1, 2, 1], np.int64)
    ins = ["x", "pads"] + (["v"] if mode == "constant" else [])
    inits = {"pads": pads, **({"v": np.array(0.25, F32)} if mode == "constant" else {})}
    opset = 19 if mode == "wrap" else 17  # wrap arrived in opset 19
    check(model([node("Pad", ins, mode=mode)], {"x": x}, inits, opset=opset), {"x": x})


RESIZE = [
    dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor",
         scales=[1, 1, 2, 2]),
    dict(mode="nearest", coordinate_transformation_mode="half_pixel",
         nearest_mode="round_prefer_ceil", sizes=[1, 2, 7, 5]),
    dict(mode="linear", coordinate_transformation_mode="half_pixel", scales=[1, 1, 1.5, 2]),
    dict(mode="linear", coordinate_transformation_mode="align_corners", sizes=[1, 2, 8, 3]),
    dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel", sizes=[1, 2, 1, 9]),
    dict(mode="linear", coordinate_transformation_mode="asymmetric", scales=[1, 1, 0.5, 2]),
    dict(mode="linear", coordinate_transformation_mode="align_corners", scales=[1, 1, 0.6, 1.5]),
]


@pytest.mark.parametrize("case", RESIZE, ids=[str(n) for n in range(len(RESIZE))])
def test_resize(case: dict, rng: np.random.Generator) -> None:
    case = dict(case)
    x = rand(rng, 1, 2, 4, 6)
    scales, sizes = case.pop("scales", None), case.pop("sizes", None)
    inits = {"roi": np.zeros(0, F32)}
    ins = ["x", "roi"]
    if scales is not None:
        inits["scales"] = np.array(scales, F32)
        ins.append("scales")
    else:
        inits["scales"] = np.zeros(0, F32)
        inits["sizes"] = np.array(sizes, np.int64)
        ins += ["scales", "sizes"]
    check(model([node("Resize", ins, **case)], {"x": x}, inits, opset=13), {"x": x})


def test_generators_and_misc(rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3)
    value = numpy_helper.from_array(np.array([1.5], F32))
    m = model([
        node("Shape", ["x"], ["s"]),
        node("ConstantOfShape", ["s"], ["ones"], value=value),
        node("Size", ["x"], ["n"]),
        node("Range", ["zero", "lim", "step"], ["rg"]),
        node("Constant", [], ["k"], value=numpy_helper.from_array(rand(rng, 3))),
        node("Add", ["x", "ones"], ["a"]),
        node("Add", ["a", "k"], ["b"]),
        node("Mul", ["b", "rg"], ["c"]),
        node("Identity", ["c"], ["idn"]),
        node("Dropout", ["idn"], ["d", "mask"]),
    ], {"x": x}, {"zero": np.array(0.0, F32), "lim": np.array(3.0, F32),
                  "step": np.array(1.0, F32)}, outputs=["d", "mask", "n"], opset=13)
    check(m, {"x": x})


def test_symbolic_dims_bind_from_shapes(rng: np.random.Generator) -> None:
    x = rand(rng, 3, 4)
    m = model([node("Relu", ["x"])], {"x": x}, dims={"x": ["batch", 4]})
    g = from_onnx(m, shapes={"x": (3, 4)})
    assert g.inputs[0].shape == (3, 4) and g.values["y"].shape == (3, 4)
    with pytest.raises(ModelImportError, match=r"input 'x' has symbolic dim 0 'batch'"):
        from_onnx(m)


def test_initializers_are_constants_not_inputs(rng: np.random.Generator) -> None:
    x, w = rand(rng, 2, 3), rand(rng, 3, 4)
    m = model([node("MatMul", ["x", "w"])], {"x": x}, {"w": w})
    m.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4]))
    g = from_onnx(m)
    assert [v.name for v in g.inputs] == ["x"]
    assert set(g.constants) == {"w"}
    assert set(g.values) == {"x", "w", "y"}
    assert g.opset == 17


# --- errors -----------------------------------------------------------------------------------


def test_truncated_file(tmp_path: Any, rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3)
    m = model([node("Conv", ["x", "w"])], {"x": rand(rng, 1, 3, 5, 5)},
              {"w": rand(rng, 4, 3, 3, 3)})
    data = m.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelImportError, match=r"cut\.onnx.*(truncated or corrupt|holds no graph)"):
        from_onnx(str(path))
    path.write_bytes(b"")
    with pytest.raises(ModelImportError, match=r"cut\.onnx"):
        from_onnx(path)
    assert x.shape == (2, 3)
    with pytest.raises(ModelImportError, match="does not exist"):
        from_onnx(tmp_path / "missing.onnx")
    os.mkfifo(tmp_path / "pipe.onnx")  # reading it blocked forever
    with pytest.raises(ModelImportError, match="pipe.onnx' is not a regular file"):
        from_onnx(tmp_path / "pipe.onnx")


def test_unknown_opset_and_domain(rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3)
    m = model([node("Relu", ["x"])], {"x": x}, opset=99)
    with pytest.raises(ModelImportError, match=r"ai\.onnx opset 99 is not supported"):
        from_onnx(m)
    m = model([node("Relu", ["x"], ["r"]),
               helper.make_node("Gelu", ["r"], ["y"], name="ms_gelu", domain="com.microsoft")],
              {"x": x})
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(ModelImportError, match=r"node 'ms_gelu' \(Gelu\) is in operator set "
                                               r"domain 'com\.microsoft' \(version 1\)"):
        from_onnx(m)
    m = model([node("Relu", ["x"])], {"x": x})
    m.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))  # imported, unused: fine
    assert from_onnx(m).values["y"].shape == (2, 3)


def test_missing_initializer(rng: np.random.Generator) -> None:
    m = model([node("Conv", ["x", "w"])], {"x": rand(rng, 1, 3, 5, 5)})
    with pytest.raises(ModelImportError,
                       match=r"node 'conv_node' \(Conv\) reads input 1 'w'.*missing initializer"):
        from_onnx(m)


def test_inconsistent_shapes(rng: np.random.Generator) -> None:
    a, b = rand(rng, 2, 3), rand(rng, 4, 5)
    with pytest.raises(ModelImportError, match=r"node 'add_node' \(Add\).*\(2, 3\).*\(4, 5\)"):
        from_onnx(model([node("Add", ["a", "b"])], {"a": a, "b": b}))
    with pytest.raises(ModelImportError, match=r"node 'reshape_node' \(Reshape\): cannot reshape "
                                               r"\(2, 3\) \(6 elements\) to \[4, -1\]"):
        from_onnx(model([node("Reshape", ["a", "s"])], {"a": a}, {"s": np.array([4, -1])}))
    m = model([node("Relu", ["a"])], {"a": a})
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2]))
    with pytest.warns(UserWarning, match=r"output 'y' is inferred as float32\[2, 3\] but the "
                                         r"model declares float32\[3, 2\]"):
        g = from_onnx(m)  # a stale shape annotation (onnxruntime too only warns)
    assert g.values["y"].shape == (2, 3)
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.INT64, [2, 3]))
    with pytest.raises(ModelImportError, match=r"inferred as float32\[2, 3\] but the model "
                                               r"declares int64\[2, 3\]"):
        from_onnx(m)
    with pytest.raises(ModelImportError, match=r"Reshape.*input 1 \('s'\).*constant"):
        from_onnx(model([node("Reshape", ["a", "s"])],
                        {"a": a, "s": np.array([3, 2], np.int64)}))


def test_unsupported_ops_listed_all(rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3)
    m = model([helper.make_node("Relu", ["x"], ["r"], name="ok"),
               helper.make_node("NonZero", ["r"], ["nz"], name="nz1"),
               helper.make_node("Unique", ["r"], ["v"], name="unique1"),
               helper.make_node("NonZero", ["x"], ["y"], name="nz2")], {"x": x})
    with pytest.raises(ModelImportError) as err:
        from_onnx(m)
    msg = str(err.value)
    assert "['NonZero', 'Unique']" in msg
    for name in ("nz1", "unique1", "nz2"):
        assert f"'{name}'" in msg
    assert "'ok'" not in msg
    assert supported("Relu") and not supported("NonZero")


# --- inspect ----------------------------------------------------------------------------------


def test_inspect_report(tmp_path: Any, rng: np.random.Generator,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from autosched.cli import main
    from autosched.graph.inspect import flops_by_op, inspect
    from importers.inspect import inspect_model

    x = rand(rng, 1, 3, 6, 6)
    m = model([node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["r"]),
               node("Relu", ["r"])], {"x": x}, {"w": rand(rng, 4, 3, 3, 3)},
              dims={"x": ["n", 3, 6, 6]})
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    g = from_onnx(m, {"x": (1, 3, 6, 6)})
    flops = flops_by_op(g)
    # 4 x 4 x 4 outputs, 27 multiply-adds each
    assert flops["Conv"] >= 2 * 64 * 27 and flops["Relu"] == 2 * 64
    report = inspect_model(path, {"x": (1, 3, 6, 6)}, tasks=False)
    assert "coverage: 3/3 nodes supported" in report
    assert any(line.split()[:2] == ["Relu", "2"] for line in report.splitlines())
    assert main(["inspect", str(path), "--shape", "x=1,3,6,6", "--no-tasks"]) == 0
    assert "Conv" in capsys.readouterr().out
    assert main(["inspect", str(path), "--no-tasks"]) == 2  # a user error: the batch dim is unbound
    assert "symbolic dim 0 'n'" in capsys.readouterr().err
    assert "tasks to tune (llvm)" in inspect(g)

    bad = model([node("Relu", ["x"], ["r"]), node("NonZero", ["r"])], {"x": x})
    report = inspect_model(bad)
    assert "coverage: 1/2 nodes supported; unsupported: NonZero" in report
