"""com.microsoft DynamicQuantizeLSTM (onnxruntime's contrib op) against onnxruntime on fresh
random int8 / uint8 weights and inputs (llvm, through the graph compiler): directions,
per-tensor and per-column scales, biases, initial states, peepholes; and the domain check
that lets only known contrib ops through. Its states, sigmoid and tanh are onnxruntime's to the
bit on every backend: llvm, the reference evaluator (constant folding), CUDA C run on the host
and on the GPU."""

from __future__ import annotations

import platform

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from autosched.errors import ModelImportError  # noqa: E402
from autosched.graph.passes import fold_constants  # noqa: E402
from autosched.targets.cuda.host_emulate import unavailable  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402
from tests.support.nvrtc import NVRTC_SKIP  # noqa: E402
from tests.support.onnx_node import RNG, model, rand, run_autosched, run_ort  # noqa: E402

OUTS = ["y", "yh", "yc"]
HOST_SKIP = NVRTC_SKIP or unavailable()
CUDA_TARGETS = [
    pytest.param("cuda -emulate=host", marks=pytest.mark.skipif(HOST_SKIP is not None,
                                                                reason=str(HOST_SKIP))),
    pytest.param("cuda", marks=pytest.mark.gpu)]


def _weights(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _case(dirs: int, steps: int, batch: int, inp: int, hidden: int, dtype: str = "int8",
          per_column: bool = False, bias: bool = True, initial: bool = False,
          peep: bool = False) -> tuple[list[str], dict, dict]:
    g = 4 * hidden
    inputs = {"x": rand((steps, batch, inp))}
    consts = {"w": _weights((dirs, inp, g), dtype), "r": _weights((dirs, hidden, g), dtype)}
    names = ["x", "w", "r", "", "", "", "", "", "ws", "wz", "rs", "rz"]
    pshape = (dirs, g) if per_column else (dirs,)
    for s, z, fan_in in (("ws", "wz", inp), ("rs", "rz", hidden)):
        # scales that keep the pre-activations of order one, so the gates do not saturate
        consts[s] = (RNG.uniform(0.5, 1.5, pshape) / (64 * np.sqrt(fan_in))).astype("float32")
        if dtype == "int8":   # onnxruntime: signed weights have zero points 0 ...
            consts[z] = np.zeros(pshape, dtype)
        else:                 # ... unsigned ones one per direction
            consts[z] = np.repeat(RNG.integers(100, 156, (dirs, 1)), pshape[-1] if per_column
                                  else 1, axis=1).reshape(pshape).astype(dtype)
    if bias:
        consts["b"] = rand((dirs, 2 * g)) * 0.2
        names[3] = "b"
    if initial:
        inputs["h0"] = rand((dirs, batch, hidden)) * 0.5
        inputs["c0"] = rand((dirs, batch, hidden))
        names[5:7] = ["h0", "c0"]
    if peep:
        consts["p"] = rand((dirs, 3 * hidden)) * 0.3
        names[7] = "p"
    return names, inputs, consts


def _node(names: list[str], hidden: int, direction: str, **attrs: object) -> object:
    return helper.make_node("DynamicQuantizeLSTM", names, OUTS, domain="com.microsoft",
                            hidden_size=hidden, direction=direction, **attrs)


def _model(node: object, inputs: dict, consts: dict) -> object:
    m = model([node], inputs, consts, OUTS)
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return m


def _compare(node: object, inputs: dict, consts: dict, target: str = "llvm",
             exact: bool = False) -> None:
    m = _model(node, inputs, consts)
    want = run_ort(m, inputs)
    got = run_autosched(m, inputs, target)
    for name, g, w in zip(OUTS, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        if exact:
            np.testing.assert_array_equal(g.view("int32"), w.view("int32"), err_msg=name)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("direction,dtype,per_column", [
    ("forward", "int8", False), ("bidirectional", "int8", True),
    ("reverse", "uint8", True), ("bidirectional", "uint8", False)])
def test_dqlstm_directions(direction: str, dtype: str, per_column: bool) -> None:
    """Batch 1 (the hidden state of the whole batch is quantized at once, as onnxruntime does
    for batch 1), a hidden size that no vector width divides."""
    dirs = 2 if direction == "bidirectional" else 1
    names, inputs, consts = _case(dirs, steps=4, batch=1, inp=6, hidden=9, dtype=dtype,
                                  per_column=per_column)
    _compare(_node(names, 9, direction), inputs, consts)


def test_dqlstm_initial_states_peepholes_batch() -> None:
    """Initial states (nonzero from the first step on), peepholes, clip and a batch of 3 with
    H > 256, where onnxruntime quantizes the batch's hidden state at once."""
    names, inputs, consts = _case(2, steps=3, batch=3, inp=5, hidden=260, initial=True,
                                  peep=True, bias=False)
    _compare(_node(names, 260, "bidirectional", clip=2.5), inputs, consts)


@pytest.mark.parametrize("target", CUDA_TARGETS)
def test_dqlstm_cuda(target: str) -> None:
    """The expanded steps' kernels with their default GPU schedules: on the GPU, and as CUDA C
    run on the host; onnxruntime's to the bit where the CPU has FMAs (as onnxruntime's
    kernels use them only there)."""
    names, inputs, consts = _case(2, steps=3, batch=1, inp=6, hidden=9, per_column=True)
    _compare(_node(names, 9, "bidirectional"), inputs, consts, target, exact=_host_has_fma())


def test_dqlstm_domain_is_checked() -> None:
    names, inputs, consts = _case(1, steps=2, batch=1, inp=3, hidden=4)
    plain = helper.make_node("DynamicQuantizeLSTM", names, OUTS, hidden_size=4)
    with pytest.raises(ModelImportError, match=r"unsupported op types \['DynamicQuantizeLSTM'"):
        from_onnx(model([plain], inputs, consts, OUTS))
    other = helper.make_node("DynamicQuantizeLSTM", names, OUTS, domain="com.example",
                             hidden_size=4)
    m = model([other], inputs, consts, OUTS)
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(ModelImportError, match=r"node '' \(DynamicQuantizeLSTM\) is in operator "
                                               r"set domain 'com\.example' \(version 1\)"):
        from_onnx(m)
    spoof = helper.make_node("com.microsoft.DynamicQuantizeLSTM", names, OUTS, hidden_size=4)
    with pytest.raises(ModelImportError, match="default ai.onnx domain, which has no such op"):
        from_onnx(model([spoof], inputs, consts, OUTS))
    m = _model(_node(names, 4, "forward"), inputs, consts)
    m.opset_import[-1].version = 2
    with pytest.raises(ModelImportError, match=r"com\.microsoft' \(version 2\)"):
        from_onnx(m)


def test_dqlstm_zero_points_one_per_direction() -> None:
    names, inputs, consts = _case(1, steps=2, batch=1, inp=3, hidden=4, dtype="uint8",
                                  per_column=True)
    consts["wz"][0, 1] += 1
    with pytest.raises(ModelImportError, match="W zero points differ within a direction"):
        from_onnx(_model(_node(names, 4, "forward"), inputs, consts),
                  {n: a.shape for n, a in inputs.items()})


def test_dynamic_quantize_linear_of_zeros() -> None:
    """An all-zero tensor (an LSTM's first hidden state) has scale 1 and zero point 0, as in
    onnxruntime; the formula's scale 0 made every quotient NaN."""
    x = {"x": np.zeros((2, 3), "float32")}
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    m = model([node], x, {}, ["y", "s", "z"])
    for g, w in zip(run_autosched(m, x), run_ort(m, x)):
        np.testing.assert_array_equal(g, w)
    assert run_ort(m, x)[1] == 1.0


def test_domain_is_checked_inside_a_branch() -> None:
    """A node of an unknown domain inside an If branch fails like one at the top level (the
    branch's nodes were taken as ai.onnx ops whatever their domain)."""
    x = rand((2, 3))
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="ext_relu",
                                               domain="com.example")], "then", [],
                             [helper.make_tensor_value_info("t", 1, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", 1, None)])
    m = model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
              {"x": x}, {"cond": np.array(True)}, ["y"])
    with pytest.raises(ModelImportError, match=r"node 'ext_relu' \(Relu\) is in operator set "
                                               r"domain 'com\.example'"):
        from_onnx(m)


def test_inspect_counts_ops_by_domain() -> None:
    """``autosched inspect`` takes a known contrib op as supported and the same op type in
    another domain as not."""
    from importers.inspect import inspect_model

    names, inputs, consts = _case(1, steps=2, batch=1, inp=3, hidden=4)
    m = _model(_node(names, 4, "forward"), inputs, consts)
    report = inspect_model(m, {n: a.shape for n, a in inputs.items()}, tasks=False)
    assert "unsupported" not in report and "NO" not in report, report
    m.graph.node[0].domain = "com.example"
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    report = inspect_model(m, {n: a.shape for n, a in inputs.items()}, tasks=False)
    assert "unsupported: com.example.DynamicQuantizeLSTM" in report, report


def _host_has_fma() -> bool:
    import llvmlite.binding as llvm

    return platform.machine() in ("aarch64", "arm64") or bool(
        llvm.get_host_cpu_features().get("fma", False))


NEEDS_FMA = pytest.mark.skipif(not _host_has_fma(), reason="onnxruntime's kernels use fused "
                               "multiply-adds only where the CPU has them")


# Inputs whose sigmoid onnxruntime's x86-64 kernel rounds to 1 + 2^-23: it floors its results at
# 0 but has no ceiling (its portable kernel, taken on other CPUs, clamps them to 1).
_SIGMOID_ABOVE_ONE = [17.482065, 17.631031, 17.695677, 17.763828, 17.807888, 17.817932, 17.831364,
                      17.844, 17.857412, 17.868923, 17.87294, 17.89196, 17.89684, 17.934595,
                      17.942505, 17.951769, 17.956633, 17.958612, 17.959602, 17.993553]


def _activations(rows: int, cols: int) -> np.ndarray:
    """float32 values across sigmoid's and tanh's range: saturated, tiny, subnormal, NaN, +-inf."""
    x = (RNG.standard_normal((rows, cols)) * 6).astype("float32")
    x[0, :10] = [np.nan, np.inf, -np.inf, 30.0, -30.0, 1e30, -1e-30, -1e-40, 0.0, -0.0]
    if platform.machine() in ("x86_64", "AMD64"):
        x[1, 3:3 + len(_SIGMOID_ABOVE_ONE)] = _SIGMOID_ABOVE_ONE
    x[-1, :cols // 2] = RNG.uniform(-20, 20, cols // 2)
    return x


@NEEDS_FMA
@pytest.mark.parametrize("target", ["llvm", "ref", *CUDA_TARGETS])
@pytest.mark.parametrize("op", ["Sigmoid", "Tanh"])
def test_sigmoid_tanh_bit_identical_to_onnxruntime(op: str, target: str) -> None:
    """A dynamically quantized model rounds activations to uint8: where ours differed from
    onnxruntime's by one ulp (in about half the elements), one rounding in 60,000 flipped and
    the flips cascaded (ddddocr_ocr_int8 matched for 5 of 16 inputs). llvm: vector lanes and the
    scalar tail; the reference evaluator (slow: fewer values); CUDA C on the host and the GPU."""
    x = _activations(*((3, 701) if target == "ref" else (7, 4103)))
    m = model([helper.make_node(op, ["x"], ["y"])], {"x": x}, {}, ["y"])
    got, want = run_autosched(m, {"x": x}, target)[0], run_ort(m, {"x": x})[0]
    # a NaN's payload is not part of IEEE arithmetic (the GPU writes its canonical 0x7fffffff)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view("int32"), want[ok].view("int32"))


@NEEDS_FMA
def test_folded_sigmoid_bit_identical_to_onnxruntime() -> None:
    """Sigmoid of a constant folds (graph/passes.py, on the reference evaluator): the folded
    values are onnxruntime's to the bit too (the exact formula differed by an ulp)."""
    c, x = _activations(5, 67), rand((5, 67))
    nodes = [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Add", ["s", "x"], ["y"])]
    m = model(nodes, {"x": x}, {"c": c}, ["y"])
    folded = fold_constants(from_onnx(m, {"x": x.shape}))
    assert [n.op_type for n in folded.nodes] == ["Add"], "the Sigmoid was not folded"
    got, want = run_autosched(m, {"x": x})[0], run_ort(m, {"x": x})[0]
    np.testing.assert_array_equal(got.view("int32"), want.view("int32"))


@NEEDS_FMA
@pytest.mark.parametrize("target", ["llvm", *CUDA_TARGETS])
def test_dqlstm_bit_identical_to_onnxruntime(target: str) -> None:
    """Each step rounds the hidden state to uint8, so the states must be onnxruntime's to the
    bit, or roundings flip and the error grows step by step: its sigmoid and tanh, and the
    cell's f*c + i*g with both products rounded (no fused multiply-add outside reductions)."""
    names, inputs, consts = _case(2, steps=6, batch=1, inp=8, hidden=64, per_column=True)
    _compare(_node(names, 64, "bidirectional"), inputs, consts, target, exact=True)
