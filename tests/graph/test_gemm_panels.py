"""Constant Gemm / MatMul weights stored as column panels on CPUs (passes.pack_gemm_weights,
te.ops.panel_matmul) and the register tiles over them (sketch.panel_width): ragged column
counts (8,210 like ddddocr's classes, 1,000 like MobileNetV2's), one row and twenty, K that
divides nothing, against numpy and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import autosched as aus
from autosched import te
from autosched.graph.compiler import prepare
from autosched.graph.graph import B_PANELS
from autosched.graph.passes import as_panels, panel_columns
from autosched.search.space import SearchSpace
from autosched.targets.target import parse
from autosched.te import ops
from importers.onnx import from_onnx
from tests.support.onnx_node import model, run_ort


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n,lanes,width", [(8210, 16, 64), (1000, 16, 64), (100, 16, 16),
                                           (120, 8, 32), (16, 8, 16), (9, 8, None), (12, 16, None)])
def test_panel_width_pads_at_most_an_eighth(n: int, lanes: int, width: int | None) -> None:
    assert panel_columns(n, lanes) == width
    if width is not None:
        assert -(-n // width) * width - n <= n // 8


def test_panels_hold_the_columns_and_zeros_past_them(rng: np.random.Generator) -> None:
    b = _f32(rng, 37, 150)
    bp = as_panels(b, 64)
    assert bp.shape == (3, 37, 64) and bp.flags.c_contiguous
    j = np.arange(150)
    np.testing.assert_array_equal(bp[j // 64, :, j % 64].T, b)
    assert not bp[2, :, 150 - 128:].any()


def _panel_task(rng: np.random.Generator, lead: tuple[int, ...], m: int, k: int, n: int,
                lanes: int = 16) -> tuple[list[te.Tensor], list[np.ndarray], np.ndarray]:
    """y = a @ b + bias over b stored as panels: the placeholders, the arrays and numpy's y."""
    a, b, bias = _f32(rng, *lead, m, k), _f32(rng, k, n), _f32(rng, n)
    p = panel_columns(n, lanes)
    assert p is not None
    bp = as_panels(b, p)
    A = te.placeholder(a.shape, name="A")
    B = te.placeholder(bp.shape, name="B")
    C = te.placeholder((n,), name="C")
    y = ops.add(ops.panel_matmul(A, B, n), C)
    return [A, B, C, y], [a, bp, bias], a @ b + bias


def _column_knob(params: dict[str, object]) -> str:
    """The tile knob of the sums' last axis (the columns): knobs come in axis order."""
    return [k for k in params if k.startswith("T_matmul.tile.")][-1]


@pytest.mark.parametrize("lead,m,k,n", [((), 20, 67, 8210), ((), 1, 131, 1000), ((), 7, 9, 150),
                                        ((3,), 5, 33, 100), ((2, 1), 1, 17, 64)])
def test_panel_matmul_default_and_sampled_schedules_match_numpy(
        lead: tuple[int, ...], m: int, k: int, n: int, rng: np.random.Generator) -> None:
    args, arrays, want = _panel_task(rng, lead, m, k, n)
    space = SearchSpace(aus.Task(args[-1], args=args, target="llvm"))
    width = arrays[1].shape[-1]
    schedules = [space.default_schedule()]
    for seed in range(3):
        low = space.lower(space.sample(np.random.default_rng(seed)))
        assert low is not None and low.schedule is not None
        schedules.append(low.schedule)
    for sch in schedules:
        got = np.full(want.shape, np.nan, np.float32)
        aus.build(sch, args, target="llvm")(*arrays, got)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * k)
    params = dict(space.default_candidate().params)
    assert width % params[_column_knob(params)][2] == 0


