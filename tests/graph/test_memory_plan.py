"""The static memory plan (graph/memory.py): values whose lifetimes overlap never share a byte,
every value is aligned, and the workspace stays at the fewest bytes live at one step on
networks whose stages change shape (equal-size buffer pools needed about twice that)."""

from __future__ import annotations

import numpy as np
import pytest

import autosched as aus
from autosched.graph import Graph, ValueInfo
from autosched.graph.memory import ALIGN, lifetimes, live_peak, memory_layout, nbytes
from autosched.testing.models import Builder, ort_run
from importers.onnx import from_onnx


def _random_steps(rng: np.random.Generator, n: int) -> tuple[Graph, list]:
    """A graph of ``n`` values of random sizes, each written by one step and read by a few
    random later steps (some never, one an output)."""
    values = {f"v{i}": ValueInfo(f"v{i}", (int(rng.integers(1, 3000)),), "float32")
              for i in range(n)}
    steps: list[tuple[list[str], list[str]]] = [([], [f"v{i}"]) for i in range(n)]
    for i in range(n):
        for _ in range(int(rng.integers(0, 3))):
            j = int(rng.integers(i, n))
            steps[j][0].append(f"v{i}")
    outputs = [f"v{int(rng.integers(0, n))}"]
    return Graph(inputs=[], outputs=outputs, nodes=[], values=values), steps


@pytest.mark.parametrize("n", [1, 2, 7, 60])
def test_values_alive_together_never_share_a_byte(rng: np.random.Generator, n: int) -> None:
    graph, steps = _random_steps(rng, n)
    offsets, size = memory_layout(graph, steps)
    spans = lifetimes(graph, steps)
    assert set(offsets) == set(spans) == set(graph.values)
    assert size >= live_peak(graph, steps)
    ranges = {v: (at, at + nbytes(graph.values[v])) for v, at in offsets.items()}
    for v, (a, b) in ranges.items():
        assert a % ALIGN == 0 and 0 <= a < b <= size, v
    names = sorted(ranges)
    for i, u in enumerate(names):
        for w in names[i + 1:]:
            (ua, ub), (wa, wb) = spans[u], spans[w]
            if ua <= wb and wa <= ub:  # alive at one step
                assert ranges[u][1] <= ranges[w][0] or ranges[w][1] <= ranges[u][0], (u, w)
    # the output lives past the last step: nothing written after it reuses its bytes
    (out,) = graph.outputs
    assert spans[out][1] == len(steps)


def _pyramid(seed: int) -> object:
    """A small feature pyramid (stride-2 stages down, upsampled and added back up, as in a
    text detector's neck): the values change size at every stage."""
    b = Builder(seed)
    x, skips, c = "x", [], 3
    for cout in (8, 16, 24, 32):
        x = b.op("Relu", [b.conv(x, c, cout, 3, stride=2, bias=True)])
        skips.append((x, cout))
        c = cout
    for skip, cs in reversed(skips[:-1]):
        up = b.op("Resize", [x, "", b.const(np.array([1, 1, 2, 2], np.float32), "s")],
                  mode="nearest")
        x = b.op("Add", [b.conv(up, c, cs, 1, bias=True), skip])
        c = cs
    return b.model(("x", (1, 3, 64, 48)), x, "pyramid")


def test_a_pyramid_fits_in_the_bytes_live_at_once(rng: np.random.Generator) -> None:
    """Buffers pooled by equal size gave this pyramid a workspace far above the bytes live at
    one step; the plan stays within an eighth of it, and the model still matches onnxruntime."""
    proto = _pyramid(int(rng.integers(1 << 30)))
    model = aus.compile(from_onnx(proto), target="llvm")
    floor = live_peak(model.graph, model._steps, model.aliases)
    assert floor <= model.peak_bytes <= floor * 1.125 + ALIGN * len(model.kernels)
    x = {"x": rng.standard_normal((1, 3, 64, 48)).astype(np.float32)}
    for _ in range(2):  # a second run over the same workspace
        (got,) = model.run(x)
        np.testing.assert_allclose(got, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
