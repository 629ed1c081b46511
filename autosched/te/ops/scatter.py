"""Indexing operators of ONNX: gather_nd, scatter_elements, scatter_nd, one_hot, trilu, cumsum.

A scatter is written as a pure function of its output position: each output element searches
the updates that land on it (a reduction over the update positions with a match condition),
so it schedules like any reduction and needs no in-place writes. Duplicate indices follow
``reduction``: ``none`` keeps the last matching update (the order ONNX's reference applies
them in), ``add`` / ``mul`` / ``max`` / ``min`` combine every match with the data.

Example::

    from autosched import te
    from autosched.te.ops import scatter
    x = te.placeholder((4, 5), name="x")
    i = te.placeholder((2, 1), dtype="int64", name="i")
    u = te.placeholder((2, 5), name="u")
    y = scatter.scatter_nd(x, i, u)                  # rows i[0], i[1] replaced by u
    c = scatter.cumsum(x, axis=1, exclusive=True)    # (4, 5)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr, cast
from autosched.te.ops import args
from autosched.te.ops.tags import INJECTIVE, REDUCE
from autosched.te.ops.transform import _index_tensor, _index_value, reshape
from autosched.te.tensor import Tensor, compute, reduce_axis

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _combine(reduction: str) -> tuple[R.Reducer, Callable[[Expr, Expr], Expr]]:
    """The reducer over matching updates and how its result joins the data element."""
    if reduction == "add":
        return R.sum, lambda d, u: d + u
    if reduction == "mul":
        return R.prod, lambda d, u: d * u
    if reduction == "max":
        return R.max, I.max
    return R.min, I.min


def _scatter(data: Tensor, count: Sequence[int], matches: Callable[..., Expr],
             update: Callable[..., Expr], reduction: str, name: str) -> Tensor:
    """out[p] = data[p] combined with update(p, r) over the positions r (of extents ``count``)
    where matches(p, r); ``none`` takes the last match."""
    if reduction not in REDUCTIONS:
        raise TEError(f"{name}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    shape = args.static_shape(data, name)
    if reduction == "none":
        total = args.prod(count)
        rv = reduce_axis((0, total), name="r")

        def last(*p: Expr) -> Expr:
            r = _unflatten(rv.var, count)
            return R.max(I.if_then_else(matches(p, r), rv.var, -1), axis=rv)

        hit = compute(shape, last, name=f"T_{name}_hit", tag=REDUCE)
        return compute(shape, lambda *p: I.if_then_else(
            hit[p] >= 0, update(p, _unflatten(I.max(hit[p], 0), count)), data[p]),
            name=f"T_{name}", tag=INJECTIVE)
    reducer, join = _combine(reduction)
    rvs = [reduce_axis((0, n), name=f"r{d}") for d, n in enumerate(count)]
    ident = reducer.fidentity(data.dtype)

    def body(*p: Expr) -> Expr:
        r = tuple(v.var for v in rvs)
        return reducer(I.if_then_else(matches(p, r), update(p, r), ident), axis=rvs)

    acc = compute(shape, body, name=f"T_{name}_acc", tag=REDUCE)
    return compute(shape, lambda *p: join(data[p], acc[p]), name=f"T_{name}", tag=INJECTIVE)


def _unflatten(flat: Expr, count: Sequence[int]) -> tuple[Expr, ...]:
    """Row-major coordinates of position ``flat`` in a box of extents ``count``."""
    out: list[Expr] = []
    inner = args.prod(count)
    for d, n in enumerate(count):
        inner //= n
        q = flat if inner == 1 else I.floordiv(flat, inner)
        out.append(q if d == 0 else I.floormod(q, n))
    return tuple(out)


def scatter_elements(data: Tensor, indices: Tensor, updates: Tensor, axis: int = 0,
                     reduction: str = "none") -> Tensor:
    """ONNX ScatterElements: updates[r] goes to data[r with r[axis] = indices[r]]; negative
    indices count from the end."""
    args.tensor(data, "scatter_elements")
    idx = _index_tensor(indices, "normalize", "scatter_elements")
    shape = args.static_shape(data, "scatter_elements")
    ushape = args.static_shape(updates, "scatter_elements")
    ax = args.axis(axis, data.ndim, "scatter_elements")
    if tuple(args.static_shape(idx, "scatter_elements")) != tuple(ushape) or len(ushape) != len(
            shape) or any(u > s for d, (u, s) in enumerate(zip(ushape, shape)) if d != ax):
        raise TEError(f"scatter_elements: indices {idx.shape} and updates {ushape} must have one "
                      f"shape, of the rank of data {shape}, no larger off axis {axis}")
    _same_dtype(data, updates, "scatter_elements")

    def at(p: tuple[Expr, ...], r: tuple[Expr, ...]) -> tuple[Expr, ...]:
        # the update position: r along the axis, p elsewhere (clamped: guarded by matches)
        return (*[I.min(v, n - 1) for v, n in zip(p[:ax], ushape[:ax])], r[0],
                *[I.min(v, n - 1) for v, n in zip(p[ax + 1:], ushape[ax + 1:])])

    def matches(p: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        inside = [v < n for d, (v, n) in enumerate(zip(p, ushape)) if d != ax and n < shape[d]]
        return I.all(*inside, _index_value(idx[at(p, r)], shape[ax], "normalize") == p[ax])

    return _scatter(data, (ushape[ax],), matches, lambda p, r: updates[at(p, r)], reduction,
                    "scatter_elements")


def scatter_nd(data: Tensor, indices: Tensor, updates: Tensor, reduction: str = "none"
               ) -> Tensor:
    """ONNX ScatterND: indices (..., q) address data's first q dims; updates has shape
    indices.shape[:-1] + data.shape[q:]."""
    args.tensor(data, "scatter_nd")
    idx = _index_tensor(indices, "normalize", "scatter_nd")
    shape = args.static_shape(data, "scatter_nd")
    ishape = args.static_shape(idx, "scatter_nd")
    q = ishape[-1] if ishape else 0
    if not ishape or q > len(shape) or tuple(args.static_shape(updates, "scatter_nd")) != (
            *ishape[:-1], *shape[q:]):
        raise TEError(f"scatter_nd: indices {ishape} and updates {updates.shape} do not fit "
                      f"data {shape} (updates must be indices.shape[:-1] + data.shape[q:])")
    _same_dtype(data, updates, "scatter_nd")
    count = max(args.prod(ishape[:-1]), 1)
    flat_idx = reshape(idx, (count, q))
    flat_upd = reshape(updates, (count, *shape[q:]))

    def matches(p: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
        return I.all(*[_index_value(flat_idx[r[0], j], shape[j], "normalize") == p[j]
                       for j in range(q)])

    return _scatter(data, (count,), matches, lambda p, r: flat_upd[(r[0], *p[q:])], reduction,
                    "scatter_nd")


def _same_dtype(data: Tensor, updates: Tensor, op: str) -> None:
    if data.dtype != updates.dtype:
        raise TEError(f"{op}: updates {updates.name} are {updates.dtype}, data {data.name} is "
                      f"{data.dtype}")


def gather_nd(data: Tensor, indices: Tensor, batch_dims: int = 0) -> Tensor:
    """ONNX GatherND: out[b, i, rest] = data[b, indices[b, i, :], rest] with ``batch_dims``
    leading dims b shared by data and indices."""
    args.tensor(data, "gather_nd")
    idx = _index_tensor(indices, "normalize", "gather_nd")
    shape = args.static_shape(data, "gather_nd")
    ishape = args.static_shape(idx, "gather_nd")
    b = batch_dims
    q = ishape[-1] if ishape else 0
    if not ishape or b + q > len(shape) or tuple(ishape[:b]) != tuple(shape[:b]):
        raise TEError(f"gather_nd: indices {ishape} do not fit data {shape} with batch_dims {b}")
    out_shape = (*ishape[:-1], *shape[b + q:])
    lead = len(ishape) - 1

    def body(*o: Expr) -> Expr:
        pos = [_index_value(idx[(*o[:lead], j)], shape[b + j], "normalize") for j in range(q)]
        return data[(*o[:b], *pos, *o[lead:])]

    return compute(out_shape, body, name="T_gather_nd", tag=INJECTIVE)


def one_hot(indices: Tensor, depth: int, off: Expr, on: Expr, axis: int = -1) -> Tensor:
    """ONNX OneHot: a new axis of ``depth`` at ``axis``, ``on`` where it equals the index
    (negative indices count from the end), else ``off``; indices of any number type."""
    args.tensor(indices, "one_hot", "indices")
    if depth < 1:
        raise TEError(f"one_hot: depth must be positive, got {depth}")
    ax = args.axis(axis, indices.ndim + 1, "one_hot")
    shape = args.static_shape(indices, "one_hot")

    def body(*o: Expr) -> Expr:
        v = indices[(*o[:ax], *o[ax + 1:])]
        i = v if v.dtype == "int64" else cast("int64", v)  # float indices truncate, as ONNX
        i = I.if_then_else(i < 0, i + depth, i)
        return I.if_then_else(i == cast("int64", o[ax]), on, off)

    return compute((*shape[:ax], depth, *shape[ax:]), body, name="T_one_hot", tag=INJECTIVE)


def trilu(x: Tensor, k: int = 0, upper: bool = True) -> Tensor:
    """ONNX Trilu: keep the upper (j - i >= k) or lower (j - i <= k) triangle of the last two
    dims, zeros elsewhere."""
    args.tensor(x, "trilu")
    if x.ndim < 2:
        raise TEError(f"trilu: input {x.name} {x.shape} needs at least 2 dims")

    def body(*i: Expr) -> Expr:
        d = i[-1] - i[-2]
        return I.if_then_else(d >= k if upper else d <= k, x[i], 0)

    return compute(x.shape, body, name="T_trilu", tag=INJECTIVE)


def cumsum(x: Tensor, axis: int, exclusive: bool = False, reverse: bool = False) -> Tensor:
    """ONNX CumSum along ``axis``: each output sums the input elements before it (and itself
    unless ``exclusive``; after it with ``reverse``)."""
    args.tensor(x, "cumsum")
    if not (dt.is_float(x.dtype) or dt.is_int(x.dtype)):
        raise TEError(f"cumsum: input {x.name} must be a number type, got {x.dtype}")
    ax = args.axis(axis, x.ndim, "cumsum")
    n = args.static_shape(x, "cumsum")[ax]
    k = reduce_axis((0, n), name="k")

    def body(*i: Expr) -> Expr:
        here = i[ax]
        if reverse:
            take = k.var > here if exclusive else k.var >= here
        else:
            take = k.var < here if exclusive else k.var <= here
        src = (*i[:ax], k.var, *i[ax + 1:])
        return R.sum(I.if_then_else(take, x[src], 0), axis=k)

    return compute(x.shape, body, name="T_cumsum", tag=REDUCE)


def depth_to_space(x: Tensor, block: int, mode: str = "DCR") -> Tensor:
    """ONNX DepthToSpace on NCHW: (N, C, H, W) -> (N, C / b^2, H b, W b); ``mode`` DCR takes
    the block offset from the channel's high part, CRD from its low part."""
    n, c, h, w = _nchw(x, "depth_to_space")
    if block < 1 or c % (block * block):
        raise TEError(f"depth_to_space: channels {c} of {x.name} are not a multiple of "
                      f"blocksize^2 = {block * block}")
    _mode(mode, "depth_to_space")
    oc = c // (block * block)

    def body(b: Expr, co: Expr, y: Expr, z: Expr) -> Expr:
        dy, dx = I.floormod(y, block), I.floormod(z, block)
        offset = dy * block + dx
        ch = offset * oc + co if mode == "DCR" else co * (block * block) + offset
        return x[b, ch, I.floordiv(y, block), I.floordiv(z, block)]

    return compute((n, oc, h * block, w * block), body, name="T_depth_to_space", tag=INJECTIVE)


