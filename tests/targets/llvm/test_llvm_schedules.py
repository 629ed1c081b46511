"""Random valid schedules of a matmul and a conv2d, built through LLVM and compared with numpy.

A seeded generator draws splits (non-dividing factors included), reorders, fuses, vectorize of
the innermost axis, parallel of the outermost, unroll, cache_write "local" + compute_at and
compute_inline of the padding; a draw that a primitive rejects (ScheduleError / LowerError) is
replaced by the next one. Shapes are small (and include size-1 dims) to keep the run short.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import LowerError, ScheduleError

N_SCHEDULES = 210
FACTORS = [1, 2, 3, 4, 5, 7, 8, 16]


def _spatial(stage, axes=None):
    return [a for a in (axes if axes is not None else stage.leaf) if a.kind != "reduce"]


def _const_extent(iv) -> int | None:
    ext = iv.dom.extent
    return ext.value if isinstance(ext, te.expr.Const) else None  # type: ignore[attr-defined]


def _tweak_loops(r: random.Random, stage, allow_reduce_split: bool = True) -> None:
    """Splits, a reorder, maybe a fuse, then vectorize / parallel / unroll on one stage."""
    for ax in list(stage.leaf):
        if (ax.kind != "reduce" or allow_reduce_split) and r.random() < 0.6:
            stage.split(ax, factor=r.choice(FACTORS))
    leaf = list(stage.leaf)
    if r.random() < 0.6:
        r.shuffle(leaf)
        stage.reorder(*leaf)
    leaf = list(stage.leaf)
    if len(leaf) >= 2 and r.random() < 0.3:
        k = r.randrange(len(leaf) - 1)
        if leaf[k].kind != "reduce" and leaf[k + 1].kind != "reduce":
            stage.fuse(leaf[k], leaf[k + 1])
    leaf = list(stage.leaf)
    inner = leaf[-1]
    if inner.kind != "reduce" and _const_extent(inner) and r.random() < 0.7:
        stage.vectorize(inner)
    outer = leaf[0]
    if len(leaf) > 1 and outer.kind != "reduce" and r.random() < 0.5:
        stage.parallel(outer)
    middle = [a for a in leaf[1:-1] if (_const_extent(a) or 99) <= 16]
    if middle and r.random() < 0.5:
        stage.unroll(r.choice(middle))


def _attach_cache(r: random.Random, s, out, cached) -> None:
    """compute_at the local cache at a random spatial loop of the output (or leave it at root),
    then tweak its own loops with the reduction outside the vectorized axis."""
    spatial = _spatial(s[out])
    if spatial and r.random() < 0.8:
        s[cached].compute_at(s[out], r.choice(spatial))
    st = s[cached]
    red = [a for a in st.leaf if a.kind == "reduce"]
    for ax in red:
        if r.random() < 0.4:
            st.split(ax, factor=r.choice(FACTORS))
    red = [a for a in st.leaf if a.kind == "reduce"]
    sp = [a for a in st.leaf if a.kind != "reduce"]
    r.shuffle(sp)
    st.reorder(*(red + sp))
    if sp and _const_extent(sp[-1]) and r.random() < 0.7:
        st.vectorize(sp[-1])
    if len(sp) > 1 and (_const_extent(sp[-2]) or 99) <= 16 and r.random() < 0.5:
        st.unroll(sp[-2])


def random_matmul(r: random.Random):
    M, N, K = (r.choice([1, 5, 8, 13, 19]) for _ in range(3))
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    cached = s.cache_write(C, "local") if r.random() < 0.5 else None
    _tweak_loops(r, s[C], allow_reduce_split=cached is None)
    if cached is not None:
        _attach_cache(r, s, C, cached)
    return s, [A, B, C]


def random_conv(r: random.Random):
    ci, h, w, co = r.choice([1, 3, 4]), r.choice([1, 5, 7]), r.choice([4, 6, 9]), r.choice([2, 5, 8])
    A = te.placeholder((1, ci, h, w), name="A")
    W = te.placeholder((co, ci, 3, 3), name="W")
    P = te.compute(
        (1, ci, h + 2, w + 2),
        lambda n, c, y, x: te.if_then_else(
            te.all(y >= 1, y < h + 1, x >= 1, x < w + 1), A[n, c, y - 1, x - 1], 0.0),
        name="P")
    rc = te.reduce_axis((0, ci), name="rc")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    Out = te.compute(
        (1, co, h, w),
        lambda n, f, y, x: te.sum(P[n, rc, y + ry, x + rx] * W[f, rc, ry, rx], axis=[rc, ry, rx]),
        name="Out")
    s = te.create_schedule(Out.op)
    if r.random() < 0.5:
        s[P].compute_inline()
    elif r.random() < 0.5:
        _tweak_loops(r, s[P])
    cached = s.cache_write(Out, "local") if r.random() < 0.5 else None
    _tweak_loops(r, s[Out], allow_reduce_split=cached is None)
    if cached is not None:
        _attach_cache(r, s, Out, cached)
    return s, [A, W, Out]


def _conv_ref(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    _, ci, h, wd = a.shape
    p = np.pad(a.astype("float64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, w.shape[0], h, wd))
    for ry in range(3):
        for rx in range(3):
            out[0] += np.einsum("fc,cyx->fyx", w[:, :, ry, rx], p[0, :, ry:ry + h, rx:rx + wd])
    return out


def _valid_schedules(make, seed: int):
    """Yield (trial seed, schedule, args, module) for N_SCHEDULES schedules that build."""
    r = random.Random(seed)
    made = tried = 0
    while made < N_SCHEDULES:
        tried += 1
        assert tried < 4 * N_SCHEDULES, f"only {made} of {tried} random schedules were valid"
        trial = r.randrange(1 << 30)
        try:
            s, args = make(random.Random(trial))
            mod = aus.build(s, args, target="llvm")
        except (ScheduleError, LowerError):
            continue
        made += 1
        yield trial, s, args, mod


def _check(mod, s, args, ins, want, trial) -> None:
    out = np.full(tuple(int(d) for d in args[-1].shape), np.nan, "float32")
    mod(*ins, out)
    try:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    except AssertionError:
        pytest.fail(f"trial seed {trial} mismatches numpy; schedule:\n{s.to_python()}\n"
                    f"{aus.lower(s, args)}")


def test_random_matmul_schedules():
    rng = np.random.default_rng()
    for trial, s, args, mod in _valid_schedules(random_matmul, seed=1):
        A, B, _ = args
        a = rng.uniform(-1, 1, tuple(int(d) for d in A.shape)).astype("float32")
        b = rng.uniform(-1, 1, tuple(int(d) for d in B.shape)).astype("float32")
        _check(mod, s, args, [a, b], a.astype("float64") @ b.astype("float64"), trial)


def test_random_conv2d_schedules():
    rng = np.random.default_rng()
    for trial, s, args, mod in _valid_schedules(random_conv, seed=2):
        A, W, _ = args
        a = rng.uniform(-1, 1, tuple(int(d) for d in A.shape)).astype("float32")
        w = rng.uniform(-1, 1, tuple(int(d) for d in W.shape)).astype("float32")
        _check(mod, s, args, [a, w], _conv_ref(a, w), trial)
