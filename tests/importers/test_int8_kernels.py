"""The CPU kernels of dynamically quantized models, checked to the bit against numpy and
onnxruntime on fresh random 8-bit inputs with random non-zero zero points: MatMulInteger /
QLinearMatMul with a constant B (zero points folded out of the sum, columns padded to whole
vectors), ConvInteger with a constant weight (as an exact float32 convolution where its sums
fit, in int16 where they do not), DynamicQuantizeLinear (min and max over the flat tensor
in vector partials) and the flat-index simplification its reads rely on."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.errors import ScheduleError  # noqa: E402
from autosched.graph import ops_quant  # noqa: E402
from autosched.search.space import SearchSpace  # noqa: E402
from autosched.targets.llvm import cpu_features  # noqa: E402
from autosched.targets.llvm import dot as dot4  # noqa: E402
from autosched.targets.llvm.cpu_features import dot_intrin  # noqa: E402
from autosched.targets.target import parse  # noqa: E402
from autosched.te.dag import topo_ops  # noqa: E402
from autosched.te.ops import quant  # noqa: E402
from autosched.te.tensor import PlaceholderOp  # noqa: E402
from autosched.tir import ir as tir  # noqa: E402
from autosched.tir.arith import simplify  # noqa: E402
from autosched.tir.evaluate import eval_int  # noqa: E402
from autosched.tir.tensor_intrin import DOT_8X4, DOT_16X4, TENSOR_INTRINS  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402
from tests.support.onnx_node import RNG, model, run_ort  # noqa: E402


def _q(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.asarray(RNG.integers(info.min, info.max + 1, shape), dtype=dtype)


def _zero_point(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random zero points, none of them 0 (a zero point of 0 would hide a dropped term)."""
    z = _q(shape, dtype)
    return np.where(z == 0, 1, z).astype(dtype)


def _both(nodes: list, inputs: dict, consts: dict) -> tuple[np.ndarray, np.ndarray, object]:
    m = model(nodes, inputs, consts, ("y",))
    compiled = aus.compile(from_onnx(m, {n: a.shape for n, a in inputs.items()}), target="llvm")
    (got,) = compiled.run(inputs)
    (want,) = run_ort(m, inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    return got, want, compiled


def _dims(t: te.Tensor | PlaceholderOp) -> tuple[int, ...]:
    return tuple(int(getattr(d, "value", d)) for d in t.shape)


def _reference(a: np.ndarray, b: np.ndarray, za: np.ndarray, zb: np.ndarray) -> np.ndarray:
    return ((a.astype("int64") - za.astype("int64")[..., None])
            @ (b.astype("int64") - zb.astype("int64"))).astype("int32")


# -- the folded integer matmul -------------------------------------------------------------
@pytest.mark.parametrize("b_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("per_column", [False, True])
def test_folded_matmul_matches_numpy(b_dtype: str, per_column: bool) -> None:
    """quant.folded_matmul over a padded B with per-row / per-column zero points, a batch
    dim, and K and N that no tile divides."""
    m, k, n, pad = 5, 37, 150, 10
    a = te.placeholder((3, m, k), dtype="uint8", name="a")
    b = te.placeholder((k, n + pad), dtype=b_dtype, name="b")
    za = te.placeholder((m,), dtype="uint8", name="za")
    zb = te.placeholder((n,) if per_column else (), dtype=b_dtype, name="zb")
    term = te.placeholder((n + pad,), dtype="int32", name="term")
    y = quant.folded_matmul(a, b, n, za, zb, term)
    assert _dims(y) == (3, m, n)
    task = aus.Task(y, args=[a, b, za, zb, term, y], target="llvm")
    f = aus.build(SearchSpace(task).default_schedule(), task.args, target="llvm")
    av, bv = _q((3, m, k), "uint8"), _q((k, n + pad), b_dtype)
    zav, zbv = _zero_point((m,), "uint8"), _zero_point((n,) if per_column else (), b_dtype)
    zb_cols = np.broadcast_to(zbv.astype("int64"), (n,))
    tv = np.zeros(n + pad, "int32")
    tv[:n] = k * zb_cols - bv[:, :n].sum(axis=0, dtype="int64")
    out = np.empty((3, m, n), "int32")
    f(av, bv, zav, zbv, tv, out)
    np.testing.assert_array_equal(out, _reference(av, bv[:, :n], zav, zb_cols))


@pytest.mark.parametrize("b_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("n", [150, 64])
def test_matmul_integer_constant_b(b_dtype: str, n: int) -> None:
    a, b = _q((2, 7, 43), "uint8"), _q((43, n), b_dtype)
    consts = {"b": b, "az": _zero_point((), "uint8"), "bz": _zero_point((n,), b_dtype)}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    got, want, _ = _both([node], {"a": a}, consts)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, _reference(a, b, consts["az"], consts["bz"]))


def test_matmul_integer_folds_zero_points_and_pads() -> None:
    """The product's reduction reads A and the constant B only (the zero points are added
    once per output, outside it), and B is stored with its columns padded to a multiple of
    COLUMN_PAD (150 -> 160): as a (K, N') matrix, or on a CPU with int8 dot products packed
    in panels of 32 columns, (N' / 32, K / 4, 32, 4)."""
    a, b = _q((6, 40), "uint8"), _q((40, 150), "uint8")
    consts = {"b": b, "az": _zero_point((), "uint8"), "bz": _zero_point((), "uint8")}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    _, _, compiled = _both([node], {"a": a}, consts)
    (kernel,) = compiled.kernels
    dot = dot_intrin(parse("llvm")) is not None
    (matmul,) = [op for op in kernel.task.dag.ops
                 if op.name == ("T_dot4" if dot else "T_matmul")]
    inputs = topo_ops([matmul.output()])
    shapes = sorted(_dims(op) for op in inputs if isinstance(op, PlaceholderOp))
    assert shapes == [(5, 10, 32, 4) if dot else (40, 160), (6, 40)], shapes
    assert ops_quant.COLUMN_PAD == 16


def test_shared_constant_derives_one_array() -> None:
    """Two products of one constant B share one padded copy of it in the compiled model."""
    b = _q((150, 150), "int8")
    consts = {"b": b, "az": _zero_point((), "uint8"), "bz": _zero_point((), "int8")}
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["p"]),
             helper.make_node("Cast", ["p"], ["c"], to=2),   # uint8 again (values wrap)
             helper.make_node("MatMulInteger", ["c", "b", "az", "bz"], ["y"])]
    a = _q((3, 150), "uint8")
    got, want, compiled = _both(nodes, {"a": a}, consts)
    np.testing.assert_array_equal(got, want)
    padded = [v for v in compiled.constants.values() if v.shape == (150, 160)]
    assert len(padded) == 1, [v.shape for v in compiled.constants.values()]


