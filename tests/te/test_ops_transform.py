"""transpose, reshape, flatten, squeeze, expand_dims, pad, concat, split, strided_slice, take,
gather against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from tests.support.helpers import check, run_te


def _rand(shape: tuple, dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng()
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-100, 100, shape).astype(dtype)


@pytest.mark.parametrize("shape,axes", [((2, 3, 4), (2, 0, 1)), ((5, 1, 3), None),
                                        ((2, 3), (-1, 0)), ((4,), (0,))])
def test_transpose(shape: tuple, axes, target: str) -> None:  # noqa: ANN001
    x = te.placeholder(shape, name="x")
    a = _rand(shape)
    (got,) = run_te(ops.transpose(x, axes), {x: a}, target)
    check(got, np.transpose(a, axes))


@pytest.mark.parametrize("shape,new", [((2, 3, 4), (4, -1)), ((2, 3, 4), (6, 4)),
                                       ((1, 6, 1), (3, 1, 2)), ((3, 5), (-1,)),
                                       ((12,), (2, 1, 3, 2)), ((4, 6), (3, 8)),
                                       ((2, 3, 4, 5), (6, 1, 20))])
def test_reshape(shape: tuple, new: tuple, target: str) -> None:
    x = te.placeholder(shape, dtype="int32", name="x")
    a = _rand(shape, "int32")
    (got,) = run_te(ops.reshape(x, new), {x: a}, target)
    check(got, a.reshape(new), "int32")


def test_flatten_squeeze_expand(target: str) -> None:
    x = te.placeholder((2, 1, 3, 4), name="x")
    a = _rand((2, 1, 3, 4))
    outs = [ops.flatten(x), ops.flatten(x, 0), ops.flatten(x, -1), ops.flatten(x, 4),
            ops.squeeze(x), ops.squeeze(x, 1), ops.expand_dims(x, 0),
            ops.expand_dims(x, (-1, 2))]
    wants = [a.reshape(2, -1), a.reshape(1, -1), a.reshape(-1, 4), a.reshape(-1, 1),
             a.squeeze(), a.squeeze(1), a[None], np.expand_dims(a, (-1, 2))]
    for g, w in zip(run_te(outs, {x: a}, target), wants):
        check(g, w)


def _np_pad(a: np.ndarray, before, after, mode: str, value: float) -> np.ndarray:  # noqa: ANN001
    crop = tuple(slice(-b if b < 0 else 0, n + a_ if a_ < 0 else n)
                 for b, a_, n in zip(before, after, a.shape))
    a = a[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(before, after)]
    if mode == "constant":
        return np.pad(a, widths, constant_values=value)
    return np.pad(a, widths, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
@pytest.mark.parametrize("before,after", [((1, 0, 2), (0, 3, 1)), ((0, 2, 0), None),
                                          ((2, -1, 1), (-1, 1, 0))])
def test_pad(mode: str, before: tuple, after, target: str) -> None:  # noqa: ANN001
    if mode != "constant" and min(before + (after or ())) < 0:
        with pytest.raises(TEError, match="only supported with mode='constant'"):
            ops.pad(te.placeholder((3, 4, 5)), before, after, mode=mode)
        return
    x = te.placeholder((3, 4, 5), name="x")
    a = _rand((3, 4, 5))
    out = ops.pad(x, before, after, value=-2.5, mode=mode)
    assert out.op.tag == "injective,pad"
    (got,) = run_te(out, {x: a}, target)
    check(got, _np_pad(a, before, after if after is not None else before, mode, -2.5))


def test_pad_int(target: str) -> None:
    x = te.placeholder((2, 3), dtype="int8", name="x")
    a = _rand((2, 3), "int8")
    (got,) = run_te(ops.pad(x, (1, 1), (0, 2), value=7), {x: a}, target)
    check(got, np.pad(a, ((1, 0), (1, 2)), constant_values=7), "int8")


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis: int, target: str) -> None:
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    shapes = [tuple(s + k if d == axis % 3 else s for d, s in enumerate(sh))
              for k, sh in enumerate(shapes)]
    xs = [te.placeholder(s, name=f"x{n}") for n, s in enumerate(shapes)]
    arrays = [_rand(s) for s in shapes]
    (got,) = run_te(ops.concat(xs, axis), dict(zip(xs, arrays)), target)
    check(got, np.concatenate(arrays, axis))


def test_concat_one(target: str) -> None:
    x = te.placeholder((3, 2), name="x")
    a = _rand((3, 2))
    (got,) = run_te(ops.concat([x], 1), {x: a}, target)
    check(got, a)


@pytest.mark.parametrize("sections,axis", [(3, 0), ([1, 4], 1), ([2], -1), (1, 2)])
def test_split(sections, axis: int, target: str) -> None:  # noqa: ANN001
    x = te.placeholder((6, 5, 3), name="x")
    a = _rand((6, 5, 3))
    outs = ops.split(x, sections, axis)
    wants = np.split(a, sections, axis)
    assert len(outs) == len(wants)
    for g, w in zip(run_te(outs, {x: a}, target), wants):
        check(g, w)


@pytest.mark.parametrize("begin,end,strides,axes", [
    ((1, 0), (3, 4), None, None),
    ((-1,), (None,), (-1,), (2,)),
    ((4, -2), (0, -100), (-2, -1), (1, 2)),
    ((-100, 1), (100, 6), (3, 2), (0, 2)),
    ((2,), (1,), (-1,), (-3,)),
    ((0, 0, 0), (1, 1, 1), (1, 1, 1), None),
])
def test_strided_slice(begin, end, strides, axes, target: str) -> None:  # noqa: ANN001
    x = te.placeholder((3, 5, 6), name="x")
    a = _rand((3, 5, 6))
    out = ops.strided_slice(x, begin, end, strides, axes)
    index = [slice(None)] * 3
    dims = axes if axes is not None else range(len(begin))
    for n, d in enumerate(dims):
        index[d] = slice(begin[n], end[n], 1 if strides is None else strides[n])
    (got,) = run_te(out, {x: a}, target)
    check(got, a[tuple(index)])


@pytest.mark.parametrize("idx_dtype", ["int32", "int64"])
@pytest.mark.parametrize("axis,ishape", [(0, (4,)), (1, (2, 3)), (-1, ()), (None, (3, 2))])
def test_take(axis, ishape: tuple, idx_dtype: str, target: str) -> None:  # noqa: ANN001
    rng = np.random.default_rng()
    shape = (3, 5, 4)
    x = te.placeholder(shape, name="x")
    i = te.placeholder(ishape, dtype=idx_dtype, name="i")
    n = int(np.prod(shape)) if axis is None else shape[axis]
    a = _rand(shape)
    iv = rng.integers(-n, n, ishape).astype(idx_dtype)  # negatives count from the end
    (got,) = run_te(ops.take(x, i, axis), {x: a, i: iv}, target)
    check(got, np.take(a, iv, axis))


def test_take_modes(target: str) -> None:
    x = te.placeholder((5, 2), name="x")
    i = te.placeholder((6,), dtype="int64", name="i")
    a = _rand((5, 2))
    iv = np.array([-7, -1, 0, 3, 5, 12], dtype="int64")
    got = run_te([ops.take(x, i, 0, mode="clip"), ops.take(x, i, 0, mode="wrap"),
                  ops.take(x, i, 0)], {x: a, i: iv}, target)
    check(got[0], np.take(a, iv, 0, mode="clip"))
    check(got[1], np.take(a, iv, 0, mode="wrap"))
    # normalize: negatives from the end, then clamped (out-of-range is an error in ONNX)
    check(got[2], a[np.clip(np.where(iv < 0, iv + 5, iv), 0, 4)])


@pytest.mark.parametrize("axis,ishape", [(0, (2, 4, 3)), (1, (3, 6, 2)), (-1, (1, 4, 5))])
def test_gather(axis: int, ishape: tuple, target: str) -> None:
    rng = np.random.default_rng()
    shape = (3, 4, 3)
    x = te.placeholder(shape, name="x")
    i = te.placeholder(ishape, dtype="int64", name="i")
    n = shape[axis]
    a = _rand(shape)
    iv = rng.integers(-n, n, ishape).astype("int64")
    (got,) = run_te(ops.gather(x, axis, i), {x: a, i: iv}, target)
    sub = a[tuple(slice(0, s) if d != axis % 3 else slice(None) for d, s in enumerate(ishape))]
    check(got, np.take_along_axis(sub, np.where(iv < 0, iv + n, iv), axis))


def P(shape: tuple, **kw) -> te.Tensor:  # noqa: N802, ANN003
    return te.placeholder(shape, **kw)


@pytest.mark.parametrize("build,words", [
    (lambda: ops.reshape(P((2, 3), name="x"), (4, 2)), ["reshape", "(2, 3)", "(4, 2)", "6"]),
    (lambda: ops.reshape(P((2, 3)), (-1, -1)), ["reshape", "more than one -1"]),
    (lambda: ops.reshape(P((2, 3)), (4, -1)), ["reshape", "(4, -1)"]),
    (lambda: ops.reshape(P((2, 3)), (0, 6)), ["reshape", "(0, 6)", "positive"]),
    (lambda: ops.transpose(P((2, 3, 4)), (0, 1)), ["transpose", "(0, 1)", "permutation"]),
    (lambda: ops.transpose(P((2, 3, 4)), (0, 1, 1)), ["transpose", "(0, 1, 1)"]),
    (lambda: ops.transpose(P((2, 3)), (0, 2)), ["transpose", "axis 2"]),
    (lambda: ops.flatten(P((2, 3)), 3), ["flatten", "axis 3"]),
    (lambda: ops.squeeze(P((2, 1)), 0), ["squeeze", "axis 0", "size 2"]),
    (lambda: ops.pad(P((2, 3)), (1,)), ["pad", "pad_before", "(1,)"]),
    (lambda: ops.pad(P((2, 3)), (0, 3), mode="reflect"), ["pad", "reflect", "(3, 3)"]),
    (lambda: ops.pad(P((2, 3)), (0, 1), mode="wrap"), ["pad", "wrap"]),
    (lambda: ops.pad(P((2, 3)), (0, -2), (0, -1)), ["pad", "empty"]),
    (lambda: ops.concat([P((2, 3)), P((2, 4))], 0), ["concat", "(2, 3)", "(2, 4)", "axis 0"]),
    (lambda: ops.concat([P((2, 3)), P((2, 3), dtype="int32")]), ["concat", "int32"]),
    (lambda: ops.concat([], 0), ["concat", "non-empty"]),
    (lambda: ops.split(P((5, 3)), 2), ["split", "2 sections", "(5, 3)"]),
    (lambda: ops.split(P((5, 3)), [3, 1]), ["split", "[3, 1]"]),
    (lambda: ops.strided_slice(P((4, 5)), (3,), (1,)), ["strided_slice", "empty", "[3:1:1]"]),
    (lambda: ops.strided_slice(P((4, 5)), (0,), (2,), (0,)), ["strided_slice", "stride 0"]),
    (lambda: ops.strided_slice(P((4, 5)), (0, 1), (2,)), ["strided_slice", "begin", "end"]),
    (lambda: ops.take(P((4, 5)), P((2,)), 0), ["take", "integers", "float32"]),
    (lambda: ops.take(P((4, 5)), P((2,), dtype="int32"), 2), ["take", "axis 2"]),
    (lambda: ops.take(P((4, 5)), P((2,), dtype="int32"), 0, mode="raise"), ["take", "raise"]),
    (lambda: ops.gather(P((4, 5)), 0, P((2, 6), dtype="int64")), ["gather", "(2, 6)", "(4, 5)"]),
    (lambda: ops.gather(P((4, 5)), 0, P((2,), dtype="int64")), ["gather", "rank"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
