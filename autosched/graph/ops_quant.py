"""Converters of the quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

The integer products subtract the zero points into int32 operands and reuse the MatMul and
Conv converters (int32 accumulation); QLinear* requantize the accumulator with the multiplier
a_scale * b_scale / y_scale, computed in float32 as onnxruntime does."""

from __future__ import annotations

import numpy as np

from autosched.graph.graph import DOT4, KERNEL_LAYOUT, Node
from autosched.graph.ops import (
    ConvertContext,
    Value,
    fail,
    optional,
    register,
    required,
    shape_of,
    tensor_input,
)
from autosched.graph.ops_math import onnx_dtype
from autosched.graph.ops_nn import conv
from autosched.te import ops
from autosched.te.expr import Expr, cast
from autosched.te.ops import quant
from autosched.te.tensor import Tensor, compute
from autosched.tir.tensor_intrin import TENSOR_INTRINS, TensorIntrin


def _tensor(ctx: ConvertContext, v: Value | None) -> Tensor | None:
    return None if v is None else ctx.const(v)


def _size(v: Value) -> int:
    return int(np.prod(shape_of(v)))


def _axis(node: Node, ndim: int, params: list[Value | None]) -> int:
    """The quantization axis; it only matters (and must be in range) for a parameter with
    more than one value."""
    a = int(node.attrs.get("axis", 1))
    if -ndim <= a < ndim:
        return a % ndim
    if all(p is None or _size(p) == 1 for p in params):
        return 0
    raise fail(node, f"axis {a} is out of range for rank {ndim}")