def test_qlinear_matmul_constant_b_ragged() -> None:
    a, b = _q((4, 29), "uint8"), _q((29, 90), "int8")
    consts = {"as": np.float32(0.02), "az": _zero_point((), "uint8"), "b": b,
              "bs": np.float32(0.01), "bz": _zero_point((), "int8"),
              "ys": np.float32(0.5), "yz": _zero_point((), "uint8")}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    got, want, _ = _both([node], {"a": a}, {k: np.asarray(v) for k, v in consts.items()})
    np.testing.assert_array_equal(got, want)


# -- int8 dot products (x86 AVX-512 VNNI) ------------------------------------------------------
VNNI_CPU = "llvm -mcpu=znver4"  # a CPU whose table entry has AVX-512 VNNI (built, not run)
HOST_DOT = dot_intrin(parse("llvm")) is not None


def _packed(b: np.ndarray, p: int) -> np.ndarray:
    """(K, N) as matmul_dot4's (N / p, K / 4, p, 4)."""
    k, n = b.shape
    return np.ascontiguousarray(b.reshape(k // 4, 4, n // p, p).transpose(2, 0, 3, 1))


@pytest.mark.parametrize("extreme", [False, True])
def test_matmul_dot4_matches_numpy(extreme: bool) -> None:
    """quant.matmul_dot4 with its untuned schedule on this CPU (the vpdpbusd nest where the
    CPU has it, plain loops elsewhere) to the bit, a batch dim and 3 panels of 16 columns;
    ``extreme``: every product 255 * -128, each lane's 4 of them summed without saturating."""
    m, k, n, p = 5, 64, 48, 16
    a = te.placeholder((2, m, k), dtype="uint8", name="a")
    packed = te.placeholder((n // p, k // 4, p, 4), dtype="int8", name="packed")
    y = quant.matmul_dot4(a, packed)
    task = aus.Task(y, args=[a, packed, y], target="llvm")
    f = aus.build(SearchSpace(task).default_schedule(), task.args, target="llvm")
    av, bv = _q((2, m, k), "uint8"), _q((k, n), "int8")
    if extreme:
        av, bv = np.full_like(av, 255), np.full_like(bv, -128)
    out = np.empty((2, m, n), "int32")
    f(av, _packed(bv, p), out)
    np.testing.assert_array_equal(out, av.astype("int64") @ bv.astype("int64"))


def test_dot_8_lanes_matches_numpy() -> None:
    """The 8-lane dot intrinsic (AVX-VNNI; AVX-512 VNNI with VL encodes it too) on a hand
    schedule of matmul_dot4 over panels of 8: run where this CPU has either, else built for
    an AVX-VNNI CPU and its IR checked."""
    a = te.placeholder((4, 32), dtype="uint8", name="a")
    packed = te.placeholder((2, 8, 8, 4), dtype="int8", name="packed")
    c = quant.matmul_dot4(a, packed)
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    ko, q = c.op.reduce_axis
    jo, ji = s[c].split(j, factor=8)
    s[c].reorder(i, jo, ko, ji, q)
    s[c].tensorize(ji, DOT_8X4)
    feats = set(cpu_features.key_features(*(getattr(parse("llvm"), f) for f in (
        "triple", "cpu", "features"))) or ())
    runs = "avxvnni" in feats or {"avx512vnni", "avx512vl"} <= feats
    built = aus.build(s, [a, packed, c], target="llvm" if runs else "llvm -mcpu=alderlake")
    assert dot4.LLVM_DOT[DOT_8X4] in built.get_source()
    if runs:
        av, bv = _q((4, 32), "uint8"), _q((32, 16), "int8")
        out = np.empty((4, 16), "int32")
        built(av, _packed(bv, 8), out)
        np.testing.assert_array_equal(out, av.astype("int64") @ bv.astype("int64"))


def test_dot4_rejects_other_sums() -> None:
    """tensorize with the dot intrinsic names what is wrong with a float product."""
    a = te.placeholder((4, 8), name="a")
    b = te.placeholder((2, 16, 4), name="b")
    ko, q = te.reduce_axis((0, 2), name="ko"), te.reduce_axis((0, 4), name="q")
    c = te.compute((4, 16), lambda i, j: te.sum(a[i, ko * 4 + q] * b[ko, j, q], axis=[ko, q]),
                   name="c")
    s = te.create_schedule(c)
    i, j = c.op.axis
    s[c].reorder(i, ko, j, q)
    with pytest.raises(ScheduleError, match="int32 sum of int32"):
        s[c].tensorize(j, DOT_16X4)


def _uses_dot(module: Any) -> bool:
    """Whether a CPU module's LLVM IR calls a dot-product instruction (vpdpbusd, usdot, udot)."""
    src = module.get_source()
    return any(name in src for name in dot4.LLVM_DOT.values())


@pytest.mark.parametrize("target, uses", [(VNNI_CPU, 16), (VNNI_CPU + " -mattr=-avx512vnni", 0),
                                          ("llvm -mcpu=alderlake", 8)])
def test_matmul_integer_dot4_code(target: str, uses: int) -> None:
    """A MatMulInteger of a constant uint8 B compiles, for a CPU with AVX-512 VNNI (16 lanes)
    or AVX-VNNI (8), to a B packed for dot products (shifted to int8) whose untuned schedule
    runs vpdpbusd; without VNNI to neither (the code is only built here: the host needs no
    VNNI)."""
    a, b = _q((20, 64), "uint8"), _q((64, 96), "uint8")
    consts = {"b": b, "az": _zero_point((), "uint8"), "bz": _zero_point((), "uint8")}
    m = model([helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])], {"a": a},
              consts, ("y",))
    compiled = aus.compile(from_onnx(m), target=target, schedule="default", executor=False)
    (kernel,) = compiled.kernels
    source = kernel.module.get_source()
    assert [TENSOR_INTRINS[d].n for d, name in dot4.LLVM_DOT.items() if name in source] == (
        [uses] if uses else [])
    if uses:
        assert "vpdpbusd" in kernel.module.get_source("asm")
    assert any(op.name == "T_dot4" for op in kernel.task.dag.ops) is bool(uses)
    panel = {16: 32, 8: 32, 0: 0}[uses]
    assert any(v.dtype == np.int8 and v.shape == (96 // max(panel, 1), 16, panel, 4)
               for v in compiled.constants.values()) is bool(uses)


@pytest.mark.parametrize("b_dtype", ["uint8", "int8"])
def test_matmul_integer_dot4_matches_ort(b_dtype: str) -> None:
    """MatMulInteger with per-column B zero points, a batch dim, K and N whole for the dot
    products (on a CPU with VNNI the packed, tensorized path) against onnxruntime and numpy."""
    a, b = _q((3, 9, 128), "uint8"), _q((128, 80), b_dtype)
    consts = {"b": b, "az": _zero_point((), "uint8"), "bz": _zero_point((80,), b_dtype)}
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    got, want, compiled = _both([node], {"a": a}, consts)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, _reference(a, b, consts["az"], consts["bz"]))
    assert any(_uses_dot(k.module) for k in compiled.kernels) is HOST_DOT


def test_dot_nest_out_of_layout_runs_plain() -> None:
    """A nest tensorized with the dot intrinsic whose int8 operand is not laid out for it
    (its lanes adjacent, the taps apart) builds as plain loops, correct, no vpdpbusd."""
    a = te.placeholder((4, 32), dtype="uint8", name="a")
    b = te.placeholder((8, 4, 16), dtype="int8", name="b")  # (K / 4, 4, N): taps apart
    ko, q = te.reduce_axis((0, 8), name="ko"), te.reduce_axis((0, 4), name="q")
    c = te.compute((4, 16), lambda i, j: te.sum(
        te.cast("int32", a[i, ko * 4 + q]) * te.cast("int32", b[ko, q, j]), axis=[ko, q]),
        name="c")
    s = te.create_schedule(c)
    i, j = c.op.axis
    s[c].reorder(i, ko, j, q)
    s[c].tensorize(j, DOT_16X4)
    built = aus.build(s, [a, b, c], target=VNNI_CPU if not HOST_DOT else "llvm")
    assert not _uses_dot(built)
    if HOST_DOT:
        av, bv = _q((4, 32), "uint8"), _q((8, 4, 16), "int8")
        out = np.empty((4, 16), "int32")
        built(av, bv, out)
        flat = bv.transpose(0, 1, 2).reshape(32, 16)
        np.testing.assert_array_equal(out, av.astype("int64") @ flat.astype("int64"))


# -- ConvInteger ----------------------------------------------------------------------------
def _conv_reference(x: np.ndarray, w: np.ndarray, xz: np.ndarray, wz: np.ndarray, pad: int,
                    stride: int, pads: list[int] | None = None) -> np.ndarray:
    """ConvInteger in int64 numpy: (x - xz) zero-padded (``pads`` as ONNX's: top, left,
    bottom, right; else ``pad`` all round), by (w - wz) per output channel."""
    t, left, b, r = pads or [pad] * 4
    xs = np.pad(x.astype("int64") - xz.astype("int64"), [(0, 0), (0, 0), (t, b), (left, r)])
    ws = w.astype("int64") - wz.astype("int64").reshape(-1, 1, 1, 1)
    o, _, kh, kw = ws.shape
    oh, ow = (xs.shape[2] - kh) // stride + 1, (xs.shape[3] - kw) // stride + 1
    y = np.zeros((x.shape[0], o, oh, ow), "int64")
    for i in range(kh):
        for j in range(kw):
            win = xs[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            y += np.einsum("nchw,oc->nohw", win, ws[:, :, i, j])
    return y.astype("int32")


@pytest.mark.parametrize(("kernel", "stride", "per_channel"),
                         [(3, 1, False), (3, 2, True), (1, 1, True), (1, 2, False)])
def test_conv_integer_constant_weight(kernel: int, stride: int, per_channel: bool) -> None:
    """onnxruntime takes one weight zero point only: per-channel ones are checked against
    numpy."""
    x, w = _q((1, 19, 11, 13), "uint8"), _q((10, 19, kernel, kernel), "uint8")
    pad = kernel // 2
    consts = {"w": w, "xz": _zero_point((), "uint8"),
              "wz": _zero_point((10,) if per_channel else (), "uint8")}
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[pad] * 4,
                            strides=[stride, stride])
    m = model([node], {"x": x}, consts, ("y",))
    (got,) = aus.compile(from_onnx(m, {"x": x.shape}), target="llvm").run({"x": x})
    np.testing.assert_array_equal(
        got, _conv_reference(x, w, consts["xz"], consts["wz"], pad, stride))
    if not per_channel:
        np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])


