"""Fuzzing tier: random lists of schedule steps on small workloads.

Each step (split, fuse, reorder, vectorize, unroll, parallel, compute_at, compute_inline,
compute_root, cache_write, rfactor) is drawn at random and applied through the stage API. A step
may be refused with a ScheduleError (that is its job), when applied or, for what only the whole
loop nest shows, when lowered; whatever lowers must build for llvm and match numpy, and the recorded steps must replay from JSON to the same loop nest.
``--fuzz-cases`` sets the count (a third of it runs here), ``--fuzz-seed`` the seed.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.errors import ScheduleError  # noqa: E402
from autosched.schedule.schedule import Schedule  # noqa: E402
from tests.support.options import FUZZ  # noqa: E402

CASES = max(1, FUZZ.cases // 3)
SEED = FUZZ.seed


def _gemm_bias_relu(m: int, n: int, k: int):  # noqa: ANN202
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    D = te.compute((m, n), lambda i, j: te.max(C[i, j] + bias[j], te.const(0.0)), name="D")

    def ref(a, b, bb):  # noqa: ANN001, ANN202
        return np.maximum(a.astype(np.float64) @ b + bb, 0)

    return [A, B, bias], D, ref


def _row_softmax(m: int, n: int):  # noqa: ANN202
    X = te.placeholder((m, n), name="X")
    r1 = te.reduce_axis((0, n), name="r1")
    r2 = te.reduce_axis((0, n), name="r2")
    mx = te.compute((m,), lambda i: te.max(X[i, r1], axis=r1), name="mx")
    ex = te.compute((m, n), lambda i, j: te.exp(X[i, j] - mx[i]), name="ex")
    sm = te.compute((m,), lambda i: te.sum(ex[i, r2], axis=r2), name="sm")
    Y = te.compute((m, n), lambda i, j: ex[i, j] / sm[i], name="Y")

    def ref(x):  # noqa: ANN001, ANN202
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return [X], Y, ref


def _pad_conv(c: int, h: int, o: int):  # noqa: ANN202
    X = te.placeholder((c, h, h), name="X")
    W = te.placeholder((o, c, 3, 3), name="W")
    P = te.compute((c, h + 2, h + 2), lambda ci, y, x: te.if_then_else(
        te.all(y >= 1, y <= h, x >= 1, x <= h), X[ci, y - 1, x - 1], te.const(0.0)), name="P")
    rc = te.reduce_axis((0, c), name="rc")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    Y = te.compute((o, h, h), lambda f, y, x: te.sum(P[rc, y + ry, x + rx] * W[f, rc, ry, rx],
                                                      axis=[rc, ry, rx]), name="Y")

    def ref(x, w):  # noqa: ANN001, ANN202
        xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))
        return np.einsum("chwij,fcij->fhw", win, w)

    return [X, W], Y, ref


@st.composite
def workloads(draw):  # noqa: ANN001, ANN201
    kind = draw(st.sampled_from(["gemm", "softmax", "conv"]))
    if kind == "gemm":
        return _gemm_bias_relu(*(draw(st.integers(1, 24)) for _ in range(3)))
    if kind == "softmax":
        return _row_softmax(draw(st.integers(1, 9)), draw(st.integers(1, 40)))
    return _pad_conv(draw(st.integers(1, 5)), draw(st.integers(1, 9)), draw(st.integers(1, 6)))


OPS = ["split", "split", "fuse", "reorder", "vectorize", "unroll", "parallel", "compute_at",
       "compute_inline", "compute_root", "cache_write", "rfactor"]


def _step(draw, s: Schedule, out) -> None:  # noqa: ANN001
    """One random step; refusals (ScheduleError) are part of the game."""
    stages = [x for x in s.stages if not x.is_placeholder]
    stg = draw(st.sampled_from(stages))
    op = draw(st.sampled_from(OPS))
    leaf = list(stg.leaf)
    if op == "split" and leaf:
        ax = draw(st.sampled_from(leaf))
        if draw(st.booleans()):
            stg.split(ax, factor=draw(st.integers(1, 8)))
        else:
            stg.split(ax, nparts=draw(st.integers(1, 8)))
    elif op == "fuse" and len(leaf) >= 2:
        i = draw(st.integers(0, len(leaf) - 2))
        stg.fuse(leaf[i], leaf[i + 1])
    elif op == "reorder" and leaf:
        stg.reorder(*draw(st.permutations(leaf)))
    elif op in ("vectorize", "unroll", "parallel") and leaf:
        getattr(stg, op)(draw(st.sampled_from(leaf)))
    elif op == "compute_at":
        consumers = [x for x in stages if x is not stg and x.leaf]
        if consumers:
            parent = draw(st.sampled_from(consumers))
            stg.compute_at(parent, draw(st.sampled_from(list(parent.leaf))))
    elif op == "compute_inline":
        stg.compute_inline()
    elif op == "compute_root":
        stg.compute_root()
    elif op == "cache_write":
        s.cache_write(stg.op.output(0) if hasattr(stg.op, "output") else out, "local")
    elif op == "rfactor":
        reds = [a for a in leaf if a.kind == "reduce"]
        if reds:
            s.rfactor(stg.op.output(0), draw(st.sampled_from(reds)))


@seed(SEED)
@settings(max_examples=CASES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck), print_blob=True)
@given(st.data())
def test_random_steps_lower_build_and_match_numpy(data) -> None:  # noqa: ANN001
    inputs, out, ref = data.draw(workloads())
    s = te.create_schedule(out.op)
    for _ in range(data.draw(st.integers(0, 8), label="steps")):
        try:
            _step(data.draw, s, out)
        except ScheduleError:
            pass
    try:
        text = aus.lower(s, [*inputs, out])
    except ScheduleError as e:
        # what only the whole loop nest shows (a compute_at whose loop no longer encloses every
        # use after later steps) is refused when lowering, with the stages named
        assert " " in str(e)
        return
    again = Schedule.from_json(out, s.to_json())
    assert str(aus.lower(again, [*inputs, out])) == str(text)
    f = aus.build(s, [*inputs, out], target="llvm")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31), label="input seed"))
    args = [rng.uniform(-1, 1, [int(d) for d in t.shape]).astype("float32") for t in inputs]
    got = np.full([int(d) for d in out.shape], np.nan, "float32")
    f(*args, got)
    np.testing.assert_allclose(got, ref(*args), rtol=1e-4, atol=1e-4)
