"""Converters of data-movement, reduction and shape ops: Reshape, Transpose, Slice, Gather,
Concat, Split, Pad, Resize, Expand, Tile, Reduce*, and the shape ops (Shape, Size,
ConstantOfShape, Range, Constant) that always give numpy arrays."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, overload

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
from autosched.te.ops.tags import BROADCAST
from autosched.te.tensor import Tensor, compute


@overload
def _ints(v: Value) -> list[int]: ...
@overload
def _ints(v: Value | None) -> list[int] | None: ...
def _ints(v: Value | None) -> list[int] | None:
    return None if v is None else [int(e) for e in np.asarray(v).reshape(-1)]


def _axes_of(node: Node, ins: list[Value | None], ctx: ConvertContext, input_from: int,
             pos: int = 1) -> list[int] | None:
    """``axes`` from the attribute (opset < input_from) or from input ``pos``."""
    if ctx.opset < input_from:
        a = node.attrs.get("axes")
        return None if a is None else [int(v) for v in a]
    return _ints(optional(ins, pos))


def _norm_axes(node: Node, axes: list[int], rank: int) -> list[int]:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise fail(node, f"axis {a} is out of range for rank {rank}")
        out.append(a + rank if a < 0 else a)
    if len(set(out)) != len(out):
        raise fail(node, f"axes {axes} repeat an axis")
    return out


def _copy(x: Tensor) -> Tensor:
    return ops.identity(x)


def empty(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An empty result: its (lack of) contents follow from the shape, so it is a constant."""
    return np.zeros(shape, dtype=dtype)


