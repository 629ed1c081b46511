"""Convolutions as matmuls of im2col patches (graph.passes.gemm_convs, te.ops.im2col): the
rewrite keeps every model's outputs (checked on the CPU against onnxruntime), moves the
activation and residual add before the reshape so they fuse into the matmul's kernel, runs
only for GPU targets in tensor-core precisions, and the convolutions then run on tensor cores
(the CUDA C on the host)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.graph.compiler import extract_tasks, prepare
from autosched.graph.executor import random_inputs
from autosched.graph.graph import FP32_OUTPUT
from autosched.graph.passes import gemm_convs, optimize
from autosched.search.measure_worker import compare
from autosched.targets.cuda.host_emulate import unavailable
from autosched.targets.target import parse
from autosched.te import ops
from autosched.testing import models
from tests.precision.conftest import assert_close
from tests.support.nvrtc import needs_nvrtc

needs_host = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _geometry_model(seed: int) -> Any:
    """Convolutions of every geometry gemm_convs meets: stride 2 with asymmetric pads,
    dilation 2, SAME_UPPER with stride 2, 1x1 (read as columns), no bias, a grouped one (left direct), an
    output read twice (nothing moves past it), PRelu per channel, Clip, a residual Add."""
    b = models.Builder(seed)
    x = "x"
    a = b.op("Conv", [x, b.weight((16, 3, 3, 3), 27), b.const(b.rng.normal(0, .1, 16)
             .astype(np.float32), "b")], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 2, 1])
    a = b.op("PRelu", [a, b.const(b.rng.uniform(0, .3, (16, 1, 1)).astype(np.float32))])
    d = b.op("Conv", [a, b.weight((16, 16, 3, 3), 144)], kernel_shape=[3, 3], dilations=[2, 2],
             pads=[2, 1, 2, 3])
    d = b.op("Clip", [d, b.const(np.array(-1, np.float32)), b.const(np.array(2, np.float32))])
    one = b.op("Conv", [d, b.weight((24, 16, 1, 1), 16)], kernel_shape=[1, 1])
    g = b.op("Conv", [one, b.weight((24, 3, 3, 3), 27)], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             group=8)
    res = b.op("Add", [g, one])  # `one` has two readers: the grouped conv and this add
    y = b.op("Relu", [b.op("Add", [b.op("Conv", [res, b.weight((24, 24, 3, 3), 216)],
                                          kernel_shape=[3, 3], pads=[1, 1, 1, 1]), res])])
    y = b.op("Conv", [y, b.weight((16, 24, 3, 3), 216)], kernel_shape=[3, 3], strides=[2, 2],
             auto_pad="SAME_UPPER")
    return b.model((x, (2, 3, 19, 23)), y, "geometry")


MODELS = {
    "geometry": lambda: _geometry_model(0),
    "resnet18_small": lambda: models.resnet18(image=32, classes=10),
    # the batch form: every GEMM over the batch's pixels, conv outputs read in (C, N, H, W)
    "resnet18_batch3": lambda: models.resnet18(image=32, batch=3, classes=10),
    "mobilenet_v2_small": lambda: models.mobilenet_v2(image=32, classes=10, width=0.5),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_rewritten_model_matches_onnxruntime(name: str, rng: np.random.Generator) -> None:
    from importers.onnx import from_onnx

    proto = MODELS[name]()
    graph = optimize(from_onnx(proto))
    g = gemm_convs(graph)
    before, after = graph.op_counts(), g.op_counts()
    grouped = sum(int(n.attrs.get("group", 1)) > 1 for n in graph.nodes if n.op_type == "Conv")
    assert after.get("Conv", 0) == grouped  # every ungrouped convolution became a matmul
    assert after["MatMul"] - before.get("MatMul", 0) == before["Conv"] - grouped
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    got = aus.compile(g, target="llvm", schedule="default").run(feeds)
    assert_close(got, models.ort_run(proto, feeds), "fp32", f"{name} with gemm convolutions")


def test_activations_and_residual_adds_fuse_into_the_matmul() -> None:
    """ResNet-18's conv + bias + residual add + relu stay one kernel as a matmul (or, where
    K is split, as the sum of its partial products): no kernel applies an activation or an
    add by itself; the patches are their own kernels."""
    from importers.onnx import from_onnx

    graph = from_onnx(models.resnet18(image=64))
    names = [t.name for t in extract_tasks(graph, "cuda -arch=sm_90", "fp16")[0]]
    assert {"matmul_add", "matmul_add_relu", "reducesum_add_relu",
            "reducesum_add_add_relu"} <= set(names)
    assert all(n == "matmul" or n.startswith((
        "matmul_add", "reducesum_add", "im2col", "reshape_im2col", "maxpool", "global", "gemm"))
        for n in names), names
    split = prepare(graph, parse("cuda -arch=sm_90"), "fp16")
    assert split.op_counts()["ReduceSum"] == 16  # all but the stem and the 3 projections


def test_deep_narrow_gemms_sum_slices_of_k_apart() -> None:
    """k_splits: ResNet-18's last stage at batch 1 (8 tiles over K = 4,608) in 8 slices,
    layer3 at batch 32 (392 tiles) in 4, layer1 at batch 32 (1,568 tiles) whole; the partial
    sums stay float32 under fp16."""
    from autosched.graph.passes import k_splits
    from importers.onnx import from_onnx

    assert k_splits(512, 4608, 49) == 8 and k_splits(256, 2304, 32 * 196) == 4
    assert k_splits(64, 576, 32 * 3136) == 1 and k_splits(512, 4608, 49, max_splits=2) == 2
    assert k_splits(64, 27 * 8, 49) == 1  # too shallow to split
    g = prepare(from_onnx(models.resnet18(image=64)), parse("cuda -arch=sm_90"), "fp16")
    partial = [n for n in g.nodes if n.op_type == "MatMul" and len(g.values[n.outputs[0]].shape)
               == 3 and g.values[n.outputs[0]].shape[0] > 1]
    assert partial and all(g.values[n.outputs[0]].dtype == "float32" for n in partial)


def test_implicit_patches_join_their_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    from importers.onnx import from_onnx

    graph = from_onnx(models.resnet18(image=64))
    monkeypatch.setenv("AUTOSCHED_CONV_GEMM", "implicit")
    names = [t.name for t in extract_tasks(graph, "cuda -arch=sm_90", "fp16")[0]]
    assert {"im2col_matmul_add_relu", "im2col_matmul_add_add_relu"} <= set(names)
    assert not [n for n in names if n.startswith(("im2col", "reshape")) and "matmul" not in n]
    monkeypatch.setenv("AUTOSCHED_CONV_GEMM", "sideways")
    with pytest.raises(ValueError, match="AUTOSCHED_CONV_GEMM='sideways'"):
        extract_tasks(graph, "cuda -arch=sm_90", "fp16")


def test_only_gpu_targets_in_tensor_core_precisions_rewrite() -> None:
    from importers.onnx import from_onnx

    graph = from_onnx(models.small_cnn())
    patches = {}
    for target, precision in (("llvm", "fp16"), ("cuda", "fp32"), ("cuda", "tf32"),
                              ("cuda", "fp16"), ("cuda", "bf16")):
        counts = prepare(graph, parse(target), precision).op_counts()
        patches[target, precision] = counts.get("Im2Col", 0)
    assert patches == {("llvm", "fp16"): 0, ("cuda", "fp32"): 0, ("cuda", "tf32"): 3,
                       ("cuda", "fp16"): 3, ("cuda", "bf16"): 3}


def test_im2col_matches_numpy(rng: np.random.Generator) -> None:
    x = te.placeholder((2, 3, 9, 11), name="x")
    col = ops.im2col(x, (3, 2), stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2))
    xa = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    got = np.empty(tuple(int(d) for d in col.shape), np.float32)
    aus.build(te.create_schedule(col.op), [x, col], target="llvm")(xa, got)
    pad = np.pad(xa, ((0, 0), (0, 0), (1, 2), (0, 1)))
    oh, ow = (pad.shape[2] - 3) // 2 + 1, pad.shape[3] - 2
    want = np.stack([pad[:, :, ky:ky + 2 * oh:2, 2 * kx:2 * kx + ow]
                     for ky in range(3) for kx in range(2)], axis=2)  # (N, C, KH*KW, OH, OW)
    np.testing.assert_array_equal(got, want.reshape(2, 3 * 6, oh * ow))


def test_im2col_columns_over_the_batch_in_both_layouts(rng: np.random.Generator) -> None:
    """batch_columns: (C * KH * KW, N * OH * OW); layout CNHW reads data stored (C, N, H, W)."""
    xa = rng.standard_normal((3, 4, 9, 11)).astype(np.float32)
    geometry: dict[str, Any] = {"stride": (2, 1), "padding": (1, 0, 2, 1), "dilation": (1, 2)}
    x = te.placeholder((3, 4, 9, 11), name="x")
    per_image = ops.im2col(x, (3, 2), **geometry)
    want = np.empty(tuple(int(d) for d in per_image.shape), np.float32)
    aus.build(te.create_schedule(per_image.op), [x, per_image], target="llvm")(xa, want)
    want = want.transpose(1, 0, 2).reshape(want.shape[1], -1)  # (K, N * P)
    for layout, data in (("NCHW", xa), ("CNHW", np.ascontiguousarray(xa.transpose(1, 0, 2, 3)))):
        xt = te.placeholder(data.shape, name="x")
        col = ops.im2col(xt, (3, 2), layout=layout, batch_columns=True, **geometry)
        got = np.empty(tuple(int(d) for d in col.shape), np.float32)
        aus.build(te.create_schedule(col.op), [xt, col], target="llvm")(data, got)
        np.testing.assert_array_equal(got, want, err_msg=layout)


def test_a_batch_runs_each_convolution_as_one_gemm() -> None:
    """At batch 4, ResNet-18's 20 convolutions are 2-d GEMMs over the batch's pixels, and
    the transposes back to (N, C, H, W) run only where pooling reads a convolution's output
    (the stem's max pool, the global pool) and for the one residual input a pool wrote."""
    from importers.onnx import from_onnx

    graph = from_onnx(models.resnet18(image=64, batch=4))
    g = prepare(graph, parse("cuda -arch=sm_90"), "fp16")
    gemms = [n for n in g.nodes if n.op_type == "MatMul"]
    columns = [g.values[n.outputs[0]].shape[-1] for n in gemms]  # split ones: (S, O, N * P)
    assert len(gemms) == 20 and columns.count(4 * 16 * 16) == 4 and min(columns) == 4 * 2 * 2
    assert all(len(g.values[n.outputs[0]].shape) == 2 for n in gemms
               if not n.attrs.get(FP32_OUTPUT))
    assert g.op_counts()["Transpose"] == 3
    one = prepare(from_onnx(models.resnet18(image=64)), parse("cuda -arch=sm_90"), "fp16")
    assert "Transpose" not in one.op_counts()  # batch 1: the per-image form is the same GEMM


def test_pointwise_convolutions_between_depthwise_ones_stay_per_image() -> None:
    """MobileNetV2 at batch 8: its 1x1 convolutions read and feed depthwise ones (direct, in
    (N, C, H, W)), so they stay matmuls per image; only the stem's 3x3 patches run over the
    batch, one transpose back for the depthwise convolution after it."""
    from importers.onnx import from_onnx

    g = prepare(from_onnx(models.mobilenet_v2(image=64, batch=8, width=0.5)),
                parse("cuda -arch=sm_90"), "fp16")
    assert g.op_counts()["Transpose"] == 1 and g.op_counts()["Im2Col"] == 1


def test_split_matmuls_keep_a_bert_layer_matching(rng: np.random.Generator) -> None:
    """split_matmuls on a small BERT layer at batch 2: the FFN's down projection (64 x 256
    tiles over K = 1,024) sums 4 slices of K, its partial sums float32 under fp16, the bias
    and residual fused into the sum; the rewritten graph matches onnxruntime on the CPU."""
    from autosched.graph.compiler import kernel_groups
    from autosched.graph.passes import split_matmuls
    from autosched.graph.precision import apply_precision
    from importers.onnx import from_onnx

    proto = models.bert_layer(seq=64, hidden=256, heads=4, ffn=1024, batch=2,
                              seed=int(rng.integers(1 << 30)))
    graph = optimize(from_onnx(proto))
    g = split_matmuls(graph, in_place=True)
    (partial,) = [n for n in g.nodes if n.attrs.get(FP32_OUTPUT) and n.op_type == "MatMul"]
    assert g.values[partial.outputs[0]].shape == (4, 2, 64, 256)
    half = apply_precision(g, "fp16")
    assert half.values[partial.outputs[0]].dtype == "float32"
    names = [grp.name for _, grp in kernel_groups(half)[0]]
    # the slices of K read in place: no kernel of their own (the GELU's output is no input)
    assert "reducesum_add_add" in names and "reshape_transpose_matmul" in names, names
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    got = aus.compile(g, target="llvm", schedule="default").run(feeds)
    assert_close(got, models.ort_run(proto, feeds), "fp32", "a BERT layer with K split")


@needs_nvrtc
@needs_host
def test_a_split_matmul_runs_on_tensor_cores_on_host(rng: np.random.Generator) -> None:
    """A linear layer of few outputs over a deep K (128 x 128 over 2,048: 8 slices) in fp16:
    partial products on tensor cores (the untuned default from 128 rows and columns), their
    sum with the bias and relu, against onnxruntime."""
    from importers.onnx import from_onnx

    b = models.Builder(int(rng.integers(1 << 30)))
    y = b.op("Relu", [b.op("Add", [b.op("MatMul", ["x", b.weight((2048, 128), 2048)]),
                                   b.const(b.rng.normal(0, .1, 128).astype(np.float32), "b")])])
    proto = b.model(("x", (1, 128, 2048)), y, "deep_linear")
    graph = from_onnx(proto)
    model = aus.compile(graph, target="cuda -arch=sm_90 -emulate=host", precision="fp16",
                        schedule="default")
    names = [k.task.name for k in model.kernels]
    assert "reducesum_add_relu" in names, names
    (mma,) = [k.module.get_source() for k in model.kernels if k.task.name == "matmul"]
    assert _on_tensor_cores(mma)
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    assert_close(model.run(feeds), models.ort_run(proto, feeds), "fp16",
                 "a deep linear layer with K split on tensor cores")


@needs_nvrtc
@needs_host
def test_a_split_matmul_reads_its_slices_of_k_in_place_on_host(rng: np.random.Generator) -> None:
    """A linear layer over a deep K after a ReLU (so its input is no graph input), 4 x 256
    rows: 8 slices of K, the product reading them straight from the ReLU's output (viewed
    (S, 4, 256, K / S)) on warpgroups, the weight's slices broadcast over the batch; no
    kernel copies the slices; against onnxruntime in fp16."""
    from importers.onnx import from_onnx

    b = models.Builder(int(rng.integers(1 << 30)))
    y = b.op("Add", [b.op("MatMul", [b.op("Relu", ["x"]), b.weight((2048, 128), 2048)]),
                     b.const(b.rng.normal(0, .1, 128).astype(np.float32), "b")])
    proto = b.model(("x", (4, 256, 2048)), y, "deep_linear_after_relu")
    graph = from_onnx(proto)
    model = aus.compile(graph, target="cuda -arch=sm_90 -emulate=host", precision="fp16",
                        schedule="default")
    names = [k.task.name for k in model.kernels]
    assert names == ["relu", "reshape_transpose_matmul", "reducesum_add"], names
    (mm,) = [k.module.get_source() for k in model.kernels if k.task.name.endswith("matmul")]
    assert "as_wgmma_m64n" in mm
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    assert_close(model.run(feeds), models.ort_run(proto, feeds), "fp16",
                 "a deep linear layer reading its slices of K in place")


@pytest.mark.parametrize("opset", [11, 17])
def test_the_sum_of_slices_follows_the_models_opset(opset: int, rng: np.random.Generator) -> None:
    """Before opset 13 ReduceSum takes its axes as an attribute: the sum of a split's slices
    spelled with an axes input reduced every axis there (aecmos, an opset-11 model, ran its
    split convolutions as a (1, O, 1) sum)."""
    from autosched.graph.passes import split_matmuls
    from importers.onnx import from_onnx

    b = models.Builder(int(rng.integers(1 << 30)))
    y = b.op("Relu", [b.conv("x", 64, 64, 3, bias=True)])
    y = b.op("MatMul", [b.op("Reshape", [y, b.const(np.array([1, 64, 64], np.int64), "s")]),
                        b.weight((64, 32), 64)])
    proto = b.model(("x", (1, 64, 8, 8)), y, "old_opset")
    proto.opset_import[0].version = opset
    graph = optimize(from_onnx(proto))
    assert graph.opset == opset
    g = split_matmuls(gemm_convs(graph, max_splits=2), max_splits=2)
    assert g.op_counts()["ReduceSum"] == 1  # the convolution's (K = 576): 64 x 64 tiles: 1
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    got = aus.compile(g, target="llvm", schedule="default").run(feeds)
    assert_close(got, models.ort_run(proto, feeds), "fp32", f"split sums at opset {opset}")


def _wide_block(seed: int, batch: int = 1) -> Any:
    """A residual block wide enough that the tensor-core tile is the untuned default (128
    output channels, 8 x 16 pixels: 128 x 128 matmuls)."""
    b = models.Builder(seed)
    y = b.conv_bn("x", 32, 128, 3)
    y = b.bn(b.conv(y, 128, 128, 3, bias=True), 128)
    y = b.op("Relu", [b.op("Add", [y, b.conv_bn("x", 32, 128, 1, act=None)])])
    return b.model(("x", (batch, 32, 8, 16)), y, "wide_block")


@needs_nvrtc
@needs_host
@pytest.mark.parametrize("precision,patches,batch", [
    ("fp16", "explicit", 1), ("fp16", "implicit", 1), ("tf32", "explicit", 1),
    ("tf32", "implicit", 1), ("fp16", "explicit", 2), ("tf32", "implicit", 2)])
def test_convolutions_run_on_tensor_cores_on_host(precision: str, patches: str, batch: int,
                                                  rng: np.random.Generator,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Explicit: an Im2Col kernel writes the patches; implicit: the matmul's tile copy gathers
    them from the input (AUTOSCHED_CONV_GEMM), one kernel per convolution; at batch 2 as
    GEMMs over the batch's pixels (the second convolution's patches read the first's output
    in (C, N, H, W), the residual add reads the projection's GEMM output)."""
    from importers.onnx import from_onnx

    monkeypatch.setenv("AUTOSCHED_CONV_GEMM", patches)
    proto = _wide_block(int(rng.integers(1 << 30)), batch)
    graph = from_onnx(proto)
    model = aus.compile(graph, target="cuda -arch=sm_90 -emulate=host", precision=precision,
                        schedule="default")
    names = [k.task.name for k in model.kernels]
    sources = [k.module.get_source() for k in model.kernels if "matmul" in k.task.name]
    assert len(sources) == 3 and all(_on_tensor_cores(s) for s in sources)
    assert ("im2col" in names) == (patches == "explicit"), names
    feeds = random_inputs(graph, seed=int(rng.integers(1 << 30)))
    assert_close(model.run(feeds), models.ort_run(proto, feeds), precision,
                 f"a residual block in {precision} on tensor cores")


def _conv_task(patches: str, precision: str, monkeypatch: pytest.MonkeyPatch, seed: int) -> Any:
    """The matmul task of one padded 3x3 convolution + bias + relu (24 -> 40 channels over
    10 x 12 pixels: 40 x 120 x 216, tiles overhang every dimension), for sm_90, and the same
    group's task for the CPU as the reference."""
    from autosched.graph.compiler import group_task, kernel_groups
    from importers.onnx import from_onnx

    monkeypatch.setenv("AUTOSCHED_CONV_GEMM", patches)
    b = models.Builder(seed)
    y = b.op("Relu", [b.conv("x", 24, 40, 3, bias=True)])
    graph = from_onnx(b.model(("x", (1, 24, 10, 12)), y, "conv"))
    gpu, cpu = parse("cuda -arch=sm_90 -emulate=host"), parse("llvm")
    g = prepare(graph, gpu, precision)
    (grp,) = [grp for _, grp in kernel_groups(g)[0] if any(n.op_type == "MatMul"
                                                             for n in grp.nodes)]
    return g, group_task(g, grp, gpu, precision), group_task(g, grp, cpu, precision)


@needs_nvrtc
@needs_host
@pytest.mark.parametrize("patches", ["explicit", "implicit"])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_sampled_tensor_core_conv_candidates_on_host(precision: str, patches: str,
                                                     rng: np.random.Generator,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates of a convolution's matmul, 3 of the tensor-core sketch (warps, fragments, k
    chunk, padding, pipeline stages drawn at random) and 2 of the SIMT one, against the same
    group compiled for the CPU."""
    from autosched.search.space import SearchSpace
    from autosched.te import dtype as dt

    g, gpu, cpu = _conv_task(patches, precision, monkeypatch, int(rng.integers(1 << 30)))
    space = SearchSpace(gpu.task)
    mma = next(k for k, sk in enumerate(space.sketches) if sk.tensor_cores)
    wanted = {k: 3 if k == mma else 2 for k in range(len(space.sketches))}
    arrays = []
    for name, t in zip(gpu.args, gpu.task.args):
        shape = tuple(int(d) for d in t.shape)
        value = g.constants.get(name, gpu.constants.get(name))
        arrays.append(np.asarray(value, dtype=dt.to_numpy(t.dtype)) if value is not None
                      else rng.uniform(-1, 1, shape).astype(dt.to_numpy(t.dtype)))
    want = [a.copy() for a in arrays]
    cpu.task.build(cpu.task.schedule())(*want)
    for _ in range(300):
        c = space.sample(rng)
        if not wanted[c.sketch]:
            continue
        low = space.lower(c)
        if low is None:
            continue
        got = [a.copy() for a in arrays]
        got[-1][...] = np.nan
        gpu.task.build(low.schedule)(*got)  # the CUDA C, run on the host
        problem = compare("out", got[-1].astype(np.float32), want[-1].astype(np.float32),
                          precision)
        assert problem is None, f"{low.candidate.as_dict()}: {problem}"
        wanted[c.sketch] -= 1
        if not any(wanted.values()):
            break
    assert not any(wanted.values()), wanted


def _on_tensor_cores(source: str) -> bool:
    """Whether CUDA C runs its matmul on tensor cores: warp tiles (wmma) or, on sm_90,
    warpgroup tiles (wgmma)."""
    return "wmma::mma_sync" in source or "as_wgmma_m64n" in source