def space_to_depth(x: Tensor, block: int, mode: str = "DCR") -> Tensor:
    """ONNX SpaceToDepth on NCHW: (N, C, H, W) -> (N, C b^2, H / b, W / b), the block offset
    in the channel's high part (DCR, the default) or its low part (CRD)."""
    n, c, h, w = _nchw(x, "space_to_depth")
    if block < 1 or h % block or w % block:
        raise TEError(f"space_to_depth: H, W = {h}, {w} of {x.name} are not multiples of "
                      f"blocksize {block}")
    _mode(mode, "space_to_depth")
    bb = block * block

    def body(b: Expr, ch: Expr, y: Expr, z: Expr) -> Expr:
        if mode == "DCR":
            offset, ci = I.floordiv(ch, c), I.floormod(ch, c)
        else:
            offset, ci = I.floormod(ch, bb), I.floordiv(ch, bb)
        dy, dx = I.floordiv(offset, block), I.floormod(offset, block)
        return x[b, ci, y * block + dy, z * block + dx]

    return compute((n, c * bb, h // block, w // block), body,
                   name="T_space_to_depth", tag=INJECTIVE)


def _mode(mode: str, op: str) -> None:
    if mode not in ("DCR", "CRD"):
        raise TEError(f"{op}: mode must be DCR or CRD, got {mode!r}")


def _nchw(x: Tensor, op: str) -> tuple[int, ...]:
    args.tensor(x, op)
    args.ndim_is(x, 4, op, "input")
    return args.static_shape(x, op)
