"""2-d convolutions: conv2d_nchw (kernel OIHW), conv2d_nhwc (kernel HWIO), depthwise, grouped,
conv2d_transpose_nchw, and im2col (the patches as matmul columns).

Shared arguments: ``stride`` and ``dilation`` are an int or (h, w); ``padding`` is an int,
(pad_h, pad_w) or (top, left, bottom, right) as ONNX orders ``pads``; ``groups`` splits the
input channels C and output channels O into that many independent convolutions (the kernel's
input-channel dim is C / groups; groups == C is depthwise). Output size per spatial dim:
(size + pad_begin + pad_end - dilation * (k - 1) - 1) // stride + 1. Padding is a separate
``pad_temp`` stage (tag ``injective,pad``), which a schedule usually inlines. ``out_dtype``
casts both operands before multiplying (int8 data with out_dtype="int32").

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((1, 8, 15, 17), name="x")
    w = te.placeholder((16, 4, 3, 3), name="w")             # groups=2: 8 / 2 = 4 in-channels
    y = ops.conv2d_nchw(x, w, stride=2, padding=1, groups=2)  # (1, 16, 8, 9)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr, cast
from autosched.te.ops import args
from autosched.te.ops.transform import pad
from autosched.te.tensor import Tensor, compute, reduce_axis


def _scaled(v: Any, s: int) -> Any:
    return v if s == 1 else v * s


def _out_dtype(data: Tensor, kernel: Tensor, out_dtype: str | None, op: str) -> str:
    args.same_dtype([data, kernel], op)
    if data.dtype == "bool":
        raise TEError(f"{op}: cannot convolve bool tensors")
    return dt.check(out_dtype or data.dtype)


def _as(v: Expr, dtype: str) -> Expr:
    return v if v.dtype == dtype else cast(dtype, v)


def _geometry(
    op: str, hw: tuple[int, int], khw: tuple[int, int], stride: Any, padding: Any, dilation: Any
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, int, int, int], tuple[int, int]]:
    strides = args.int_tuple(stride, 2, op, "stride")
    dil = args.int_tuple(dilation, 2, op, "dilation")
    pads = args.padding2d(padding, op)
    out = []
    for d in range(2):
        span = hw[d] + pads[d] + pads[d + 2] - dil[d] * (khw[d] - 1) - 1
        if span < 0:
            raise TEError(
                f"{op}: kernel {khw} (dilation {dil}) is larger than the padded input {hw} "
                f"(padding {pads})"
            )
        out.append(span // strides[d] + 1)
    return strides, dil, pads, (out[0], out[1])


def accumulator_rows(rows: int) -> int:
    """The output rows a channels-last convolution computes: ``rows`` rounded up to a
    multiple of 6 (or of 3) where that adds at most an eighth, so register tiles of 3 or 6
    rows exist (with 16 AVX2 registers, 6 rows x 2 vectors leaves room for the operands;
    ResNet's 112, 56, 28 and 14 rows have no factor 3). The rows past the output are summed
    over zero padding and never stored."""
    for m in (6, 3):
        up = -(-rows // m) * m
        if up - rows <= rows // 8:
            return up
    return rows


def _groups(groups: Any, c_in: int, c_out: int, k_in: int, op: str, what: str) -> None:
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise TEError(f"{op}: groups must be a positive int, got {groups!r}")
    if c_in % groups or c_out % groups:
        raise TEError(f"{op}: groups={groups} must divide the input channels ({c_in}) and the "
                      f"output channels ({c_out}); {what}")
    if k_in != c_in // groups:
        raise TEError(f"{op}: the kernel has {k_in} input channels but the data has {c_in} "
                      f"channels / groups={groups} = {c_in // groups}; {what}")


def _channel(f: Expr, rc: Any, groups: int, per_group: int, ci: int) -> Any:
    """The input channel that reduce step ``rc`` of output channel ``f`` reads."""
    if groups == 1:
        return rc
    g = I.floordiv(f, per_group)
    return g if ci == 1 else g * ci + rc


def _attrs(strides: Any, pads: Any, dil: Any, groups: int) -> dict[str, Any]:
    return {"strides": strides, "padding": pads, "dilation": dil, "groups": groups}


def conv2d_nchw(
    data: Tensor, kernel: Tensor, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1, out_dtype: str | None = None, kernel_layout: str = "OIHW",
) -> Tensor:
    """out[n, f, y, x] = sum_{c, ky, kx} pad(data)[n, g*Cg + c, y*sh + ky*dh, x*sw + kx*dw]
    * kernel[f, c, ky, kx] with data (N, C, H, W), kernel (O, C / groups, KH, KW), g the group
    of output channel f. Compute ``conv2d_nchw`` (tag ``conv2d_nchw``;
    ``group_conv2d_nchw`` / ``depthwise_conv2d_nchw`` when grouped).

    ``kernel_layout="IHWO"`` takes the kernel as (C / groups, KH, KW, O), output channels
    last (a constant kernel transposed once, ahead of time): the sums are then computed
    channels-last in a stage ``conv2d_nhwc_acc`` (N, OH, OW, O), whose channel axis is the
    contiguous one a CPU vectorizes even when the rows are 7 wide or strided, and
    ``conv2d_nchw`` stores them NCHW."""
    op = "conv2d_nchw"
    if kernel_layout not in ("OIHW", "IHWO"):
        raise TEError(f"{op}: kernel_layout must be OIHW or IHWO, got {kernel_layout!r}")
    args.tensor(data, op, "data")
    args.tensor(kernel, op, "kernel")
    args.ndim_is(data, 4, op, "data (N, C, H, W)")
    args.ndim_is(kernel, 4, op, f"kernel ({', '.join(kernel_layout)})")
    n, c, h, w = args.static_shape(data, op)
    dims = dict(zip(kernel_layout, args.static_shape(kernel, op)))
    o, ci, kh, kw = dims["O"], dims["I"], dims["H"], dims["W"]
    _groups(groups, c, o, ci, op, f"data {data.shape}, kernel {kernel.shape} ({kernel_layout})")
    out_dt = _out_dtype(data, kernel, out_dtype, op)
    strides, dil, pads, (oh, ow) = _geometry(op, (h, w), (kh, kw), stride, padding, dilation)
    rows = oh if kernel_layout == "OIHW" else accumulator_rows(oh)
    bottom = max(pads[2], (rows - 1) * strides[0] + dil[0] * (kh - 1) + 1 - h - pads[0])
    padded = data if not any((*pads, bottom)) else pad(
        data, (0, 0, pads[0], pads[1]), (0, 0, bottom, pads[3]), name="pad_temp")
    rc, ry, rx = reduce_axis((0, ci), "rc"), reduce_axis((0, kh), "ry"), reduce_axis((0, kw), "rx")
    per_group = o // groups

    def body(b: Expr, f: Expr, y: Expr, x: Expr) -> Expr:
        ch = _channel(f, rc, groups, per_group, ci)
        v = padded[b, ch, _scaled(y, strides[0]) + _scaled(ry, dil[0]),
                   _scaled(x, strides[1]) + _scaled(rx, dil[1])]
        k = kernel[f, rc, ry, rx] if kernel_layout == "OIHW" else kernel[rc, ry, rx, f]
        return R.sum(_as(v, out_dt) * _as(k, out_dt), axis=[rc, ry, rx])

    tag = op if groups == 1 else "depthwise_conv2d_nchw" if ci == 1 else "group_conv2d_nchw"
    attrs = _attrs(strides, pads, dil, groups)
    if kernel_layout == "OIHW":
        return compute((n, o, oh, ow), body, name="conv2d_nchw", tag=tag, attrs=attrs)
    acc = compute((n, rows, ow, o), lambda b, y, x, f: body(b, f, y, x), name="conv2d_nhwc_acc",
                  tag=tag, attrs=attrs)
    return compute((n, o, oh, ow), lambda b, f, y, x: acc[b, y, x, f], name="conv2d_nchw",
                   tag="injective", attrs={**attrs, "kernel_layout": kernel_layout})


def im2col(data: Tensor, kernel_size: Any, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, layout: str = "NCHW", batch_columns: bool = False) -> Tensor:
    """The patches a convolution multiplies, one column per output pixel: data (N, C, H, W)
    becomes (N, C * KH * KW, OH * OW) with
    ``col[n, (c * KH + ky) * KW + kx, y * OW + x] = pad(data)[n, c, y*sh + ky*dh, x*sw + kx*dw]``
    (zero in the padding). A convolution with an (O, C, KH, KW) kernel is then the matmul
    ``kernel.reshape(O, -1) @ col``, (N, O, OH * OW): the form tensor cores multiply
    (graph.passes.gemm_convs). With ``batch_columns`` the columns run over the whole batch,
    (C * KH * KW, N * OH * OW) with column ``n * OH * OW + y * OW + x``: the convolution is one
    GEMM whose output is (O, N * OH * OW), each weight read once for the batch. ``layout``
    "CNHW" reads data stored (C, N, H, W), such a GEMM's output viewed as an image. Compute
    ``im2col``, tag ``injective``."""
    op = "im2col"
    args.tensor(data, op, "data")
    if layout not in ("NCHW", "CNHW"):
        raise TEError(f"{op}: layout must be NCHW or CNHW, got {layout!r}")
    args.ndim_is(data, 4, op, f"data ({', '.join(layout)})")
    n, c, h, w = args.static_shape(data, op)
    if layout == "CNHW":
        n, c = c, n
    kh, kw = args.int_tuple(kernel_size, 2, op, "kernel_size")
    strides, dil, pads, (oh, ow) = _geometry(op, (h, w), (kh, kw), stride, padding, dilation)
    padded = data if not any(pads) else pad(
        data, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3]), name="pad_temp")

    def patch(b: Expr, k: Expr, p: Expr) -> Expr:
        y, x = I.floordiv(p, ow), I.floormod(p, ow)
        ky, kx = I.floormod(I.floordiv(k, kw), kh), I.floormod(k, kw)
        ch = I.floordiv(k, kh * kw)
        iy = _scaled(y, strides[0]) + _scaled(ky, dil[0])
        ix = _scaled(x, strides[1]) + _scaled(kx, dil[1])
        return padded[ch, b, iy, ix] if layout == "CNHW" else padded[b, ch, iy, ix]

    attrs = _attrs(strides, pads, dil, 1)
    if batch_columns:
        return compute((c * kh * kw, n * oh * ow),
                       lambda k, q: patch(I.floordiv(q, oh * ow), k, I.floormod(q, oh * ow)),
                       name="im2col", tag="injective", attrs=attrs)
    return compute((n, c * kh * kw, oh * ow), patch, name="im2col", tag="injective",
                   attrs=attrs)


def conv2d_nhwc(
    data: Tensor, kernel: Tensor, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    groups: int = 1, out_dtype: str | None = None,
) -> Tensor:
    """out[n, y, x, f] = sum_{ky, kx, c} pad(data)[n, y*sh + ky*dh, x*sw + kx*dw, g*Cg + c]
    * kernel[ky, kx, c, f] with data (N, H, W, C), kernel (KH, KW, C / groups, O).
    Compute ``conv2d_nhwc``."""
    op = "conv2d_nhwc"
    args.tensor(data, op, "data")
    args.tensor(kernel, op, "kernel")
    args.ndim_is(data, 4, op, "data (N, H, W, C)")
    args.ndim_is(kernel, 4, op, "kernel (KH, KW, I, O)")
    n, h, w, c = args.static_shape(data, op)
    kh, kw, ci, o = args.static_shape(kernel, op)
    _groups(groups, c, o, ci, op, f"data {data.shape}, kernel {kernel.shape}")
    out_dt = _out_dtype(data, kernel, out_dtype, op)
    strides, dil, pads, (oh, ow) = _geometry(op, (h, w), (kh, kw), stride, padding, dilation)
    padded = data if not any(pads) else pad(
        data, (0, pads[0], pads[1], 0), (0, pads[2], pads[3], 0), name="pad_temp")
    ry, rx, rc = reduce_axis((0, kh), "ry"), reduce_axis((0, kw), "rx"), reduce_axis((0, ci), "rc")
    per_group = o // groups

    def body(b: Expr, y: Expr, x: Expr, f: Expr) -> Expr:
        ch = _channel(f, rc, groups, per_group, ci)
        v = padded[b, _scaled(y, strides[0]) + _scaled(ry, dil[0]),
                   _scaled(x, strides[1]) + _scaled(rx, dil[1]), ch]
        return R.sum(_as(v, out_dt) * _as(kernel[ry, rx, rc, f], out_dt), axis=[ry, rx, rc])

    tag = op if groups == 1 else "depthwise_conv2d_nhwc" if ci == 1 else "group_conv2d_nhwc"
    return compute((n, oh, ow, o), body, name="conv2d_nhwc", tag=tag,
                   attrs=_attrs(strides, pads, dil, groups))


def depthwise_conv2d_nchw(
    data: Tensor, kernel: Tensor, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
    out_dtype: str | None = None,
) -> Tensor:
    """Depthwise convolution with TVM's kernel layout (C, M, KH, KW), M the channel multiplier:
    output channel f = c * M + m reads input channel c only. Equals conv2d_nchw with
    groups=C and the kernel reshaped to (C * M, 1, KH, KW). Compute
    ``depthwise_conv2d_nchw``."""
    op = "depthwise_conv2d_nchw"
    args.tensor(data, op, "data")
    args.tensor(kernel, op, "kernel")
    args.ndim_is(data, 4, op, "data (N, C, H, W)")
    args.ndim_is(kernel, 4, op, "kernel (C, M, KH, KW)")
    n, c, h, w = args.static_shape(data, op)
    kc, m, kh, kw = args.static_shape(kernel, op)
    if kc != c:
        raise TEError(f"{op}: kernel {kernel.shape} has {kc} channels, data {data.shape} has {c}")
    out_dt = _out_dtype(data, kernel, out_dtype, op)
    strides, dil, pads, (oh, ow) = _geometry(op, (h, w), (kh, kw), stride, padding, dilation)
    padded = data if not any(pads) else pad(
        data, (0, 0, pads[0], pads[1]), (0, 0, pads[2], pads[3]), name="pad_temp")
    ry, rx = reduce_axis((0, kh), "ry"), reduce_axis((0, kw), "rx")

    def body(b: Expr, f: Expr, y: Expr, x: Expr) -> Expr:
        ch = f if m == 1 else I.floordiv(f, m)
        mi = 0 if m == 1 else I.floormod(f, m)
        v = padded[b, ch, _scaled(y, strides[0]) + _scaled(ry, dil[0]),
                   _scaled(x, strides[1]) + _scaled(rx, dil[1])]
        return R.sum(_as(v, out_dt) * _as(kernel[ch, mi, ry, rx], out_dt), axis=[ry, rx])

    return compute((n, c * m, oh, ow), body, name="depthwise_conv2d_nchw", tag=op,
                   attrs=_attrs(strides, pads, dil, c))


@dataclass(frozen=True)
class _Phases:
    """One spatial dim of a transposed convolution split by output phase. Output position z
    (counted before the begin padding is cropped) is z = q * stride + p: phase p, phase row q.
    Kernel tap k adds data row i to z = i * stride + k * dilation, so it serves the phase
    (k * dilation) % stride at data row q - (k * dilation) // stride. Each phase is thus a plain
    (stride-1) convolution of the data with its own taps, ``step`` data rows apart; a phase
    with fewer taps than ``taps`` has zeros in the rest (kernels the stride does not divide;
    with a dilation, phases whose taps start off that step, which are then summed one data row
    apart, and phases that no tap reaches: rare in models)."""

    stride: int
    dilation: int
    kernel: int
    step: int        # data rows between successive taps of one phase
    taps: int        # taps per phase: the reduction extent
    crop: int        # output positions cropped at the start (the begin padding)
    rows: int        # phase rows the output keeps
    pad: tuple[int, int]  # zero rows before and after the data
    offset: int      # the padded data row of phase row 0 at reduce step 0

    def kernel_tap(self, p: Any, r: Expr) -> tuple[Any, list[Expr]]:
        """The kernel tap that reduce step ``r`` of phase ``p`` applies, and when it exists.
        Steps run over the taps from the last to the first, so the data row grows with r."""
        back = self.taps - 1 - r if self.taps > 1 else 0
        if self.stride == 1:  # one phase, every step a tap
            return back, []
        at = _scaled(back, self.step * self.stride) + p if self.taps > 1 else p  # tap * dilation
        if self.dilation == 1:
            return at, [at < self.kernel] if self.taps * self.stride > self.kernel else []
        k = I.floordiv(at, self.dilation)
        return k, [I.floormod(at, self.dilation) == 0, k < self.kernel]

    def data_row(self, row: Expr, r: Any) -> Expr:
        """The padded data row that phase row ``row`` reads at reduce step ``r``."""
        at = row + _scaled(r, self.step)
        return at + self.offset if self.offset else at

    def position(self, pos: Expr) -> tuple[Any, Expr]:
        """(phase, phase row) of output position ``pos``."""
        if self.stride == 1:
            return 0, pos
        z = pos + self.crop if self.crop else pos
        first = self.crop // self.stride
        row = I.floordiv(z, self.stride)
        return I.floormod(z, self.stride), row - first if first else row


def _phases(size: int, kernel: int, stride: int, dilation: int, crop: int, out: int
            ) -> _Phases:
    """The phases of one dim: data ``size``, ``kernel`` taps, ``crop`` = the begin padding,
    ``out`` positions kept."""
    offsets = [k * dilation // stride for k in range(kernel)]
    step = dilation // math.gcd(dilation, stride)
    if any(o % step for o in offsets):
        step = 1
    taps = offsets[-1] // step + 1
    first = crop // stride
    rows = (crop + out - 1) // stride - first + 1
    base = first - (taps - 1) * step
    before, after = max(-base, 0), max(rows + first - size, 0)
    return _Phases(stride, dilation, kernel, step, taps, crop, rows, (before, after),
                   base + before)


def conv2d_transpose_nchw(
    data: Tensor, kernel: Tensor, stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
    groups: int = 1, dilation: Any = 1, out_dtype: str | None = None,
) -> Tensor:
    """The gradient of conv2d_nchw with respect to its input (ONNX ConvTranspose): data
    (N, C, H, W), kernel (C, O / groups, KH, KW) as ONNX and TVM lay it out. Output size per
    spatial dim: (size - 1) * stride - pad_begin - pad_end + dilation * (k - 1) +
    output_padding + 1; ``output_padding`` (int or pair) adds rows / columns at the bottom /
    right and must be smaller than the stride or the dilation.

    Computed by output phase, so that only the taps that reach an output are summed: output
    row y of stride sh lies in phase (y + pad_top) % sh, and each of the sh * sw phases is a
    stride-1 convolution of the (padded) data with its own taps of the kernel. A stage
    ``kernel_phases`` (C, O / groups, SH, SW, TH, TW) lays the taps out per phase (an index
    remap that a schedule inlines; zeros where a phase has fewer taps), the reduction
    ``conv2d_transpose_phases`` (N, O, SH, SW, rows, columns) sums them over the data's
    contiguous rows, and ``conv2d_transpose_nchw`` interleaves the phases into (N, O, OH, OW).
    With stride 1 there is one phase and the reduction is the output. Tags
    ``conv2d_transpose_nchw`` on the reduction."""
    op = "conv2d_transpose_nchw"
    args.tensor(data, op, "data")
    args.tensor(kernel, op, "kernel")
    args.ndim_is(data, 4, op, "data (N, C, H, W)")
    args.ndim_is(kernel, 4, op, "kernel (C, O / groups, KH, KW)")
    n, c, h, w = args.static_shape(data, op)
    kc, og, kh, kw = args.static_shape(kernel, op)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise TEError(f"{op}: groups must be a positive int, got {groups!r}")
    if kc != c or c % groups:
        raise TEError(f"{op}: data {data.shape} has {c} channels; the kernel {kernel.shape} "
                      f"needs {c} in dim 0 and groups={groups} must divide it")
    out_dt = _out_dtype(data, kernel, out_dtype, op)
    strides = args.int_tuple(stride, 2, op, "stride")
    dil = args.int_tuple(dilation, 2, op, "dilation")
    pads = args.padding2d(padding, op)
    opad = args.int_tuple(output_padding, 2, op, "output_padding", minimum=0)
    for d in range(2):
        if opad[d] >= strides[d] and opad[d] >= dil[d]:
            raise TEError(f"{op}: output_padding {opad} must be smaller than the stride "
                          f"{strides} or the dilation {dil}")
    size = [(s - 1) * strides[d] - pads[d] - pads[d + 2] + dil[d] * (k - 1) + opad[d] + 1
            for d, (s, k) in enumerate(((h, kh), (w, kw)))]
    if min(size) < 1:
        raise TEError(f"{op}: padding {pads} leaves no output for input {data.shape} and "
                      f"kernel {kernel.shape}")
    py, px = (_phases(s, k, strides[d], dil[d], pads[d], size[d])
              for d, (s, k) in enumerate(((h, kh), (w, kw))))
    zero = args.scalar(0, kernel.dtype, op)

    def tap(ci: Expr, fo: Expr, sy: Any, sx: Any, ty: Expr, tx: Expr) -> Expr:
        ky, cy = py.kernel_tap(sy, ty)
        kx, cx = px.kernel_tap(sx, tx)
        k = kernel[ci, fo, ky, kx]
        return I.if_then_else(I.all(*cy, *cx), k, zero) if cy or cx else k

    taps = compute((c, og, py.stride, px.stride, py.taps, px.taps), tap, name="kernel_phases",
                   tag="injective")
    padded = data if not any((*py.pad, *px.pad)) else pad(
        data, (0, 0, py.pad[0], px.pad[0]), (0, 0, py.pad[1], px.pad[1]), name="pad_temp")
    cg = c // groups
    rc = reduce_axis((0, cg), "rc")
    ry, rx = reduce_axis((0, py.taps), "ry"), reduce_axis((0, px.taps), "rx")

    def body(b: Expr, f: Expr, sy: Any, sx: Any, y: Expr, x: Expr) -> Expr:
        ch = _channel(f, rc, groups, og, cg)
        fo = f if groups == 1 else I.floormod(f, og)
        v = padded[b, ch, py.data_row(y, ry), px.data_row(x, rx)]
        return R.sum(_as(v, out_dt) * _as(taps[ch, fo, sy, sx, ry, rx], out_dt),
                     axis=[rc, ry, rx])

    attrs = {**_attrs(strides, pads, dil, groups), "output_padding": opad}
    if strides == (1, 1):
        return compute((n, og * groups, size[0], size[1]),
                       lambda b, f, y, x: body(b, f, 0, 0, y, x), name=op, tag=op, attrs=attrs)
    phases = compute((n, og * groups, py.stride, px.stride, py.rows, px.rows), body,
                     name="conv2d_transpose_phases", tag=op, attrs=attrs)

    def interleave(b: Expr, f: Expr, y: Expr, x: Expr) -> Expr:
        (sy, qy), (sx, qx) = py.position(y), px.position(x)
        return phases[b, f, sy, sx, qy, qx]

    return compute((n, og * groups, size[0], size[1]), interleave, name=op, tag="injective",
                   attrs=attrs)