@pytest.mark.parametrize(("c", "kernel", "pads", "stride", "w_dtype", "per_channel"), [
    (6, 3, [1, 1, 1, 1], 1, "uint8", False),   # channels padded to 8 with the zero point
    (16, 1, [0, 0, 0, 0], 1, "int8", True),    # an int8 weight, stored plus 128
    (8, 3, [0, 2, 1, 0], 1, "uint8", True),    # pads on two sides only
    (8, 3, [1, 1, 1, 1], 2, "uint8", False),   # the input's columns in two phases
    (5, 3, [0, 1, 2, 0], 2, "int8", True),
])
def test_conv_integer_dot4_matches(c: int, kernel: int, pads: list[int], stride: int,
                                   w_dtype: str, per_channel: bool) -> None:
    """ConvInteger (on a CPU with VNNI as quant.conv2d_dot4, its padding x's zero point and
    output rows of 13 or 7 computed 16 wide) against numpy and onnxruntime."""
    x, w = _q((2, c, 7, 13), "uint8"), _q((20, c, kernel, kernel), w_dtype)
    consts = {"w": w, "xz": _zero_point((), "uint8"),
              "wz": _zero_point((20,) if per_channel else (), w_dtype)}
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=pads,
                            strides=[stride] * 2)
    m = model([node], {"x": x}, consts, ("y",))
    compiled = aus.compile(from_onnx(m, {"x": x.shape}), target="llvm")
    (got,) = compiled.run({"x": x})
    np.testing.assert_array_equal(
        got, _conv_reference(x, w, consts["xz"], consts["wz"], 0, stride, pads))
    if not per_channel:
        np.testing.assert_array_equal(got, run_ort(m, {"x": x})[0])
    assert any(_uses_dot(k.module) for k in compiled.kernels) is HOST_DOT


