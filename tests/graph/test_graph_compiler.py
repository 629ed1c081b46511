"""Graph passes, fusion, task extraction, the CPU executor, export/load and the model CLI, on
small graphs built by hand or with onnx.helper, checked against numpy and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import autosched as aus
from autosched.errors import ModelImportError
from autosched.graph import Graph, Node, ValueInfo
from autosched.graph.compiler import extract_tasks, plan, prepare
from autosched.graph.graph import KERNEL_LAYOUT
from autosched.graph.passes import eliminate_dead, fold_batch_norm, fold_constants
from autosched.targets.target import parse
from autosched.testing.models import Builder, ort_run, small_cnn
from importers.onnx import from_onnx


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _conv_bn_model(rng: np.random.Generator, second_reader: bool) -> object:
    b = Builder(int(rng.integers(1 << 30)))
    y = b.conv("x", 3, 5, 3, bias=True)
    z = b.op("Relu", [b.bn(y, 5)])
    out = b.op("Add", [z, y]) if second_reader else z
    return b.model(("x", (1, 3, 7, 6)), out, "conv_bn")


@pytest.mark.parametrize("second_reader", [False, True])
def test_batch_norm_folds_into_conv(second_reader: bool, rng: np.random.Generator) -> None:
    m = _conv_bn_model(rng, second_reader)
    g = from_onnx(m)
    folded = fold_batch_norm(g)
    counts = folded.op_counts()
    # folded only when the BatchNormalization is the conv output's only reader
    assert counts.get("BatchNormalization", 0) == (1 if second_reader else 0)
    x = {"x": _f32(rng, 1, 3, 7, 6)}
    (y,) = aus.compile(g, "llvm").run(x)
    (ref,) = ort_run(m, x)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_one_dimensional_conv_is_packed_channels_last(rng: np.random.Generator) -> None:
    """A 5 x 1 kernel over a (C, L, 1) map: rows of one column are no vector, so the sums run
    channels-last (OIHW took magika's 1-d conv 4.5x longer)."""
    b = Builder(int(rng.integers(1 << 30)))
    y = b.conv("x", 32, 48, 1, bias=True)
    w = b.weight((40, 48, 5, 1), 48 * 5)
    out = b.op("Conv", [y, w], kernel_shape=[5, 1])
    m = b.model(("x", (1, 32, 30, 1)), out, "conv1d")
    g = from_onnx(m)
    cpu = prepare(g, parse("llvm"))
    assert [n.attrs.get(KERNEL_LAYOUT) for n in cpu.nodes if n.op_type == "Conv"] == [
        "IHWO", "IHWO"]
    x = {"x": _f32(rng, 1, 32, 30, 1)}
    (got,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(got, ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


def test_cpu_conv_weights_are_packed_channels_last(rng: np.random.Generator) -> None:
    m = _conv_bn_model(rng, second_reader=False)
    g = from_onnx(m)
    cpu, gpu = prepare(g, parse("llvm")), prepare(g, parse("cuda"))
    (conv,) = [n for n in cpu.nodes if n.op_type == "Conv"]
    (orig,) = [n for n in gpu.nodes if n.op_type == "Conv"]
    assert conv.attrs[KERNEL_LAYOUT] == "IHWO" and KERNEL_LAYOUT not in orig.attrs
    np.testing.assert_array_equal(cpu.constants[conv.inputs[1]],
                                  gpu.constants[orig.inputs[1]].transpose(1, 2, 3, 0))
    x = {"x": _f32(rng, 1, 3, 7, 6)}
    (y,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(y, ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("columns,packed", [(7, True), (14, True), (15, True), (16, False),
                                            (30, False)])
def test_cpu_1x1_convs_over_long_rows_keep_oihw(columns: int, packed: bool,
                                                rng: np.random.Generator) -> None:
    """A stride-1 1x1 conv sums along its rows (OIHW) from PACK_1X1_BELOW_COLUMNS output
    columns on, channels-last below; either way it matches onnxruntime."""
    b = Builder(int(rng.integers(1 << 30)))
    y = b.op("Clip", [b.conv("x", 24, 40, 1, bias=True), b.const(np.float32(0)),
                      b.const(np.float32(6))])
    m = b.model(("x", (1, 24, 5, columns)), y, "pointwise")
    g = from_onnx(m)
    (conv,) = [n for n in prepare(g, parse("llvm")).nodes if n.op_type == "Conv"]
    assert (conv.attrs.get(KERNEL_LAYOUT) == "IHWO") == packed
    x = {"x": _f32(rng, 1, 24, 5, columns)}
    (out,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(out, ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_cpu_gemm_weights_are_stored_k_by_n(trans_b: int, rng: np.random.Generator) -> None:
    w = _f32(rng, 11, 6) if trans_b else _f32(rng, 6, 11)
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=0.5)]
    inits = [helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.ravel())
             for k, v in (("w", w), ("c", _f32(rng, 11)))]
    m = helper.make_model(helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 11])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    g = from_onnx(m)
    (gemm,) = prepare(g, parse("llvm")).nodes
    (orig,) = prepare(g, parse("cuda")).nodes
    assert int(gemm.attrs.get("transB", 0)) == 0 and int(orig.attrs.get("transB", 0)) == trans_b
    assert prepare(g, parse("llvm")).constants[gemm.inputs[1]].shape == (6, 11)
    x = {"x": _f32(rng, 3, 6)}
    (y,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(y, ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


def _graph(nodes: list[Node], inputs: list[ValueInfo], outputs: list[str],
           constants: dict[str, np.ndarray]) -> Graph:
    """A Graph with every value's info taken from an import of the same nodes."""
    values = {v.name: v for v in inputs}
    values.update({k: ValueInfo(k, a.shape, str(a.dtype)) for k, a in constants.items()})
    return Graph(inputs=inputs, outputs=outputs, nodes=nodes, constants=constants,
                 values=values, opset=17)


def test_constant_subgraph_folds_and_dead_nodes_go(rng: np.random.Generator) -> None:
    w = _f32(rng, 4, 3, 3, 3)
    c = _f32(rng, 1, 3, 5, 5)
    x = ValueInfo("x", (1, 4, 3, 3), "float32")
    nodes = [Node("conv", "Conv", ["c", "w"], ["cw"]),        # constants only: folded
             Node("add", "Add", ["x", "cw"], ["y"]),
             Node("dead", "Relu", ["x"], ["unused"])]          # nothing reads it
    g = _graph(nodes, [x], ["y"], {"w": w, "c": c})
    g.values.update({"cw": ValueInfo("cw", (1, 4, 3, 3), "float32"),
                     "y": ValueInfo("y", (1, 4, 3, 3), "float32"),
                     "unused": ValueInfo("unused", (1, 4, 3, 3), "float32")})
    f = eliminate_dead(fold_constants(g))
    assert [n.op_type for n in f.nodes] == ["Add"]
    # direct convolution in numpy: out[o, i, j] = sum_c,u,v c[c, i+u, j+v] w[o, c, u, v]
    win = np.lib.stride_tricks.sliding_window_view(c[0], (3, 3), axis=(1, 2))
    ref_cw = np.einsum("cijuv,ocuv->oij", win, w)[None]
    np.testing.assert_allclose(f.constants["cw"], ref_cw, rtol=1e-4, atol=1e-4)
    xv = _f32(rng, 1, 4, 3, 3)
    (y,) = aus.compile(g, "llvm").run({"x": xv})
    np.testing.assert_allclose(y, xv + ref_cw, rtol=1e-4, atol=1e-4)


def _resnet_block_model(seed: int) -> object:
    b = Builder(seed)
    y = b.conv_bn("x", 8, 8, 3)
    for _ in range(2):  # two identical basic blocks: the same tasks twice
        h = b.conv_bn(y, 8, 8, 3)
        h = b.conv_bn(h, 8, 8, 3, act=None)
        y = b.op("Relu", [b.op("Add", [h, y])])
    return b.model(("x", (1, 8, 9, 9)), y, "blocks")


def test_fusion_groups_and_task_weights(rng: np.random.Generator) -> None:
    m = _resnet_block_model(int(rng.integers(1 << 30)))
    g = from_onnx(m)
    names = [grp.name for grp in plan(prepare(g))]
    # conv + bias (folded batch norm) + residual add + relu in one kernel
    assert names == ["conv_relu", "conv_relu", "conv_add_relu", "conv_relu", "conv_add_relu"]
    tasks, weights = extract_tasks(g, "llvm")
    assert sorted(weights) == [2, 3]  # conv_relu 3x (stem shares the shape), conv_add_relu 2x
    assert sum(weights) == len(names)
    x = {"x": _f32(rng, 1, 8, 9, 9)}
    (y,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(y, ort_run(m, x)[0], rtol=1e-4, atol=1e-4)


def test_injective_chain_is_one_kernel(rng: np.random.Generator) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 6, 4))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = helper.make_tensor("shape", TensorProto.INT64, (4,), [2, 6, 2, 2])
    nodes = [helper.make_node("Exp", ["x"], ["e"]),
             helper.make_node("Reshape", ["e", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Neg", ["t"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "inj", [x], [out], [shape]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    g = from_onnx(m)
    assert [grp.name for grp in plan(prepare(g))] == ["exp_reshape_transpose_neg"]
    xv = {"x": _f32(rng, 2, 6, 4)}
    (y,) = aus.compile(g, "llvm").run(xv)
    np.testing.assert_allclose(y, ort_run(m, xv)[0], rtol=1e-5, atol=1e-6)


def test_fusion_never_makes_a_cycle(rng: np.random.Generator) -> None:
    # Split's second half reaches the Add directly, its first half through a Conv: the Add
    # must not join the Split's group (the Conv reads that group and the Add reads the Conv)
    b = Builder(int(rng.integers(1 << 30)))
    s0, s1 = b.node("Split", ["x", b.const(np.array([4, 4], np.int64), "split")], 2, axis=1)
    c = b.conv(s0, 4, 4, 3)
    y = b.op("Add", [s1, c])
    m = b.model(("x", (1, 8, 5, 5)), y, "split")
    g = from_onnx(m)
    xv = {"x": _f32(rng, 1, 8, 5, 5)}
    (out,) = aus.compile(g, "llvm").run(xv)
    np.testing.assert_allclose(out, ort_run(m, xv)[0], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def cnn() -> tuple[object, object]:
    m = small_cnn(image=12)
    return m, aus.compile(from_onnx(m), "llvm")


def test_executor_rejects_bad_inputs(cnn: tuple[object, object]) -> None:
    _, model = cnn
    good = np.random.default_rng().standard_normal((1, 3, 12, 12)).astype(np.float32)
    with pytest.raises(ModelImportError, match="unknown inputs \\['image'\\]"):
        model.run({"input": good, "image": good})
    with pytest.raises(ModelImportError, match="missing input input"):
        model.run({})
    with pytest.raises(ModelImportError, match=r"must be float32\[1, 3, 12, 12\], got "
                                               r"float32\[1, 3, 12, 13\]"):
        model.run({"input": np.zeros((1, 3, 12, 13), np.float32) + 1})
    with pytest.raises(ModelImportError, match="got float64"):
        model.run({"input": good.astype(np.float64)})


def test_kernel_times_follow_execution_order(cnn: tuple[object, object],
                                             rng: np.random.Generator) -> None:
    _, model = cnn
    x = {"input": rng.standard_normal((1, 3, 12, 12)).astype(np.float32)}
    times = model.kernel_times(x, repeat=3)
    assert [n for n, _ in times] == [k.task.name for k in model.kernels]
    assert all(t > 0 for _, t in times)
    (y,) = model.run(x)   # timing left the model usable
    assert np.isfinite(y).all()


def test_memory_plan_reuses_buffers(cnn: tuple[object, object]) -> None:
    _, model = cnn
    total = sum(a.nbytes for a in model.storage.values())
    distinct = {a.__array_interface__["data"][0] for a in model.storage.values()}
    assert model.peak_bytes < total and len(distinct) < len(model.storage)
    # Flatten after the global pool is a view of the pool's output, not a copy kernel
    assert [k.task.name for k in model.kernels][-2:] == ["globalaveragepool", "gemm"]
    (flat,) = model.aliases
    assert np.shares_memory(model.storage[flat], model.storage[model.aliases[flat]])


def test_export_and_load_run_the_same(cnn: tuple[object, object], tmp_path: object) -> None:
    from autosched.graph.deploy import export
    from autosched.graph.loader import load

    m, model = cnn
    export(model, tmp_path)
    deployed = load(tmp_path)
    x = {"input": np.random.default_rng().standard_normal((1, 3, 12, 12)).astype(np.float32)}
    (a,) = model.run(x)
    (b,) = deployed.run(x)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(b, ort_run(m, x)[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ModelImportError, match="missing input"):
        deployed.run({})


def test_cli_compile_and_run(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    from autosched.cli import main

    path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(image=10), str(path))
    assert main(["compile", str(path), "-o", str(tmp_path / "build")]) == 0
    assert main(["run", str(tmp_path / "build")]) == 0
    out = capsys.readouterr().out
    assert "output" in out and "float32[1, 10]" in out and "latency" in out
    x = np.random.default_rng().standard_normal((1, 3, 10, 10)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["bench", str(path), "--input", f"input={tmp_path / 'x.npy'}",
                 "--repeat", "2"]) == 0
    assert "outputs match" in capsys.readouterr().out


def test_cli_tune_prints_tasks_and_estimate(tmp_path: object,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    from autosched.cli import main

    b = Builder(0)
    y = b.op("Relu", [b.conv("x", 3, 4, 3, bias=True)])
    path = tmp_path / "tiny.onnx"
    onnx.save(b.model(("x", (1, 3, 6, 5)), y, "tiny"), str(path))
    log = tmp_path / "tiny.jsonl"
    assert main(["tune", str(path), "--trials", "4", "--batch-size", "4", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "1 tasks (1 kernels), 4 trials" in out and "conv_relu" in out
    line = next(ln for ln in out.splitlines() if "estimated end-to-end latency" in ln)
    assert line.endswith(" ms")  # the one task has a measured best
    assert "chosen in the model: " in out  # the host runs the model: chosen there at the end
    x = {"x": np.random.default_rng().standard_normal((1, 3, 6, 5)).astype(np.float32)}
    (tuned,) = aus.compile(from_onnx(path), "llvm", log=log).run(x)
    np.testing.assert_allclose(tuned, ort_run(str(path), x)[0], rtol=1e-4, atol=1e-4)


def _gelu_model(rng: np.random.Generator, extra_reader: bool) -> object:
    b = Builder(int(rng.integers(1 << 30)))
    w = b.weight((6, 10), 6)
    f = b.op("Add", [b.op("MatMul", ["x", w]), b.const(_f32(rng, 10), "b")])
    e = b.op("Erf", [b.op("Div", [f, b.const(np.array(np.sqrt(2), np.float32), "c")])])
    g = b.op("Mul", [b.op("Mul", [f, b.op("Add", [e, b.const(np.array(1, np.float32), "c")])]),
                     b.const(np.array(0.5, np.float32), "c")])
    if extra_reader:  # f also feeds a matmul: it must be written out, the region stays apart
        g = b.op("Add", [g, b.op("MatMul", [f, b.weight((10, 10), 10)])])
    return b.model(("x", (3, 7, 6)), g, "gelu")


@pytest.mark.parametrize("extra_reader", [False, True])
def test_converging_elementwise_region_fuses(extra_reader: bool,
                                             rng: np.random.Generator) -> None:
    m = _gelu_model(rng, extra_reader)
    g = from_onnx(m)
    names = [grp.name for grp in plan(prepare(g))]
    if extra_reader:
        assert names == ["matmul_add", "div_erf_add_mul_mul", "matmul_add"]
    else:  # the matmul, its bias and the whole Gelu (f is read twice) in one kernel
        assert names == ["matmul_add_div_erf_add_mul_mul"]
    x = {"x": _f32(rng, 3, 7, 6)}
    (y,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(y, ort_run(m, x)[0], rtol=1e-4, atol=1e-4)
