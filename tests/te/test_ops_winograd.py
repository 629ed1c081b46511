"""Winograd convolution: the derived matrices against direct correlation, the three TE steps
against a float64 numpy convolution, their argument errors, and the graph pass that splits
stride-1 3x3 Convs of a CPU model (checked against onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import TEError
from autosched.graph.compiler import prepare
from autosched.targets.target import parse
from autosched.te import ops
from autosched.testing.models import Builder, ort_run
from importers.onnx import from_onnx
from tests.support.helpers import run_te


def _conv_ref(x: np.ndarray, w: np.ndarray, pads: tuple[int, int, int, int]) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    return np.einsum("bchwij,kcij->bkhw", win, w.astype(np.float64))


@pytest.mark.parametrize("m", [2, 3, 4, 6])
def test_matrices_compute_a_correlation(m: int, rng: np.random.Generator) -> None:
    at, g, bt = ops.winograd_matrices(m)
    assert at.shape == (m, m + 2) and g.shape == (m + 2, 3) and bt.shape == (m + 2, m + 2)
    for _ in range(3):
        d, k = rng.standard_normal(m + 2), rng.standard_normal(3)
        np.testing.assert_allclose(at @ ((g @ k) * (bt @ d)), np.correlate(d, k, "valid"),
                                   rtol=1e-9, atol=1e-9)
    # 2-d: A^T [(G k G^T) . (B^T d B)] A is the 2-d correlation of one tile
    d, k = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    got = at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T
    want = _conv_ref(d[None, None], k[None, None], (0, 0, 0, 0))[0, 0]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n,c,h,w,k,m,pads", [
    (1, 16, 14, 14, 24, 4, (1, 1, 1, 1)),
    (2, 5, 13, 11, 7, 4, (1, 1, 1, 1)),     # tiles overhang the output; batch 2
    (1, 6, 9, 10, 4, 2, (0, 2, 1, 0)),      # asymmetric padding
    (1, 3, 5, 5, 2, 3, (0, 0, 0, 0)),       # no padding, odd tile
])
def test_steps_match_direct_convolution(n: int, c: int, h: int, w: int, k: int, m: int,
                                        pads: tuple[int, int, int, int],
                                        rng: np.random.Generator) -> None:
    at, _, bt = ops.winograd_matrices(m)
    x = rng.uniform(-1, 1, (n, c, h, w)).astype(np.float32)
    kern = rng.uniform(-1, 1, (k, c, 3, 3)).astype(np.float32)
    want = _conv_ref(x, kern, pads)
    xp, btp = te.placeholder(x.shape, name="x"), te.placeholder(bt.shape, name="bt")
    v = ops.winograd_input(xp, btp, m, pads)
    alpha2, tiles = (m + 2) ** 2, int(v.shape[2])
    assert tuple(v.shape) == (alpha2, c, tiles)
    up, atp = te.placeholder((alpha2, k, c), name="u"), te.placeholder(at.shape, name="at")
    y = ops.winograd_output(ops.batch_matmul(up, v), atp, m, want.shape)
    u = ops.winograd_weight(kern, m)
    (got,) = run_te(y, {xp: x, btp: bt.astype(np.float32), up: u,
                        atp: at.astype(np.float32)}, target="llvm")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_bad_arguments_name_the_value() -> None:
    x = te.placeholder((1, 4, 8, 8), name="x")
    with pytest.raises(TEError, match="tile size m"):
        ops.winograd_matrices(1)
    with pytest.raises(TEError, match=r"bt must be \(6, 6\)"):
        ops.winograd_input(x, te.placeholder((4, 4), name="bt"), 4)
    with pytest.raises(TEError, match=r"kernel must be \(K, C, 3, 3\)"):
        ops.winograd_weight(np.zeros((4, 4, 5, 5), np.float32), 4)
    prod = te.placeholder((36, 8, 3), name="prod")
    with pytest.raises(TEError, match=r"prod must be \(36, 8, 4\)"):
        ops.winograd_output(prod, te.placeholder((4, 6), name="at"), 4, (1, 8, 8, 8))


def _model(seed: int) -> object:
    b = Builder(seed)
    y = b.op("Relu", [b.conv("x", 48, 48, 3, bias=True)])          # Winograd
    z = b.op("Relu", [b.op("Add", [b.conv(y, 48, 48, 3, bias=True), y])])  # Winograd + residual
    s = b.conv(z, 48, 16, 3, stride=2, bias=True)                   # strided: direct
    return b.model(("x", (1, 48, 28, 28)), b.op("Relu", [s]), "winograd_net")


def test_graph_pass_splits_stride1_convs_and_matches_onnxruntime(
        rng: np.random.Generator) -> None:
    proto = _model(int(rng.integers(1 << 30)))
    g = from_onnx(proto)
    cpu, gpu = prepare(g, parse("llvm")), prepare(g, parse("cuda"))
    counts = cpu.op_counts()
    assert counts["WinogradInput"] == counts["WinogradOutput"] == 2 and counts["Conv"] == 1
    assert "WinogradInput" not in gpu.op_counts()   # GPU convolutions stay direct
    x = {"x": rng.uniform(-1, 1, (1, 48, 28, 28)).astype(np.float32)}
    (y,) = aus.compile(g, "llvm").run(x)
    np.testing.assert_allclose(y, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin, cout, out_hw, m", [
    (16, 16, (56, 56), None),     # too few channels to repay the transforms
    (16, 32, (32, 32), None),
    (32, 32, (56, 56), None),     # 32 a side: direct (0.68x with Winograd, tuned)
    (32, 64, (80, 80), None),
    (48, 48, (56, 56), 4),        # 1.4 MB of transformed tiles: in the caches
    (48, 48, (450, 60), None),    # 11.7 MB with 48 channels a side: direct
    (64, 64, (450, 60), 4),       # 64 a side repay tiles out of the caches
    (64, 64, (900, 161), 4),      # 85 MB of them too (transform rows computed in tiles)
    (128, 64, (900, 161), 4),
    (48, 48, (900, 161), None),   # 48 a side only while they fit the caches
    (48, 64, (12, 12), 2),
    (64, 64, (6, 40), None),      # under F(2x2)'s 7 rows
])
def test_winograd_tile_weighs_channels_against_tile_bytes(cin, cout, out_hw, m) -> None:
    from autosched.graph.graph import Node
    from autosched.graph.passes import winograd_tile

    node = Node("c", "Conv", ["x", "w"], ["y"], {"pads": [1, 1, 1, 1]})
    w = np.ones((cout, cin, 3, 3), np.float32)
    assert winograd_tile(node, w, (1, cout, *out_hw)) == m
