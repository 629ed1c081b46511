"""Image resizing: resize2d with nearest, linear (bilinear) and cubic interpolation, as ONNX
Resize defines them (opset 11+), for NCHW (default) or NHWC data.

For each output coordinate x (per spatial dim, input size n_in, output size n_out, scale =
n_out / n_in unless ``scales`` gives it) the source coordinate is, by
``coordinate_transformation_mode``:

* ``half_pixel``            (x + 0.5) / scale - 0.5
* ``pytorch_half_pixel``    as half_pixel, but 0 when n_out == 1
* ``align_corners``         x * (n_in - 1) / (n_out - 1), 0 when n_out == 1
* ``asymmetric``            x / scale
* ``tf_half_pixel_for_nn``  (x + 0.5) / scale

Coordinates are computed in float32. ``nearest`` rounds the coordinate by ``rounding_method``
(``round_prefer_floor``: halves go down, ONNX's default; ``round_prefer_ceil``; ``floor``;
``ceil``) and clamps it into the input. ``linear`` clamps the coordinate into [0, n_in - 1] and
blends the two neighbours (the same as ONNX's edge handling). ``cubic`` uses Keys' kernel with
coefficient ``cubic_alpha`` (ONNX default -0.75) over four neighbours, edges repeated
(exclude_outside=0). Linear and cubic interpolate in float32 and need float data.

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((1, 3, 5, 7), name="x")
    y = ops.resize2d(x, (10, 3), method="linear", coordinate_transformation_mode="align_corners")
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te.expr import Expr, cast, const
from autosched.te.ops import args
from autosched.te.ops.tags import INJECTIVE
from autosched.te.tensor import Tensor, compute

MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
         "tf_half_pixel_for_nn")
ROUNDING = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
METHODS = ("nearest", "linear", "bilinear", "cubic")
F32 = "float32"


def source_coord(x: Expr, n_in: int, n_out: int, scale: float | None, mode: str) -> Expr:
    """The float32 input coordinate that output index ``x`` samples.

    Without an explicit ``scale`` the ratio n_in / n_out is applied as one integer product and
    one division ((2x + 1) * n_in / (2 n_out) for half_pixel), so a coordinate that is exactly
    an integer or a half in exact arithmetic is exactly that in float32 and in float64, and
    nearest rounding agrees across backends (dividing by a rounded float scale does not)."""
    xf = cast(F32, x)
    if mode == "align_corners":
        return const(0.0, F32) if n_out == 1 else xf * float(n_in - 1) / float(n_out - 1)
    if mode == "pytorch_half_pixel" and n_out == 1:
        return const(0.0, F32)
    if scale is not None:  # the ONNX formula with the given float scale
        if mode == "asymmetric":
            return xf / scale
        shifted = (xf + 0.5) / scale
        return shifted if mode == "tf_half_pixel_for_nn" else shifted - 0.5
    if mode == "asymmetric":
        return xf * float(n_in) / float(n_out)
    shifted = (xf * 2.0 + 1.0) * float(n_in) / float(2 * n_out)
    return shifted if mode == "tf_half_pixel_for_nn" else shifted - 0.5


def _nearest(c: Expr, n_in: int, rounding: str) -> Expr:
    r = {
        "round_prefer_floor": lambda v: I.ceil(v - 0.5),
        "round_prefer_ceil": lambda v: I.floor(v + 0.5),
        "floor": I.floor,
        "ceil": I.ceil,
    }[rounding](c)
    return I.min(I.max(cast(dt.INDEX, r), 0), n_in - 1)


def _cubic_weights(t: Expr, a: float) -> list[Expr]:
    """Keys' cubic convolution weights of the neighbours at -1, 0, 1, 2 for fraction t."""

    def near(s: Expr) -> Expr:  # |s| <= 1
        return ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0

    def far(s: Expr) -> Expr:  # 1 < |s| < 2
        return ((a * s - 5.0 * a) * s + 8.0 * a) * s - 4.0 * a

    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


