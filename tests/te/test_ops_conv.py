"""Convolutions against numpy references written over explicitly padded arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from autosched.te.dag import topo_ops
from tests.support.helpers import check, run_te


def _rand(shape: tuple, dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng()
    if dtype.startswith("float"):
        return rng.uniform(-1, 1, shape).astype(dtype)
    return rng.integers(-60, 60, shape).astype(dtype)


def _pads(padding) -> tuple[int, int, int, int]:  # noqa: ANN001
    if isinstance(padding, int):
        return (padding,) * 4
    return tuple(padding) * 2 if len(padding) == 2 else tuple(padding)


def _pair(v) -> tuple[int, int]:  # noqa: ANN001
    return (v, v) if isinstance(v, int) else tuple(v)


def conv_nchw_ref(x: np.ndarray, w: np.ndarray, stride, padding, dilation, groups) -> np.ndarray:  # noqa: ANN001
    """Sum over kernel taps of strided views of the zero-padded input, one group at a time."""
    (sh, sw), (dh, dw) = _pair(stride), _pair(dilation)
    t, left, b, r = _pads(padding)
    x = x.astype(np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)))
    n, c, h, wd = x.shape
    o, ig, kh, kw = w.shape
    oh = (h + t + b - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + left + r - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xs = xp[:, g * ig:(g + 1) * ig]
        for ky in range(kh):
            for kx in range(kw):
                patch = xs[:, :, ky * dh:ky * dh + sh * (oh - 1) + 1:sh,
                           kx * dw:kx * dw + sw * (ow - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, ky, kx].astype(np.float64))
    return out


CASES = [  # (data shape, out channels, kernel hw, stride, padding, dilation, groups)
    ((1, 3, 7, 9), 4, (3, 3), 1, 1, 1, 1),
    ((2, 4, 9, 8), 6, (3, 2), (2, 1), (1, 0), 1, 2),
    ((1, 6, 10, 7), 6, (3, 3), 2, (1, 2, 0, 1), (2, 1), 6),     # depthwise, asymmetric pads
    ((1, 4, 6, 6), 8, (1, 1), 1, 0, 1, 4),                      # depthwise, multiplier 2
    ((1, 2, 5, 11), 3, (2, 4), (1, 3), (0, 2), (2, 2), 1),
    ((3, 1, 4, 4), 1, (4, 4), 1, 0, 1, 1),                      # kernel covers the input
]


@pytest.mark.parametrize("shape,o,k,stride,padding,dilation,groups", CASES)
def test_conv2d_nchw(shape, o, k, stride, padding, dilation, groups, target: str) -> None:  # noqa: ANN001
    x = te.placeholder(shape, name="x")
    w = te.placeholder((o, shape[1] // groups, *k), name="w")
    a, wv = _rand(shape), _rand((o, shape[1] // groups, *k))
    out = ops.conv2d_nchw(x, w, stride, padding, dilation, groups)
    want = conv_nchw_ref(a, wv, stride, padding, dilation, groups)
    assert tuple(out.shape) == want.shape
    (got,) = run_te(out, {x: a, w: wv}, target)
    check(got, want)


@pytest.mark.parametrize("shape,o,k,stride,padding,dilation,groups", CASES[:4])
def test_conv2d_nhwc(shape, o, k, stride, padding, dilation, groups, target: str) -> None:  # noqa: ANN001
    n, c, h, wd = shape
    x = te.placeholder((n, h, wd, c), name="x")
    w = te.placeholder((*k, c // groups, o), name="w")
    a, wv = _rand((n, h, wd, c)), _rand((*k, c // groups, o))
    out = ops.conv2d_nhwc(x, w, stride, padding, dilation, groups)
    want = conv_nchw_ref(a.transpose(0, 3, 1, 2), wv.transpose(3, 2, 0, 1), stride, padding,
                         dilation, groups).transpose(0, 2, 3, 1)
    assert tuple(out.shape) == want.shape
    (got,) = run_te(out, {x: a, w: wv}, target)
    check(got, want)


def test_conv2d_int8_out_int32(target: str) -> None:
    x = te.placeholder((1, 3, 5, 6), dtype="int8", name="x")
    w = te.placeholder((2, 3, 3, 3), dtype="int8", name="w")
    a, wv = _rand((1, 3, 5, 6), "int8"), _rand((2, 3, 3, 3), "int8")
    out = ops.conv2d_nchw(x, w, padding=1, out_dtype="int32")
    (got,) = run_te(out, {x: a, w: wv}, target)
    check(got, conv_nchw_ref(a, wv, 1, 1, 1, 1).astype(np.int32), "int32")


@pytest.mark.parametrize("m,stride,padding", [(1, 1, 1), (2, 2, (0, 1, 1, 0))])
def test_depthwise_conv2d_nchw(m: int, stride, padding, target: str) -> None:  # noqa: ANN001
    x = te.placeholder((2, 3, 7, 6), name="x")
    w = te.placeholder((3, m, 3, 3), name="w")
    a, wv = _rand((2, 3, 7, 6)), _rand((3, m, 3, 3))
    out = ops.depthwise_conv2d_nchw(x, w, stride, padding)
    want = conv_nchw_ref(a, wv.reshape(3 * m, 1, 3, 3), stride, padding, 1, 3)
    assert out.op.tag == "depthwise_conv2d_nchw"
    (got,) = run_te(out, {x: a, w: wv}, target)
    check(got, want)


def conv_transpose_ref(x: np.ndarray, w: np.ndarray, stride, padding, output_padding, groups,
                       dilation) -> np.ndarray:  # noqa: ANN001
    """The scatter definition: every input pixel adds kernel * value into the full output,
    which is then cropped by the padding."""
    (sh, sw), (dh, dw), (oph, opw) = _pair(stride), _pair(dilation), _pair(output_padding)
    t, left, b, r = _pads(padding)
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    oh = (h - 1) * sh - t - b + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - left - r + dw * (kw - 1) + opw + 1
    full = np.zeros((n, og * groups, t + oh + sh + dh * kh, left + ow + sw + dw * kw))
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg].astype(np.float64)
        for ky in range(kh):
            for kx in range(kw):
                contrib = np.einsum("nchw,cf->nfhw", xs, w[g * cg:(g + 1) * cg, :, ky, kx])
                full[:, g * og:(g + 1) * og, ky * dh:ky * dh + sh * (h - 1) + 1:sh,
                     kx * dw:kx * dw + sw * (wd - 1) + 1:sw] += contrib
    return full[:, :, t:t + oh, left:left + ow]


# shapes that no tile divides, strides 1 to 3 (ragged phases: k % stride != 0), groups up to
# depthwise, dilation coprime with the stride and sharing a factor with it, output_padding,
# padding past a whole phase row, size-1 dims
TRANSPOSE_CASES = [
    ((1, 3, 4, 5), 2, (3, 3), 2, 1, 1, 1, 1),
    ((2, 4, 3, 3), 3, (2, 3), (1, 2), (0, 1, 1, 0), (0, 1), 2, 1),
    ((1, 2, 5, 4), 1, (3, 2), 3, (2, 1), 2, 1, (1, 2)),
    ((1, 2, 3, 4), 2, (3, 3), 1, 0, 0, 1, 2),
    ((1, 5, 7, 9), 3, (3, 3), 2, 1, 1, 1, 1),
    ((2, 6, 5, 6), 4, (4, 5), (3, 2), (2, 1, 0, 3), (2, 1), 3, 1),
    ((1, 4, 6, 5), 2, (3, 2), (2, 3), 0, (1, 0), 2, (2, 1)),
    ((1, 3, 5, 7), 2, (3, 3), (3, 2), 1, 0, 1, (2, 3)),
    ((1, 4, 9, 4), 1, (2, 2), 2, 0, 0, 4, 1),
    ((1, 3, 6, 6), 2, (5, 3), 1, (2, 1, 3, 0), 0, 1, (1, 2)),
    ((1, 2, 4, 4), 3, (3, 3), 2, (3, 2, 2, 3), 1, 1, 1),
    ((1, 2, 1, 3), 2, (1, 2), (2, 3), 0, (1, 2), 1, 1),
    ((1, 24, 7, 11), 5, (2, 2), 2, 0, 0, 1, 1),
]


@pytest.mark.parametrize("shape,og,k,stride,padding,opad,groups,dilation", TRANSPOSE_CASES)
def test_conv2d_transpose_nchw(shape, og, k, stride, padding, opad, groups, dilation,  # noqa: ANN001
                               target: str) -> None:
    check_transpose(shape, og, k, stride, padding, opad, groups, dilation, target)


def test_conv2d_transpose_random_attributes(rng: np.random.Generator, target: str) -> None:
    """Shapes and attributes drawn afresh each run (the seed is printed)."""
    for _ in range(3):
        groups = int(rng.integers(1, 3))
        k, stride, dilation = (tuple(int(v) for v in rng.integers(1, hi, 2))
                               for hi in (5, 4, 3))
        pads = tuple(int(rng.integers(0, k[d % 2])) for d in range(4))
        opad = tuple(int(rng.integers(0, max(stride[d], dilation[d]))) for d in range(2))
        size = tuple(int(rng.integers(pads[d] + pads[d + 2] + 1, 10)) for d in range(2))
        shape = (1, 2 * groups, *size)
        check_transpose(shape, int(rng.integers(1, 4)), k, stride, pads, opad, groups, dilation,
                        target)


def check_transpose(shape, og, k, stride, padding, opad, groups, dilation,  # noqa: ANN001
                    target: str) -> None:
    c = shape[1]
    x = te.placeholder(shape, name="x")
    w = te.placeholder((c, og, *k), name="w")
    a, wv = _rand(shape), _rand((c, og, *k))
    out = ops.conv2d_transpose_nchw(x, w, stride, padding, opad, groups, dilation)
    want = conv_transpose_ref(a, wv, stride, padding, opad, groups, dilation)
    assert tuple(out.shape) == want.shape
    (got,) = run_te(out, {x: a, w: wv}, target)
    check(got, want)


def _stage(t: te.Tensor, name: str) -> Any:
    (found,) = [op for op in topo_ops([t]) if op.name == name]
    return found


@pytest.mark.parametrize("k,stride,dilation,taps", [(2, 2, 1, 1), (3, 2, 1, 2), (4, 2, 1, 2),
                                                    (5, 3, 1, 2), (3, 1, 2, 3), (3, 2, 2, 3),
                                                    (3, 2, 3, 4)])
def test_conv2d_transpose_sums_only_taps_that_reach(k: int, stride: int, dilation: int,
                                                    taps: int) -> None:
    """Each output sums ceil(k / stride) taps per dim, not k: the reduction runs over the taps
    of one phase, with no division of a reduce variable and no condition on the data. (A
    dilation of 3 with stride 2 puts phase 1's tap between phase 0's and is summed over the
    4 offsets that span them.)"""
    x, w = te.placeholder((1, 4, 6, 7), name="x"), te.placeholder((4, 3, k, k), name="w")
    out = ops.conv2d_transpose_nchw(x, w, stride, 0, 0, 1, dilation)
    red = out.op if stride == 1 else _stage(out, "conv2d_transpose_phases")
    assert [int(r.dom.extent.value) for r in red.reduce_axis] == [4, taps, taps]
    assert red.tag == "conv2d_transpose_nchw"
    body = str(red.body)
    assert "%" not in body and "//" not in body and "select" not in body, body
    ragged = stride > 1 and (dilation > 1 or taps * stride != k)
    assert ("select" in str(_stage(out, "kernel_phases").body)) == ragged


def test_conv2d_transpose_stride1_is_one_stage() -> None:
    x, w = te.placeholder((1, 4, 6, 7), name="x"), te.placeholder((4, 3, 3, 3), name="w")
    out = ops.conv2d_transpose_nchw(x, w, 1, 1)
    assert out.op.name == "conv2d_transpose_nchw" and out.op.reduce_axis


def test_conv_stages_and_tags() -> None:
    x, w = te.placeholder((1, 4, 5, 5), name="x"), te.placeholder((4, 2, 3, 3), name="w")
    out = ops.conv2d_nchw(x, w, padding=1, groups=2)
    assert out.op.tag == "group_conv2d_nchw" and out.op.name == "conv2d_nchw"
    (padded,) = out.op.input_tensors[:1]
    assert padded.op.name == "pad_temp" and padded.op.tag == "injective,pad"
    assert dict(out.op.attrs)["groups"] == 2
    plain = ops.conv2d_nchw(x, te.placeholder((3, 4, 3, 3)))
    assert [t.op.name for t in plain.op.input_tensors][0] == "x"  # no pad stage without padding


def P(shape: tuple, **kw) -> te.Tensor:  # noqa: N802, ANN003
    return te.placeholder(shape, **kw)


@pytest.mark.parametrize("build,words", [
    (lambda: ops.conv2d_nchw(P((1, 3, 5, 5)), P((4, 2, 3, 3))),
     ["conv2d_nchw", "2 input channels", "3 channels"]),
    (lambda: ops.conv2d_nchw(P((1, 6, 5, 5)), P((4, 3, 3, 3)), groups=4),
     ["conv2d_nchw", "groups=4", "(6)"]),
    (lambda: ops.conv2d_nchw(P((1, 3, 2, 2)), P((4, 3, 3, 3))), ["conv2d_nchw", "larger",
                                                                 "(2, 2)"]),
    (lambda: ops.conv2d_nchw(P((1, 3, 5, 5)), P((4, 3, 3, 3)), stride=0), ["stride", ">= 1"]),
    (lambda: ops.conv2d_nchw(P((1, 3, 5, 5)), P((4, 3, 3, 3)), padding=(1, 2, 3)),
     ["padding", "(1, 2, 3)"]),
    (lambda: ops.conv2d_nchw(P((3, 5, 5)), P((4, 3, 3, 3))), ["conv2d_nchw", "4-d", "(3, 5, 5)"]),
    (lambda: ops.conv2d_nhwc(P((1, 5, 5, 3)), P((3, 3, 2, 4))), ["conv2d_nhwc", "input channels"]),
    (lambda: ops.conv2d_nchw(P((1, 3, 5, 5)), P((4, 3, 3, 3), dtype="float16")),
     ["conv2d_nchw", "float16"]),
    (lambda: ops.depthwise_conv2d_nchw(P((1, 3, 5, 5)), P((4, 1, 3, 3))),
     ["depthwise_conv2d_nchw", "4 channels", "3"]),
    (lambda: ops.conv2d_transpose_nchw(P((1, 3, 5, 5)), P((3, 2, 3, 3)), stride=2,
                                       output_padding=2),
     ["conv2d_transpose_nchw", "output_padding", "(2, 2)"]),
    (lambda: ops.conv2d_transpose_nchw(P((1, 4, 5, 5)), P((3, 2, 3, 3))),
     ["conv2d_transpose_nchw", "4 channels"]),
    (lambda: ops.conv2d_transpose_nchw(P((1, 4, 5, 5)), P((4, 2, 3, 3)), groups=3),
     ["groups=3"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))


@pytest.mark.parametrize("rows,want", [(112, 114), (56, 60), (28, 30), (14, 15), (7, 7),
                                       (5, 5), (1, 1), (12, 12)])
def test_accumulator_rows_add_factors_of_three(rows: int, want: int) -> None:
    from autosched.te.ops.conv import accumulator_rows

    assert accumulator_rows(rows) == want