@register("QuantizeLinear")
def _quantize(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    zp = optional(ins, 2)
    if zp is not None:
        out = str(zp.dtype)
    elif int(node.attrs.get("output_dtype", 0)):
        out = onnx_dtype(int(node.attrs["output_dtype"]))
    else:
        out = "uint8"
    return [quant.quantize(x, tensor_input(ctx, node, ins, 1), _tensor(ctx, zp),
                           _axis(node, x.ndim, ins[1:3]), int(node.attrs.get("block_size", 0)),
                           out)]


@register("DequantizeLinear")
def _dequantize(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    y = quant.dequantize(x, tensor_input(ctx, node, ins, 1), _tensor(ctx, optional(ins, 2)),
                         _axis(node, x.ndim, ins[1:3]),
                         int(node.attrs.get("block_size", 0)))
    out = int(node.attrs.get("output_dtype", 0))
    if out and onnx_dtype(out) != y.dtype:
        raise fail(node, f"output_dtype {onnx_dtype(out)} differs from the scale's {y.dtype}")
    return [y]


@register("DynamicQuantizeLinear")
def _dynamic_quantize(node: Node, ins: list[Value | None], ctx: ConvertContext
                      ) -> list[Value]:
    return list(quant.dynamic_quantize(tensor_input(ctx, node, ins, 0)))


def _operand(ctx: ConvertContext, x: Value, zp: Value | None, axis_from_end: int) -> Tensor:
    """x - zero point as int32; a 1-d zero point runs along ``axis_from_end`` of x."""
    t = ctx.const(x)
    z = _tensor(ctx, zp)
    return quant.shift(t, z, t.ndim - axis_from_end if t.ndim else 0)


# float32 holds every integer below 2**24 exactly: a sum of products of 8-bit differences
# (each at most 255 in magnitude) that stays under it is exact in any order, FMAs included.
EXACT_FLOAT_SUM = 2**24


def _exact_in_float(shifted: np.ndarray) -> bool:
    """Whether every partial sum of a convolution by ``shifted`` (OIHW, w - w_zero) of 8-bit
    data minus its zero point stays an integer float32 holds exactly."""
    taps = np.abs(shifted.astype("int64")).reshape(shifted.shape[0], -1).sum(axis=1)
    return int(taps.max(initial=0)) * 255 < EXACT_FLOAT_SUM


def _int_conv(node: Node, x: Tensor, w: Value, w_zero: Value | None, ctx: ConvertContext
              ) -> Tensor:
    """The convolution of int32 ``x`` (its zero point already subtracted) by ``w - w_zero``
    (one zero point, or one per output channel), as int32. A constant weight and zero point
    are subtracted ahead of time, and where no partial sum can leave float32's exact
    integers (_exact_in_float) the convolution runs as a float one (one FMA per tap instead
    of an integer multiply and add), its weight stored channels-last where a float Conv's
    would be (passes.packing_pays); otherwise the shifted weight is int16 (it holds any
    difference of 8-bit values)."""
    attrs = {k: v for k, v in node.attrs.items() if k in (
        "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}
    as_conv = Node(node.name, "Conv", node.inputs[:2], node.outputs[:1], attrs)
    if not (isinstance(w, np.ndarray) and w.ndim == 4 and w.dtype.itemsize == 1
            and (w_zero is None or isinstance(w_zero, np.ndarray))):
        wt = quant.shift(ctx.const(w), _tensor(ctx, w_zero), 0)
        return conv(as_conv, x, wt, None, ctx)
    zw = 0 if w_zero is None else np.asarray(w_zero, "int16").reshape(-1, 1, 1, 1)
    shifted = (w.astype("int16") - zw).astype("int16")
    if not _exact_in_float(shifted):
        return conv(as_conv, x, quant.shift(ctx.const(shifted), None, 0), None, ctx)
    xf = compute(x.shape, lambda *i: cast("float32", x[i]), name="T_float")
    weight = shifted.astype("float32")
    y = conv(as_conv, xf, ctx.const(weight), None, ctx)
    from autosched.graph.passes import packing_pays  # passes imports the converters

    if int(attrs.get("group", 1)) == 1 and packing_pays(as_conv, w, shape_of(y)):
        as_conv.attrs = {**attrs, KERNEL_LAYOUT: "IHWO"}
        ihwo = np.asarray(weight.transpose(1, 2, 3, 0), order="C")
        y = conv(as_conv, xf, ctx.const(ihwo), None, ctx)
    return compute(y.shape, lambda *i: cast("int32", y[i]), name="T_exact_int")


# Columns of a constant integer B are padded to a multiple of this (the int32 lanes of an
# AVX-512 vector) when N is not one, so every register tile is whole vectors: ddddocr's
# 20 x 1024 x 8210 product took 9.0 ms with tiles of 10 columns, 2.0 ms over 8224.
COLUMN_PAD = 16


def _padded_columns(n: int) -> int:
    """Columns a constant B is stored with: n, or n rounded up to COLUMN_PAD where that
    costs under a tenth more work."""
    up = -(-n // COLUMN_PAD) * COLUMN_PAD
    return up if (up - n) * 10 < n else n


def packs_dot4(b: np.ndarray, a_shape: tuple[int, ...], lanes: int) -> bool:
    """Whether a constant B of an integer matmul with A of ``a_shape`` can be stored packed
    for int8 dot products (passes.dot4_products): 8-bit, 2-d, K a multiple of 4, its columns
    in panels of whole vectors of ``lanes`` (passes.panel_columns)."""
    from autosched.graph.passes import panel_columns  # passes imports the converters

    return (b.ndim == 2 and b.dtype in (np.uint8, np.int8) and len(a_shape) >= 1
            and a_shape[-1] == b.shape[0] and b.shape[0] % 4 == 0
            and panel_columns(b.shape[1], lanes) is not None)


def _dot(node: Node) -> TensorIntrin | None:
    """The 8-bit dot product passes.dot4_products marked ``node`` for, if any."""
    name = node.attrs.get(DOT4)
    return TENSOR_INTRINS[name] if isinstance(name, str) else None


def _integer_matmul(ctx: ConvertContext, a: Value, b: Value, a_zero: Value | None,
                    b_zero: Value | None, dot: TensorIntrin | None = None) -> Tensor:
    """sum_k (a - a_zero)(b - b_zero) as int32 (numpy matmul's broadcasting); A's zero point
    runs along its rows (axis -2), B's along its columns (axis -1). A constant 2-d B with
    constant zero points gets quant.folded_matmul: zero points out of the inner loop, the
    columns padded to whole vectors. With ``dot`` (passes.dot4_products) B is stored as the
    intrinsic's ``b_dtype`` (a uint8 B and its zero point less 128 as int8, an int8 one plus
    128 as uint8: the same differences) packed for quant.matmul_dot4."""
    folds = isinstance(b, np.ndarray) and b.ndim == 2 and b.dtype.itemsize == 1 and (
        b_zero is None or isinstance(b_zero, np.ndarray)) and shape_of(a)[-1] == b.shape[0]
    if not folds:
        return ops.matmul(_operand(ctx, a, a_zero, 2), _operand(ctx, b, b_zero, 1))
    assert isinstance(b, np.ndarray)
    k, n = b.shape
    zb = np.zeros(n, "int64") if b_zero is None else np.broadcast_to(
        np.asarray(b_zero, "int64").reshape(-1), (n,))
    lanes = dot.n if dot is not None else 0
    dot4 = dot is not None and packs_dot4(b, shape_of(a), lanes)
    if dot4 and dot is not None and b.dtype != dot.b_dtype:
        shift = 128 if dot.b_dtype == "uint8" else -128
        b, zb = (b.astype("int16") + shift).astype(dot.b_dtype), zb + shift
        b_zero = zb.astype("int16")
    from autosched.graph.passes import panel_columns, zero_padded_columns  # passes imports us

    width = panel_columns(n, lanes) if dot4 else None
    padded = zero_padded_columns(b, -(-n // width) * width if width else _padded_columns(n))
    term = np.zeros(padded.shape[1], "int32")
    term[:n] = k * zb - b.sum(axis=0, dtype="int64")
    if width:  # (N' / P, K / 4, P, 4): panels of P columns, each column's taps by 4
        padded = np.asarray(padded.reshape(k // 4, 4, -1, width).transpose(2, 0, 3, 1),
                            order="C")
    return quant.folded_matmul(
        ctx.const(a), ctx.const(padded), n, _tensor(ctx, a_zero),
        None if not zb.any() else ctx.const(np.asarray(b_zero)),
        None if a_zero is None else ctx.const(term))


@register("MatMulInteger")
def _matmul_integer(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [_integer_matmul(ctx, required(node, ins, 0), required(node, ins, 1),
                            optional(ins, 2), optional(ins, 3), _dot(node))]


@register("ConvInteger")
def _conv_integer(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [_conv_product(node, required(node, ins, 0), required(node, ins, 1),
                          optional(ins, 2), optional(ins, 3), ctx)]


def _conv_product(node: Node, x: Value, w: Value, x_zero: Value | None, w_zero: Value | None,
                  ctx: ConvertContext) -> Tensor:
    """The int32 convolution of ConvInteger / QLinearConv: as int8 dot products where
    passes.dot4_products marked the node, else by _int_conv."""
    dot = _dot(node)
    if dot is not None and isinstance(w, np.ndarray):
        return _dot4_conv(node, x, w, x_zero, w_zero, dot, ctx)
    return _int_conv(node, _operand(ctx, x, x_zero, 1), w, w_zero, ctx)


def packs_conv_dot4(node: Node, w: np.ndarray, x_shape: tuple[int, ...]) -> bool:
    """Whether a ConvInteger of a uint8 x of ``x_shape`` by constant ``w`` can run as int8 dot
    products (passes.dot4_products): 2-d, one group, dilation 1, pads not negative, an 8-bit
    weight."""
    ones = [1, 1]
    return (w.ndim == 4 and len(x_shape) == 4 and w.dtype in (np.uint8, np.int8)
            and int(node.attrs.get("group", 1)) == 1 and x_shape[1] == w.shape[1]
            and len(node.attrs.get("strides", ones)) == 2
            and list(node.attrs.get("dilations", ones)) == ones
            and min(node.attrs.get("pads", [0])) >= 0)


def _dot4_conv(node: Node, x: Value, w: np.ndarray, x_zero: Value | None,
               w_zero: Value | None, dot: TensorIntrin, ctx: ConvertContext) -> Tensor:
    """ConvInteger as quant.conv2d_dot4 for the dot product ``dot``: the weight as uint8 (an
    int8 one and its zero point plus 128: the same differences), its channels in groups of 4
    padded with the zero point; x as ``dot``'s per-lane dtype."""
    from autosched.graph.ops_nn import _pads

    o, c, kh, kw = w.shape
    zw = np.zeros(o, "int64") if w_zero is None else np.broadcast_to(
        np.asarray(w_zero, "int64").reshape(-1), (o,))
    wu = w.astype("int64")
    if w.dtype == np.int8:
        wu, zw = wu + 128, zw + 128
    c4 = -(-c // 4)
    full = np.empty((o, c4 * 4, kh, kw), "int64")
    full[:, :c] = wu
    full[:, c:] = zw[:, None, None, None]
    packed = np.asarray(full.reshape(o, c4, 4, kh, kw).transpose(0, 1, 3, 4, 2), "uint8",
                        order="C")
    taps = (wu - zw[:, None, None, None]).reshape(o, -1).sum(axis=1).astype("int32")
    h, wd = shape_of(x)[2:]
    strides = [int(v) for v in node.attrs.get("strides", [1, 1])]
    begins, ends = _pads(node, [h, wd], [kh, kw], strides, [1, 1])
    return quant.conv2d_dot4(
        ctx.const(x), _tensor(ctx, x_zero), ctx.const(packed),
        ctx.const(zw.astype("int32")) if zw.any() else None, ctx.const(taps),
        (begins[0], begins[1], ends[0], ends[1]), dot.n, strides, dot.b_dtype)


def _multiplier(ctx: ConvertContext, a_scale: Value, b_scale: Value, y_scale: Value) -> Tensor:
    """a_scale * b_scale / y_scale in float32 (b_scale may hold one value per column or output
    channel)."""
    vals = [a_scale, b_scale, y_scale]
    arrays = [np.asarray(v, "float32").reshape(-1) for v in vals if isinstance(v, np.ndarray)]
    if len(arrays) == len(vals):
        a, b, y = arrays
        return ctx.const((a * b / y).astype("float32"))
    ta, tb, ty = (ctx.const(v) for v in vals)
    n = _size(tb)

    def at(t: Tensor, k: Expr) -> Expr:
        v = t[(0,) * t.ndim] if _size(t) == 1 else t[(k,)]
        return v if t.dtype == "float32" else cast("float32", v)

    return compute((n,), lambda k: at(ta, k) * at(tb, k) / at(ty, k), name="T_multiplier")


def _scales(node: Node, ins: list[Value | None], ctx: ConvertContext) -> Tensor:
    """The QLinear ops' requantization multiplier from inputs 1, 4 and 6."""
    return _multiplier(ctx, *(required(node, ins, pos) for pos in (1, 4, 6)))


@register("QLinearMatMul")
def _qlinear_matmul(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    acc = _integer_matmul(ctx, required(node, ins, 0), required(node, ins, 3), ins[2], ins[5],
                          _dot(node))
    mult = _scales(node, ins, ctx)
    zp = required(node, ins, 7)
    return [quant.requantize(acc, mult, ctx.const(zp), acc.ndim - 1, str(zp.dtype))]


@register("QLinearConv")
def _qlinear_conv(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    acc = _conv_product(node, required(node, ins, 0), required(node, ins, 3), ins[2],
                        required(node, ins, 5), ctx)
    mult = _scales(node, ins, ctx)
    zp = required(node, ins, 7)
    bias = _tensor(ctx, optional(ins, 8))
    return [quant.requantize(acc, mult, ctx.const(zp), 1, str(zp.dtype), bias)]
