"""softmax, log_softmax, layer_norm, instance_norm and batch_norm_inference against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from tests.support.helpers import check, run_te


def _rand(shape: tuple, dtype: str = "float32", lo: float = -3, hi: float = 3) -> np.ndarray:
    return np.random.default_rng().uniform(lo, hi, shape).astype(dtype)


def _softmax(a: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(axis: int, target: str) -> None:
    x = te.placeholder((3, 1, 7) if axis != 1 else (2, 5, 3), name="x")
    a = _rand(tuple(x.shape)) * 20  # large values: the max shift must keep exp finite
    got = run_te([ops.softmax(x, axis), ops.log_softmax(x, axis)], {x: a}, target)
    a64 = a.astype(np.float64)
    check(got[0], _softmax(a64, axis))
    check(got[1], np.log(_softmax(a64, axis)), atol=1e-4)


def test_softmax_float16(target: str) -> None:
    x = te.placeholder((4, 9), dtype="float16", name="x")
    a = _rand((4, 9), "float16")
    (got,) = run_te(ops.softmax(x), {x: a}, target)
    check(got, _softmax(a.astype(np.float64), -1), "float16")


@pytest.mark.parametrize("shape,axis", [((2, 3, 8), -1), ((3, 4, 5), (1, 2)), ((5, 1, 4), 0)])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape: tuple, axis, affine: bool, target: str) -> None:  # noqa: ANN001
    axes = tuple(sorted(a % len(shape) for a in ((axis,) if isinstance(axis, int) else axis)))
    pshape = tuple(shape[d] for d in axes)
    x, g, b = (te.placeholder(shape, name="x"), te.placeholder(pshape, name="g"),
               te.placeholder(pshape, name="b"))
    a = _rand(shape) + 5.0  # a mean far from 0 checks the two-pass variance
    gv, bv = _rand(pshape), _rand(pshape)
    out = ops.layer_norm(x, g if affine else None, b if affine else None, axis, eps=1e-3)
    a64 = a.astype(np.float64)
    mean = a64.mean(axis=axes, keepdims=True)
    var = a64.var(axis=axes, keepdims=True)
    want = (a64 - mean) / np.sqrt(var + 1e-3)
    if affine:
        view = tuple(s if d in axes else 1 for d, s in enumerate(shape))
        want = want * gv.reshape(view) + bv.reshape(view)
    (got,) = run_te(out, {x: a, g: gv, b: bv} if affine else {x: a}, target)
    check(got, want, atol=1e-4)


def test_instance_norm(target: str) -> None:
    x, g, b = (te.placeholder((2, 3, 4, 5), name="x"), te.placeholder((3,), name="g"),
               te.placeholder((3,), name="b"))
    a, gv, bv = _rand((2, 3, 4, 5)), _rand((3,)), _rand((3,))
    (got,) = run_te(ops.instance_norm(x, g, b, eps=1e-5), {x: a, g: gv, b: bv}, target)
    a64 = a.astype(np.float64)
    m, v = a64.mean(axis=(2, 3), keepdims=True), a64.var(axis=(2, 3), keepdims=True)
    check(got, (a64 - m) / np.sqrt(v + 1e-5) * gv[:, None, None] + bv[:, None, None], atol=1e-4)


@pytest.mark.parametrize("shape,axis", [((2, 3, 4, 5), 1), ((4, 6), -1), ((3, 5, 2), 1)])
def test_batch_norm_inference(shape: tuple, axis: int, target: str) -> None:
    c = shape[axis]
    x = te.placeholder(shape, name="x")
    params = [te.placeholder((c,), name=n) for n in ("gamma", "beta", "mean", "var")]
    a = _rand(shape)
    gv, bv, mv = _rand((c,)), _rand((c,)), _rand((c,))
    vv = _rand((c,), lo=0.1, hi=2.0)
    out = ops.batch_norm_inference(x, *params, eps=1e-4, axis=axis)
    (got,) = run_te(out, {x: a, **dict(zip(params, [gv, bv, mv, vv]))}, target)
    view = tuple(c if d == axis % len(shape) else 1 for d in range(len(shape)))
    want = (a.astype(np.float64) - mv.reshape(view)) / np.sqrt(vv.reshape(view) + 1e-4) \
        * gv.reshape(view) + bv.reshape(view)
    check(got, want)


def P(shape: tuple, **kw) -> te.Tensor:  # noqa: N802, ANN003
    return te.placeholder(shape, **kw)


@pytest.mark.parametrize("build,words", [
    (lambda: ops.softmax(P((2, 3)), axis=2), ["softmax", "axis 2"]),
    (lambda: ops.softmax(P((2, 3), dtype="int32")), ["softmax", "int32"]),
    (lambda: ops.layer_norm(P((2, 3, 4), name="x"), P((3,), name="g"), None, axis=-1),
     ["layer_norm", "gamma", "(3,)", "(4,)"]),
    (lambda: ops.layer_norm(P((2, 3, 4)), None, P((4,), dtype="float16"), axis=-1),
     ["layer_norm", "beta", "float16"]),
    (lambda: ops.batch_norm_inference(P((2, 3, 4)), P((3,)), P((3,)), P((4,)), P((3,))),
     ["batch_norm_inference", "mean", "(4,)", "(3,)"]),
    (lambda: ops.batch_norm_inference(P((2, 3, 4)), P((3,)), P((3,)), P((3,)), None),
     ["batch_norm_inference", "var", "required"]),
    (lambda: ops.instance_norm(P((2, 3)), P((3,)), P((3,))), ["instance_norm", "(2, 3)"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