@pytest.mark.parametrize(("stride", "dilation", "uses"), [(1, 1, True), (2, 1, True),
                                                          (1, 2, False)])
def test_conv_integer_dot4_code(stride: int, dilation: int, uses: bool) -> None:
    """For a CPU with AVX-512 VNNI a ConvInteger's untuned code runs vpdpbusd over an input
    stored in groups of 4 channels (strided: its columns in phases); a dilated one keeps the
    exact float convolution (built here, not run)."""
    x, w = _q((1, 24, 16, 40), "uint8"), _q((32, 24, 3, 3), "uint8")
    consts = {"w": w, "xz": _zero_point((), "uint8"), "wz": _zero_point((), "uint8")}
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1] * 4,
                            strides=[stride] * 2, dilations=[dilation] * 2)
    m = model([node], {"x": x}, consts, ("y",))
    compiled = aus.compile(from_onnx(m), target=VNNI_CPU, schedule="default", executor=False)
    (kernel,) = compiled.kernels
    assert _uses_dot(kernel.module) is uses
    assert any(op.name == "T_dot4_input" for op in kernel.task.dag.ops) is uses


@pytest.mark.parametrize("fits", [True, False])
def test_conv_integer_sums_near_float_limit(fits: bool, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """Weights whose tap sums times 255 sit just under 2**24 (float path) or past it (int16
    path), with inputs that make the sums large and odd: past 2**24 a float sum rounds, as
    the float path forced onto the second case shows. (Those paths are the ones of CPUs
    without int8 dot products: taken here on any.)"""
    monkeypatch.setattr(cpu_features, "dot_intrin", lambda target: None)
    c, big = 256, 27 if fits else 121             # 2304 taps x 27 x 255 < 2**24 < x 121
    w = (128 + big - 2 * RNG.integers(0, 2, (4, c, 3, 3))).astype("uint8")
    x = np.where(RNG.random((1, c, 5, 6)) < 0.9, 255, 1).astype("uint8")   # x - 128 = +-127
    consts = {"w": w, "xz": np.asarray(128, "uint8"), "wz": np.asarray(128, "uint8")}
    assert ops_quant._exact_in_float(w.astype("int16") - 128) == fits
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1] * 4)
    got, want, _ = _both([node], {"x": x}, consts)
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > (2**22 if fits else 2**24)
    if not fits:
        monkeypatch.setattr(ops_quant, "EXACT_FLOAT_SUM", 2**40)
        forced, _, _ = _both([node], {"x": x}, consts)
        assert not np.array_equal(forced, want)


