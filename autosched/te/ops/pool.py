"""2-d pooling: max_pool2d, avg_pool2d, global_max_pool2d, global_avg_pool2d (NCHW default,
NHWC with ``layout="NHWC"``).

``pool_size``, ``strides`` and ``dilation`` are an int or (h, w) (strides default to 1, as in
ONNX and TVM); ``padding`` is an int, (pad_h, pad_w) or (top, left, bottom, right). Output size
per spatial dim: (size + pad_begin + pad_end - dilation * (k - 1) - 1) / stride + 1, rounded
down, or up with ``ceil_mode`` (then a last window that would start past the input and the
begin padding is dropped, as PyTorch and onnxruntime do). Padding never wins a max and is never
summed; reads outside the input are guarded by ``te.if_then_else`` inside the reduction.
avg_pool2d divides by the taps inside the input (``count_include_pad=False``, ONNX's default)
or inside the padded input (``True``; taps a ceil-mode window hangs past the end padding are
never counted).

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((1, 3, 15, 15), name="x")
    y = ops.max_pool2d(x, 3, strides=2, padding=1)              # (1, 3, 8, 8)
    z = ops.avg_pool2d(x, (2, 3), strides=2, ceil_mode=True)    # (1, 3, 8, 7)
"""

from __future__ import annotations

from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr, cast, const
from autosched.te.ops import args
from autosched.te.ops.reduction import reduce
from autosched.te.ops.tags import ELEMWISE
from autosched.te.tensor import Tensor, compute, reduce_axis

# max_pool2d takes a window's max in two passes (rows, then columns) from this many taps:
# 3 x 3 windows (6 compares an output instead of 9, plus a pass over an intermediate as
# wide as the input) stay one pass
SEPARABLE_TAPS = 16


def _spatial_axes(data: Tensor, layout: str, op: str) -> tuple[int, int]:
    if layout not in ("NCHW", "NHWC"):
        raise TEError(f"{op}: layout must be NCHW or NHWC, got {layout!r}")
    args.ndim_is(data, 4, op, f"data ({layout})")
    return layout.index("H"), layout.index("W")


