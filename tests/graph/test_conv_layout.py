"""Which convolutions compute channels-last (passes.packing_pays), and that both layouts of a
few-channel stem and a many-channel large map match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from autosched.graph.graph import KERNEL_LAYOUT, Node
from autosched.graph.passes import packing_pays


@pytest.mark.parametrize("cin, kernel, strides, out_hw, packs", [
    (1, 3, 1, (900, 120), False),   # a spectrogram's first conv: sums along the long rows
    (3, 3, 1, (224, 224), False),
    (8, 5, 1, (172, 264), False),
    (3, 7, 2, (112, 112), True),    # strided: the row reads would be gathers
    (8, 1, 1, (24, 96), True),      # 1x1 over few channels
    (64, 1, 1, (7, 7), True),       # 1x1 over short rows
    (64, 1, 1, (56, 56), False),
    (64, 3, 1, (56, 56), False),
    (64, 3, 1, (900, 161), True),   # many channels over a large map: channels-last
    (32, 3, 1, (256, 256), True),
    (16, 3, 1, (900, 161), False),
])
def test_packing_pays(cin, kernel, strides, out_hw, packs) -> None:
    node = Node("c", "Conv", ["x", "w"], ["y"], {"strides": [strides, strides]})
    w = np.ones((32, cin, kernel, kernel), np.float32)
    assert packing_pays(node, w, (1, 32, *out_hw)) is packs


def test_a_one_channel_stem_matches_onnxruntime(rng: np.random.Generator) -> None:
    import autosched as aus
    from autosched.graph.compiler import prepare
    from autosched.targets.target import parse
    from autosched.testing.models import Builder, ort_run
    from importers.onnx import from_onnx

    b = Builder(int(rng.integers(1 << 30)))
    y = b.op("Relu", [b.conv("x", 1, 16, 3, bias=True)])
    proto = b.model(("x", (1, 1, 40, 52)), y, "stem")
    g = from_onnx(proto)
    convs = [n for n in prepare(g, parse("llvm")).nodes if n.op_type == "Conv"]
    assert convs and all(KERNEL_LAYOUT not in n.attrs for n in convs)
    x = {"x": rng.uniform(-1, 1, (1, 1, 40, 52)).astype(np.float32)}
    (got,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(got, ort_run(proto, x)[0], rtol=1e-5, atol=1e-5)


def test_a_large_many_channel_map_runs_channels_last_and_matches_onnxruntime(
        rng: np.random.Generator) -> None:
    import autosched as aus
    from autosched.graph.compiler import prepare
    from autosched.targets.target import parse
    from autosched.testing.models import Builder, ort_run
    from importers.onnx import from_onnx

    b = Builder(int(rng.integers(1 << 30)))
    y = b.op("Relu", [b.conv("x", 32, 16, 3, bias=True)])
    proto = b.model(("x", (1, 32, 256, 260)), y, "map")
    g = from_onnx(proto)
    convs = [n for n in prepare(g, parse("llvm")).nodes if n.op_type == "Conv"]
    assert convs and all(KERNEL_LAYOUT in n.attrs for n in convs)
    x = {"x": rng.uniform(-1, 1, (1, 32, 256, 260)).astype(np.float32)}
    (got,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(got, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
