"""Converters of the quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

The integer products subtract the zero points into int32 operands and reuse the MatMul and
Conv converters (int32 accumulation); QLinear* requantize the accumulator with the multiplier
a_scale * b_scale / y_scale, computed in float32 as onnxruntime does."""

from __future__ import annotations

import numpy as np

from autosched.graph.graph import Node
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


def _int_conv(node: Node, x: Tensor, w: Tensor, ctx: ConvertContext) -> Tensor:
    attrs = {k: v for k, v in node.attrs.items() if k in (
        "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}
    return conv(Node(node.name, "Conv", node.inputs[:2], node.outputs[:1], attrs), x, w, None,
                ctx)


@register("MatMulInteger")
def _matmul_integer(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    # A's zero point runs along its rows (axis -2), B's along its columns (axis -1)
    a = _operand(ctx, required(node, ins, 0), optional(ins, 2), 2)
    b = _operand(ctx, required(node, ins, 1), optional(ins, 3), 1)
    return [ops.matmul(a, b)]


@register("ConvInteger")
def _conv_integer(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = _operand(ctx, required(node, ins, 0), optional(ins, 2), 1)
    w = tensor_input(ctx, node, ins, 1)
    w = quant.shift(w, _tensor(ctx, optional(ins, 3)), 0)   # one zero point per output channel
    return [_int_conv(node, x, w, ctx)]


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
    a = _operand(ctx, required(node, ins, 0), ins[2], 2)
    b = _operand(ctx, required(node, ins, 3), ins[5], 1)
    acc = ops.matmul(a, b)
    mult = _scales(node, ins, ctx)
    zp = required(node, ins, 7)
    return [quant.requantize(acc, mult, ctx.const(zp), acc.ndim - 1, str(zp.dtype))]


@register("QLinearConv")
def _qlinear_conv(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = _operand(ctx, required(node, ins, 0), ins[2], 1)
    w = quant.shift(tensor_input(ctx, node, ins, 3), tensor_input(ctx, node, ins, 5), 0)
    acc = _int_conv(node, x, w, ctx)
    mult = _scales(node, ins, ctx)
    zp = required(node, ins, 7)
    bias = _tensor(ctx, optional(ins, 8))
    return [quant.requantize(acc, mult, ctx.const(zp), 1, str(zp.dtype), bias)]
