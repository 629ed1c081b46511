"""Converters of network layers: Conv, ConvTranspose, Gemm, MatMul, pooling, softmax and the
normalisations. 1-d convolutions and pools run as 2-d ones with a unit height."""

from __future__ import annotations

from typing import Any

import numpy as np

from autosched import te
from autosched.graph.graph import B_PANELS, KERNEL_LAYOUT, Node
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
from autosched.graph.ops_math import _operand
from autosched.te import intrin as I
from autosched.te import ops
from autosched.te.expr import Expr
from autosched.te.ops.norm import moments
from autosched.te.ops.tags import BROADCAST
from autosched.te.tensor import Tensor, compute


def _ints(node: Node, name: str, default: list[int]) -> list[int]:
    return [int(v) for v in node.attrs.get(name, default)]


def _pads(node: Node, sizes: list[int], kernel: list[int], strides: list[int],
          dil: list[int]) -> tuple[list[int], list[int]]:
    """Begin and end padding per spatial dim from ``pads`` or ``auto_pad``."""
    nd = len(sizes)
    auto = node.attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = _ints(node, "pads", [0] * 2 * nd)
        if len(pads) != 2 * nd:
            raise fail(node, f"pads {pads} must have {2 * nd} entries")
        return pads[:nd], pads[nd:]
    if auto == "VALID":
        return [0] * nd, [0] * nd
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise fail(node, f"auto_pad {auto!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    begins, ends = [], []
    for n, k, s, d in zip(sizes, kernel, strides, dil):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins, ends


def _window(node: Node, sizes: list[int], kernel: list[int], strides: list[int],
            dil: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Strides and begin / end pads of a sliding window, checked against the input.

    A pad wider than the input plus the dilated kernel only adds windows that read padding
    alone, and sized the padded copy past what memory (or int64) holds: it is refused. A stride
    past the padded extent gives the one window at the start, as the padded extent itself does,
    so it is clamped there (int32 index arithmetic then stays in range)."""
    if any(v < 1 for v in (*kernel, *strides, *dil)):
        raise fail(node, f"kernel {kernel}, strides {strides} and dilations {dil} must be "
                         f"positive")
    begins, ends = _pads(node, sizes, kernel, strides, dil)
    for n, k, d, b, e in zip(sizes, kernel, dil, begins, ends):
        reach = n + (k - 1) * d
        if min(b, e) < 0 or max(b, e) > reach:
            raise fail(node, f"pads {begins + ends} must lie in [0, {reach}] for an input of "
                             f"{sizes} and kernel {kernel} (dilations {dil})")
    strides = [min(s, max(n + b + e, 1)) for s, n, b, e in zip(strides, sizes, begins, ends)]
    return strides, begins, ends


def _spatial(node: Node, x: Tensor) -> int:
    nd = x.ndim - 2
    if nd not in (1, 2):
        raise fail(node, f"only 1-d and 2-d (N, C, W) / (N, C, H, W) inputs are supported, got "
                         f"{x.shape}")
    return nd


def _lift(x: Tensor) -> Tensor:
    """(N, C, W) as (N, C, 1, W)."""
    return ops.expand_dims(x, 2)


def _channel_bias(ctx: ConvertContext, y: Tensor, bias: Value | None) -> Tensor:
    """``y`` plus the optional per-output-channel ``bias``."""
    if bias is None:
        return y
    b = ctx.const(bias)
    if b.ndim != 1 or b.shape[0] != y.shape[1]:
        raise ValueError(f"bias {b.shape} must be ({y.shape[1]},), one per output channel")
    return compute(y.shape, lambda *i: y[i] + b[i[1]], name="T_bias_add", tag=BROADCAST)


def _conv_depth1(node: Node, x: Tensor, w: Tensor, bias: Value | None,
                 ctx: ConvertContext) -> Tensor:
    """A 3-d Conv whose kernel has depth 1 (stride 1, no depth padding or dilation): a 2-d
    Conv of every depth slice, with the slices folded into the batch (RivaGAN's (1, k, k)
    kernels). Other 3-d kernels are refused by name."""
    nd = 3
    strides = _ints(node, "strides", [1] * nd)
    dil = _ints(node, "dilations", [1] * nd)
    pads = _ints(node, "pads", [0] * 2 * nd)
    ks = _ints(node, "kernel_shape", list(shape_of(w)[2:]))
    auto = node.attrs.get("auto_pad", "NOTSET")
    if (shape_of(w)[2] != 1 or ks[0] != 1 or strides[0] != 1 or dil[0] != 1
            or len(pads) != 2 * nd or pads[0] or pads[nd] or auto not in ("NOTSET", "")):
        raise fail(node, f"3-d convolution is supported for kernels of depth 1 (stride 1, no "
                         f"depth padding) only; got kernel {ks}, strides {strides}, pads {pads}")
    n, c, d, h, wd = shape_of(x)
    slices = ops.reshape(ops.transpose(x, (0, 2, 1, 3, 4)), (n * d, c, h, wd))
    attrs = {**node.attrs, "kernel_shape": ks[1:], "strides": strides[1:], "dilations": dil[1:],
             "pads": [pads[1], pads[2], pads[4], pads[5]]}
    flat = Node(node.name, node.op_type, node.inputs, node.outputs, attrs)
    y = conv(flat, slices, ops.squeeze(w, 2), bias, ctx)
    o, oh, ow = shape_of(y)[1:]
    return ops.transpose(ops.reshape(y, (n, d, o, oh, ow)), (0, 2, 1, 3, 4))


@register("Conv")
def _conv(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x, w = tensor_input(ctx, node, ins, 0), tensor_input(ctx, node, ins, 1)
    return [conv(node, x, w, optional(ins, 2), ctx)]


def conv(node: Node, x: Tensor, w: Tensor, bias: Value | None, ctx: ConvertContext) -> Tensor:
    """The Conv ``node`` of input ``x``, weight ``w`` and an optional bias."""
    if x.ndim == 5 and w.ndim == 5 and node.attrs.get(KERNEL_LAYOUT, "OIHW") == "OIHW":
        return _conv_depth1(node, x, w, bias, ctx)
    nd = _spatial(node, x)
    if w.ndim != x.ndim:
        raise fail(node, f"weight {w.shape} must have the rank of the input {x.shape}")
    layout = node.attrs.get(KERNEL_LAYOUT, "OIHW")  # IHWO: from passes.pack_conv_weights
    k = list(shape_of(w)[2:] if layout == "OIHW" else shape_of(w)[1:-1])
    ks = _ints(node, "kernel_shape", k)
    if ks != k:
        raise fail(node, f"kernel_shape {ks} disagrees with the weight {w.shape}")
    strides = _ints(node, "strides", [1] * nd)
    dil = _ints(node, "dilations", [1] * nd)
    strides, begins, ends = _window(node, list(shape_of(x)[2:]), k, strides, dil)
    if nd == 1:
        x, w = _lift(x), _lift(w)
        strides, dil, begins, ends = [1, *strides], [1, *dil], [0, *begins], [0, *ends]
    y = ops.conv2d_nchw(x, w, stride=tuple(strides), padding=(*begins, *ends),
                        dilation=tuple(dil), groups=int(node.attrs.get("group", 1)),
                        kernel_layout=layout)
    y = _channel_bias(ctx, y, bias)
    return ops.squeeze(y, 2) if nd == 1 else y


@register("WinogradInput")
def _winograd_input(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    """passes.winograd_convs' first step (attributes m, pads as ONNX orders them)."""
    pads = tuple(int(v) for v in node.attrs["pads"])
    data, bt = tensor_input(ctx, node, ins, 0), tensor_input(ctx, node, ins, 1)
    return [ops.winograd_input(data, bt, int(node.attrs["m"]), pads)]


@register("Im2Col")
def _im2col(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    """passes.gemm_convs' patches (attributes kernel_shape, strides, dilations, pads; layout
    and batch_columns where the columns run over the batch)."""
    pads = [int(v) for v in node.attrs["pads"]]
    return [ops.im2col(tensor_input(ctx, node, ins, 0), tuple(node.attrs["kernel_shape"]),
                       stride=tuple(node.attrs["strides"]), padding=tuple(pads),
                       dilation=tuple(node.attrs["dilations"]),
                       layout=str(node.attrs.get("layout", "NCHW")),
                       batch_columns=bool(node.attrs.get("batch_columns", 0)))]


@register("WinogradOutput")
def _winograd_output(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    """passes.winograd_convs' last step: inputs the product, A^T and the optional bias;
    attributes m and the Conv's output shape."""
    prod, at = tensor_input(ctx, node, ins, 0), tensor_input(ctx, node, ins, 1)
    m = int(node.attrs["m"])
    n, k, oh, ow = (int(d) for d in node.attrs["shape"])
    y = ops.winograd_output(prod, at, m, (n, k, oh, ow))
    return [_channel_bias(ctx, y, optional(ins, 2))]


@register("ConvTranspose")
def _conv_transpose(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x, w = tensor_input(ctx, node, ins, 0), tensor_input(ctx, node, ins, 1)
    nd = _spatial(node, x)
    sizes = list(shape_of(x)[2:])
    k = list(shape_of(w)[2:])
    strides = _ints(node, "strides", [1] * nd)
    dil = _ints(node, "dilations", [1] * nd)
    opad = _ints(node, "output_padding", [0] * nd)
    auto = node.attrs.get("auto_pad", "NOTSET")
    out_shape = _ints(node, "output_shape", [])[-nd:] if "output_shape" in node.attrs else None
    if out_shape is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [n * s for n, s in zip(sizes, strides)]
    if out_shape is not None:
        begins, ends = [], []
        for d in range(nd):
            total = (strides[d] * (sizes[d] - 1) + opad[d] + (k[d] - 1) * dil[d] + 1
                     - out_shape[d])
            if total < 0:  # a larger output than the full result: rows added at the end
                opad[d] -= total
                total = 0
            half = total // 2
            upper = auto == "SAME_UPPER"  # as ONNX says: NOTSET pads more at the start
            begins.append(half if upper else total - half)
            ends.append(total - half if upper else half)
    elif auto == "VALID":
        begins, ends = [0] * nd, [0] * nd
    else:
        pads = _ints(node, "pads", [0] * 2 * nd)
        begins, ends = pads[:nd], pads[nd:]
    if nd == 1:
        x, w = _lift(x), _lift(w)
        strides, dil, opad = [1, *strides], [1, *dil], [0, *opad]
        begins, ends = [0, *begins], [0, *ends]
    y = ops.conv2d_transpose_nchw(x, w, stride=tuple(strides), padding=(*begins, *ends),
                                  output_padding=tuple(opad),
                                  groups=int(node.attrs.get("group", 1)), dilation=tuple(dil))
    y = _channel_bias(ctx, y, optional(ins, 2))
    return [ops.squeeze(y, 2) if nd == 1 else y]


@register("Gemm")
def _gemm(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    alpha = float(node.attrs.get("alpha", 1.0))
    beta = float(node.attrs.get("beta", 1.0))
    ta, tb = bool(node.attrs.get("transA", 0)), bool(node.attrs.get("transB", 0))
    a, b = tensor_input(ctx, node, ins, 0), tensor_input(ctx, node, ins, 1)
    panels = B_PANELS in node.attrs  # B as column panels (passes.pack_gemm_weights)
    if a.ndim != 2 or b.ndim != 2 + panels:
        raise fail(node, f"A {a.shape} and B {b.shape} must be 2-d")
    if panels:
        y = ops.panel_matmul(a, b, int(node.attrs[B_PANELS]), transpose_a=ta)
    else:
        y = ops.matmul(a, b, transpose_a=ta, transpose_b=tb)
    if alpha != 1.0:
        y = ops.multiply(y, alpha)
    c = optional(ins, 2)
    if c is not None and beta != 0.0:
        if isinstance(c, np.ndarray) and beta != 1.0:
            c, beta = (c * beta).astype(c.dtype), 1.0
        cv: Any = _operand(ctx, c, [y])
        if beta != 1.0:
            cv = ops.multiply(cv, beta)
        y = ops.add(y, cv)
    return [y]


@register("MatMul")
def _matmul(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    a, b = required(node, ins, 0), required(node, ins, 1)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [np.matmul(a, b)]
    if B_PANELS in node.attrs:  # B as column panels (passes.pack_gemm_weights)
        return [ops.panel_matmul(ctx.const(a), ctx.const(b), int(node.attrs[B_PANELS]))]
    return [ops.matmul(ctx.const(a), ctx.const(b))]


def _pool(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    nd = x.ndim - 2
    if nd != 3:
        _spatial(node, x)
    if len(node.outputs) > 1 and node.outputs[1]:
        raise fail(node, "the Indices output is not supported")
    k = _ints(node, "kernel_shape", [])
    if len(k) != nd:
        raise fail(node, f"kernel_shape {k} must have {nd} entries for input {x.shape}")
    strides = _ints(node, "strides", [1] * nd)
    dil = _ints(node, "dilations", [1] * nd)
    strides, begins, ends = _window(node, list(shape_of(x)[2:]), k, strides, dil)
    ceil_mode = bool(node.attrs.get("ceil_mode", 0))
    if nd == 3:
        return [_pool3d(node, x, k, strides, dil, begins, ends, ceil_mode)]
    if nd == 1:
        x = _lift(x)
        k, strides, dil, begins, ends = [1, *k], [1, *strides], [1, *dil], [0, *begins], [0, *ends]
    geometry: dict[str, Any] = dict(pool_size=tuple(k), strides=tuple(strides),
                                    padding=(*begins, *ends), dilation=tuple(dil),
                                    ceil_mode=ceil_mode)
    if node.op_type == "MaxPool":
        y = ops.max_pool2d(x, **geometry)
    else:
        y = ops.avg_pool2d(x, count_include_pad=bool(node.attrs.get("count_include_pad", 0)),
                           **geometry)
    return [ops.squeeze(y, 2) if nd == 1 else y]


register("MaxPool", "AveragePool")(_pool)


def _pool3d(node: Node, x: Tensor, k: list[int], strides: list[int], dil: list[int],
            begins: list[int], ends: list[int], ceil_mode: bool) -> Tensor:
    """3-d max / average pooling (NCDHW) with the 2-d pools' window geometry per dim."""
    from autosched.te import dtype as dt
    from autosched.te.ops.pool import _Window

    op = node.op_type
    sizes = list(shape_of(x)[2:])
    wins = [_Window(n, *geo, ceil_mode, op) for n, geo in zip(sizes, zip(k, strides, dil, begins,
                                                                      ends))]
    rs = [te.reduce_axis((0, w.k), f"r{d}") for d, w in enumerate(wins)]
    out_shape = (*x.shape[:2], *(w.out for w in wins))
    is_max = op == "MaxPool"
    if not is_max and not x.dtype.startswith("float"):
        raise fail(node, f"needs a float input, got {x.dtype}")
    fill = te.const(dt.min_value(x.dtype) if is_max else 0, x.dtype)

    def window(*i: Any) -> Any:
        rows = [w.row(i[2 + d], r) for d, (w, r) in enumerate(zip(wins, rs))]
        conds = [c for w, row in zip(wins, rows) for c in w.guards(row)]
        v: Expr = x[(i[0], i[1], *rows)]
        v = I.if_then_else(I.all(*conds), v, fill) if conds else v
        return (te.max if is_max else te.sum)(v, axis=rs)

    total = compute(out_shape, window, name="pool3d_max" if is_max else "pool3d_sum")
    if is_max:
        return total
    include = bool(node.attrs.get("count_include_pad", 0))

    def mean(*i: Any) -> Any:
        count: Any = 1
        for d, w in enumerate(wins):
            count = count * w.count(i[2 + d], include)
        if isinstance(count, int):
            return total[i] * (1.0 / count)
        return total[i] / te.cast(x.dtype, count)

    return compute(out_shape, mean, name="pool3d_avg", tag=BROADCAST)


@register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    avg = node.op_type == "GlobalAveragePool"
    if x.ndim == 4:
        return [ops.global_avg_pool2d(x) if avg else ops.global_max_pool2d(x)]
    if x.ndim < 3:
        raise fail(node, f"needs (N, C, spatial...) input, got {x.shape}")
    axes = tuple(range(2, x.ndim))
    return [ops.mean(x, axes, keepdims=True) if avg else ops.max(x, axes, keepdims=True)]


@register("Softmax", "LogSoftmax")
def _softmax(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    fn = ops.softmax if node.op_type == "Softmax" else ops.log_softmax
    axis = int(node.attrs.get("axis", 1 if ctx.opset < 13 else -1))
    ax = axis + x.ndim if axis < 0 else axis
    if not 0 <= ax < max(x.ndim, 1):
        raise fail(node, f"axis {axis} is out of range for input {x.shape}")
    if ctx.opset >= 13 or ax == x.ndim - 1:
        return [fn(x, ax)]
    # before opset 13 the input is flattened to 2-d at axis and normalised along dim 1
    flat = ops.flatten(x, ax)
    return [ops.reshape(fn(flat, 1), shape_of(x))]


def _param(ctx: ConvertContext, v: Value | None, shape: tuple[int, ...]) -> Tensor | None:
    """A scale / bias stretched to the normalised shape when it is a constant that broadcasts."""
    if v is None:
        return None
    if isinstance(v, np.ndarray) and tuple(v.shape) != shape:
        v = np.asarray(np.broadcast_to(v, shape), order="C")
    return ctx.const(v)


@register("LayerNormalization")
def _layer_norm(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    axis = int(node.attrs.get("axis", -1))
    ax = axis + x.ndim if axis < 0 else axis
    axes = tuple(range(ax, x.ndim))
    eps = float(node.attrs.get("epsilon", 1e-5))
    shape = tuple(shape_of(x)[d] for d in axes)
    g = _param(ctx, optional(ins, 1), shape)
    b = _param(ctx, optional(ins, 2), shape)
    outs: list[Value] = [ops.layer_norm(x, g, b, axis=axes, eps=eps)]
    if any(node.outputs[1:]):
        mean, var = moments(x, axes, "LayerNormalization")
        inv = compute(var.shape, lambda *i: I.rsqrt(var[i] + eps), name="T_inv_std_dev")
        outs += [mean, inv]
    return outs


@register("BatchNormalization")
def _batch_norm(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    if node.attrs.get("training_mode", 0):
        raise fail(node, "training_mode=1 is not supported (inference only)")
    x = tensor_input(ctx, node, ins, 0)
    if len(ins) < 5:
        raise fail(node, f"needs X, scale, B, mean and var; got {len(ins)} inputs")
    scale, bias, mean, var = (tensor_input(ctx, node, ins, pos) for pos in range(1, 5))
    return [ops.batch_norm_inference(x, scale, bias, mean, var,
                                     eps=float(node.attrs.get("epsilon", 1e-5)))]


@register("InstanceNormalization")
def _instance_norm(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    x = tensor_input(ctx, node, ins, 0)
    return [ops.instance_norm(x, tensor_input(ctx, node, ins, 1), tensor_input(ctx, node, ins, 2),
                              eps=float(node.attrs.get("epsilon", 1e-5)))]



@register("LRN")
def _lrn(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    """x / (bias + alpha / size * sum of x^2 over a window of channels) ^ beta."""
    x = tensor_input(ctx, node, ins, 0)
    if x.ndim < 3:
        raise fail(node, f"needs (N, C, spatial...) input, got {x.shape}")
    size = int(node.attrs["size"])
    alpha = float(node.attrs.get("alpha", 1e-4))
    beta = float(node.attrs.get("beta", 0.75))
    bias = float(node.attrs.get("bias", 1.0))
    c = shape_of(x)[1]
    lo = (size - 1) // 2
    sq = compute(x.shape, lambda *i: x[i] * x[i], name="T_lrn_square")
    r = te.reduce_axis((0, size), "rc")
    zero = te.const(0.0, x.dtype)

    def window(*i: Any) -> Any:
        ch = i[1] + r - lo
        v = sq[(i[0], ch, *i[2:])]
        return te.sum(I.if_then_else(I.all(ch >= 0, ch < c), v, zero), axis=r)

    total = compute(x.shape, window, name="T_lrn_sum")
    scale = alpha / size
    return [compute(x.shape, lambda *i: x[i] / I.pow(total[i] * scale + bias, beta),
                    name="T_lrn", tag=BROADCAST)]