def resize2d(
    data: Tensor, size: Sequence[int] | None, layout: str = "NCHW", method: str = "linear",
    coordinate_transformation_mode: str = "half_pixel",
    rounding_method: str = "round_prefer_floor", scales: Sequence[float] | None = None,
    cubic_alpha: float = -0.75,
) -> Tensor:
    """Resize the H and W dims of ``data`` to ``size`` = (out_h, out_w) (or, with size None,
    to floor(in * scales)). ``scales`` = (scale_h, scale_w) replaces n_out / n_in in the
    coordinate formulas, as ONNX's scales input does. Compute ``resize``."""
    op = "resize2d"
    args.tensor(data, op, "data")
    if layout not in ("NCHW", "NHWC"):
        raise TEError(f"{op}: layout must be NCHW or NHWC, got {layout!r}")
    args.ndim_is(data, 4, op, f"data ({layout})")
    for what, value, allowed in (("method", method, METHODS),
                                 ("coordinate_transformation_mode",
                                  coordinate_transformation_mode, MODES),
                                 ("rounding_method", rounding_method, ROUNDING)):
        if value not in allowed:
            raise TEError(f"{op}: {what} must be one of {', '.join(allowed)}, got {value!r}")
    shape = args.static_shape(data, op)
    ha, wa = layout.index("H"), layout.index("W")
    n_in = (shape[ha], shape[wa])
    if scales is not None:
        sc = tuple(float(s) for s in scales)
        if len(sc) != 2 or min(sc) <= 0:
            raise TEError(f"{op}: scales must be two positive numbers, got {scales!r}")
    if size is None:
        if scales is None:
            raise TEError(f"{op}: give size or scales")
        n_out = tuple(int(math.floor(n * s)) for n, s in zip(n_in, sc))
    else:
        n_out = args.int_tuple(size, 2, op, "size")
    if min(n_out) < 1:
        raise TEError(f"{op}: output size {n_out} from input {n_in} is empty")
    given = scales is not None
    if method != "nearest":
        args.float_dtype(data, op)
    mode = coordinate_transformation_mode
    out_shape = tuple(n_out[0] if d == ha else n_out[1] if d == wa else s
                      for d, s in enumerate(shape))

    def read(i: Sequence[Expr], y: Any, x: Any) -> Expr:
        v = data[tuple(y if d == ha else x if d == wa else v for d, v in enumerate(i))]
        return v if v.dtype == F32 or method == "nearest" else cast(F32, v)

    def coords(i: Sequence[Expr]) -> tuple[Expr, Expr]:
        return (source_coord(i[ha], n_in[0], n_out[0], sc[0] if given else None, mode),
                source_coord(i[wa], n_in[1], n_out[1], sc[1] if given else None, mode))

    def nearest(*i: Expr) -> Expr:
        cy, cx = coords(i)
        return read(i, _nearest(cy, n_in[0], rounding_method), _nearest(cx, n_in[1],
                                                                         rounding_method))

    def linear(*i: Expr) -> Expr:
        taps = []
        for c, n in zip(coords(i), n_in):
            c = I.min(I.max(c, 0.0), float(n - 1))
            lo = cast(dt.INDEX, I.floor(c))
            taps.append((lo, I.min(lo + 1, n - 1), c - cast(F32, lo)))
        (y0, y1, wy), (x0, x1, wx) = taps
        top = read(i, y0, x0) * (1.0 - wx) + read(i, y0, x1) * wx
        bottom = read(i, y1, x0) * (1.0 - wx) + read(i, y1, x1) * wx
        return _back(top * (1.0 - wy) + bottom * wy)

    def cubic(*i: Expr) -> Expr:
        taps = []
        for c, n in zip(coords(i), n_in):
            base = I.floor(c)
            lo = cast(dt.INDEX, base)
            weights = _cubic_weights(c - base, float(cubic_alpha))
            rows = [I.min(I.max(lo + k, 0), n - 1) for k in (-1, 0, 1, 2)]
            taps.append(list(zip(rows, weights)))
        out: Any = None
        for y, wy in taps[0]:
            row: Any = None
            for x, wx in taps[1]:
                term = read(i, y, x) * wx
                row = term if row is None else row + term
            out = row * wy if out is None else out + row * wy
        return _back(out)

    def _back(v: Expr) -> Expr:
        return v if data.dtype == F32 else cast(data.dtype, v)

    body = {"nearest": nearest, "linear": linear, "bilinear": linear, "cubic": cubic}[method]
    return compute(out_shape, body, name="resize", tag=INJECTIVE,
                   attrs={"method": "linear" if method == "bilinear" else method,
                          "coordinate_transformation_mode": mode, "layout": layout})
