"""How big a folded constant may get, and what runs instead.

Importers and ``passes.fold_constants`` replace a node whose inputs are all constants by its
values. A tiny model can ask for a huge one (ConstantOfShape [50000, 50000], Range 0..3e9, an
Expand of one number): ``folded_bytes`` says how many bytes a fold would make without making
them, and above FOLD_LIMIT_BYTES the node stays in the graph as a runtime kernel
(``runtime_node``: ConstantOfShape and Range become RuntimeFill and RuntimeRange, whose
converters here build TE computations; other ops stay as they are and read their constant
inputs as kernel arguments). A kernel indexes at most MAX_KERNEL_ELEMENTS elements per value.

Example::

    from autosched.graph.fold import FOLD_LIMIT_BYTES, folded_bytes
    folded_bytes(node, [np.array([50000, 50000])], opset=17)   # 10_000_000_000
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autosched import te
from autosched.errors import ModelImportError
from autosched.graph.graph import Node
from autosched.graph.ops import (
    ConvertContext,
    Value,
    const_inputs,
    convert,
    fail,
    register,
    shape_of,
)
from autosched.te.tensor import Tensor

# A folded value lives in the model (and in memory during import): 64 MiB covers every weight
# a real model computes from constants, and stops a 170-byte model from asking for gigabytes.
FOLD_LIMIT_BYTES = 64 << 20
# Loop variables and offsets are int32.
MAX_KERNEL_ELEMENTS = 2**31 - 1


def _fill_bytes(node: Node, ins: Sequence[Value | None]) -> int:
    value = node.attrs.get("value")
    itemsize = 4 if value is None else np.asarray(value).dtype.itemsize
    return math.prod(int(d) for d in np.asarray(ins[0]).reshape(-1)) * itemsize


def _range_count(node: Node, ins: Sequence[Value | None]) -> int:
    start, limit, delta = (np.asarray(v).reshape(()).item() for v in ins[:3])
    if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
        raise fail(node, f"start {start}, limit {limit}, delta {delta} make no finite range")
    return max(math.ceil((limit - start) / delta), 0)


def _range_bytes(node: Node, ins: Sequence[Value | None]) -> int:
    return _range_count(node, ins) * np.asarray(ins[0]).dtype.itemsize


_GENERATED = {"ConstantOfShape": _fill_bytes, "Range": _range_bytes}


def lazy_inputs(node: Node, ins: Sequence[Value | None], opset: int) -> list[Value | None]:
    """The inputs with constants as placeholders, except those that must stay constants."""
    fixed = set(const_inputs(node.op_type, opset))
    return [te.placeholder(v.shape, str(v.dtype), name=f"in{k}")
            if isinstance(v, np.ndarray) and k not in fixed else v for k, v in enumerate(ins)]


def _nbytes(v: Value) -> int:
    return math.prod(shape_of(v)) * np.dtype(v.dtype).itemsize


def folded_bytes(node: Node, ins: Sequence[Value | None], opset: int) -> int | None:
    """Bytes of ``node``'s outputs if folded, found without computing them (the converter runs
    on placeholders); None when the converter needs its inputs as values to say."""
    if node.op_type in _GENERATED:
        return _GENERATED[node.op_type](node, ins)
    try:
        outs = convert(node, lazy_inputs(node, ins, opset), ConvertContext(opset=opset))
    except Exception:  # noqa: BLE001  a probe: the fold that follows reports real errors
        return None
    return sum(_nbytes(o) for o in outs)


def runtime_node(node: Node, ins: Sequence[Value | None]) -> Node:
    """``node`` as a node that computes at run time what folding it would make."""
    out = node.outputs[:1]
    if node.op_type == "ConstantOfShape":
        value = node.attrs.get("value")
        fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)[:1]
        shape = [int(d) for d in np.asarray(ins[0]).reshape(-1)]
        return Node(node.name, "RuntimeFill", [], out, {"shape": shape, "value": fill})
    if node.op_type == "Range":
        start, _, delta = (np.asarray(v).reshape(()) for v in ins[:3])
        return Node(node.name, "RuntimeRange", [], out,
                    {"start": start, "delta": delta.astype(start.dtype),
                     "count": _range_count(node, ins)})
    return node


def runtime_outputs(node: Node, ins: Sequence[Value | None], ctx: ConvertContext,
                    where: str) -> tuple[Node, list[Value]]:
    """``runtime_node(node, ins)`` and its TE outputs; a ModelImportError naming the node when
    no kernel can compute them."""
    kept = runtime_node(node, ins)
    outs = convert(kept, lazy_inputs(kept, ins if kept is node else [], ctx.opset), ctx)
    for name, o in zip(node.outputs, outs):
        size = math.prod(shape_of(o))
        if not isinstance(o, Tensor) or size > MAX_KERNEL_ELEMENTS:
            raise ModelImportError(
                f"{where}: node {node.name!r} ({node.op_type}) output {name!r} "
                f"{o.dtype}{list(o.shape)} is too large to fold (over {FOLD_LIMIT_BYTES} bytes) "
                f"and to compute at run time (over {MAX_KERNEL_ELEMENTS} elements)")
    return kept, outs


@register("RuntimeFill")
def _runtime_fill(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    fill = np.asarray(node.attrs["value"]).reshape(-1)
    value = te.const(fill[0].item(), str(fill.dtype))
    return [te.compute(tuple(node.attrs["shape"]), lambda *i: value, name="T_fill")]


@register("RuntimeRange")
def _runtime_range(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    start, delta = np.asarray(node.attrs["start"]), np.asarray(node.attrs["delta"])
    dtype = str(start.dtype)
    first, step = te.const(start.item(), dtype), te.const(delta.item(), dtype)
    return [te.compute((int(node.attrs["count"]),),
                       lambda i: first + te.cast(dtype, i) * step, name="T_range")]
