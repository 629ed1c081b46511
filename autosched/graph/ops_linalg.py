"""Converters of Einsum and GroupNormalization (TE ops in autosched.te.ops.einsum and
group_norm)."""

from __future__ import annotations

import numpy as np

from autosched.graph.graph import Node
from autosched.graph.ops import (
    ConvertContext,
    Value,
    fail,
    register,
    required,
    shape_of,
    tensor_input,
)
from autosched.te.ops.einsum import einsum
from autosched.te.ops.group_norm import group_norm
from autosched.te.tensor import Tensor, compute


@register("Einsum")
def _einsum(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    operands = [ctx.const(v) for v in ins if v is not None]
    return [einsum(str(node.attrs["equation"]), *operands)]


def _per_channel(v: Value, channels: int, groups: int, ctx: ConvertContext) -> Tensor:
    """Opset 18's scale and bias hold one value per group: repeat it over the group's
    channels."""
    if int(np.prod(shape_of(v))) == channels:
        return ctx.const(v)
    if isinstance(v, np.ndarray):
        return ctx.const(np.repeat(v.reshape(-1), channels // groups))
    t = ctx.const(v)
    return compute((channels,), lambda c: t[c // (channels // groups)], name="T_group_param")


@register("GroupNormalization")
def _group_norm(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    groups = int(node.attrs["num_groups"])
    if x.ndim < 2 or shape_of(x)[1] % groups:
        raise fail(node, f"channels of input {x.shape} are not a multiple of {groups} groups")
    c = shape_of(x)[1]
    scale, bias = (_per_channel(required(node, ins, pos), c, groups, ctx) for pos in (1, 2))
    stat = "float32" if int(node.attrs.get("stash_type", 1)) == 1 else x.dtype
    if x.dtype == "float64":
        stat = "float64"
    return [group_norm(x, scale, bias, groups, float(node.attrs.get("epsilon", 1e-5)), stat)]
