"""Converters of the quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

The integer products subtract the zero points into int32 operands and reuse the MatMul and
Conv converters (int32 accumulation); QLinear* requantize the accumulator with the multiplier
a_scale * b_scale / y_scale, computed in float32 as onnxruntime does."""

from __future__ import annotations

import numpy as np

from autosched.graph.graph import Node
from autosched.graph.ops import CONVERTERS, ConvertContext, Value, fail, register
from autosched.graph.ops_math import onnx_dtype
from autosched.te.expr import cast
from autosched.te.ops import quant
from autosched.te.tensor import Tensor, compute


def _opt(ins: list[Value | None], pos: int) -> Value | None:
    return ins[pos] if len(ins) > pos else None


def _tensor(ctx: ConvertContext, v: Value | None) -> Tensor | None:
    return None if v is None else ctx.const(v)


def _axis(node: Node, ndim: int, params: list[Value | None]) -> int:
    """The quantization axis; it only matters (and must be in range) for a parameter with
    more than one value."""
    a = int(node.attrs.get("axis", 1))
    if -ndim <= a < ndim:
        return a % ndim
    if all(p is None or int(np.prod(p.shape)) == 1 for p in params):
        return 0
    raise fail(node, f"axis {a} is out of range for rank {ndim}")


@register("QuantizeLinear")
def _quantize(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = ctx.const(ins[0])
    zp = _opt(ins, 2)
    if zp is not None:
        out = str(zp.dtype)
    elif int(node.attrs.get("output_dtype", 0)):
        out = onnx_dtype(int(node.attrs["output_dtype"]))
    else:
        out = "uint8"
    return [quant.quantize(x, ctx.const(ins[1]), _tensor(ctx, zp), _axis(node, x.ndim, ins[1:3]),
                           int(node.attrs.get("block_size", 0)), out)]


@register("DequantizeLinear")
def _dequantize(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = ctx.const(ins[0])
    y = quant.dequantize(x, ctx.const(ins[1]), _tensor(ctx, _opt(ins, 2)),
                         _axis(node, x.ndim, ins[1:3]),
                         int(node.attrs.get("block_size", 0)))
    out = int(node.attrs.get("output_dtype", 0))
    if out and onnx_dtype(out) != y.dtype:
        raise fail(node, f"output_dtype {onnx_dtype(out)} differs from the scale's {y.dtype}")
    return [y]


@register("DynamicQuantizeLinear")
def _dynamic_quantize(node: Node, ins: list[Value | None], ctx: ConvertContext
                      ) -> list[Value]:
    return list(quant.dynamic_quantize(ctx.const(ins[0])))


def _operand(ctx: ConvertContext, x: Value, zp: Value | None, axis_from_end: int) -> Tensor:
    """x - zero point as int32; a 1-d zero point runs along ``axis_from_end`` of x."""
    t = ctx.const(x)
    z = _tensor(ctx, zp)
    return quant.shift(t, z, t.ndim - axis_from_end if t.ndim else 0)


def _int_matmul(node: Node, a: Tensor, b: Tensor, ctx: ConvertContext) -> Tensor:
    mm = Node(node.name, "MatMul", node.inputs[:1] + node.inputs[3:4], node.outputs[:1], {})
    (y,) = CONVERTERS["MatMul"](mm, [a, b], ctx)
    return y


def _int_conv(node: Node, x: Tensor, w: Tensor, ctx: ConvertContext) -> Tensor:
    attrs = {k: v for k, v in node.attrs.items() if k in (
        "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}
    conv = Node(node.name, "Conv", node.inputs[:2], node.outputs[:1], attrs)
    (y,) = CONVERTERS["Conv"](conv, [x, w], ctx)
    return y


@register("MatMulInteger")
def _matmul_integer(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    # A's zero point runs along its rows (axis -2), B's along its columns (axis -1)
    a = _operand(ctx, ins[0], _opt(ins, 2), 2)
    b = _operand(ctx, ins[1], _opt(ins, 3), 1)
    return [_int_matmul(node, a, b, ctx)]


@register("ConvInteger")
def _conv_integer(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = _operand(ctx, ins[0], _opt(ins, 2), 1)
    w = ctx.const(ins[1])
    w = quant.shift(w, _tensor(ctx, _opt(ins, 3)), 0)   # one zero point per output channel
    return [_int_conv(node, x, w, ctx)]


def _multiplier(ctx: ConvertContext, a_scale: Value, b_scale: Value, y_scale: Value) -> Tensor:
    """a_scale * b_scale / y_scale in float32 (b_scale may hold one value per column or output
    channel)."""
    vals = [a_scale, b_scale, y_scale]
    if all(isinstance(v, np.ndarray) for v in vals):
        a, b, y = (np.asarray(v, "float32").reshape(-1) for v in vals)
        return ctx.const((a * b / y).astype("float32"))
    a, b, y = (ctx.const(v) for v in vals)
    n = int(np.prod(b.shape))

    def at(t: Tensor, k: object) -> object:
        v = t[(0,) * t.ndim] if int(np.prod(t.shape)) == 1 else t[(k,)]
        return v if t.dtype == "float32" else cast("float32", v)

    return compute((n,), lambda k: at(a, k) * at(b, k) / at(y, k), name="T_multiplier")


@register("QLinearMatMul")
def _qlinear_matmul(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    a = _operand(ctx, ins[0], ins[2], 2)
    b = _operand(ctx, ins[3], ins[5], 1)
    acc = _int_matmul(node, a, b, ctx)
    mult = _multiplier(ctx, ins[1], ins[4], ins[6])
    zp = ins[7]
    return [quant.requantize(acc, mult, ctx.const(zp), acc.ndim - 1, str(zp.dtype))]


@register("QLinearConv")
def _qlinear_conv(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = _operand(ctx, ins[0], ins[2], 1)
    w = quant.shift(ctx.const(ins[3]), ctx.const(ins[5]), 0)
    acc = _int_conv(node, x, w, ctx)
    mult = _multiplier(ctx, ins[1], ins[4], ins[6])
    zp = ins[7]
    bias = _tensor(ctx, _opt(ins, 8))
    return [quant.requantize(acc, mult, ctx.const(zp), 1, str(zp.dtype), bias)]