# -- DynamicQuantizeLinear --------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 1, 45), (4, 50)])
def test_dynamic_quantize_exact(shape: tuple[int, ...]) -> None:
    x = (RNG.standard_normal(shape) * 3 + RNG.standard_normal()).astype("float32")
    m = model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], {"x": x},
              {}, ("y", "s", "z"))
    got = aus.compile(from_onnx(m, {"x": x.shape}), target="llvm").run({"x": x})
    want = run_ort(m, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_scalar_reduction_gets_vector_partials() -> None:
    """A reduction to a scalar over a contiguous tensor is rfactored into a vectorized stage
    by default (it was one scalar loop)."""
    x = te.placeholder((3, 50, 7), name="x")
    y, _, _ = quant.dynamic_quantize(x)
    task = aus.Task(y, target="llvm")
    sch = SearchSpace(task).default_schedule()
    lines = str(aus.lower(sch, task.args)).splitlines()
    for partial in ("T_max.rf[k0.inner] = max(", "T_min.rf[k0.inner_1] = min("):
        at = next(i for i, line in enumerate(lines) if partial in line)
        loop = next(line for line in reversed(lines[:at]) if line.strip().startswith("for"))
        assert "vectorized" in loop, lines


def test_reshape_offset_simplifies_to_the_flat_index() -> None:
    """The row-major offset of a flat index read through a reshape into (1, 64, 8, 20)
    simplifies back to the index, so the read is a contiguous vector."""
    ko, ki = te.var("ko"), te.var("ki")
    flat = ko * 16 + ki
    buf = tir.Buffer("x", tuple(te.const(d) for d in (1, 64, 8, 20)), "float32")
    idx = (te.const(0), flat // 160, flat // 20 % 8, flat % 20)
    assert str(simplify(tir.flat_offset(buf, idx))) == str(simplify(flat))


def test_flat_index_merges_keep_their_value() -> None:
    """Sums of quotients and remainders the simplifier merges (one index split into up to
    four axes, quotients of a shifted index) keep their value at random points, and the
    offset of a split flat index is the index again."""
    x, y = te.var("x"), te.var("y")
    cases = [((x + 160) // 160 * 160 + x // 20 % 8 * 20 + x % 20, "x + 160"),
             ((x + 160) // 160 * 8 + x // 20 % 8, None),
             ((y * 320 + x) // 160 * 8 + (x + y * 320) // 20 % 8, None),
             (x // 96 * 96 + x // 12 % 8 * 12 + x // 3 % 4 * 3 + x % 3, "x")]
    for e, text in cases:
        s = simplify(e)
        if text is not None:
            assert str(s) == text, s
        for xv, yv in RNG.integers(-10**6, 10**6, (200, 2)):
            env = {x.uid: int(xv), y.uid: int(yv)}
            assert eval_int(s, env) == eval_int(e, env), (e, s, env)


def test_dynamic_quantize_kernel_matches_numpy() -> None:
    """The default schedule of DynamicQuantizeLinear over a 4-d tensor whose size no vector
    divides (its min and max read it flat), against numpy."""
    x = te.placeholder((2, 5, 3, 23), name="x")
    outs = quant.dynamic_quantize(x)
    task = aus.Task(list(outs), target="llvm")
    f = aus.build(SearchSpace(task).default_schedule(), task.args, target="llvm")
    xv = (RNG.standard_normal((2, 5, 3, 23)) * 2 + 0.5).astype("float32")
    q, s, z = np.empty(xv.shape, "uint8"), np.empty((), "float32"), np.empty((), "uint8")
    f(xv, q, s, z)
    lo, hi = np.float32(min(xv.min(), 0)), np.float32(max(xv.max(), 0))
    scale = np.float32((hi - lo) / np.float32(255))
    zero = np.uint8(np.clip(np.round(-lo / scale), 0, 255))
    assert s == scale and z == zero
    want = np.clip(np.round(xv / scale) + np.float32(zero), 0, 255).astype("uint8")
    np.testing.assert_array_equal(q, want)