class _Window:
    """The geometry of one spatial dim: which input rows output row ``y``'s taps read."""

    def __init__(self, size: int, k: int, s: int, d: int, pb: int, pe: int, ceil: bool, op: str):
        span = size + pb + pe - d * (k - 1) - 1
        if span < 0:
            raise TEError(f"{op}: window {k} (dilation {d}) is larger than the padded input "
                          f"{size} (padding {pb}, {pe})")
        out = -(-span // s) + 1 if ceil else span // s + 1
        if ceil and (out - 1) * s >= size + pb:
            out -= 1
        self.size, self.k, self.s, self.d, self.pb, self.pe, self.out = size, k, s, d, pb, pe, out

    def row(self, y: Expr, r: Any) -> Expr:
        start = y if self.s == 1 else y * self.s
        tap = r if self.d == 1 else r * self.d
        return start + tap - self.pb if self.pb else start + tap

    def guards(self, row: Expr) -> list[Expr]:
        """Conditions for ``row`` to lie in the input, only those some window can break."""
        conds = [row >= 0] if self.pb else []
        last = (self.out - 1) * self.s + (self.k - 1) * self.d - self.pb
        return [*conds, row < self.size] if last >= self.size else conds

    def count(self, y: Expr, include_pad: bool) -> Expr | int:
        """How many taps of window ``y`` fall in [0, size) (or the padded range)."""
        lo, hi = (-self.pb, self.size + self.pe) if include_pad else (0, self.size)
        start = (self.out - 1) * self.s - self.pb
        if -self.pb >= lo and start + (self.k - 1) * self.d < hi:
            return self.k  # no window is ever cut: a constant divisor
        first = y * self.s - self.pb
        d = self.d
        r_lo = I.max(I.floordiv(lo - first + (d - 1), d), 0)
        r_hi = I.min(I.floordiv(hi - 1 - first, d), self.k - 1)
        return I.max(r_hi - r_lo + 1, 1)


def _setup(
    data: Tensor, pool_size: Any, strides: Any, padding: Any, dilation: Any, ceil_mode: bool,
    layout: str, op: str,
) -> tuple[int, int, _Window, _Window]:
    args.tensor(data, op, "data")
    ha, wa = _spatial_axes(data, layout, op)
    shape = args.static_shape(data, op)
    ks = args.int_tuple(pool_size, 2, op, "pool_size")
    ss = args.int_tuple(strides, 2, op, "strides")
    ds = args.int_tuple(dilation, 2, op, "dilation")
    t, left, b, r = args.padding2d(padding, op)
    for d, (p1, p2) in enumerate(((t, b), (left, r))):
        if max(p1, p2) >= ds[d] * (ks[d] - 1) + 1:
            raise TEError(f"{op}: padding {(t, left, b, r)} must be smaller than the window "
                          f"{ks} (dilation {ds}) so that no window lies wholly in the padding")
    wh = _Window(shape[ha], ks[0], ss[0], ds[0], t, b, ceil_mode, op)
    ww = _Window(shape[wa], ks[1], ss[1], ds[1], left, r, ceil_mode, op)
    return ha, wa, wh, ww


def _out_shape(data: Tensor, ha: int, wa: int, wh: _Window, ww: _Window) -> tuple[args.Dim, ...]:
    return tuple(wh.out if d == ha else ww.out if d == wa else s
                 for d, s in enumerate(data.shape))


def _guarded(v: Expr, conds: list[Expr], fill: Any) -> Expr:
    """``v`` where every condition holds (a tap inside the input), else ``fill``."""
    return I.if_then_else(I.all(*conds), v, fill) if conds else v


def _pooled(data: Tensor, ha: int, wa: int, wh: _Window, ww: _Window, reducer: R.Reducer,
            fill: Any, name: str, tag: str, attrs: dict[str, Any]) -> Tensor:
    ry, rx = reduce_axis((0, wh.k), "ry"), reduce_axis((0, ww.k), "rx")

    def body(*i: Expr) -> Expr:
        iy, ix = wh.row(i[ha], ry), ww.row(i[wa], rx)
        index = tuple(iy if d == ha else ix if d == wa else v for d, v in enumerate(i))
        return reducer(_guarded(data[index], wh.guards(iy) + ww.guards(ix), fill),
                       axis=[ry, rx])

    return compute(_out_shape(data, ha, wa, wh, ww), body, name=name, tag=tag, attrs=attrs)


def _max_along(src: Tensor, axis: int, win: _Window, fill: Any, r_name: str,
               shape: tuple[args.Dim, ...], name: str, attrs: dict[str, Any] | None = None
               ) -> Tensor:
    """The max of each window of ``win`` along one ``axis`` of ``src``."""
    r = reduce_axis((0, win.k), r_name)

    def body(*i: Expr) -> Expr:
        row = win.row(i[axis], r)
        v = src[tuple(row if d == axis else x for d, x in enumerate(i))]
        return R.max(_guarded(v, win.guards(row), fill), axis=[r])

    return compute(shape, body, name=name, tag="pool_max", attrs=attrs)


def _separable_max(data: Tensor, ha: int, wa: int, wh: _Window, ww: _Window, fill: Any,
                   attrs: dict[str, Any]) -> Tensor:
    """The max of each window as the max over its columns of the max over its rows: stage
    ``pool_max_rows`` (every input column, output rows) then ``pool_max``; kh + kw compares
    an output instead of kh * kw."""
    rows = _max_along(data, ha, wh, fill, "ry",
                      tuple(wh.out if d == ha else s for d, s in enumerate(data.shape)),
                      "pool_max_rows")
    return _max_along(rows, wa, ww, fill, "rx", _out_shape(data, ha, wa, wh, ww), "pool_max",
                      attrs)


def _attrs(wh: _Window, ww: _Window, layout: str) -> dict[str, Any]:
    return {"pool_size": (wh.k, ww.k), "strides": (wh.s, ww.s), "dilation": (wh.d, ww.d),
            "padding": (wh.pb, ww.pb, wh.pe, ww.pe), "layout": layout}


def max_pool2d(
    data: Tensor, pool_size: Any, strides: Any = 1, padding: Any = 0, dilation: Any = 1,
    ceil_mode: bool = False, layout: str = "NCHW",
) -> Tensor:
    """The largest element of each window (ONNX MaxPool). Compute ``pool_max``; windows of
    SEPARABLE_TAPS or more taps whose sides add to at most half as many take their rows'
    maxima first (stage ``pool_max_rows``): ddddocr_det's 5 x 5, 9 x 9 and 13 x 13 windows."""
    op = "max_pool2d"
    ha, wa, wh, ww = _setup(data, pool_size, strides, padding, dilation, ceil_mode, layout, op)
    if data.dtype == "bool":
        raise TEError(f"{op}: cannot pool a bool tensor {data.name}")
    fill = const(dt.min_value(data.dtype), data.dtype)
    attrs = _attrs(wh, ww, layout)
    if wh.k * ww.k >= SEPARABLE_TAPS and 2 * (wh.k + ww.k) <= wh.k * ww.k:
        return _separable_max(data, ha, wa, wh, ww, fill, attrs)
    return _pooled(data, ha, wa, wh, ww, R.max, fill, "pool_max", "pool_max", attrs)


def avg_pool2d(
    data: Tensor, pool_size: Any, strides: Any = 1, padding: Any = 0, dilation: Any = 1,
    ceil_mode: bool = False, count_include_pad: bool = False, layout: str = "NCHW",
) -> Tensor:
    """The mean of each window (ONNX AveragePool) of a float tensor: ``pool_sum`` (a reduction)
    then ``pool_avg`` (sum / count, elementwise)."""
    op = "avg_pool2d"
    ha, wa, wh, ww = _setup(data, pool_size, strides, padding, dilation, ceil_mode, layout, op)
    args.float_dtype(data, op)
    zero = const(0, data.dtype)
    attrs = {**_attrs(wh, ww, layout), "count_include_pad": bool(count_include_pad)}
    total = _pooled(data, ha, wa, wh, ww, R.sum, zero, "pool_sum", "pool_avg", attrs)

    def body(*i: Expr) -> Expr:
        ch, cw = wh.count(i[ha], count_include_pad), ww.count(i[wa], count_include_pad)
        if isinstance(ch, int) and isinstance(cw, int):
            return total[i] * (1.0 / (ch * cw))
        return total[i] / cast(data.dtype, ch * cw)

    return compute(total.shape, body, name="pool_avg", tag=ELEMWISE)


def _global(data: Tensor, layout: str, op: str) -> tuple[int, int]:
    args.tensor(data, op, "data")
    return _spatial_axes(data, layout, op)


def global_max_pool2d(data: Tensor, layout: str = "NCHW") -> Tensor:
    """Max over H and W, keeping them as size-1 dims: (N, C, 1, 1) for NCHW."""
    ha, wa = _global(data, layout, "global_max_pool2d")
    if data.dtype == "bool":
        raise TEError(f"global_max_pool2d: cannot pool a bool tensor {data.name}")
    return reduce(data, (ha, wa), True, R.max, "global_pool_max", "global_max_pool2d")


def global_avg_pool2d(data: Tensor, layout: str = "NCHW") -> Tensor:
    """Mean over H and W of a float tensor, keeping them as size-1 dims: (N, C, 1, 1)."""
    op = "global_avg_pool2d"
    ha, wa = _global(data, layout, op)
    args.float_dtype(data, op)
    total = reduce(data, (ha, wa), True, R.sum, "global_pool_sum", op)
    scale = 1.0 / (args.static_shape(data, op)[ha] * data.shape[wa])
    return compute(total.shape, lambda *i: total[i] * scale, name="global_avg_pool",
                   tag=ELEMWISE)
