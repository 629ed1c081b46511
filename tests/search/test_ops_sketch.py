"""Operators under auto-scheduler schedules: sketches sampled for each op graph must build and
agree with the TE interpreter (the default-schedule tests cannot see tiling, rfactor, inlining
or compute_at mistakes that an op's index arithmetic provokes)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.schedule.schedule import create_schedule
from autosched.search.sketch import generate_sketches
from autosched.targets.target import parse
from autosched.te import ops
from tests.support.helpers import check
from tests.support.te_interp import evaluate

P = te.placeholder


def _graphs() -> dict:
    def conv() -> tuple:
        x, w = P((1, 4, 9, 10), name="x"), P((6, 4, 3, 3), name="w")
        return [x, w], ops.relu(ops.conv2d_nchw(x, w, 1, 1))

    def conv_bias_relu() -> tuple:  # the consumer is fused through the inlined bias add
        x, w, b = P((1, 4, 9, 10), name="x"), P((6, 4, 3, 3), name="w"), P((6,), name="b")
        y = ops.conv2d_nchw(x, w, 1, 1)
        return [x, w, b], ops.relu(ops.add(y, ops.reshape(b, (1, 6, 1, 1))))

    def conv_packed() -> tuple:  # channels-last sums, stored NCHW by a permuted fused consumer
        x, w, r = P((1, 4, 9, 10), name="x"), P((4, 3, 3, 6), name="w"), P((1, 6, 5, 5), name="r")
        y = ops.conv2d_nchw(x, w, 2, 1, kernel_layout="IHWO")
        return [x, w, r], ops.relu(ops.add(y, r))

    def conv_packed_rows() -> tuple:  # 14 output rows summed as 15 (register tiles of 3 or 5)
        x, w = P((1, 5, 14, 6), name="x"), P((5, 3, 3, 8), name="w")
        return [x, w], ops.relu(ops.conv2d_nchw(x, w, 1, 1, kernel_layout="IHWO"))

    def group_conv() -> tuple:
        x, w = P((1, 6, 9, 10), name="x"), P((6, 2, 3, 3), name="w")
        return [x, w], ops.conv2d_nchw(x, w, 2, (1, 0, 0, 1), 1, 3)

    def depthwise() -> tuple:
        x, w = P((1, 6, 8, 7), name="x"), P((6, 1, 3, 3), name="w")
        return [x, w], ops.depthwise_conv2d_nchw(x, w, 1, 1)

    def conv_transpose() -> tuple:
        x, w = P((1, 3, 5, 4), name="x"), P((3, 2, 3, 3), name="w")
        return [x, w], ops.conv2d_transpose_nchw(x, w, 2, 1, 1)

    def conv_nhwc() -> tuple:
        x, w = P((1, 9, 10, 4), name="x"), P((3, 3, 4, 5), name="w")
        return [x, w], ops.conv2d_nhwc(x, w, 1, 1)

    def dense() -> tuple:
        a, b, c = P((7, 13), name="a"), P((9, 13), name="b"), P((9,), name="c")
        return [a, b, c], ops.dense(a, b, c)

    def batch_matmul() -> tuple:
        a, b = P((3, 5, 6), name="a"), P((1, 6, 7), name="b")
        return [a, b], ops.batch_matmul(a, b)

    def softmax() -> tuple:
        x = P((3, 17), name="x")
        return [x], ops.softmax(x)

    def layer_norm() -> tuple:
        x, g, b = P((2, 5, 12), name="x"), P((12,), name="g"), P((12,), name="b")
        return [x, g, b], ops.layer_norm(x, g, b)

    def max_pool() -> tuple:
        x = P((1, 3, 11, 9), name="x")
        return [x], ops.max_pool2d(x, 3, 2, 1, ceil_mode=True)

    def avg_pool() -> tuple:
        x = P((1, 3, 11, 9), name="x")
        return [x], ops.avg_pool2d(x, 3, 2, 1)

    def global_avg_pool() -> tuple:
        x = P((1, 3, 11, 9), name="x")
        return [x], ops.global_avg_pool2d(x)

    def resize() -> tuple:
        x = P((1, 3, 5, 4), name="x")
        return [x], ops.resize2d(x, (7, 9))

    def mean_exp() -> tuple:
        x = P((3, 4, 5), name="x")
        return [x], ops.mean(ops.exp(x), axis=(0, 2))

    def transpose_reshape() -> tuple:
        x = P((3, 4, 5), name="x")
        return [x], ops.reshape(ops.transpose(x, (2, 0, 1)), (5, 12))

    def take() -> tuple:
        x, i = P((3, 4, 5), name="x"), P((2, 3), dtype="int64", name="i")
        return [x, i], ops.take(x, i, 1)

    def where_broadcast() -> tuple:
        x, y = P((3, 4, 5), name="x"), P((4, 1), name="y")
        return [x, y], ops.where(ops.greater(x, y), ops.sigmoid(x), ops.multiply(y, 2.0))

    def argmax() -> tuple:
        x = P((3, 4, 5), dtype="int32", name="x")
        return [x], ops.argmax(x, axis=1)

    return {f.__name__: f for f in (conv, conv_bias_relu, conv_packed, conv_packed_rows, group_conv, depthwise,
                                    conv_transpose, conv_nhwc, dense, batch_matmul, softmax,
                                    layer_norm, max_pool, avg_pool, global_avg_pool, resize, mean_exp,
                                    transpose_reshape, take, where_broadcast, argmax)}


GRAPHS = _graphs()
# the CPU reduce rule indexes stage.leaf past the fused data axes when it rfactors a reduction

def _array(rng: np.random.Generator, t: te.Tensor) -> np.ndarray:
    if t.dtype.startswith("int"):
        return rng.integers(-4, 4, tuple(t.shape)).astype(t.dtype)
    return rng.standard_normal(tuple(t.shape)).astype(t.dtype)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_sampled_sketches(name: str, target: str) -> None:
    rng = np.random.default_rng()
    # schedule choices are seeded per graph so a failure replays; inputs are fresh
    knob_rng = np.random.default_rng(zlib.crc32(name.encode()))
    inputs, out = GRAPHS[name]()
    values = {t: _array(rng, t) for t in inputs}
    (want,) = evaluate(out, values)
    sketches = generate_sketches(create_schedule(out.op), parse(target))
    for _ in range(3):
        sketch = sketches[int(knob_rng.integers(len(sketches)))]
        params = {k.name: k.sample(knob_rng) for k in sketch.knobs}
        while sketch.violation(params):  # as SearchSpace.sample: redraw illegal register tiles
            params = {k.name: k.sample(knob_rng) for k in sketch.knobs}
        sch = sketch.apply(create_schedule(out.op), params)
        got = np.full(tuple(out.shape), np.nan if out.dtype.startswith("float") else 77,
                      out.dtype)
        aus.build(sch, [*inputs, out], target=target)(*[values[t] for t in inputs], got)
        check(got, want, out.dtype, **({"rtol": 1e-4, "atol": 1e-4}
                                        if out.dtype.startswith("float") else {}))


@pytest.mark.parametrize("name", ["max_pool", "avg_pool", "mean_exp"])
def test_window_reductions_vectorize_their_data_axis(name: str) -> None:
    """Pooling windows reduce inside the data loops on the CPU: every vector length and
    parallel depth builds and agrees with the interpreter, the window loops sit outside the
    vector lanes."""
    rng = np.random.default_rng()
    inputs, out = GRAPHS[name]()
    values = {t: _array(rng, t) for t in inputs}
    (want,) = evaluate(out, values)
    (sketch,) = generate_sketches(create_schedule(out.op), parse("llvm"))
    (rule,) = [r for r in sketch.rules if r.kind == "window"]
    vector, parallel, _ = rule.knobs
    for vec in vector.options:
        for depth in parallel.options:
            params = {k.name: k.default() for k in sketch.knobs}
            params.update({vector.name: vec, parallel.name: depth})
            sch = sketch.apply(create_schedule(out.op), params)
            leaf = sch.stage(rule.stage).leaf
            if vec > 1:
                assert leaf[-1].kind == "data" and leaf[-2].kind == "reduce", leaf
            got = np.full(tuple(out.shape), np.nan, out.dtype)
            aus.build(sch, [*inputs, out], target="llvm")(*[values[t] for t in inputs], got)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_overhanging_row_tiles_store_only_the_output() -> None:
    """A channels-last convolution sums rows past its output (accumulator_rows) so that
    tiles of 3 rows exist; every row tile of the padded extent stores only the real rows."""
    rng = np.random.default_rng()
    inputs, out = GRAPHS["conv_packed_rows"]()
    values = {t: _array(rng, t) for t in inputs}
    (want,) = evaluate(out, values)
    (sketch,) = generate_sketches(create_schedule(out.op), parse("llvm"))
    (rule,) = [r for r in sketch.rules if r.kind == "tile"]
    rows = next(k for k in rule.knobs if k.name.endswith("tile.y"))
    assert rows.extent == 15
    for tile in [(5, 1, 3), (1, 3, 5), (3, 5, 1)]:
        params = {k.name: k.default() for k in sketch.knobs}
        params[rows.name] = tile
        sch = sketch.apply(create_schedule(out.op), params)
        got = np.full(tuple(out.shape), np.nan, out.dtype)
        aus.build(sch, [*inputs, out], target="llvm")(*[values[t] for t in inputs], got)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