@register("Reshape", const_inputs=lambda opset: (1,) if opset >= 5 else ())
def _reshape(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    target = (_ints(required(node, ins, 1)) if ctx.opset >= 5
              else [int(v) for v in node.attrs["shape"]])
    in_shape = shape_of(x)
    allowzero = bool(node.attrs.get("allowzero", 0))
    shape = []
    for d, v in enumerate(target):
        if v == 0 and not allowzero:
            if d >= len(in_shape):
                raise fail(node, f"shape {target}: 0 at dim {d} copies a dim the input "
                                 f"{in_shape} does not have")
            v = in_shape[d]
        shape.append(v)
    total = int(np.prod(in_shape))
    if shape.count(-1) > 1:
        raise fail(node, f"shape {target} has more than one -1")
    if -1 in shape:
        known = int(np.prod([v for v in shape if v != -1]))
        if known == 0 or total % known:
            raise fail(node, f"cannot reshape {in_shape} ({total} elements) to {target}")
        shape[shape.index(-1)] = total // known
    if int(np.prod(shape)) != total or min(shape, default=1) < 0:
        raise fail(node, f"cannot reshape {in_shape} ({total} elements) to {target} "
                         f"-> {tuple(shape)}")
    if isinstance(x, np.ndarray):
        return [x.reshape(shape)]
    if 0 in shape:
        return [empty(tuple(shape), x.dtype)]
    return [ops.reshape(x, tuple(shape))]


@register("Flatten")
def _flatten(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    axis = int(node.attrs.get("axis", 1))
    s = shape_of(x)
    ax = axis + len(s) if axis < 0 else axis
    if not 0 <= ax <= len(s):
        raise fail(node, f"axis {axis} is out of range for input {s}")
    if isinstance(x, np.ndarray):
        return [x.reshape(int(np.prod(s[:ax])), int(np.prod(s[ax:])))]
    return [ops.flatten(x, ax)]


@register("Transpose")
def _transpose(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    perm = node.attrs.get("perm")
    perm = None if perm is None else [int(p) for p in perm]
    if isinstance(x, np.ndarray):
        return [np.transpose(x, perm)]
    return [ops.transpose(x, perm)]


@register("Squeeze", const_inputs=lambda opset: (1,) if opset >= 13 else ())
def _squeeze(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    s = shape_of(x)
    axes = _axes_of(node, ins, ctx, 13)
    drop = [d for d, v in enumerate(s) if v == 1] if axes is None else _norm_axes(
        node, axes, len(s))
    bad = [d for d in drop if s[d] != 1]
    if bad:
        raise fail(node, f"cannot squeeze axis {bad[0]} of {s}: its size is {s[bad[0]]}")
    shape = tuple(v for d, v in enumerate(s) if d not in drop)
    if isinstance(x, np.ndarray):
        return [x.reshape(shape)]
    return [ops.reshape(x, shape)]


@register("Unsqueeze", const_inputs=lambda opset: (1,) if opset >= 13 else ())
def _unsqueeze(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    s = shape_of(x)
    axes = _axes_of(node, ins, ctx, 13)
    if not axes:
        raise fail(node, "needs axes")
    new = _norm_axes(node, axes, len(s) + len(axes))
    it = iter(s)
    shape = tuple(1 if d in new else next(it) for d in range(len(s) + len(axes)))
    if isinstance(x, np.ndarray):
        return [x.reshape(shape)]
    return [ops.reshape(x, shape)]


@register("Concat")
def _concat(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    values = [v for v in ins if v is not None]
    axis = int(node.attrs["axis"]) if "axis" in node.attrs else None
    if axis is None:
        raise fail(node, "needs the axis attribute")
    arrays = [v for v in values if isinstance(v, np.ndarray)]
    if len(arrays) == len(values):
        return [np.concatenate(arrays, axis=axis)]
    # ONNX allows empty inputs along the axis; they add nothing
    kept = [v for v in values if shape_of(v)[axis] != 0]
    if len(kept) == 1:
        return [_copy(ctx.const(kept[0]))]
    return [ops.concat([ctx.const(v) for v in kept], axis)]


@register("Split", const_inputs=lambda opset: (1,) if opset >= 13 else ())
def _split(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    s = shape_of(x)
    axis = int(node.attrs.get("axis", 0))
    ax = axis + len(s) if axis < 0 else axis
    n = s[ax]
    sizes = _ints(optional(ins, 1)) if ctx.opset >= 13 and len(ins) > 1 else (
        [int(v) for v in node.attrs["split"]] if "split" in node.attrs else None)
    if sizes is None:
        parts = int(node.attrs.get("num_outputs", len(node.outputs)))
        chunk = -(-n // parts)
        sizes = [min(chunk, n - chunk * k) for k in range(parts)]
        if "num_outputs" not in node.attrs and n % parts:
            raise fail(node, f"{parts} outputs do not divide axis {axis} of {s}")
    if sum(sizes) != n or min(sizes) < 0:
        raise fail(node, f"split sizes {sizes} do not add up to axis {axis} of {s} ({n})")
    cuts = list(np.cumsum(sizes)[:-1])
    if isinstance(x, np.ndarray):
        return list(np.split(x, cuts, axis=ax))
    if len(sizes) == 1:
        return [_copy(x)]
    outs: list[Value] = []
    for lo, size in zip([0, *cuts], sizes):
        if size == 0:
            outs.append(empty(tuple(size if d == ax else v for d, v in enumerate(s)), x.dtype))
        else:
            outs.append(ops.strided_slice(x, [int(lo)], [int(lo) + size], [1], [ax]))
    return outs


@register("Slice", const_inputs=lambda opset: (1, 2, 3, 4) if opset >= 10 else ())
def _slice(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    s = shape_of(x)
    steps: list[int] | None = None
    if ctx.opset < 10:
        starts, ends = list(node.attrs["starts"]), list(node.attrs["ends"])
        axes = node.attrs.get("axes")
    else:
        starts, ends = _ints(required(node, ins, 1)), _ints(required(node, ins, 2))
        axes, steps = _ints(optional(ins, 3)), _ints(optional(ins, 4))
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise fail(node, f"starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in "
                         "length")
    axes = _norm_axes(node, axes, len(s))
    index: list[slice] = [slice(None)] * len(s)
    for a, b, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise fail(node, f"step 0 on axis {a}")
        # INT64 extremes mean "to the end"; slice.indices clamps them as ONNX does
        index[a] = slice(int(b), int(e), int(st))
    if isinstance(x, np.ndarray):
        return [x[tuple(index)]]
    out_len = [len(range(*index[d].indices(n))) for d, n in enumerate(s)]
    if 0 in out_len:
        return [empty(tuple(out_len), x.dtype)]
    return [ops.strided_slice(x, [index[a].start for a in axes], [index[a].stop for a in axes],
                              [index[a].step for a in axes], axes)]


def _check_indices(node: Node, idx: Value, n: int, axis: int) -> None:
    """Constant indices out of [-n, n) are the model's error, found at import."""
    if isinstance(idx, np.ndarray) and ((idx >= n) | (idx < -n)).any():
        bad = idx[(idx >= n) | (idx < -n)].reshape(-1)[:8]
        raise fail(node, f"indices {bad} are out of range for axis {axis} ({n})")


def _mode(idx: Value) -> str:
    """Runtime indices are checked by the kernel (strict: out of range fails the run, as in
    ONNX); constant ones were checked here, so the kernel only normalizes them."""
    return "normalize" if isinstance(idx, np.ndarray) else "strict"


@register("Gather")
def _gather(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x, idx = required(node, ins, 0), required(node, ins, 1)
    axis = int(node.attrs.get("axis", 0))
    _check_indices(node, idx, shape_of(x)[axis], axis)
    if isinstance(x, np.ndarray) and isinstance(idx, np.ndarray):
        return [np.take(x, idx, axis=axis)]
    return [ops.take(ctx.const(x), ctx.const(idx), axis=axis, mode=_mode(idx))]


@register("GatherElements")
def _gather_elements(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x, idx = required(node, ins, 0), required(node, ins, 1)
    axis = int(node.attrs.get("axis", 0))
    _check_indices(node, idx, shape_of(x)[axis], axis)
    if isinstance(x, np.ndarray) and isinstance(idx, np.ndarray):
        return [np.take_along_axis(x, np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)]
    return [ops.gather(ctx.const(x), axis, ctx.const(idx), mode=_mode(idx))]


@register("Expand", const_inputs=(1,))
def _expand(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    target = tuple(_ints(required(node, ins, 1)))
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(shape_of(x), target))
    except ValueError:
        raise fail(node, f"input {shape_of(x)} does not broadcast with {target}") from None
    if isinstance(x, np.ndarray):
        return [np.array(np.broadcast_to(x, shape), order="C")]  # 0-d stays 0-d
    return [ops.broadcast_to(x, shape) if shape != shape_of(x) else _copy(x)]


@register("Tile", const_inputs=(1,))
def _tile(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    reps = _ints(required(node, ins, 1))
    s = shape_of(x)
    if len(reps) != len(s) or min(reps, default=1) < 1:
        raise fail(node, f"repeats {reps} must be one positive count per dim of {s}")
    if isinstance(x, np.ndarray):
        return [np.tile(x, reps)]
    shape = tuple(n * r for n, r in zip(s, reps))

    def body(*i: Any) -> Any:
        return x[tuple(v if r == 1 else I.floormod(v, n) for v, n, r in zip(i, s, reps))]

    return [compute(shape, body, name="T_tile", tag=BROADCAST)]


_REDUCE: dict[str, tuple[Callable[..., Tensor], Callable[..., np.ndarray], int]] = {
    # op: (TE reduction, numpy reduction, first opset where axes is an input)
    "ReduceMean": (ops.mean, np.mean, 18),
    "ReduceSum": (ops.sum, np.sum, 13),
    "ReduceMax": (ops.max, np.max, 18),
    "ReduceMin": (ops.min, np.min, 18),
    "ReduceProd": (ops.prod, np.prod, 18),
    "ReduceSumSquare": (ops.sum, np.sum, 18),
    "ReduceL1": (ops.sum, np.sum, 18),
    "ReduceL2": (ops.sum, np.sum, 18),
    "ReduceLogSum": (ops.sum, np.sum, 18),
    "ReduceLogSumExp": (ops.sum, np.sum, 18),
}


def _reduce_const(op: str) -> Callable[[int], tuple[int, ...]]:
    first = _REDUCE[op][2]
    return lambda opset: (1,) if opset >= first else ()


def _pre(op: str, x: Tensor) -> Tensor:
    if op == "ReduceSumSquare" or op == "ReduceL2":
        return ops.multiply(x, x)
    if op == "ReduceL1":
        return ops.abs(x)
    if op == "ReduceLogSumExp":
        return ops.exp(x)
    return x


def _post(op: str, y: Tensor) -> Tensor:
    if op == "ReduceL2":
        return ops.sqrt(y)
    if op in ("ReduceLogSum", "ReduceLogSumExp"):
        return ops.log(y)
    return y


def _empty_value(op: str, dtype: str) -> Any:
    """What a reduction over no elements gives (its identity element)."""
    if op in ("ReduceMax", "ReduceMin"):
        high = op == "ReduceMin"
        if dtype == "bool":
            return high
        if np.issubdtype(np.dtype(dtype), np.floating):
            return np.inf if high else -np.inf
        info = np.iinfo(dtype)
        return info.max if high else info.min
    if op in ("ReduceLogSum", "ReduceLogSumExp"):
        return -np.inf
    if op == "ReduceMean":
        return np.nan
    return 1 if op == "ReduceProd" else 0


def _reduce(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    te_fn, np_fn, first = _REDUCE[node.op_type]
    x = required(node, ins, 0)
    s = shape_of(x)
    axes = _axes_of(node, ins, ctx, first)
    keep = bool(node.attrs.get("keepdims", 1))
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return [x if isinstance(x, np.ndarray) else _copy(x)]
        axes = list(range(len(s)))
    axes = _norm_axes(node, axes, len(s))
    if isinstance(x, np.ndarray) and node.op_type in ("ReduceSum", "ReduceMax", "ReduceMin",
                                                      "ReduceProd", "ReduceMean"):
        return [np.asarray(np_fn(x, axis=tuple(axes), keepdims=keep)).astype(x.dtype)]
    if any(s[a] == 0 for a in axes):
        out = tuple(1 if d in axes else v for d, v in enumerate(s) if keep or d not in axes)
        return [np.full(out, _empty_value(node.op_type, str(x.dtype)), dtype=x.dtype)]
    t = ctx.const(x)
    if t.dtype == "bool" and node.op_type in ("ReduceMax", "ReduceMin"):
        # any / all as max / min over 0 and 1
        y = te_fn(ops.cast(t, "uint8"), tuple(axes), keepdims=keep)
        return [ops.cast(y, "bool")]
    y = te_fn(_pre(node.op_type, t), tuple(axes), keepdims=keep)
    return [_post(node.op_type, y)]


for _op in _REDUCE:
    register(_op, const_inputs=_reduce_const(_op))(_reduce)


@register("ArgMax", "ArgMin")
def _arg(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    fn = ops.argmax if node.op_type == "ArgMax" else ops.argmin
    return [fn(tensor_input(ctx, node, ins, 0), int(node.attrs.get("axis", 0)),
               keepdims=bool(node.attrs.get("keepdims", 1)),
               select_last_index=bool(node.attrs.get("select_last_index", 0)))]


@register("Pad", const_inputs=lambda opset: (1, 2, 3) if opset >= 11 else ())
def _pad(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = required(node, ins, 0)
    s = shape_of(x)
    mode = node.attrs.get("mode", "constant")
    if ctx.opset < 11:
        pads = [int(v) for v in node.attrs.get("pads", node.attrs.get("paddings", []))]
        value: Any = float(node.attrs.get("value", 0.0))
        axes = list(range(len(s)))
    else:
        pads = _ints(required(node, ins, 1))
        cv = optional(ins, 2)
        value = 0 if cv is None or np.asarray(cv).size == 0 else np.asarray(cv).reshape(-1)[0]
        ax = _ints(optional(ins, 3))
        axes = list(range(len(s))) if ax is None else _norm_axes(node, ax, len(s))
    if len(pads) != 2 * len(axes):
        raise fail(node, f"pads {pads} must have 2 entries per padded axis ({len(axes)})")
    before, after = [0] * len(s), [0] * len(s)
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise fail(node, f"mode {mode!r} is not supported (constant, edge, reflect, wrap)")
    if mode == "wrap":
        return [_wrap_pad(node, ctx.const(x), before, after)]
    if isinstance(x, np.ndarray) and mode == "constant" and min(pads, default=0) >= 0:
        return [np.pad(x, list(zip(before, after)), constant_values=value)]
    t = ctx.const(x)
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.item()
    if not t.dtype.startswith("float"):
        value = int(value) if not isinstance(value, bool) else value
    if t.dtype == "bool":
        value = bool(value)
    if not any(before) and not any(after):
        return [_copy(t)]
    return [ops.pad(t, before, after, value=value, mode=mode)]


def _wrap_pad(node: Node, x: Tensor, before: list[int], after: list[int]) -> Tensor:
    """Pad mode wrap: the input repeats periodically (numpy.pad mode="wrap")."""
    s = shape_of(x)
    if min(before + after) < 0:
        raise fail(node, f"negative pads {before}/{after} with mode wrap are not supported")
    shape = tuple(n + b + a for n, b, a in zip(s, before, after))

    def body(*i: Any) -> Any:
        return x[tuple(I.floormod(v - b, n) if b or a else v
                       for v, n, b, a in zip(i, s, before, after))]

    return compute(shape, body, name="T_pad_wrap", tag=BROADCAST)


def _given(ins: list[Value | None], pos: int) -> np.ndarray | None:
    """Constant input ``pos``, or None where it is omitted or empty (Resize's scales, sizes)."""
    v = optional(ins, pos)
    return None if v is None or np.asarray(v).size == 0 else np.asarray(v)


@register("Resize", const_inputs=(1, 2, 3))
def _resize(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    if ctx.opset < 11:
        raise fail(node, "Resize before opset 11 is not supported")
    x = tensor_input(ctx, node, ins, 0)
    s = shape_of(x)
    mode = node.attrs.get("mode", "nearest")
    coord = node.attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest_mode = node.attrs.get("nearest_mode", "round_prefer_floor")
    for name, bad in (("exclude_outside", 0), ("antialias", 0)):
        if node.attrs.get(name, 0) != bad:
            raise fail(node, f"{name}={node.attrs[name]} is not supported")
    if node.attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise fail(node, "keep_aspect_ratio_policy other than stretch is not supported")
    if coord == "tf_crop_and_resize":
        raise fail(node, "coordinate_transformation_mode tf_crop_and_resize is not supported")
    scales, sizes = _given(ins, 2), _given(ins, 3)
    axes = node.attrs.get("axes")
    axes = list(range(len(s))) if axes is None else _norm_axes(node, list(axes), len(s))
    full_scales = [1.0] * len(s)
    full_sizes = list(s)
    if sizes is not None:
        for a, v in zip(axes, sizes.reshape(-1)):
            full_sizes[a] = int(v)
    elif scales is not None:
        for a, v in zip(axes, scales.reshape(-1)):
            full_scales[a] = float(v)
            full_sizes[a] = int(np.floor(s[a] * float(v)))
    else:
        raise fail(node, "needs scales or sizes")
    if len(s) != 4 or full_sizes[0] != s[0] or full_sizes[1] != s[1]:
        raise fail(node, f"only resizing the last two dims of a 4-d input is supported, got "
                         f"{s} -> {full_sizes}")
    method = {"nearest": "nearest", "linear": "linear", "cubic": "cubic"}.get(mode)
    if method is None:
        raise fail(node, f"mode {mode!r} is not supported")
    return [ops.resize2d(x, None if sizes is None else tuple(full_sizes[2:]), method=method,
                         coordinate_transformation_mode=coord, rounding_method=nearest_mode,
                         scales=None if sizes is not None else tuple(full_scales[2:]),
                         cubic_alpha=float(node.attrs.get("cubic_coeff_a", -0.75)))]


# --- shape ops: always numpy -----------------------------------------------------------------

@register("Shape")
def _shape(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    s = shape_of(required(node, ins, 0))
    start = int(node.attrs.get("start", 0))
    end = node.attrs.get("end")
    return [np.array(s[start:None if end is None else int(end)], dtype=np.int64)]


@register("Size")
def _size(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    return [np.array(math.prod(shape_of(required(node, ins, 0))), dtype=np.int64)]


@register("ConstantOfShape", const_inputs=(0,))
def _constant_of_shape(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    value = node.attrs.get("value")
    fill = np.zeros((1,), np.float32) if value is None else np.asarray(value).reshape(-1)
    return [np.full(tuple(_ints(required(node, ins, 0))), fill[0], dtype=fill.dtype)]


@register("Range", const_inputs=(0, 1, 2))
def _range(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    start, limit, delta = (np.asarray(required(node, ins, pos)).reshape(1)[0] for pos in range(3))
    return [np.arange(start, limit, delta, dtype=start.dtype)]


@register("Constant")
def _constant(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    a = node.attrs
    if "value" in a:
        return [np.asarray(a["value"])]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in a:
            return [np.asarray(a[key], dtype=dtype)]
    raise fail(node, f"needs a value attribute, got {sorted(a)}")

