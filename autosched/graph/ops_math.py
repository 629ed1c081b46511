"""Converters of elementwise ops: activations, arithmetic with broadcasting, comparisons,
logic, Cast, Clip, Where. All-constant inputs are computed in numpy (shape arithmetic folds)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
from autosched.te import intrin as I
from autosched.te import ops
from autosched.te.tensor import Tensor


def all_const(values: list[Any]) -> bool:
    return all(isinstance(v, np.ndarray) for v in values if v is not None)


def onnx_dtype(to: int) -> str:
    """An ONNX TensorProto data type number as a TE dtype name."""
    from onnx import helper

    try:
        name = str(np.dtype(helper.tensor_dtype_to_np_dtype(to)))
    except (KeyError, TypeError):
        name = f"onnx type {to}"
    from autosched.te import dtype as dt

    if name not in dt.ALL_TYPES:
        raise ValueError(f"data type {name} is not supported")
    return name


def _operand(ctx: ConvertContext, v: Value, other: list[Value]) -> Any:
    """A constant of one element whose rank does not exceed the tensors' becomes a literal."""
    if isinstance(v, np.ndarray) and v.size == 1:
        rank = max((t.ndim for t in other if isinstance(t, Tensor)), default=-1)
        if v.ndim <= rank:
            return v.reshape(()).item()
    return ctx.const(v)


# --- unary -----------------------------------------------------------------------------------

_UNARY: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray] | None]] = {
    "Relu": (ops.relu, lambda a: np.maximum(a, 0).astype(a.dtype)),
    "Sigmoid": (ops.sigmoid, None),
    "Tanh": (ops.tanh, None),
    "Erf": (ops.erf, None),
    "Exp": (ops.exp, None),
    "Log": (ops.log, None),
    "Sqrt": (ops.sqrt, np.sqrt),
    "Reciprocal": (ops.reciprocal, None),
    "Neg": (ops.negative, np.negative),
    "Abs": (ops.abs, np.abs),
    "Floor": (ops.floor, np.floor),
    "Ceil": (ops.ceil, np.ceil),
    "Sign": (ops.sign, np.sign),
    "Softplus": (ops.softplus, None),
    "Softsign": (ops.softsign, None),
    "Sin": (ops.sin, None),
    "Cos": (ops.cos, None),
    "Round": (ops.round, None),
    "HardSwish": (ops.hard_swish, None),
    "Not": (ops.logical_not, np.logical_not),
}


