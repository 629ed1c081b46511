"""8-bit dot products on aarch64 boards: MatMulInteger and ConvInteger of uint8 data by constant
8-bit weights compile, for a CPU with dotprod (Cortex-A76: ``udot``, both operands uint8) or
i8mm (Neoverse N2: ``usdot``, uint8 by int8), to code that runs those instructions; the model
library runs under qemu-aarch64 emulating such a CPU and matches onnxruntime on the host to
the bit, on fresh random data and non-zero zero points. A Cortex-A72 (neither) gets plain
code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.graph.deploy import export  # noqa: E402
from autosched.targets.llvm import dot as dot4  # noqa: E402
from autosched.tir.tensor_intrin import UDOT_4X4, USDOT_4X4  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402
from tests.support.onnx_node import model, run_ort  # noqa: E402

BOARDS = [  # target, the CPU qemu emulates, the instruction its code must hold
    pytest.param("-mcpu=cortex-a76", "cortex-a76", UDOT_4X4, id="dotprod"),
    pytest.param("-mcpu=neoverse-n2", "max", USDOT_4X4, id="i8mm"),
    pytest.param("-mcpu=cortex-a72", "cortex-a72", None, id="plain"),
]


def _q(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.asarray(rng.integers(info.min, info.max + 1, shape), dtype=dtype)


def _zero(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    z = _q(rng, shape, dtype)
    return np.where(z == 0, 1, z).astype(dtype)  # a zero point of 0 would hide a dropped term


def _model(rng: np.random.Generator, w_dtype: str) -> tuple[Any, dict[str, np.ndarray]]:
    """A MatMulInteger (per-column B zero points, a batch dim) and two ConvIntegers (3x3
    stride 1 with 6 input channels, not a multiple of 4; 3x3 stride 2 with one-sided pads)."""
    feeds = {"a": _q(rng, (2, 5, 64), "uint8"), "x": _q(rng, (1, 6, 11, 13), "uint8")}
    consts = {
        "b": _q(rng, (64, 24), w_dtype), "az": _zero(rng, (), "uint8"),
        "bz": _zero(rng, (24,), w_dtype),
        "w1": _q(rng, (8, 6, 3, 3), w_dtype), "xz": _zero(rng, (), "uint8"),
        "wz1": _zero(rng, (), w_dtype),  # onnxruntime takes one weight zero point
        "w2": _q(rng, (12, 8, 3, 3), w_dtype), "wz2": _zero(rng, (), w_dtype),
    }
    nodes = [
        helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"]),
        helper.make_node("ConvInteger", ["x", "w1", "xz", "wz1"], ["c1"], pads=[1, 1, 1, 1]),
        # the first conv's int32 output brought back to uint8 for the second
        helper.make_node("Cast", ["c1"], ["c1f"], to=1),
        helper.make_node("Mul", ["c1f", "scale"], ["c1s"]),
        helper.make_node("QuantizeLinear", ["c1s", "one", "xz"], ["x2"]),
        helper.make_node("ConvInteger", ["x2", "w2", "xz", "wz2"], ["c2"], strides=[2, 2],
                         pads=[0, 1, 1, 0]),
    ]
    consts |= {"scale": np.array(1 / 2048, "float32"), "one": np.array(1.0, "float32")}
    return model(nodes, feeds, consts, ("y", "c2")), feeds


@pytest.mark.parametrize("mcpu, qemu_cpu, intrin", BOARDS)
@pytest.mark.parametrize("w_dtype", ["int8", "uint8"])
def test_int8_model_on_aarch64(mcpu: str, qemu_cpu: str, intrin: str | None, w_dtype: str,
                               tmp_path: Path, c_runner: Any) -> None:
    run = c_runner("aarch64", cpu=qemu_cpu)  # skips without the cross tools
    rng = np.random.default_rng()
    proto, feeds = _model(rng, w_dtype)
    graph = from_onnx(proto)
    compiled = aus.compile(graph, target=f"llvm -mtriple=aarch64-linux-gnu {mcpu}",
                           executor=False)
    source = "".join(k.module.get_source() for k in compiled.kernels)
    used = sorted(d for d, name in dot4.LLVM_DOT.items() if name in source)
    assert used == ([intrin] if intrin else [])
    if intrin:  # the products, all three of them, run as the instruction
        dots = {k.task.name for k in compiled.kernels if dot4.LLVM_DOT[intrin] in
                k.module.get_source()}
        assert len(dots) == 3, dots
        asm = "".join(k.module.get_source("asm") for k in compiled.kernels)
        assert f"\t{intrin.split('_')[1]}\t" in asm
    export(compiled, tmp_path / "build", name="q8")
    want = run_ort(proto, feeds)
    got = run(tmp_path / "build", "q8", [feeds[v.name] for v in graph.inputs],
              [(w.shape, str(w.dtype)) for w in want])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
