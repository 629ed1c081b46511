"""Converters of indexing and selection ops: GatherND, ScatterElements (and opset 9's
Scatter), ScatterND, OneHot, Trilu, CumSum, DepthToSpace, SpaceToDepth, TopK.

Inputs that fix an output shape (OneHot's depth, TopK's K) or a loop structure (CumSum's axis,
Trilu's k) must be constants."""

from __future__ import annotations

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
    tensor_input,
)
from autosched.te.expr import const
from autosched.te.ops import scatter
from autosched.te.ops.sort import topk


def scalar_input(node: Node, ins: list[Value | None], pos: int, default: int) -> int:
    """An optional constant integer input (a one-element array), or ``default``."""
    v = optional(ins, pos)
    if v is None:
        return default
    arr = np.asarray(v)
    if arr.size != 1:
        raise fail(node, f"input {pos} must hold one value, got shape {arr.shape}")
    return int(arr.reshape(()))


@register("GatherND")
def _gather_nd(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x, idx = (tensor_input(ctx, node, ins, pos) for pos in range(2))
    return [scatter.gather_nd(x, idx, int(node.attrs.get("batch_dims", 0)))]


@register("ScatterElements", "Scatter")
def _scatter_elements(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x, idx, updates = (tensor_input(ctx, node, ins, pos) for pos in range(3))
    return [scatter.scatter_elements(x, idx, updates, int(node.attrs.get("axis", 0)),
                                     str(node.attrs.get("reduction", "none")))]


@register("ScatterND")
def _scatter_nd(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x, idx, updates = (tensor_input(ctx, node, ins, pos) for pos in range(3))
    return [scatter.scatter_nd(x, idx, updates, str(node.attrs.get("reduction", "none")))]


@register("OneHot", const_inputs=(1,))
def _one_hot(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    depth = float(np.asarray(required(node, ins, 1)).reshape(-1)[0])  # floats truncate
    values = required(node, ins, 2)
    if isinstance(values, np.ndarray):
        if values.size != 2:
            raise fail(node, f"values must hold [off, on], got shape {values.shape}")
        flat = values.reshape(-1)
        dtype = str(values.dtype)
        off: Any = const(flat[0].item(), dtype)
        on: Any = const(flat[1].item(), dtype)
    else:
        off, on = values[0], values[1]
    return [scatter.one_hot(tensor_input(ctx, node, ins, 0), int(depth), off, on,
                            int(node.attrs.get("axis", -1)))]


@register("Trilu", const_inputs=(1,))
def _trilu(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [scatter.trilu(tensor_input(ctx, node, ins, 0), scalar_input(node, ins, 1, 0),
                          bool(node.attrs.get("upper", 1)))]


@register("CumSum", const_inputs=(1,))
def _cumsum(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [scatter.cumsum(tensor_input(ctx, node, ins, 0), scalar_input(node, ins, 1, 0),
                           bool(node.attrs.get("exclusive", 0)),
                           bool(node.attrs.get("reverse", 0)))]


@register("DepthToSpace")
def _depth_to_space(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    return [scatter.depth_to_space(x, int(node.attrs["blocksize"]),
                                   str(node.attrs.get("mode", "DCR")))]


@register("SpaceToDepth")
def _space_to_depth(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    return [scatter.space_to_depth(x, int(node.attrs["blocksize"]),
                                   str(node.attrs.get("mode", "DCR")))]


@register("TopK", const_inputs=lambda opset: (1,) if opset >= 10 else ())
def _topk(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    k = int(node.attrs["k"]) if ctx.opset < 10 else scalar_input(node, ins, 1, -1)
    values, indices = topk(tensor_input(ctx, node, ins, 0), k, int(node.attrs.get("axis", -1)),
                           bool(node.attrs.get("largest", 1)))
    return [values, indices]