def test_register_tiles_that_cross_a_panel_are_refused(rng: np.random.Generator) -> None:
    """A vector reaching into the next panel loads lane by lane: the tile rule refuses a
    register tile whose columns do not divide the panel, before anything is built."""
    args, _, _ = _panel_task(rng, (), 20, 64, 8210)
    space = SearchSpace(aus.Task(args[-1], args=args, target="llvm"))
    sketch = space.sketches[0]
    params = dict(space.default_candidate().params)
    key = _column_knob(params)
    assert sketch.violation(params) is None
    assert "crosses the 64-column panels" in str(sketch.violation({**params, key: (1, 1, 48)}))
    drawn = [dict(space.sample(np.random.default_rng(s)).params)[key][2] for s in range(20)]
    assert all(64 % c == 0 for c in drawn)


@pytest.mark.parametrize("m,k,n,trans_a", [(20, 67, 8210, 0), (1, 131, 1000, 0), (3, 29, 75, 1)])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_onnx_gemm_over_panels_matches_onnxruntime(m: int, k: int, n: int, trans_a: int,
                                                   trans_b: int, rng: np.random.Generator
                                                   ) -> None:
    a_shape = (k, m) if trans_a else (m, k)
    b = _f32(rng, n, k) if trans_b else _f32(rng, k, n)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=trans_a, transB=trans_b,
                            alpha=0.75)
    proto = model([node], {"a": _f32(rng, *a_shape)}, {"b": b, "c": _f32(rng, n)}, ["y"])
    graph = from_onnx(proto, {"a": a_shape})
    (gemm,) = prepare(graph, parse("llvm")).nodes
    assert gemm.attrs[B_PANELS] == n and int(gemm.attrs.get("transB", 0)) == 0
    (gpu,) = prepare(graph, parse("cuda")).nodes  # GPUs keep B as it is
    assert B_PANELS not in gpu.attrs and int(gpu.attrs.get("transB", 0)) == trans_b
    feeds = {"a": _f32(rng, *a_shape)}
    (got,) = aus.compile(graph, target="llvm").run(feeds)
    np.testing.assert_allclose(got, run_ort(proto, feeds)[0], rtol=1e-4, atol=1e-4 * k)


def test_onnx_matmul_of_a_3d_input_over_panels_matches_onnxruntime(
        rng: np.random.Generator) -> None:
    """An LSTM's input projection: (T, 1, K) times a constant (K, N), N ragged, then Relu
    fused after the column slice."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])]
    proto = model(nodes, {"x": _f32(rng, 6, 1, 45)}, {"w": _f32(rng, 45, 200)}, ["y"])
    graph = from_onnx(proto, {"x": (6, 1, 45)})
    assert [n.attrs.get(B_PANELS) for n in prepare(graph, parse("llvm")).nodes
            if n.op_type == "MatMul"] == [200]
    feeds = {"x": _f32(rng, 6, 1, 45)}
    (got,) = aus.compile(graph, target="llvm").run(feeds)
    np.testing.assert_allclose(got, run_ort(proto, feeds)[0], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("m,k,n", [(1, 70, 1000), (9, 31, 8210)])
def test_panel_matmul_as_the_output_stores_only_its_columns(m: int, k: int, n: int,
                                                          rng: np.random.Generator) -> None:
    """No reader after the sums: the column stage is the output the tile is fused into, and
    the buffer past column n (here one larger array's tail) is never written."""
    a, b = _f32(rng, m, k), _f32(rng, k, n)
    bp = as_panels(b, 64)
    A, B = te.placeholder(a.shape, name="A"), te.placeholder(bp.shape, name="B")
    y = ops.panel_matmul(A, B, n)
    assert y.op.name == "T_matmul_columns"
    sch = SearchSpace(aus.Task(y, args=[A, B, y], target="llvm")).default_schedule()
    backing = np.full(m * n + 64, np.nan, np.float32)
    got = backing[:m * n].reshape(m, n)
    aus.build(sch, [A, B, y], target="llvm")(a, bp, got)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4 * k)
    assert np.isnan(backing[m * n:]).all()
