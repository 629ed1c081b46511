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
from autosched.te.tensor import Tensor, compute, reduce_axis


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


def folded_matmul(a: Tensor, b: Tensor, columns: int, a_zero: Tensor | None,
                  b_zero: Tensor | None, column_term: Tensor | None) -> Tensor:
    """sum_k (a - a_zero)(b - b_zero) as int32, for a (..., M, K) and a 2-d b (K, N') whose
    first ``columns`` columns are the operand (the rest pad the rows of b to whole vectors;
    they are computed and never stored). The zero points come out of the sum:

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

    prod = matmul(shift(a, None, 0), shift(b, None, 0))
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
