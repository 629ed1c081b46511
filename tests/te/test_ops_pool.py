"""Pooling against a numpy reference that walks every window explicitly."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from autosched.te.ops import pool
from tests.support.helpers import check, run_te


def _pair(v) -> tuple[int, int]:  # noqa: ANN001
    return (v, v) if isinstance(v, int) else tuple(v)


def _pads(p) -> tuple[int, int, int, int]:  # noqa: ANN001
    if isinstance(p, int):
        return (p,) * 4
    return tuple(p) * 2 if len(p) == 2 else tuple(p)


def _out_size(n: int, k: int, s: int, d: int, pb: int, pe: int, ceil: bool) -> int:
    eff = d * (k - 1) + 1
    if ceil:
        out = int(np.ceil((n + pb + pe - eff) / s)) + 1
        if (out - 1) * s >= n + pb:  # the last window must start inside the input or pad
            out -= 1
        return out
    return (n + pb + pe - eff) // s + 1


def pool_ref(x: np.ndarray, kind: str, k, s, p, d, ceil: bool, include_pad: bool) -> np.ndarray:  # noqa: ANN001
    (kh, kw), (sh, sw), (dh, dw) = _pair(k), _pair(s), _pair(d)
    t, left, b, r = _pads(p)
    n, c, h, w = x.shape
    oh, ow = _out_size(h, kh, sh, dh, t, b, ceil), _out_size(w, kw, sw, dw, left, r, ceil)
    out = np.zeros((n, c, oh, ow))
    for y in range(oh):
        for xx in range(ow):
            rows = [y * sh - t + i * dh for i in range(kh)]
            cols = [xx * sw - left + j * dw for j in range(kw)]
            vals = [x[:, :, i, j].astype(np.float64) for i in rows for j in cols
                    if 0 <= i < h and 0 <= j < w]
            if kind == "max":
                out[:, :, y, xx] = np.max(vals, axis=0)
                continue
            if include_pad:
                count = sum(1 for i in rows for j in cols
                            if -t <= i < h + b and -left <= j < w + r)
            else:
                count = len(vals)
            out[:, :, y, xx] = np.sum(vals, axis=0) / count
    return out


CASES = [  # (shape, pool, stride, padding, dilation, ceil_mode)
    ((1, 2, 7, 9), 3, 2, 1, 1, False),
    ((2, 3, 8, 5), (2, 3), (2, 1), (1, 0, 0, 2), 1, False),
    ((1, 2, 7, 7), 2, 2, 0, 1, True),
    ((1, 1, 9, 10), 3, 3, (1, 2), 1, True),
    ((1, 3, 9, 8), (3, 2), 1, (2, 1), (2, 3), False),
    ((2, 1, 5, 6), 2, (3, 2), (1, 1, 0, 0), 1, True),
    ((1, 2, 4, 4), 4, 1, 0, 1, False),
    # max: rows first (SEPARABLE_TAPS), as YOLO's SPP windows; padded, strided, dilated, ceil
    ((1, 3, 13, 13), 13, 1, 6, 1, False),
    ((2, 2, 9, 9), 5, 1, 2, 1, False),
    ((1, 2, 11, 12), (4, 5), (2, 3), (1, 2, 2, 1), (2, 1), True),
]


@pytest.mark.parametrize("shape,k,s,p,d,ceil", CASES)
def test_max_pool2d(shape, k, s, p, d, ceil: bool, target: str) -> None:  # noqa: ANN001
    x = te.placeholder(shape, name="x")
    a = np.random.default_rng().standard_normal(shape).astype("float32") - 3  # all negative-ish
    out = ops.max_pool2d(x, k, s, p, d, ceil_mode=ceil)
    want = pool_ref(a, "max", k, s, p, d, ceil, False)
    assert tuple(out.shape) == want.shape and out.op.tag == "pool_max"
    taps = np.prod(np.broadcast_to(k, 2))
    rows = [t.op.name for t in out.op.input_tensors]
    assert ("pool_max_rows" in rows) == (taps >= pool.SEPARABLE_TAPS), rows
    (got,) = run_te(out, {x: a}, target)
    check(got, want)


@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("shape,k,s,p,d,ceil", CASES)
def test_avg_pool2d(shape, k, s, p, d, ceil: bool, include_pad: bool, target: str) -> None:  # noqa: ANN001
    x = te.placeholder(shape, name="x")
    a = np.random.default_rng().uniform(0.5, 1.5, shape).astype("float32")
    out = ops.avg_pool2d(x, k, s, p, d, ceil_mode=ceil, count_include_pad=include_pad)
    want = pool_ref(a, "avg", k, s, p, d, ceil, include_pad)
    assert tuple(out.shape) == want.shape
    (got,) = run_te(out, {x: a}, target)
    check(got, want)


def test_pool_nhwc_and_int(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((1, 7, 6, 3), name="x")
    q = te.placeholder((1, 2, 7, 6), dtype="int8", name="q")
    a = rng.standard_normal((1, 7, 6, 3)).astype("float32")
    qa = rng.integers(-128, 127, (1, 2, 7, 6)).astype("int8")
    outs = [ops.max_pool2d(x, 3, 2, 1, layout="NHWC"), ops.avg_pool2d(x, 2, 2, layout="NHWC"),
            ops.max_pool2d(q, 2, 2, 1)]
    got = run_te(outs, {x: a, q: qa}, target)
    nchw = a.transpose(0, 3, 1, 2)
    check(got[0], pool_ref(nchw, "max", 3, 2, 1, 1, False, False).transpose(0, 2, 3, 1))
    check(got[1], pool_ref(nchw, "avg", 2, 2, 0, 1, False, False).transpose(0, 2, 3, 1))
    check(got[2], pool_ref(qa, "max", 2, 2, 1, 1, False, False).astype("int8"), "int8")


def test_global_pools(target: str) -> None:
    x = te.placeholder((2, 3, 5, 7), name="x")
    y = te.placeholder((1, 4, 3, 2), name="y")
    rng = np.random.default_rng()
    a = rng.standard_normal((2, 3, 5, 7)).astype("float32")
    b = rng.standard_normal((1, 4, 3, 2)).astype("float32")
    outs = [ops.global_avg_pool2d(x), ops.global_max_pool2d(x),
            ops.global_avg_pool2d(y, layout="NHWC")]
    got = run_te(outs, {x: a, y: b}, target)
    check(got[0], a.mean(axis=(2, 3), keepdims=True))
    check(got[1], a.max(axis=(2, 3), keepdims=True))
    check(got[2], b.mean(axis=(1, 2), keepdims=True))


def P(shape: tuple, **kw) -> te.Tensor:  # noqa: N802, ANN003
    return te.placeholder(shape, **kw)


@pytest.mark.parametrize("build,words", [
    (lambda: ops.max_pool2d(P((1, 2, 3, 3)), 5), ["max_pool2d", "larger", "3"]),
    (lambda: ops.max_pool2d(P((1, 2, 5, 5)), 3, padding=3), ["max_pool2d", "padding",
                                                              "smaller"]),
    (lambda: ops.avg_pool2d(P((1, 2, 5, 5)), 0), ["avg_pool2d", "pool_size", ">= 1"]),
    (lambda: ops.avg_pool2d(P((1, 2, 5, 5), dtype="int32"), 2), ["avg_pool2d", "int32"]),
    (lambda: ops.max_pool2d(P((2, 5, 5)), 2), ["max_pool2d", "4-d", "(2, 5, 5)"]),
    (lambda: ops.max_pool2d(P((1, 2, 5, 5)), 2, layout="NCWH"), ["max_pool2d", "NCWH"]),
    (lambda: ops.global_avg_pool2d(P((1, 2, 5))), ["global_avg_pool2d", "4-d"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
