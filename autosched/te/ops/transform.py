"""Injective data movement: transpose, reshape, flatten, squeeze, expand_dims, pad, concat,
split, strided_slice, take, gather (tag ``injective``).

Each output element reads one input element at computed indices (pad and concat choose with
``te.if_then_else``, whose untaken branch is never read, so out-of-bounds indices there are
harmless). Index tensors of take / gather are read in their own dtype (an int64 index is
compared as int64, never truncated first) and made safe: negative values count from the end
(numpy / ONNX) and the result is clamped into range, so a bad index never reads wild memory.
Mode ``strict`` (ONNX's semantics, what the importer uses) also reports an index that was out
of range: the kernel's status says so and the run raises (``index_check`` below).

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((2, 3, 4), name="x")
    y = ops.reshape(ops.transpose(x, (2, 0, 1)), (4, -1))     # (4, 6)
    z = ops.strided_slice(x, begin=(2,), end=(None,), strides=(-1,), axes=(2,))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te.expr import Call, Expr, cast, const
from autosched.te.ops import args
from autosched.te.ops.tags import INJECTIVE, PAD
from autosched.te.tensor import Tensor, compute


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """Permute dims: output dim d is input dim axes[d]; None reverses them (numpy.transpose)."""
    args.tensor(x, "transpose")
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(axes)
    norm = [args.axis(a, x.ndim, "transpose") for a in perm] if len(perm) == x.ndim else []
    if sorted(norm) != list(range(x.ndim)):
        raise TEError(f"transpose: axes {axes!r} is not a permutation of the {x.ndim} dims of "
                      f"{x.name} {x.shape}")
    inverse = [norm.index(d) for d in range(x.ndim)]
    return compute(
        tuple(x.shape[a] for a in norm),
        lambda *i: x[tuple(i[inverse[d]] for d in range(x.ndim))],
        name="T_transpose",
        tag=INJECTIVE,
    )


def _reshape_groups(
    in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> list[tuple[list[int], list[int]]]:
    """Runs of input dims and output dims with equal element counts, ignoring size-1 dims:
    (2, 3, 4) -> (6, 4) pairs ([0, 1], [0]) and ([2], [1]), so the last dim maps straight."""
    ins = [d for d, s in enumerate(in_shape) if s != 1]
    outs = [d for d, s in enumerate(out_shape) if s != 1]
    groups: list[tuple[list[int], list[int]]] = []
    a = b = 0
    while a < len(ins):
        gi, go = [ins[a]], [outs[b]]
        pi, po = in_shape[ins[a]], out_shape[outs[b]]
        a, b = a + 1, b + 1
        while pi != po:
            if pi < po:
                gi.append(ins[a])
                pi *= in_shape[ins[a]]
                a += 1
            else:
                go.append(outs[b])
                po *= out_shape[outs[b]]
                b += 1
        groups.append((gi, go))
    return groups


def reshape(x: Tensor, newshape: int | Sequence[int]) -> Tensor:
    """numpy.reshape in row-major order; one dim may be -1 (inferred). Dims must be positive
    (ONNX's 0 = "copy this dim" is the importer's job)."""
    args.tensor(x, "reshape")
    shape = args.static_shape(x, "reshape")
    items: list[Any] = list(newshape) if isinstance(newshape, (tuple, list)) else [newshape]
    if any(isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1) for v in items):
        raise TEError(f"reshape: new shape {tuple(items)} of {x.name} {shape} must hold positive "
                      "ints and at most one -1")
    total = args.prod(shape)
    if items.count(-1) > 1:
        raise TEError(f"reshape: new shape {tuple(items)} has more than one -1")
    if -1 in items:
        known = args.prod([v for v in items if v != -1])
        if total % known:
            raise TEError(f"reshape: cannot reshape {x.name} {shape} ({total} elements) to "
                          f"{tuple(items)}")
        items[items.index(-1)] = total // known
    out_shape = tuple(items)
    if args.prod(out_shape) != total:
        raise TEError(f"reshape: cannot reshape {x.name} {shape} ({total} elements) to "
                      f"{out_shape} ({args.prod(out_shape)} elements)")
    groups = _reshape_groups(shape, out_shape)

    def body(*i: Expr) -> Expr:
        index: list[Any] = [0] * x.ndim
        for gi, go in groups:
            flat: Any = i[go[0]]
            for d in go[1:]:
                flat = flat * out_shape[d] + i[d]
            inner = args.prod([shape[d] for d in gi])
            for d in gi:
                inner //= shape[d]
                q = flat if inner == 1 else I.floordiv(flat, inner)
                index[d] = q if d == gi[0] else I.floormod(q, shape[d])
        return x[tuple(index)]

    return compute(out_shape, body, name="T_reshape", tag=INJECTIVE)


def flatten(x: Tensor, axis: int = 1) -> Tensor:
    """2-d (prod(shape[:axis]), prod(shape[axis:])) as ONNX Flatten; axis in [-ndim, ndim]."""
    args.tensor(x, "flatten")
    shape = args.static_shape(x, "flatten")
    ax = args.axis(axis, x.ndim, "flatten", end_ok=True)
    return reshape(x, (args.prod(shape[:ax]), args.prod(shape[ax:])))


def squeeze(x: Tensor, axis: None | int | Sequence[int] = None) -> Tensor:
    """Drop size-1 dims (all of them, or the listed ones, which must be 1)."""
    args.tensor(x, "squeeze")
    shape = args.static_shape(x, "squeeze")
    if axis is None:
        drop = tuple(d for d, s in enumerate(shape) if s == 1)
    else:
        drop = args.axes(axis, x.ndim, "squeeze")
        bad = [d for d in drop if shape[d] != 1]
        if bad:
            raise TEError(f"squeeze: axis {bad[0]} of {x.name} {shape} has size {shape[bad[0]]}, "
                          "not 1")
    return reshape(x, tuple(s for d, s in enumerate(shape) if d not in drop))


def expand_dims(x: Tensor, axis: int | Sequence[int]) -> Tensor:
    """Insert size-1 dims at ``axis`` (positions in the result, numpy.expand_dims)."""
    args.tensor(x, "expand_dims")
    shape = args.static_shape(x, "expand_dims")
    count = 1 if isinstance(axis, int) else len(axis)
    new = args.axes(axis, x.ndim + count, "expand_dims")
    it = iter(shape)
    return reshape(x, tuple(1 if d in new else next(it) for d in range(x.ndim + count)))


def pad(
    x: Tensor, pad_before: Sequence[int], pad_after: Sequence[int] | None = None,
    value: float | int = 0, mode: str = "constant", name: str = "T_pad",
) -> Tensor:
    """Pad dim d with pad_before[d] elements in front and pad_after[d] behind (default: same
    as before). ``mode``: ``constant`` (``value``), ``edge`` (repeat the border) or ``reflect``
    (mirror without repeating the border, pads < dim). Negative pads crop, as ONNX Pad allows
    (constant mode only).
    Tag ``injective,pad``."""
    args.tensor(x, "pad")
    before = args.int_tuple(pad_before, x.ndim, "pad", "pad_before", minimum=-(2**31))
    after = before if pad_after is None else args.int_tuple(
        pad_after, x.ndim, "pad", "pad_after", minimum=-(2**31))
    shape = args.static_shape(x, "pad")
    out_shape = tuple(s + b + a for s, b, a in zip(shape, before, after))
    if any(s < 1 for s in out_shape):
        raise TEError(f"pad: padding {before}/{after} leaves {x.name} {shape} empty: {out_shape}")
    if mode not in ("constant", "edge", "reflect"):
        raise TEError(f"pad: mode must be constant, edge or reflect, got {mode!r}")
    if mode != "constant" and min(before + after) < 0:
        raise TEError(f"pad: negative padding {before}/{after} (cropping) is only supported "
                      f"with mode='constant', not {mode!r}")
    if mode == "reflect":
        for d, (s, b, a) in enumerate(zip(shape, before, after)):
            if b >= s or a >= s:
                raise TEError(f"pad: reflect padding ({b}, {a}) of dim {d} must be smaller "
                              f"than the dim ({s})")
    fill = args.scalar(value, x.dtype, "pad")

    def source(i: Expr, d: int) -> Expr:
        j = i - before[d] if before[d] else i
        n = shape[d]
        if mode == "edge":
            return I.min(I.max(j, 0), n - 1) if before[d] > 0 or after[d] > 0 else j
        if mode == "reflect" and (before[d] > 0 or after[d] > 0):
            j = I.abs(j) if before[d] > 0 else j
            return I.min(j, 2 * (n - 1) - j) if after[d] > 0 else j
        return j

    def body(*i: Expr) -> Expr:
        index = tuple(source(v, d) for d, v in enumerate(i))
        if mode != "constant":
            return x[index]
        inside = [index[d] >= 0 for d in range(x.ndim) if before[d] > 0]
        inside += [index[d] < shape[d] for d in range(x.ndim) if after[d] > 0]
        return I.if_then_else(I.all(*inside), x[index], fill) if inside else x[index]

    return compute(out_shape, body, name=name, tag=PAD)


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors along ``axis``; other dims must match (numpy.concatenate)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise TEError(f"concat: needs a non-empty list of tensors, got {tensors!r}")
    for n, t in enumerate(tensors):
        args.tensor(t, "concat", f"input {n}")
    first = tensors[0]
    args.same_dtype(tensors, "concat")
    ax = args.axis(axis, first.ndim, "concat")
    shapes = [args.static_shape(t, "concat") for t in tensors]
    for s in shapes:
        if len(s) != first.ndim or any(a != b for d, (a, b) in enumerate(zip(s, shapes[0]))
                                       if d != ax):
            listed = ", ".join(str(x) for x in shapes)
            raise TEError(f"concat: shapes {listed} differ outside axis {axis}")
    offsets = [0]
    for s in shapes:
        offsets.append(offsets[-1] + s[ax])
    out_shape = tuple(offsets[-1] if d == ax else s for d, s in enumerate(shapes[0]))

    def body(*i: Expr) -> Expr:
        def read(n: int) -> Expr:
            at = i[ax] - offsets[n] if offsets[n] else i[ax]
            return tensors[n][tuple(at if d == ax else v for d, v in enumerate(i))]

        out = read(len(tensors) - 1)
        for n in range(len(tensors) - 2, -1, -1):
            out = I.if_then_else(i[ax] < offsets[n + 1], read(n), out)
        return out

    return compute(out_shape, body, name="T_concat", tag=INJECTIVE)


concatenate = concat


def _slice(x: Tensor, starts: list[int], steps: list[int], lengths: list[int], name: str) -> Tensor:
    def body(*i: Expr) -> Expr:
        return x[tuple(
            v if (b, s) == (0, 1) else (b + v * s if s != 1 else v + b)
            for v, b, s in zip(i, starts, steps)
        )]

    return compute(tuple(lengths), body, name=name, tag=INJECTIVE)


def strided_slice(
    x: Tensor, begin: Sequence[int | None], end: Sequence[int | None],
    strides: Sequence[int] | None = None, axes: Sequence[int] | None = None,
) -> Tensor:
    """x[begin:end:stride] per axis with Python slice rules: negative indices count from the
    end, out-of-range bounds clamp, negative strides walk backwards, None is open. ``axes``
    names the sliced dims (default: the first len(begin)); others are kept whole. An empty
    result is a TEError."""
    args.tensor(x, "strided_slice")
    shape = args.static_shape(x, "strided_slice")
    begin, end = list(begin), list(end)
    steps = [1] * len(begin) if strides is None else list(strides)
    dims = list(range(len(begin))) if axes is None else [
        args.axis(a, x.ndim, "strided_slice") for a in axes]
    if not len(begin) == len(end) == len(steps) == len(dims) or len(set(dims)) != len(dims):
        raise TEError(f"strided_slice: begin {begin}, end {end}, strides {steps}, axes {axes} "
                      f"must have one distinct axis per entry (input {shape})")
    starts, step_of, lengths = [0] * x.ndim, [1] * x.ndim, list(shape)
    for d, b, e, s in zip(dims, begin, end, steps):
        if d >= x.ndim:
            raise TEError(f"strided_slice: {len(begin)} entries for a {x.ndim}-d input {shape}")
        if s == 0:
            raise TEError(f"strided_slice: stride 0 on axis {d}")
        start, stop, step = slice(b, e, s).indices(shape[d])
        n = len(range(start, stop, step))
        if n == 0:
            raise TEError(f"strided_slice: axis {d} of {shape} sliced [{b}:{e}:{s}] is empty")
        starts[d], step_of[d], lengths[d] = start, step, n
    return _slice(x, starts, step_of, lengths, "T_strided_slice")


def split(
    x: Tensor, indices_or_sections: int | Sequence[int], axis: int = 0
) -> list[Tensor]:
    """numpy.split: an int cuts ``axis`` into that many equal parts (it must divide the dim);
    a list of indices cuts before each index. Empty parts are a TEError."""
    args.tensor(x, "split")
    shape = args.static_shape(x, "split")
    ax = args.axis(axis, x.ndim, "split")
    n = shape[ax]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        if k < 1 or n % k:
            raise TEError(f"split: {k} sections do not divide axis {axis} of {x.name} {shape}")
        cuts = [n // k * j for j in range(1, k)]
    else:
        cuts = list(indices_or_sections)
    bounds = [0, *cuts, n]
    if any(not 0 <= b <= n for b in cuts) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise TEError(f"split: indices {cuts} must increase strictly within (0, {n}) for axis "
                      f"{axis} of {x.name} {shape}")
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        starts = [lo if d == ax else 0 for d in range(x.ndim)]
        lengths = [hi - lo if d == ax else s for d, s in enumerate(shape)]
        out.append(_slice(x, starts, [1] * x.ndim, lengths, "T_split"))
    return out


MODES = ("normalize", "clip", "wrap", "strict")
INDEX_CHECK = "index_check"  # Call(INDEX_CHECK, (i, n)): i, and the run fails unless 0 <= i < n


def index_check(i: Expr, n: int) -> Expr:
    """``i`` unchanged; a backend that runs it records a failure when ``i`` is not in
    [0, n) (the LLVM kernel's STATUS_INDEX), which the run then raises."""
    return Call(INDEX_CHECK, (i, const(n, i.dtype)), i.dtype)


def _index_value(v: Expr, n: int, mode: str) -> Expr:
    """A loaded index made an int32 position in [0, n), computed in the index's own dtype
    (narrow ones widened) so that an int64 index is never truncated before the check."""
    wide = v.dtype if v.dtype in ("int32", "int64") else "int64"
    i = cast(wide, v)
    if mode == "wrap":
        return cast(dt.INDEX, I.floormod(i, n))
    if mode in ("normalize", "strict"):
        i = I.if_then_else(i < 0, i + n, i)
    if mode == "strict":
        i = index_check(i, n)
    return cast(dt.INDEX, I.min(I.max(i, 0), n - 1))


def _check_axis(x: Tensor, n: int, indices: Tensor, axis: int, op: str) -> None:
    """Every index into an empty axis is out of range (and the clamp has no element to
    read)."""
    if n == 0 and args.prod(args.static_shape(indices, op)) > 0:
        raise TEError(f"{op}: axis {axis} of {x.name} is empty, so indices {indices.name} "
                      f"{tuple(indices.shape)} cannot index it")


def _index_tensor(indices: Any, mode: str, op: str) -> Tensor:
    args.tensor(indices, op, "indices")
    if not dt.is_int(indices.dtype):
        raise TEError(f"{op}: indices {indices.name} must be integers, got {indices.dtype}")
    if mode not in MODES:
        raise TEError(f"{op}: mode must be normalize, clip, wrap or strict, got {mode!r}")
    return indices


def take(x: Tensor, indices: Tensor, axis: int | None = None, mode: str = "normalize") -> Tensor:
    """Gather along ``axis`` (numpy.take, ONNX Gather): out shape is x.shape[:axis] +
    indices.shape + x.shape[axis+1:]; axis None indexes the flattened x. ``mode``:
    ``normalize`` (negative counts from the end, then clamped), ``clip`` (clamped to
    [0, n-1], TVM's default), ``wrap`` (modulo n), ``strict`` (ONNX: negative counts from the
    end, out of range fails the run)."""
    args.tensor(x, "take")
    idx = _index_tensor(indices, mode, "take")
    shape = args.static_shape(x, "take")
    if axis is None:
        total = args.prod(shape)
        _check_axis(x, total, idx, 0, "take")

        def flat_body(*i: Expr) -> Expr:
            f = _index_value(idx[i], total, mode)
            index: list[Any] = []
            inner = total
            for d, s in enumerate(shape):
                inner //= s
                q = f if inner == 1 else I.floordiv(f, inner)
                index.append(q if d == 0 else I.floormod(q, s))
            return x[tuple(index)]

        return compute(idx.shape, flat_body, name="T_take", tag=INJECTIVE)
    ax = args.axis(axis, x.ndim, "take")
    _check_axis(x, shape[ax], idx, ax, "take")
    k = idx.ndim

    def body(*i: Expr) -> Expr:
        pos = _index_value(idx[i[ax:ax + k]], shape[ax], mode)
        return x[(*i[:ax], pos, *i[ax + k:])]

    return compute((*shape[:ax], *idx.shape, *shape[ax + 1:]), body, name="T_take",
                   tag=INJECTIVE)


def gather(x: Tensor, axis: int, indices: Tensor, mode: str = "normalize") -> Tensor:
    """out[..i_axis..] = x[..indices[..i_axis..]..] (ONNX GatherElements, TVM gather): indices
    has x's rank, its shape is the output's, and its dims off ``axis`` are at most x's.
    ``mode`` as for ``take``."""
    args.tensor(x, "gather")
    idx = _index_tensor(indices, mode, "gather")
    shape = args.static_shape(x, "gather")
    ax = args.axis(axis, x.ndim, "gather")
    ishape = args.static_shape(idx, "gather")
    if len(ishape) != x.ndim or any(a > b for d, (a, b) in enumerate(zip(ishape, shape))
                                    if d != ax):
        raise TEError(f"gather: indices {ishape} must have the rank of {x.name} {shape} and no "
                      f"larger dims off axis {axis}")
    _check_axis(x, shape[ax], idx, ax, "gather")

    def body(*i: Expr) -> Expr:
        pos = _index_value(idx[i], shape[ax], mode)
        return x[tuple(pos if d == ax else v for d, v in enumerate(i))]

    return compute(ishape, body, name="T_gather", tag=INJECTIVE)
