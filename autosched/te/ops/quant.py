"""Linear quantization (ONNX QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the
integer parts of QLinearMatMul / QLinearConv / MatMulInteger / ConvInteger).

``q = saturate(round(x / scale) + zero_point)``, ``x = (q - zero_point) * scale``; rounding is
half to even. A parameter (scale or zero point) is a tensor of one value (any rank), one value
per index of ``axis`` (1-d), or, blocked, x's rank with ``axis`` divided into blocks of
``block`` elements.

Example::

    from autosched import te
    from autosched.te.ops import quant
    x = te.placeholder((4, 6), name="x")
    s = te.placeholder((6,), name="s")
    z = te.placeholder((6,), dtype="uint8", name="z")
    q = quant.quantize(x, s, z, axis=1)             # uint8 (4, 6)
    y = quant.dequantize(q, s, z, axis=1)           # float32 (4, 6)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr, cast
from autosched.te.ops import args
from autosched.te.ops.reduction import max as reduce_max
from autosched.te.ops.reduction import min as reduce_min
from autosched.te.ops.tags import BROADCAST
from autosched.te.ops.transform import reshape
from autosched.te.tensor import MATERIALIZE, Tensor, compute, reduce_axis


def param(p: Tensor, index: Sequence[Expr], axis: int, block: int = 0) -> Expr:
    """The element of parameter ``p`` that applies at ``index`` of the quantized tensor."""
    if args.prod(args.static_shape(p, "quantize")) == 1:
        return p[(0,) * p.ndim]
    if p.ndim == 1 and not block:
        return p[index[axis]]
    if p.ndim == len(index) and block:
        return p[tuple(I.floordiv(v, block) if d == axis else v for d, v in enumerate(index))]
    raise TEError(f"quantize: parameter {p.name} {p.shape} is neither one value, one per index "
                  f"of axis {axis}, nor blocked (block size {block})")


def check_param(p: Tensor | None, shape: Sequence[int], axis: int, block: int, op: str) -> None:
    """A parameter's shape must fit one of the three forms (a one-line error naming it)."""
    if p is None:
        return
    ps = args.static_shape(p, op)
    n = args.prod(ps)
    ok = n == 1 or (len(ps) == 1 and not block and ps[0] == shape[axis]) or (
        block > 0 and len(ps) == len(shape) and all(
            (a == -(-b // block)) if d == axis else a == b
            for d, (a, b) in enumerate(zip(ps, shape))))
    if not ok:
        raise TEError(f"{op}: {p.name} {tuple(ps)} does not fit input {tuple(shape)} along "
                      f"axis {axis}" + (f" with block size {block}" if block else ""))


def saturate(v: Expr, dtype: str) -> Expr:
    """Float ``v`` clamped to ``dtype``'s range and converted (v is already integral)."""
    info = np.iinfo(dtype)
    return cast(dtype, I.min(I.max(v, float(info.min)), float(info.max)))


def quantize(x: Tensor, scale: Tensor, zero_point: Tensor | None, axis: int = 1,
             block: int = 0, out_dtype: str = "uint8") -> Tensor:
    """saturate(round(x / scale) + zero_point) as ``out_dtype`` (the zero point's dtype)."""
    args.tensor(x, "quantize")
    args.float_dtype(x, "quantize")
    ax = args.axis(axis, max(x.ndim, 1), "quantize") if x.ndim else 0
    shape = args.static_shape(x, "quantize")
    for p in (scale, zero_point):
        check_param(p, shape, ax, block, "quantize")
    if not dt.is_int(out_dtype):
        raise TEError(f"quantize: output dtype must be an integer type, got {out_dtype}")

    def body(*i: Expr) -> Expr:
        s = param(scale, i, ax, block)
        v = x[i] if x.dtype == "float32" else cast("float32", x[i])
        q = I.round(v / (s if s.dtype == "float32" else cast("float32", s)))
        if zero_point is not None:
            q = q + cast("float32", param(zero_point, i, ax, block))
        return saturate(q, out_dtype)

    return compute(x.shape, body, name="T_quantize", tag=BROADCAST)


def dequantize(x: Tensor, scale: Tensor, zero_point: Tensor | None, axis: int = 1,
               block: int = 0) -> Tensor:
    """(x - zero_point) * scale in the scale's dtype."""
    args.tensor(x, "dequantize")
    ax = args.axis(axis, max(x.ndim, 1), "dequantize") if x.ndim else 0
    shape = args.static_shape(x, "dequantize")
    for p in (scale, zero_point):
        check_param(p, shape, ax, block, "dequantize")
    out = scale.dtype

    def body(*i: Expr) -> Expr:
        v = cast("int32", x[i])
        if zero_point is not None:
            v = v - cast("int32", param(zero_point, i, ax, block))
        return cast(out, v) * param(scale, i, ax, block)

    return compute(x.shape, body, name="T_dequantize", tag=BROADCAST)


def shift(x: Tensor, zero_point: Tensor | None, axis: int) -> Tensor:
    """x - zero_point as int32 (the operand of an integer matmul or convolution)."""
    def body(*i: Expr) -> Expr:
        v = cast("int32", x[i])
        return v if zero_point is None else v - cast("int32", param(zero_point, i, axis))

    return compute(x.shape, body, name="T_shift", tag=BROADCAST)


def requantize(acc: Tensor, multiplier: Tensor, zero_point: Tensor | None, axis: int,
               out_dtype: str, bias: Tensor | None = None) -> Tensor:
    """saturate(round((acc + bias) * multiplier) + zero_point): an int32 accumulator back to
    ``out_dtype``; ``multiplier`` (float32) and ``bias`` (int32) per index of ``axis``."""
    def body(*i: Expr) -> Expr:
        a = acc[i] if bias is None else acc[i] + param(bias, i, axis)
        q = I.round(cast("float32", a) * param(multiplier, i, axis))
        if zero_point is not None:
            q = q + cast("float32", param(zero_point, i, axis))
        return saturate(q, out_dtype)

    return compute(acc.shape, body, name="T_requantize", tag=BROADCAST)


def dynamic_quantize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """ONNX DynamicQuantizeLinear: uint8 data, its scale (range including 0 over 255) and
    zero point, all from x's min and max. An all-zero x has scale 1 (as onnxruntime: the
    formula's 0 would make every quotient NaN)."""
    args.tensor(x, "dynamic_quantize")
    if x.dtype != "float32":
        raise TEError(f"dynamic_quantize: input {x.name} must be float32, got {x.dtype}")
    # over the flat tensor: one reduce loop, which the CPU default splits into vector partials
    flat = reshape(x, (args.prod(args.static_shape(x, "dynamic_quantize")),))
    lo, hi = reduce_min(flat), reduce_max(flat)

    def range_over_255() -> Expr:
        top, bottom = I.max(hi[()], 0.0), I.min(lo[()], 0.0)
        return I.if_then_else(top == bottom, 1.0, (top - bottom) / 255.0)

    scale = compute((), range_over_255, name="T_dq_scale", tag=BROADCAST)
    zp = compute((), lambda: saturate(I.round(0.0 - I.min(lo[()], 0.0) / scale[()]), "uint8"),
                 name="T_dq_zero_point", tag=BROADCAST)
    return quantize(x, scale, zp, 0, 0, "uint8"), scale, zp


def matmul_dot4(a: Tensor, packed: Tensor) -> Tensor:
    """sum_k int32(a[..., m, k]) * int32(b[k, n]) for a of shape (..., M, K), K a multiple of
    4, and b given packed in column panels of P columns, (N / P, K / 4, P, 4)
    (``packed[n // P, k // 4, n % P, k % 4] == b[k, n]``): the reduction over k as k // 4 and
    k % 4, whose (n, k % 4) nest is a CPU's 8-bit dot product (tensor intrinsic kind "dot": a
    uint8, b int8, or uint8 for aarch64's udot) and plain code elsewhere. A register tile then reads each panel as one
    stream (ddddocr's 8.4 MB weight: 1.13 ms in the model as (K / 4, N, 4), strided); attrs
    ``{"panel": P}`` keep the tile rule's vectors inside the panels, as panel_matmul's."""
    k_ext = args.static_shape(a, "matmul_dot4")[-1]
    count, groups, p, four = args.static_shape(packed, "matmul_dot4")
    if four != 4 or k_ext != 4 * groups:
        raise TEError(f"matmul_dot4: {packed.name} {tuple(packed.shape)} is no "
                      f"(N / P, K / 4, P, 4) packing of a K of {k_ext}")
    ko = reduce_axis((0, groups), name="ko")
    q = reduce_axis((0, 4), name="q")
    return compute((*a.shape[:-1], count * p), lambda *i: R.sum(
        cast("int32", a[(*i[:-1], ko * 4 + q)])
        * cast("int32", packed[I.floordiv(i[-1], p), ko, I.floormod(i[-1], p), q]),
        axis=[ko, q]), name="T_dot4", attrs={"panel": p})


def conv2d_dot4(x: Tensor, x_zero: Tensor | None, weight: Tensor, w_zero: Tensor | None,
                taps: Tensor, pads: Sequence[int], lanes: int = 16,
                strides: Sequence[int] = (1, 1), x_dtype: str = "int8") -> Tensor:
    """ConvInteger, one group: sum over (c, kh, kw) of (x - x_zero) * (w - w_zero) as int32
    for uint8 NCHW ``x`` (one zero point), as 8-bit dot products (matmul_dot4's form, its
    ``lanes`` output columns of a row):

        sum (x - zx)(w - zw) = sum x' w - zw sum x' + (s - zx) sum (w - zw),  x' = x - s

    where x' is ``x_dtype``: int8 (s = 128: x86's vpdpbusd, aarch64's usdot) or uint8 (s = 0:
    aarch64's udot).

    ``weight``: (O, C4, KH, KW, 4) uint8, the channels in groups of 4 (an int8 weight plus
    128, its zero point too; channels past C hold the zero point: they add nothing);
    ``w_zero``: (O,) int32 or None; ``taps``: (O,) int32, sum (w - zw) per output channel.
    x' is stored padded (``pads``: top, left, bottom, right; padding holds zx - s, so that
    x - zx is 0 there), its channels in groups of 4 adjacent, rows past the output's width
    rounded up to ``lanes`` (those columns are computed and never stored); the sums of x'
    per window, which a weight zero point needs, as each pixel's channel sum first. With a column
    stride s over 1 its columns are stored in s phases, column ``w`` at ``[w % s, w // s]``:
    the lanes of one tap then read adjacent groups again."""
    n_, c, h, w = args.static_shape(x, "conv2d_dot4")
    o, c4, kh, kw, four = args.static_shape(weight, "conv2d_dot4")
    if four != 4 or c4 * 4 < c or -(-c // 4) != c4:
        raise TEError(f"conv2d_dot4: weight {weight.name} {tuple(weight.shape)} is no "
                      f"(O, C / 4, KH, KW, 4) packing of {c} channels")
    pt, pl, pb, pr = pads
    sh, sw = strides
    oh, ow = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    wide = -(-ow // lanes) * lanes
    if x_dtype not in ("int8", "uint8"):
        raise TEError(f"conv2d_dot4: x' is stored as int8 or uint8, not {x_dtype}")
    zx: Expr = cast("int32", x_zero[(0,) * x_zero.ndim]) if x_zero is not None else cast(
        "int32", 0)
    s = 128 if x_dtype == "int8" else 0

    def shifted(b: Expr, g: Expr, i: Expr, j: Expr, q: Expr) -> Expr:
        ch, ih, iw = g * 4 + q, i - pt, j - pl
        inside = I.all(ch < c, ih >= 0, ih < h, iw >= 0, iw < w)
        pad = I.if_then_else(ch < c, zx - s, cast("int32", 0))
        return cast(x_dtype, I.if_then_else(inside, cast("int32", x[b, ch, ih, iw]) - s, pad))

    rows, cols = (oh - 1) * sh + kh, wide + (kw - 1) // sw
    if sw == 1:
        xp = compute((n_, c4, rows, cols, 4), shifted, name="T_dot4_input",
                     attrs={MATERIALIZE: 1})
    else:
        xp = compute((n_, c4, rows, sw, cols, 4),
                     lambda b, g, i, ph, j, q: shifted(b, g, i, j * sw + ph, q),
                     name="T_dot4_input", attrs={MATERIALIZE: 1})

    def at(i: Any, j: Any, y: Any, x_: Any) -> tuple[Any, ...]:
        """Where output (i, j)'s tap (y, x_) reads xp: row, then (phase,) column."""
        if sw == 1:
            return i * sh + y, j + x_
        return i * sh + y, I.floormod(x_, sw), j + I.floordiv(x_, sw)

    def window(b: Any, g: Any, i: Any, j: Any, y: Any, x_: Any, q: Any) -> Expr:
        return xp[(b, g, *at(i, j, y, x_), q)]

    rc = reduce_axis((0, c4), name="rc")
    ry, rx = reduce_axis((0, kh), name="ry"), reduce_axis((0, kw), name="rx")
    q = reduce_axis((0, 4), name="q")
    prod = compute((n_, o, oh, wide), lambda b, f, i, j: R.sum(
        cast("int32", weight[f, rc, ry, rx, q]) * cast("int32", window(b, rc, i, j, ry, rx, q)),
        axis=[rc, ry, rx, q]), name="T_dot4")
    sums = None
    if w_zero is not None:  # each window's sum of x': its pixels' channel sums, then the taps
        sc, sq = reduce_axis((0, c4), name="sc"), reduce_axis((0, 4), name="sq")
        pixels = compute((n_, *xp.shape[2:-1]), lambda b, *p: R.sum(
            cast("int32", xp[(b, sc, *p, sq)]), axis=[sc, sq]), name="T_dot4_pixel_sums")
        sy, sx = reduce_axis((0, kh), name="sy"), reduce_axis((0, kw), name="sx")
        sums = compute((n_, oh, wide), lambda b, i, j: R.sum(
            pixels[(b, *at(i, j, sy, sx))], axis=[sy, sx]), name="T_dot4_sums")

    def body(b: Expr, f: Expr, i: Expr, j: Expr) -> Expr:
        v: Expr = prod[b, f, i, j] + (s - zx) * taps[f]
        return v if sums is None or w_zero is None else v - w_zero[f] * sums[b, i, j]

    return compute((n_, o, oh, ow), body, name="T_int_conv", tag=BROADCAST)


def folded_matmul(a: Tensor, b: Tensor, columns: int, a_zero: Tensor | None,
                  b_zero: Tensor | None, column_term: Tensor | None) -> Tensor:
    """sum_k (a - a_zero)(b - b_zero) as int32, for a (..., M, K) and a 2-d b (K, N') whose
    first ``columns`` columns are the operand (the rest pad the rows of b to whole vectors;
    they are computed and never stored), or b packed for matmul_dot4 (4-d). The zero points
    come out of the sum:

        sum_k (a - za)(b - zb) = sum_k a b - zb sum_k a + za (K zb - sum_k b)

    so the inner loop multiplies the widened integers themselves (no subtraction per product),
    and only the row sums of a are computed beside it. ``a_zero``: one value or one per row
    (M); ``b_zero``: one value or one per column; ``column_term`` (N', int32): K zb - sum_k b,
    computed ahead of time for a constant b (None when a has no zero point)."""
    for t in (a, b):
        if not dt.is_int(t.dtype) or dt.nbytes(t.dtype) > 2:
            raise TEError(f"folded_matmul: {t.name} must hold 8- or 16-bit integers, got "
                          f"{t.dtype}")
    from autosched.te.ops.matmul import matmul

    prod = (matmul_dot4(a, b) if b.ndim == 4
            else matmul(shift(a, None, 0), shift(b, None, 0)))
    k_ext = args.static_shape(a, "folded_matmul")[-1]
    row_sum = None
    if b_zero is not None:
        k = reduce_axis((0, k_ext), name="k")
        row_sum = compute(a.shape[:-1], lambda *i: R.sum(cast("int32", a[(*i, k)]), axis=k),
                          name="T_row_sum")
    shape = (*prod.shape[:-1], columns)

    def body(*i: Expr) -> Expr:
        v: Expr = prod[i]
        if row_sum is not None and b_zero is not None:
            v = v - cast("int32", param(b_zero, i, len(i) - 1)) * row_sum[i[:-1]]
        if a_zero is not None and column_term is not None:
            v = v + cast("int32", param(a_zero, i, len(i) - 2)) * column_term[i[-1]]
        return v

    return compute(shape, body, name="T_int_matmul", tag=BROADCAST)