@register(*_UNARY)
def _unary(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    fn, np_fn = _UNARY[node.op_type]
    x = required(node, ins, 0)
    if isinstance(x, np.ndarray) and np_fn is not None:
        return [np.asarray(np_fn(x)).astype(x.dtype)]
    return [fn(ctx.const(x))]


@register("Identity")
def _identity(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    # a copy, so the output is its own buffer when the graph returns it
    return [x if isinstance(x, np.ndarray) else ops.identity(x)]


@register("Dropout", const_inputs=(1, 2))
def _dropout(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    given_ratio, given_training = optional(ins, 1), optional(ins, 2)
    ratio = float(node.attrs.get("ratio", 0.5)) if given_ratio is None else float(
        np.asarray(given_ratio).reshape(()))
    # before opset 7 is_test chose the mode; runtimes treat those models as inference too
    training = isinstance(given_training, np.ndarray) and bool(given_training)
    if training and ratio != 0.0:
        raise fail(node, f"training mode with ratio {ratio} is not supported (inference only)")
    out = x if isinstance(x, np.ndarray) else ops.identity(x)
    mask = np.ones(shape_of(x), dtype=bool)
    return [out, mask]


@register("LeakyRelu")
def _leaky(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [ops.leaky_relu(tensor_input(ctx, node, ins, 0), float(node.attrs.get("alpha", 0.01)))]


@register("Elu")
def _elu(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [ops.elu(tensor_input(ctx, node, ins, 0), float(node.attrs.get("alpha", 1.0)))]


@register("Selu")
def _selu(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    return [ops.selu(x, float(node.attrs.get("alpha", 1.67326319217681884765625)),
                     float(node.attrs.get("gamma", 1.05070102214813232421875)))]


@register("HardSigmoid")
def _hard_sigmoid(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [ops.hard_sigmoid(tensor_input(ctx, node, ins, 0), float(node.attrs.get("alpha", 0.2)),
                             float(node.attrs.get("beta", 0.5)))]


@register("Gelu")
def _gelu(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [ops.gelu(tensor_input(ctx, node, ins, 0), str(node.attrs.get("approximate", "none")))]


@register("PRelu")
def _prelu(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    given = required(node, ins, 0)
    x, slope = ctx.const(given), _operand(ctx, required(node, ins, 1), [given])
    if isinstance(slope, Tensor) and ops.broadcast_shape([x.shape, slope.shape], "PRelu") != tuple(
            x.shape):
        raise fail(node, f"slope {slope.shape} does not broadcast to the input {x.shape}")
    return [ops.binary_op(x, slope, lambda v, s: I.if_then_else(v > 0, v, v * s), "T_prelu")]


@register("Clip", const_inputs=())
def _clip(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    if ctx.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
        bounds: list[Any] = [lo, hi]
    else:
        bounds = [optional(ins, 1), optional(ins, 2)]
    if isinstance(x, np.ndarray) and all_const(bounds):
        lo_v = -np.inf if bounds[0] is None else bounds[0]
        hi_v = np.inf if bounds[1] is None else bounds[1]
        return [np.clip(x, lo_v, hi_v).astype(x.dtype)]
    out = ctx.const(x)
    for n, b in enumerate(bounds):
        if b is None:
            continue
        if isinstance(b, Tensor):
            out = ops.maximum(out, b) if n == 0 else ops.minimum(out, b)
            continue
        v = np.asarray(b).reshape(()).item()
        out = ops.clip(out, a_min=v) if n == 0 else ops.clip(out, a_max=v)
    return [out if out is not x else ops.identity(out)]


# --- binary with broadcasting --------------------------------------------------------------


def _np_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div rounds toward zero
    return (a / b).astype(a.dtype)


def _np_mod(node: Node) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return np.fmod if node.attrs.get("fmod", 0) else np.mod


_BINARY: dict[str, tuple[Callable[[Any, Any], Tensor], Callable[..., np.ndarray]]] = {
    "Add": (ops.add, np.add),
    "Sub": (ops.subtract, np.subtract),
    "Mul": (ops.multiply, np.multiply),
    "Div": (ops.divide, _np_div),
    "Equal": (ops.equal, np.equal),
    "Less": (ops.less, np.less),
    "Greater": (ops.greater, np.greater),
    "LessOrEqual": (ops.less_equal, np.less_equal),
    "GreaterOrEqual": (ops.greater_equal, np.greater_equal),
    "And": (ops.logical_and, np.logical_and),
    "Or": (ops.logical_or, np.logical_or),
    "Xor": (ops.logical_xor, np.logical_xor),
}


@register(*_BINARY)
def _binary(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    fn, np_fn = _BINARY[node.op_type]
    a, b = required(node, ins, 0), required(node, ins, 1)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        out = np.asarray(np_fn(a, b))
        return [out if out.dtype == bool else out.astype(np.result_type(a, b))]
    return [fn(_operand(ctx, a, [b]), _operand(ctx, b, [a]))]


@register("Mod")
def _mod(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    a, b = required(node, ins, 0), required(node, ins, 1)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [np.asarray(_np_mod(node)(a, b)).astype(a.dtype)]
    fn = ops.mod if node.attrs.get("fmod", 0) else ops.floor_mod
    return [fn(_operand(ctx, a, [b]), _operand(ctx, b, [a]))]


@register("Pow")
def _pow(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    a, b = required(node, ins, 0), required(node, ins, 1)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [np.power(a, b.astype(a.dtype)).astype(a.dtype)]
    # ONNX lets the exponent have another type; the result has the base's
    if isinstance(b, np.ndarray) and b.dtype != np.dtype(a.dtype):
        b = b.astype(a.dtype)
    elif isinstance(b, Tensor) and b.dtype != a.dtype:
        b = ops.cast(b, str(a.dtype))
    if isinstance(b, np.ndarray) and b.size == 1 and b.ndim <= a.ndim:
        e = float(b.reshape(()))
        base = ctx.const(a)
        if e == 2.0:
            return [ops.multiply(base, base)]
        if e == 0.5 and base.dtype.startswith("float"):
            return [ops.sqrt(base)]
    return [ops.power(_operand(ctx, a, [b]), _operand(ctx, b, [a]))]


_VARIADIC: dict[str, tuple[Callable[[Any, Any], Tensor], Callable[..., np.ndarray]]] = {
    "Max": (ops.maximum, np.maximum),
    "Min": (ops.minimum, np.minimum),
    "Sum": (ops.add, np.add),
    "Mean": (ops.add, np.add),
}


@register(*_VARIADIC)
def _variadic(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    fn, np_fn = _VARIADIC[node.op_type]
    values = [v for v in ins if v is not None]
    if not values:
        raise fail(node, "needs at least one input")
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    if len(arrays) == len(values):
        out = arrays[0]
        for arr in arrays[1:]:
            out = np_fn(out, arr)
        if node.op_type == "Mean":
            out = out / len(arrays)
        return [np.asarray(out).astype(arrays[0].dtype)]
    acc: Any = ctx.const(values[0])
    for v in values[1:]:
        acc = fn(acc, _operand(ctx, v, [acc]))
    if node.op_type == "Mean" and len(values) > 1:
        acc = ops.multiply(acc, 1.0 / len(values))
    return [acc if len(values) > 1 else ops.identity(acc)]


@register("Where")
def _where(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    c, a, b = (required(node, ins, pos) for pos in range(3))
    if isinstance(c, np.ndarray) and isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [np.where(c, a, b).astype(np.result_type(a, b))]
    return [ops.where(ctx.const(c), ctx.const(a), ctx.const(b))]


def cast_to(x: Value, to: str) -> Value:
    if isinstance(x, np.ndarray):
        return x.astype(to)
    if x.dtype == to:
        return ops.identity(x)
    if x.dtype == "float64" and to == "float16":
        # the LLVM backend crashes on a direct double -> half conversion; go through float32
        return ops.cast(ops.cast(x, "float32"), to)
    # float to int truncates toward zero in TE as in ONNX
    return ops.cast(x, to)


@register("Cast")
def _cast(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [cast_to(required(node, ins, 0), onnx_dtype(int(node.attrs["to"])))]


@register("CastLike")
def _cast_like(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [cast_to(required(node, ins, 0), str(required(node, ins, 1).dtype))]
