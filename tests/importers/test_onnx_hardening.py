"""Hostile and careless ONNX models: dynamic dims written as -1 or 0, values assigned twice or
read before they exist, external data outside the model's directory, constants that would fold
to gigabytes, scalar constants in fused kernels. Each imports and matches onnxruntime, or fails with one
ModelImportError line naming the value and the nodes at fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import autosched as aus
from autosched.errors import ModelImportError
from importers.onnx import from_onnx

ort = pytest.importorskip("onnxruntime")


def _model(nodes: list[Any], inputs: list[Any], outputs: list[str],
           inits: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    g = helper.make_graph(nodes, "m", inputs, outs,
                          [numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _f32(name: str, dims: list[Any]) -> Any:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _ort(m: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    src = m if isinstance(m, str) else m.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)


def _compiled(m: Any, feeds: dict[str, np.ndarray], **shapes: Any) -> list[np.ndarray]:
    return aus.compile(from_onnx(m, shapes or None), "llvm").run(feeds)


def _one_line(err: pytest.ExceptionInfo[ModelImportError], *words: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


# --- dynamic dims stored as non-positive dim values ------------------------------------------

@pytest.mark.parametrize("dyn", [-1, 0])
def test_non_positive_dim_value_is_a_symbolic_dim(dyn: int, rng: np.random.Generator) -> None:
    b = numpy_helper.from_array(rng.standard_normal((3, 5)).astype("float32"), "b")
    g = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"], name="add")], "m",
                          [_f32("x", [dyn, 3, 5])], [_f32("y", [dyn, 3, 5])], [b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = rng.standard_normal((2, 3, 5)).astype("float32")
    (got,) = _compiled(m, {"x": x}, x=x.shape)
    np.testing.assert_allclose(got, x + numpy_helper.to_array(b), rtol=1e-6)
    with pytest.raises(ModelImportError) as err:
        from_onnx(m)
    _one_line(err, "input 'x'", "dim 0", f"dim_value {dyn}", "shapes=")
    with pytest.raises(ModelImportError) as err:
        from_onnx(m, {"x": (-2, 3, 5)})
    _one_line(err, "input 'x'", "(-2, 3, 5)", "negative")


# --- values assigned once, defined before use ------------------------------------------------

def _relu(x: str, y: str, name: str) -> Any:
    return helper.make_node("Relu", [x], [y], name=name)


SSA_CASES = {
    "two writers": ([_relu("x", "y", "first"), _relu("x", "y", "second")],
                    ["y", "first", "second"]),
    "shadows input": ([_relu("x", "t", "a"), _relu("t", "x", "b"), _relu("x", "y", "c")],
                      ["'x'", "node 'b'", "graph input"]),
    "shadows initializer": ([_relu("x", "w", "a"), helper.make_node("Add", ["w", "x"], ["y"],
                                                                    name="c")],
                            ["'w'", "node 'a'", "initializer"]),
    "out of order": ([_relu("t", "y", "late"), _relu("x", "t", "early")],
                     ["'t'", "node 'late'", "node 'early'"]),
    "cycle": ([helper.make_node("Add", ["x", "u"], ["t"], name="a"), _relu("t", "u", "b"),
               _relu("t", "y", "c")], ["'u'", "node 'a'", "node 'b'"]),
}


@pytest.mark.parametrize("case", list(SSA_CASES))
def test_non_ssa_models_are_rejected(case: str, rng: np.random.Generator) -> None:
    nodes, words = SSA_CASES[case]
    w = rng.standard_normal((2, 3)).astype("float32")
    m = _model(nodes, [_f32("x", [2, 3])], ["y"], {"w": w})
    with pytest.raises(ModelImportError) as err:
        from_onnx(m)
    _one_line(err, *words)


@pytest.mark.parametrize("op", ["RuntimeFill", "WinogradInput"])
def test_internal_op_types_are_not_onnx_ops(op: str) -> None:
    m = _model([helper.make_node(op, ["x"], ["y"], name="inner")], [_f32("x", [2, 3])], ["y"])
    with pytest.raises(ModelImportError) as err:
        from_onnx(m)
    _one_line(err, "unsupported op types", op, "node 'inner'")


def test_initializer_listed_as_input_is_still_accepted(rng: np.random.Generator) -> None:
    w = rng.standard_normal((2, 3)).astype("float32")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")],
               [_f32("x", [2, 3]), _f32("w", [2, 3])], ["y"], {"w": w})
    x = rng.standard_normal((2, 3)).astype("float32")
    (got,) = _compiled(m, {"x": x})
    np.testing.assert_allclose(got, x + w, rtol=1e-6)


# --- external data ---------------------------------------------------------------------------

def _external_model(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    w = rng.standard_normal((64, 16)).astype("float32")
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [_f32("x", [3, 64])],
               ["y"], {"w": w})
    return m, w


def test_external_data_is_read_from_the_models_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    m, w = _external_model(rng)
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere").mkdir()
    path = tmp_path / "model" / "m.onnx"
    onnx.save_model(m, path, save_as_external_data=True, location="weights.bin",
                    size_threshold=0)
    monkeypatch.chdir(tmp_path / "elsewhere")
    x = rng.standard_normal((3, 64)).astype("float32")
    (got,) = _compiled(str(path), {"x": x})
    (want,) = _ort(str(path), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # a proto whose external data was not loaded cannot know where the data is
    with pytest.raises(ModelImportError) as err:
        from_onnx(onnx.load(path, load_external_data=False))
    _one_line(err, "tensor 'w'", "weights.bin", "path")


def _point_data_at(m: onnx.ModelProto, location: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    t = out.graph.initializer[0]
    size = len(t.raw_data) if t.raw_data else 4 * int(np.prod(t.dims))
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(size))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return out


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_external_data_never_leaves_the_models_directory(
        where: str, tmp_path: Path, rng: np.random.Generator) -> None:
    m, w = _external_model(rng)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(w.tobytes())
    (tmp_path / "model").mkdir()
    location = {"parent": "../secret.bin", "absolute": str(secret), "symlink": "link.bin"}[where]
    if where == "symlink":
        (tmp_path / "model" / "link.bin").symlink_to(secret)
    path = tmp_path / "model" / "m.onnx"
    path.write_bytes(_point_data_at(m, location).SerializeToString())
    with pytest.raises(ModelImportError) as err:
        from_onnx(str(path))
    _one_line(err, "tensor 'w'", "external data")


# --- constants too large to fold -------------------------------------------------------------

def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def _tiny_model_of_huge_constant(op: str) -> onnx.ModelProto:
    if op == "ConstantOfShape":
        node = helper.make_node(op, ["s"], ["y"], name="fill")
        inits = {"s": _i64(50_000, 50_000)}
    else:
        node = helper.make_node(op, ["a", "b", "c"], ["y"], name="fill")
        inits = {"a": _i64(0).reshape(()), "b": _i64(3_000_000_000).reshape(()),
                 "c": _i64(1).reshape(())}
    return _model([node], [], ["y"], inits)


@pytest.mark.parametrize("op", ["ConstantOfShape", "Range"])
def test_huge_constant_fails_fast_naming_the_node(op: str) -> None:
    import time
    import tracemalloc

    m = _tiny_model_of_huge_constant(op)
    assert len(m.SerializeToString()) < 200
    start = time.perf_counter()
    tracemalloc.start()
    try:
        with pytest.raises(ModelImportError) as err:
            from_onnx(m)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 2
    assert peak < 16 << 20
    _one_line(err, "node 'fill'", op, "too large")


# just over the 64 MiB folding limit: the values are computed by a kernel at run time
BIG = 4097


def _big_fill(rng: np.random.Generator) -> tuple[list[Any], dict[str, np.ndarray]]:
    value = numpy_helper.from_array(np.array([rng.uniform(1, 2)], np.float32))
    return [helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill", value=value),
            helper.make_node("Mul", ["c", "x"], ["y"], name="mul")], {"s": _i64(BIG, BIG)}


def _big_range(rng: np.random.Generator) -> tuple[list[Any], dict[str, np.ndarray]]:
    start, step = int(rng.integers(-9, 9)), int(rng.integers(2, 5))
    inits = {"a": np.array(start, np.int32), "b": np.array(start + step * BIG * BIG, np.int32),
             "d": np.array(step, np.int32), "s": _i64(BIG, BIG)}
    return [helper.make_node("Range", ["a", "b", "d"], ["r"], name="range"),
            helper.make_node("Reshape", ["r", "s"], ["c"], name="reshape"),
            helper.make_node("Cast", ["c"], ["cf"], name="cast", to=TensorProto.FLOAT),
            helper.make_node("Mul", ["cf", "x"], ["y"], name="mul")], inits


def _big_expand(rng: np.random.Generator) -> tuple[list[Any], dict[str, np.ndarray]]:
    inits = {"v": rng.standard_normal((1, BIG)).astype("float32"), "s": _i64(BIG, BIG)}
    return [helper.make_node("Expand", ["v", "s"], ["c"], name="expand"),
            helper.make_node("Mul", ["c", "x"], ["y"], name="mul")], inits


@pytest.mark.parametrize("build", [_big_fill, _big_range, _big_expand])
def test_constant_over_the_fold_limit_runs_as_a_kernel(build: Any,
                                                       rng: np.random.Generator) -> None:
    nodes, inits = build(rng)
    m = _model(nodes, [_f32("x", [BIG, 1])], ["y"], inits)
    g = from_onnx(m)
    assert sum(a.nbytes for a in g.constants.values()) < 1 << 20
    x = rng.standard_normal((BIG, 1)).astype("float32")
    (got,) = aus.compile(g, "llvm").run({"x": x})
    (want,) = _ort(m, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_unfoldable_value_needed_as_a_constant_names_both_nodes() -> None:
    count = 9_000_000  # 72 MB of int64
    inits = {"a": _i64(1).reshape(()), "b": _i64(count + 1).reshape(()),
             "d": _i64(1).reshape(())}
    m = _model([helper.make_node("Range", ["a", "b", "d"], ["r"], name="range"),
                helper.make_node("Reshape", ["x", "r"], ["y"], name="reshape")],
               [_f32("x", [2, 3])], ["y"], inits)
    with pytest.raises(ModelImportError) as err:
        from_onnx(m)
    _one_line(err, "node 'reshape'", "node 'range'", "constant")


def test_fold_constants_pass_keeps_huge_values_as_kernels(rng: np.random.Generator) -> None:
    from autosched.graph import Graph, Node, ValueInfo
    from autosched.graph.passes import fold_constants

    v = rng.standard_normal((1, BIG)).astype("float32")
    values = {"x": ValueInfo("x", (BIG, 1), "float32"), "v": ValueInfo("v", v.shape, "float32"),
              "s": ValueInfo("s", (2,), "int64"),
              "c": ValueInfo("c", (BIG, BIG), "float32"),
              "y": ValueInfo("y", (BIG, BIG), "float32")}
    g = Graph(inputs=[values["x"]], outputs=["y"],
              nodes=[Node("expand", "Expand", ["v", "s"], ["c"]),
                     Node("mul", "Mul", ["c", "x"], ["y"])],
              constants={"v": v, "s": _i64(BIG, BIG)}, values=values, opset=17)
    assert [n.name for n in fold_constants(g).nodes] == ["expand", "mul"]
    x = rng.standard_normal((BIG, 1)).astype("float32")
    (got,) = aus.compile(g, "llvm").run({"x": x})
    np.testing.assert_allclose(got, v * x, rtol=1e-6)


# --- scalar and one-element constants in fused kernels ---------------------------------------

def _layer_norm(rng: np.random.Generator, d: int, scalar: bool) -> onnx.ModelProto:
    """LayerNorm as exporters decompose it, its constants 0-d (``scalar``) or of shape (1,);
    the variance is clamped by Max(0, v) with the constant first, so a fused kernel takes the
    constant as a parameter instead of folding it into a literal."""
    shape = () if scalar else (1,)
    inits = {"axes": _i64(-1), "two": np.full(shape, 2.0, np.float32),
             "zero": np.full(shape, 0.0, np.float32), "eps": np.full(shape, 1e-5, np.float32),
             "one": np.full(shape, 1.0, np.float32),
             "gamma": rng.standard_normal(d).astype("float32"),
             "beta": rng.standard_normal(d).astype("float32")}
    steps = [("ReduceMean", ["x", "axes"], "mean"), ("Sub", ["x", "mean"], "dev"),
             ("Pow", ["dev", "two"], "sq"), ("ReduceMean", ["sq", "axes"], "var"),
             ("Max", ["zero", "var"], "var0"), ("Add", ["var0", "eps"], "vare"),
             ("Sqrt", ["vare"], "std"), ("Div", ["one", "std"], "inv"),
             ("Reciprocal", ["inv"], "std2"), ("Reciprocal", ["std2"], "inv2"),
             ("Mul", ["dev", "inv2"], "norm"), ("Mul", ["norm", "gamma"], "scaled"),
             ("Add", ["scaled", "beta"], "y")]
    nodes = [helper.make_node(op, ins, [out], name=f"{out}_node") for op, ins, out in steps]
    return _model(nodes, [_f32("x", [2, 5, d])], ["y"], inits, opset=18)


@pytest.mark.parametrize("scalar", [True, False])
def test_decomposed_layer_norm_with_scalar_constants(scalar: bool,
                                                     rng: np.random.Generator) -> None:
    m = _layer_norm(rng, 19, scalar)
    x = rng.standard_normal((2, 5, 19)).astype("float32")
    (got,) = _compiled(m, {"x": x})
    (want,) = _ort(m, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_inspect_does_not_fold_what_import_left_unfolded(rng: np.random.Generator) -> None:
    import tracemalloc

    from autosched.graph.inspect import inspect

    nodes, inits = _big_expand(rng)
    g = from_onnx(_model(nodes, [_f32("x", [BIG, 1])], ["y"], inits))
    tracemalloc.start()
    try:
        report = inspect(g, tasks=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "Expand" in report
    assert peak < 16 << 20  # numpy reports its arrays to tracemalloc


@pytest.mark.parametrize("op,inputs,missing", [
    ("MatMul", ["x", ""], 1), ("Conv", ["x", ""], 1), ("Gemm", ["", "x"], 0),
    ("Reshape", ["x", ""], 1), ("Where", ["x", "x", ""], 2)])
def test_omitted_required_input_names_the_node(op: str, inputs: list[str], missing: int) -> None:
    m = _model([helper.make_node(op, inputs, ["y"], name="n0")], [_f32("x", [2, 3])], ["y"])
    with pytest.raises(ModelImportError) as err:
        from_onnx(m)
    _one_line(err, f"node 'n0' ({op})", f"input {missing} is missing")
