"""resize2d against a numpy implementation of the ONNX Resize formulas.

The reference builds one interpolation matrix per spatial dim (rows: output positions, columns:
input positions, entries: weights) and applies both with einsum; coordinates follow the ONNX
formula with exact rationals when the scale is n_out / n_in (resize2d is exact there), in float32
when a float scale is given.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from autosched import te
from autosched.errors import TEError
from autosched.te import ops
from tests.support.helpers import check, run_te

F = np.float32


def _coord(n_in: int, n_out: int, scale: float | None, mode: str) -> list[float]:
    """ONNX's x_original per output x: exact (Fraction) when the scale is n_out / n_in, in
    float32 when a float scale is given, as the ONNX scales input."""
    if mode == "align_corners":
        return [0.0] * n_out if n_out == 1 else [
            float(Fraction(x * (n_in - 1), n_out - 1)) for x in range(n_out)]
    if mode == "pytorch_half_pixel" and n_out == 1:
        return [0.0]
    if scale is None:
        ratio = Fraction(n_in, n_out)
        if mode == "asymmetric":
            return [float(x * ratio) for x in range(n_out)]
        shift = Fraction(0) if mode == "tf_half_pixel_for_nn" else Fraction(1, 2)
        return [float((x + Fraction(1, 2)) * ratio - shift) for x in range(n_out)]
    x = np.arange(n_out).astype(F)
    s = F(scale)
    if mode == "asymmetric":
        return list(x / s)
    if mode == "tf_half_pixel_for_nn":
        return list((x + F(0.5)) / s)
    return list((x + F(0.5)) / s - F(0.5))


def _keys(s: np.ndarray, a: float) -> np.ndarray:
    s = np.abs(s)
    near = (a + 2) * s**3 - (a + 3) * s**2 + 1
    far = a * s**3 - 5 * a * s**2 + 8 * a * s - 4 * a
    return np.where(s <= 1, near, np.where(s < 2, far, 0.0))


def interp_matrix(n_in: int, n_out: int, scale: float | None, mode: str, method: str,
                  rounding: str) -> np.ndarray:
    c = _coord(n_in, n_out, scale, mode)
    m = np.zeros((n_out, n_in))
    for y, v in enumerate(c):
        if method == "nearest":
            r = {"round_prefer_floor": np.ceil(v - 0.5), "round_prefer_ceil": np.floor(v + 0.5),
                 "floor": np.floor(v), "ceil": np.ceil(v)}[rounding]
            m[y, int(np.clip(r, 0, n_in - 1))] = 1
        elif method == "linear":
            v = min(max(v, 0.0), n_in - 1.0)
            lo = int(np.floor(v))
            m[y, lo] += 1 - (v - lo)
            m[y, min(lo + 1, n_in - 1)] += v - lo
        else:
            base = int(np.floor(v))
            for k in (-1, 0, 1, 2):
                m[y, min(max(base + k, 0), n_in - 1)] += _keys(np.array(v - (base + k)), -0.75)
    return m


def resize_ref(a: np.ndarray, size: tuple, mode: str, method: str, rounding: str,
               scales: tuple | None = None) -> np.ndarray:
    _, _, h, w = a.shape
    sh, sw = scales if scales is not None else (None, None)
    my = interp_matrix(h, size[0], sh, mode, method, rounding)
    mx = interp_matrix(w, size[1], sw, mode, method, rounding)
    return np.einsum("yh,nchw,xw->ncyx", my, a.astype(np.float64), mx)


MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
SIZES = [((5, 7), (10, 3)), ((4, 4), (1, 9)), ((6, 3), (4, 8))]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("in_hw,out_hw", SIZES)
def test_linear(mode: str, in_hw: tuple, out_hw: tuple, target: str) -> None:
    x = te.placeholder((2, 3, *in_hw), name="x")
    a = np.random.default_rng().standard_normal((2, 3, *in_hw)).astype("float32")
    out = ops.resize2d(x, out_hw, method="linear", coordinate_transformation_mode=mode)
    (got,) = run_te(out, {x: a}, target)
    check(got, resize_ref(a, out_hw, mode, "linear", ""), atol=1e-5)


@pytest.mark.parametrize("rounding", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("mode", MODES + ["tf_half_pixel_for_nn"])
@pytest.mark.parametrize("in_hw,out_hw", SIZES[:2] + [((2, 3), (4, 6))])
def test_nearest(mode: str, rounding: str, in_hw: tuple, out_hw: tuple, target: str) -> None:
    x = te.placeholder((1, 2, *in_hw), dtype="int32", name="x")
    a = np.random.default_rng().integers(-100, 100, (1, 2, *in_hw)).astype("int32")
    out = ops.resize2d(x, out_hw, method="nearest", coordinate_transformation_mode=mode,
                       rounding_method=rounding)
    (got,) = run_te(out, {x: a}, target)
    check(got, np.rint(resize_ref(a, out_hw, mode, "nearest", rounding)).astype("int32"), "int32")


@pytest.mark.parametrize("mode", ["half_pixel", "align_corners"])
def test_cubic(mode: str, target: str) -> None:
    x = te.placeholder((1, 2, 4, 5), name="x")
    a = np.random.default_rng().standard_normal((1, 2, 4, 5)).astype("float32")
    out = ops.resize2d(x, (7, 3), method="cubic", coordinate_transformation_mode=mode)
    (got,) = run_te(out, {x: a}, target)
    check(got, resize_ref(a, (7, 3), mode, "cubic", ""), atol=1e-5)


def test_scales_nhwc_float16(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((1, 3, 5, 2), name="x")  # NHWC
    h = te.placeholder((1, 2, 3, 3), dtype="float16", name="h")
    a = rng.standard_normal((1, 3, 5, 2)).astype("float32")
    hv = rng.standard_normal((1, 2, 3, 3)).astype("float16")
    outs = [ops.resize2d(x, None, layout="NHWC", scales=(2.5, 0.5), method="bilinear"),
            ops.resize2d(h, (5, 4), method="linear")]
    assert tuple(outs[0].shape) == (1, 7, 2, 2)
    got = run_te(outs, {x: a, h: hv}, target)
    want = resize_ref(a.transpose(0, 3, 1, 2), (7, 2), "half_pixel", "linear", "",
                      scales=(2.5, 0.5)).transpose(0, 2, 3, 1)
    check(got[0], want, atol=1e-5)
    check(got[1], resize_ref(hv, (5, 4), "half_pixel", "linear", ""), "float16")


@pytest.mark.parametrize("build,words", [
    (lambda: ops.resize2d(te.placeholder((1, 2, 3, 3)), (4, 4), method="area"),
     ["resize2d", "method", "area"]),
    (lambda: ops.resize2d(te.placeholder((1, 2, 3, 3)), (4, 4),
                          coordinate_transformation_mode="half"), ["resize2d", "half"]),
    (lambda: ops.resize2d(te.placeholder((1, 2, 3, 3), dtype="int32"), (4, 4)),
     ["resize2d", "int32"]),
    (lambda: ops.resize2d(te.placeholder((2, 3, 3)), (4, 4)), ["resize2d", "4-d"]),
    (lambda: ops.resize2d(te.placeholder((1, 2, 3, 3)), (0, 4)), ["resize2d", "size"]),
    (lambda: ops.resize2d(te.placeholder((1, 2, 3, 3)), None, scales=(0.1, 1.0)),
     ["resize2d", "empty"]),
])
def test_errors(build, words: list[str]) -> None:  # noqa: ANN001
    with pytest.raises(TEError) as err:
        build()
    for w in words:
        assert w in str(err.value), (w, str(err.value))
