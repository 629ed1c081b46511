"""Hostile and careless ONNX models: dynamic dims written as -1 or 0, values assigned twice or
read before they exist, external data outside the model's directory, constants that would fold
to gigabytes, and very long chains. Each imports and matches onnxruntime, or fails with one
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


# --- long chains -----------------------------------------------------------------------------

def test_chain_of_3000_elementwise_nodes(rng: np.random.Generator) -> None:
    kinds = ["Neg", "Abs", "Sigmoid", "Relu", "Tanh"]
    nodes, prev = [], "x"
    for k in range(3000):
        nodes.append(helper.make_node(kinds[k % len(kinds)], [prev], [f"v{k}"], name=f"n{k}"))
        prev = f"v{k}"
    m = _model(nodes, [_f32("x", [3, 7])], [prev])
    x = rng.standard_normal((3, 7)).astype("float32")
    (got,) = _compiled(m, {"x": x})
    (want,) = _ort(m, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
