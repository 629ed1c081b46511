"""Sketches: schedule structures derived from the DAG by rules, with no per-operator templates.

Rules, applied from the outputs back to the inputs (as Ansor does):

* inline      every non-output stage without a reduction is inlined into its readers
* tile        a reduction with data reuse (some read ignores some data axis: matmul, conv)
              gets multi-level tiling, SSRSRS on CPUs: the consumer tiles the data axes in two
              levels (S S), the producer is computed at the consumer's tile and loops as
              R S R S inside it. The consumer is an elementwise output that reads the producer
              elementwise (fused: bias, activation, residual) or else a cache_write copy.
* window      (CPU) a reduction over a small window (pooling): the data loops parallel and
              vectorized like an elementwise stage, the window's loops inside them
* reduce      a reduction without reuse (softmax's max / sum, norms): outer data loops
              parallel; optionally rfactor the reduction so its inner part vectorizes; optionally
              computed at its consumer's outer loop
* injective   the rest (elementwise outputs): outer axes fused and parallel, the last axis split
              and vectorized

Each rule declares knobs (knobs.py); a Sketch applies its rules with one value per knob. The
CPU rules' parallel knobs also offer 0, the stage serial on the calling thread (no fork-join),
the untuned default of kernels under SERIAL_US of work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from autosched import settings
from autosched.errors import ScheduleError
from autosched.schedule.schedule import Schedule, Stage
from autosched.search.knobs import ChoiceKnob, Knob, TileKnob, divisors
from autosched.targets.llvm.cpu_features import dot_intrin
from autosched.targets.target import Target
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.tensor import MATERIALIZE, ComputeOp, PlaceholderOp
from autosched.te.visit import post_order
from autosched.tir.tensor_intrin import TENSOR_INTRINS, dot_mismatch

Params = dict[str, Any]

UNROLL_STEPS = (0, 16, 64, 512)
VECTOR_LENGTHS = (1, 4, 8, 16, 32, 64)
PARALLEL_TASKS = 16  # outer parallel tasks an untuned default aims for (a few per core)
# The untuned default runs a kernel serially (no parallel loop: no fork-join, and its data stays
# in the calling core's caches) when its work, estimated from its flops and bytes at one core's
# rates, is under SERIAL_US microseconds (_serial_default). Measured on a 2-core Zen 4 VM
# (kernel_times of the untuned demo CNN, 1 and 2 threads, benchmarks/parallel_default.py):
# idle, the second thread saved 0.4-4 us on kernels of 1-13 us or cost up to 1.1 us (8.3 ->
# 9.4 us), and saved 5-7 us on the 22 us matmuls; with the other core busy (load average 4-6)
# no kernel gained, and the model ran 0.175 ms with every stage parallel against 0.169 ms with
# small stages serial. The rates make the estimate of the compute-bound kernels (matmul,
# convolution) their one-thread time; Winograd input transforms and the global pool take 2-8x
# their estimate.
SERIAL_US = 15.0
FLOPS_PER_US = 160e3
BYTES_PER_US = 54e3


# -- DAG analysis ---------------------------------------------------------------------------
def _reads(op: ComputeOp) -> list[E.TensorRead]:
    return [n for n in post_order(op.body) if isinstance(n, E.TensorRead)]


def has_reuse(op: ComputeOp, of: str | None = None) -> bool:
    """A reduction where some read (of stage ``of``, or any) does not depend on some data
    axis of extent > 1 (so tiling reuses what it reads along that axis)."""
    if not op.reduce_axis:
        return False
    axis_uids = {a.var.uid for a in op.axis if _static_extent(a) > 1}
    for r in _reads(op):
        if of is not None and r.tensor.op.name != of:
            continue
        used = {n.uid for i in r.indices for n in post_order(i) if isinstance(n, E.Var)}
        if axis_uids - used:
            return True
    return False


def reads_per_element(op: ComputeOp, of: str) -> float:
    """How often ``op`` reads each element of stage ``of``, on average: its iterations (data
    and reduction axes) times its reads of ``of``, over the elements of ``of``."""
    reads = [r for r in _reads(op) if r.tensor.op.name == of]
    if not reads:
        return 0.0
    steps = math.prod(_static_extent(a) for a in (*op.axis, *op.reduce_axis))
    return steps * len(reads) / max(_tensor_size(reads[0].tensor), 1)


class DagInfo:
    """Which stages are inlined, and who reads whom once they are."""

    def __init__(self, sch: Schedule):
        self.sch = sch
        self.outputs = {st.name for st in sch.stages if st.is_output}
        self.compute = [st for st in sch.stages if isinstance(st.op, ComputeOp)]
        self.inlined = {st.name for st in self.compute
                        if not st.compute_op.reduce_axis and st.name not in self.outputs
                        and not dict(st.compute_op.attrs).get(MATERIALIZE)}
        self.readers: dict[str, list[str]] = {st.name: [] for st in sch.stages}
        for st in self.compute:
            if st.name in self.inlined:
                continue
            for p in self._sources(st):
                if st.name not in self.readers[p]:
                    self.readers[p].append(st.name)

    def _sources(self, st: Stage) -> list[str]:
        """Non-inlined stages read by ``st``, looking through inlined ones."""
        out: list[str] = []
        stack = [st]
        while stack:
            cur = stack.pop()
            for q in self.sch.reads_of(cur):
                if q.name in self.inlined:
                    stack.append(q)
                elif q.name not in out and not isinstance(q.op, PlaceholderOp):
                    out.append(q.name)
        return out

    def fused_reader(self, name: str, permuted: bool = False
                     ) -> tuple[str, tuple[int, ...]] | None:
        """reader_map's (reader, order) when the reader reads ``name`` at exactly its own
        indices; with ``permuted``, also at a permutation of them (a convolution computed
        channels-last and stored NCHW)."""
        found = self.reader_map(name)
        if found is None or (not permuted and found[1] != tuple(range(len(found[1])))):
            return None
        return found

    def reader_map(self, name: str) -> tuple[str, tuple[int, ...]] | None:
        """(reader, order) when the single output reader of ``name`` reads it, everywhere, at
        its own axes in some order: ``order[p]`` is the reader axis used as index ``p``."""
        readers = self.readers[name]
        if len(readers) != 1 or readers[0] not in self.outputs:
            return None
        e = self.sch.stage(readers[0])
        t = self.sch.stage(name)
        if e.compute_op.reduce_axis or len(e.compute_op.axis) != len(t.compute_op.axis):
            return None
        from autosched.schedule.lower import LowerContext, expand_inline

        probe = Schedule(self.sch.outputs)  # read through the stages the sketch inlines
        for s in self.inlined:
            probe.stage(s).compute_inline()
        ctx = LowerContext(probe, [], "probe")
        expand_inline(ctx)
        t = probe.stage(name)
        axis_of = {a.var.uid: j for j, a in enumerate(e.compute_op.axis)}
        order: tuple[int, ...] | None = None
        for n in post_order(ctx.bodies[e.name]):
            if isinstance(n, E.TensorRead) and n.tensor.op.uid in t.uids:
                js = tuple(axis_of.get(i.uid, -1) if isinstance(i, E.Var) else -1
                           for i in n.indices)
                if -1 in js or len(set(js)) != len(js) or (order is not None and js != order):
                    return None
                order = js
        # the reader may read a leading part of an axis (a convolution computing rows past
        # its output, so that register tiles of 3 or 6 rows exist): its tiles then overhang
        if order is None or any(_static_extent(e.compute_op.axis[j]) > _static_extent(a)
                                for j, a in zip(order, t.compute_op.axis)):
            return None
        return e.name, order


# -- rules ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    stage: str
    knobs: tuple[Knob, ...]
    apply: Callable[[Schedule, Params], None]
    kind: str
    # why these knob values cannot work (None: they may), told without building a schedule
    check: Callable[[Params], str | None] | None = None


def _static_extent(iv: E.IterVar) -> int:
    ext = iv.dom.extent
    return int(ext.value) if isinstance(ext, E.Const) else 1


def _inline_rule(name: str) -> Rule:
    def apply(sch: Schedule, p: Params) -> None:
        sch.stage(name).compute_inline()

    return Rule(name, (), apply, "inline")


def has_condition(op: ComputeOp) -> bool:
    """The body branches on its indices (padding, a border): inlined into a tiled reduction it
    puts a select into the innermost loop, which keeps that loop from vectorizing cleanly."""
    return any(isinstance(n, E.Select) for n in post_order(op.body))


# From this many reads of each padded element on, computing the padding first pays for its
# pass over memory; below, masked loads are cheaper: a depthwise 3 x 3 convolution reads
# each one 9 times, a Winograd input transform 9 (6 rows of B^T over tiles 4 rows apart:
# 1.0-1.6x faster inlined), a dense convolution 9 times per output channel (an 11 x 11 one
# of 3 channels, 363: 0.89x inlined).
PAD_REUSE = 16


def _pad_rule(name: str, sch0: Schedule, info: DagInfo) -> Rule:
    """A conditional stage read by a tiled reduction: inlined, or computed on its own first
    (parallel and vectorized like an injective stage) so the reduction reads plain memory.
    The untuned default computes it first where its readers read each element PAD_REUSE
    times or more (a dense convolution, once per output channel and tap) and inlines it
    where they do not (a depthwise convolution reads each element for a few taps of one
    channel: a separate pass over the padded copy cost more than the masked loads, 0.11 ->
    0.09 ms for 144 channels at 56 x 56, stride 2)."""
    root = _injective_rule(name, sch0)
    inline = sum(reads_per_element(r.compute_op, name)
                 for r in _direct_readers(sch0, info, name)) < PAD_REUSE
    knobs = (ChoiceKnob(f"{name}.inline", (0, 1), default_index=int(inline)), *root.knobs)

    def apply(sch: Schedule, p: Params) -> None:
        if p[f"{name}.inline"]:
            sch.stage(name).compute_inline()
        else:
            root.apply(sch, p)

    return Rule(name, knobs, apply, "pad")


def tile_pair(sch: Schedule, name: str, fused_into: str | None) -> tuple[Stage, Stage]:
    """(consumer, producer) of a tiled reduction: the fused elementwise output and the
    reduction itself in local scope, or the reduction and its cache_write "local" copy."""
    if fused_into is None:
        consumer = sch.stage(name)
        return consumer, sch[sch.cache_write(consumer.op.output(), "local")]
    producer = sch.stage(name)
    producer.set_scope("local")
    return sch.stage(fused_into), producer


def register_tile(op: ComputeOp, lanes: int, budget: int = 16) -> list[int]:
    """The untuned innermost tile length of each data axis: the register tile of accumulators
    (at most ``budget`` vectors of ``lanes``, the last axis vectorized) that does the most
    useful multiply-adds per vector or broadcast load, counted from which axes each read of
    the body depends on. A 3x3 convolution over 56 columns gets 4 channels x 56 columns; one
    over 7 columns, 2 channels x 7 rows x 16 columns (one masked vector, below); a matmul 4
    rows x 64 columns. Over column panels (panel_width) the columns divide the panel.

    Where the best such tile's columns leave a vector of odd lanes (13 columns are three
    vectors, of 8, 4 and 1 lanes: ``vector_pieces``) or fill under half of one (the 2 that
    divide 166 columns, from 16 on), the tile is chosen again counting the pieces, between
    those columns and whole vectors that may overhang the last axis (its last tile masked):
    a batched matmul over 169 columns ran 4x faster in tiles of 16 than of 13, a 3x3
    convolution over 13 x 13 2.8x faster in 16-column tiles. Where a read cuts the
    last axis into rows (``row_length``: a Winograd transform's flattened tiles), the columns
    divide the row, so that the read's lanes stay in one (its input transform at 56 x 56,
    0.47 -> 0.36 ms; at 900 x 161, 91 -> 53 ms)."""
    ext = [_static_extent(a) for a in op.axis]
    if not ext:
        return []
    row = math.gcd(ext[-1], row_length(op, op.axis[-1].var) or 0)
    row = row if row >= MIN_ROW else ext[-1]
    tile = _register_tile(op, ext, lanes, budget, divisors(row), lambda n: -(-n // lanes))
    if row < ext[-1] or (vector_pieces(tile[-1], lanes) == -(-tile[-1] // lanes)
                         and not 2 * tile[-1] <= lanes < ext[-1]):
        return tile
    whole = [lanes * j for j in (1, 2, 3, 4) if lanes * (j - 1) < ext[-1]]
    return _register_tile(op, ext, lanes, budget, sorted({tile[-1], *whole}),
                          lambda n: vector_pieces(n, lanes))


def _register_tile(op: ComputeOp, ext: list[int], lanes: int, budget: int, lasts: list[int],
                   vectors: Callable[[int], int]) -> list[int]:
    """register_tile's search over the last axis's ``lasts``, ``vectors(n)`` registers per
    row of n columns."""
    n = len(ext)
    uids = [a.var.uid for a in op.axis]
    deps, strided = [], []
    for r in _reads(op):
        used = {v.uid for i in r.indices for v in post_order(i) if isinstance(v, E.Var)}
        deps.append([d for d in range(n) if uids[d] in used])
        strided.append(uids[n - 1] in used and _stride(r, uids[n - 1]) != 1)
    # only the innermost few non-trivial axes are worth a register tile
    free = [d for d in range(n - 1) if ext[d] > 1][-3:]
    best: tuple[tuple[float, int, bool, int], list[int]] = ((-1.0, 0, False, 0), [1] * n)

    def visit(i: int, tile: list[int], acc: int) -> None:
        nonlocal best
        if i < len(free):
            d = free[i]
            for t in divisors(ext[d]):
                if acc * t <= budget:
                    tile[d] = t
                    visit(i + 1, tile, acc * t)
            tile[d] = 1
            return
        last = tile[n - 1]
        vec = vectors(last)
        loads = 0
        for ds, gather in zip(deps, strided):
            m = 1
            for d in ds:  # a strided read along the vector is one scalar load per lane
                m *= (last if gather else vec) if d == n - 1 else tile[d]
            loads += m
        # the columns a tile computes that are inside the tensor, on average
        inside = ext[n - 1] / -(-ext[n - 1] // last)
        useful = acc / vec * inside / lanes
        key = (useful / max(loads, 1), acc, ext[n - 1] % last == 0, last)
        if key > best[0]:
            best = (key, list(tile))

    panel = panel_width(op)
    for last in lasts:
        vec = vectors(last)
        if last <= 4 * lanes and vec <= budget and (panel is None or panel % last == 0):
            tile = [1] * n
            tile[n - 1] = last
            visit(0, tile, vec)
    return best[1]


# Rows shorter than this are no vectors worth keeping a read's lanes in (a Winograd output
# transform's x // 4 over 14 columns, rows of 2: 0.09 ms against 0.06 gathered by 16).
MIN_ROW = 4


def row_length(op: ComputeOp, var: E.Var) -> int | None:
    """The row that a read of ``op`` cuts the axis ``var`` into, when its element does not
    move a constant stride along ``var`` (``rows[p // 41, p % 41 * 4]``: a Winograd
    transform's tiles of a flattened tile index): the greatest common divisor of the
    constants dividing ``var`` there. Vectors of a length dividing it stay in one row, where
    the read moves a constant stride and loads as vectors; across rows it loads lane by lane
    (a 900 x 161 map's input transform: 85 ms in vectors of 16 tiles, 55 in rows of 41).
    None when every read moves a constant stride."""
    from autosched.tir.arith import simplify
    from autosched.tir.visit import linear_coeff, uses_var

    row = 0
    for r in _reads(op):
        shape = [int(d.value) if isinstance(d, E.Const) else d for d in r.tensor.shape]
        divs = [int(n.b.value) for i in r.indices for n in post_order(i)
                if isinstance(n, E.Binary) and n.op.divides and isinstance(n.b, E.Const)
                and int(n.b.value) > 0 and uses_var(n.a, var)]
        if not divs or not all(isinstance(d, int) for d in shape):
            continue
        flat: E.Expr = E.const(0)
        for i, d in zip(r.indices, shape):
            flat = flat * d + i
        if linear_coeff(simplify(flat), var) is None:
            row = math.gcd(row, *divs)
    return row or None


def vector_pieces(length: int, lanes: int) -> int:
    """The vector registers a vectorized loop of ``length`` elements occupies: full vectors
    of ``lanes``, then the rest in powers of two (as the CPU code generator emits it)."""
    full, rest = divmod(length, lanes)
    return full + bin(rest).count("1")


def panel_width(op: ComputeOp) -> int | None:
    """P when ``op`` reads its right operand as column panels of P (te.ops.panel_matmul):
    its last axis then steps through one panel's P contiguous columns, and a vector that
    crossed into the next panel would load lane by lane."""
    width = dict(op.attrs).get("panel")
    return width if isinstance(width, int) and width > 0 else None


def _stride(read: E.TensorRead, uid: int) -> int | None:
    """How far the flat element read moves when the axis ``uid`` steps by one (None when it
    cannot be told statically)."""
    from autosched.tir.evaluate import eval_int

    shape = [int(d.value) if isinstance(d, E.Const) else d for d in read.tensor.shape]
    if not all(isinstance(d, int) for d in shape):
        return None
    env = {v.uid: 0 for i in read.indices for v in post_order(i) if isinstance(v, E.Var)}

    def flat(at: int) -> int:
        env[uid] = at
        out = 0
        for i, d in zip(read.indices, shape):
            out = out * d + eval_int(i, env)
        return out

    try:
        return flat(1) - flat(0)
    except Exception:  # an index the integer evaluator cannot fold (a call, a load)
        return None


def accumulator_registers(inner: list[int], lanes: int) -> int:
    """Registers the accumulators of a register tile (innermost lengths per data axis, the
    last one vectorized when longer than 1) occupy."""
    if not inner:
        return 0
    return math.prod(inner[:-1]) * -(-inner[-1] // lanes)


# Reductions of at most HOSTED_TAPS taps whose one reader is a tiled stage that reads them
# off their own indices (a Winograd transform's rows, then its columns) can be computed
# inside that reader's parallel tiles (the ``host`` knob), each tile's rows while they are in
# the caches; untuned, where their output would not stay in the caches (HOSTED_MIN_BYTES):
# 64 channels over 900 x 161 (57 MB of rows), input transform 34 -> 23 ms, output 39 -> 10;
# over 56 x 56 (1.2 MB) the output transform took 0.14 ms computed first, 0.36 hosted.
HOSTED_TAPS = 16
HOSTED_MIN_BYTES = 4 << 20


def _tile_rule(name: str, fused_into: str | None, sch0: Schedule, lanes: int = 8,
               order: tuple[int, ...] | None = None, registers: int = 16,
               host: str | None = None, covers: dict[int, int] | None = None,
               dot: str | None = None) -> Rule:
    """Multi-level tiling of reduction ``name`` (SSRSRS), its consumer fused or a cache_write;
    ``order`` is DagInfo.reader_map's for a consumer that reads it permuted. A register tile
    whose accumulators need more than the target's ``registers`` vector registers is illegal:
    it spills on every multiply-add (on AVX2's 16 registers a 7 x 2-vector tile ran at a third
    of the speed of the same loop nest with 2 x 4). With ``dot`` (an int8 dot product's
    tensor intrinsic, where ``dot_form`` holds) the last reduce axis (its 4 taps) goes inside
    the register tile, whose innermost column loop of the intrinsic's lanes is tensorized
    instead of vectorized."""
    op = sch0.stage(name).compute_op
    pre = f"{name}."
    n = len(op.axis)
    order = order or tuple(range(n))
    serial = _serial_default(sch0)
    # untuned default: the register tile above (leaving registers for the operands), 8 (4 on
    # the last axis) of them per parallel task along each axis (fewer where that leaves under
    # PARALLEL_TASKS tasks), k by 8
    reg = register_tile(op, lanes, budget=min(16, registers - 4))
    dot_lanes = TENSOR_INTRINS[dot].n if dot else 0
    if dot:
        reg[-1] = dot_lanes
    covers = covers or {}
    data = [TileKnob(f"{pre}tile.{a.name}", _static_extent(a), 3,
                     prefer=(4 if d == n - 1 else 8, 1, reg[d]),
                     exact_inner=_static_extent(a) % reg[d] != 0)
            for d, a in enumerate(op.axis)]
    for d, c in covers.items():  # a hosted producer's reused axis whole in each tile
        if math.prod(data[d].default()) % c and c % reg[d] == 0:
            data[d] = replace(data[d], prefer=(c // reg[d], 1, reg[d]))
    data = _spread(data, fixed={data[d].name for d in covers})
    taps = op.reduce_axis[-1:] if dot else []  # inside the tensorized nest, whole
    red = [TileKnob(f"{pre}rtile.{r.name}", _static_extent(r), 1, max_innermost=64, prefer=(8,))
           for r in op.reduce_axis if all(r is not t for t in taps)]
    knobs: list[Knob] = data + red + [
        ChoiceKnob(f"{pre}at", (0, 1), default_index=1),
        parallel_knob(pre, [k.extent // math.prod(k.default()) for k in data], serial),
        ChoiceKnob(f"{pre}unroll", UNROLL_STEPS, default_index=2),
    ]
    if host is not None:  # 1: computed in the host's outermost (parallel) loop, serially
        knobs.append(ChoiceKnob(f"{pre}host", (0, 1),
                                default_index=int(_stage_bytes(op) >= HOSTED_MIN_BYTES)))

    panel = panel_width(op)

    def check(p: Params) -> str | None:
        inner = [p[k.name][2] for k in data]
        acc = accumulator_registers(inner, lanes)
        if acc > registers:
            return (f"{name}: register tile {inner} needs {acc} accumulator registers; the "
                    f"target has {registers}")
        if panel is not None and panel % inner[-1]:
            return f"{name}: register tile {inner} crosses the {panel}-column panels"
        if dot and inner[-1] != dot_lanes:
            return f"{name}: register tile {inner} is not {dot_lanes} columns wide ({dot})"
        return None

    def apply(sch: Schedule, p: Params) -> None:
        why = check(p)
        if why:
            raise ScheduleError(why)
        if host is not None and p.get(f"{pre}host", 0):  # records from before: not hosted
            return _hosted(sch, name, host, lanes)
        tiles = [p[k.name] for k in data]
        consumer, producer = tile_pair(sch, name, fused_into)
        outer, mid, inner = [], [], []
        for j, (f1, f2, f3) in zip(order, tiles):  # the reader's axis tiled like ours
            a, rest = consumer.split(consumer.compute_op.axis[j], factor=f1 * f2 * f3)
            b, c = consumer.split(rest, factor=f2 * f3)
            outer.append(a)
            mid.append(b)
            inner.append(c)
        # the tile loops in our axis order, the element loops in the reader's (its stores)
        back = [order.index(j) for j in range(n)]
        consumer.reorder(*outer, *mid, *(inner[q] for q in back))
        depth = p[f"{pre}parallel"]
        par = _parallel(consumer, outer, depth)
        at_outer = par if depth == len(outer) else outer[-1]
        producer.compute_at(consumer, mid[-1] if p[f"{pre}at"] else at_outer)
        last = tiles[back[-1]][1] * tiles[back[-1]][2]
        if 1 < last <= 64:
            consumer.vectorize(inner[back[-1]])
        d1, d2, d3 = [], [], []
        for ax, (_, f2, f3) in zip(producer.compute_op.axis, tiles):
            x1, rest = producer.split(ax, factor=f2 * f3)
            x2, x3 = producer.split(rest, factor=f3)
            d1.append(x1)
            d2.append(x2)
            d3.append(x3)
        r0, r1 = [], []
        for ax, knob in zip(producer.compute_op.reduce_axis, red):
            (g,) = p[knob.name]
            a, b = producer.split(ax, factor=g)
            r0.append(a)
            r1.append(b)
        producer.reorder(*d1, *r0, *d2, *r1, *d3, *taps)
        if dot:
            producer.tensorize(d3[-1], dot)
        elif tiles[-1][2] > 1:
            producer.vectorize(d3[-1])
        unroll = p[f"{pre}unroll"]
        if unroll:
            producer.pragma(d1[0], "auto_unroll_max_step", unroll)
            producer.pragma(d1[0], "unroll_explicit", True)

    return Rule(name, tuple(knobs), apply, "tile", check)


def _hosted(sch: Schedule, name: str, host: str, lanes: int) -> None:
    """The tiled rule's ``host`` form: ``name`` computed in ``host``'s outermost loop, over
    the region one of its tiles reads, its last axis in vectors of ``lanes`` (the last
    overhanging) with the taps inside, accumulating in registers."""
    st = sch.stage(name)
    *axes, last = st.compute_op.axis
    lo, li = st.split(last, factor=min(lanes, _static_extent(last)))
    st.reorder(*axes, lo, *st.compute_op.reduce_axis, li)
    st.vectorize(li)
    at = sch.stage(host)
    st.compute_at(at, at.leaf[0])


def _spread(data: list[TileKnob], tasks: int = PARALLEL_TASKS,
            fixed: set[str] | None = None) -> list[TileKnob]:
    """The untuned tiles with fewer register tiles per parallel task (the axis with the most
    first, none of ``fixed``) until the outer loops make ``tasks`` tasks, where the extents
    allow it."""
    data = list(data)
    free = [k for k in data if k.name not in (fixed or set())]
    while free and math.prod(k.extent // math.prod(k.default()) for k in data) < tasks:
        k = max(free, key=lambda k: k.default()[0])
        per_task = k.default()[0]
        if per_task <= 1:
            break
        halved = replace(k, prefer=(per_task // 2, *k.prefer[1:]))
        data[data.index(k)], free[free.index(k)] = halved, halved
    return data


def parallel_knob(pre: str, outer_extents: list[int], serial: bool) -> ChoiceKnob:
    """How many outer loops (fused) run in parallel: 0 runs the stage serially on the calling
    thread (no fork-join at all), d > 0 fuses the d outermost and splits them among the
    threads. Untuned: serial when ``serial``, else the fewest loops that make PARALLEL_TASKS
    tasks. (Records from before 0 was offered hold 1..n, which keep their meaning.)"""
    n = len(outer_extents)
    default = 0 if serial or n == 0 else 1 + _parallel_depth(outer_extents)
    return ChoiceKnob(f"{pre}parallel", tuple(range(n + 1)), default_index=default)


def _parallel(stage: Stage, outer: list[E.IterVar], depth: int) -> E.IterVar:
    """The ``depth`` outermost of ``outer`` fused into one parallel loop (returned); with
    ``depth`` 0 nothing is parallel and the outermost loop is returned."""
    if depth == 0:
        return outer[0]
    par = stage.fuse(*outer[:depth]) if depth > 1 else outer[0]
    stage.parallel(par)
    return par


def stage_work(sch: Schedule, name: str) -> tuple[int, float]:
    """(flops, bytes) of stage ``name`` once the stages a sketch inlines are folded into it:
    its arithmetic and theirs, and the bytes of what it writes and of every tensor it reads
    through them (each once); a tensor of symbolic shape counts as infinitely large."""
    from autosched.te.dtype import nbytes
    from autosched.te.flops import flop_count

    def size(op: ComputeOp | PlaceholderOp) -> float:
        dims = [int(d.value) for d in op.shape if isinstance(d, E.Const)]
        if len(dims) < len(op.shape):
            return math.inf
        return float(math.prod(dims) * nbytes(op.dtype))

    root = sch.stage(name)
    ops: dict[str, Stage] = {name: root}
    read: dict[str, Stage] = {}
    stack = [root]
    while stack:
        for q in sch.reads_of(stack.pop()):
            inline = isinstance(q.op, ComputeOp) and not q.compute_op.reduce_axis and \
                not q.is_output
            if inline and q.name not in ops:
                ops[q.name] = q
                stack.append(q)
            elif not inline:
                read[q.name] = q
    return flop_count([st.op for st in ops.values()]), \
        sum(size(st.op) for st in (root, *read.values()))


def _serial_default(sch: Schedule) -> bool:
    """Whether the kernel of ``sch`` is too small to be worth a fork-join untuned: its stages'
    work (each stage the sketch does not inline, with what it inlines) under SERIAL_US. The
    whole kernel, not each stage: once one stage forks, the workers are awake and a small
    stage beside it gains from them (MobileNetV2's small pads run serially before their
    parallel convolutions made those kernels 8% slower)."""
    return estimated_us(sch) < SERIAL_US


def estimated_us(sch: Schedule) -> float:
    """Microseconds of the kernel of ``sch`` on one CPU core, estimated from the flops and
    bytes of its stages (each stage the sketch does not inline, with what it inlines) at
    FLOPS_PER_US and BYTES_PER_US: a rough size, to order kernels, not to predict them."""
    us = 0.0
    for st in sch.stages:
        if isinstance(st.op, ComputeOp) and (st.compute_op.reduce_axis or st.is_output):
            flops, nbytes = stage_work(sch, st.name)
            us += flops / FLOPS_PER_US + nbytes / BYTES_PER_US
    return us


def _parallel_depth(outer_extents: list[int], tasks: int = PARALLEL_TASKS) -> int:
    """Index of the fewest outer loops (fused) that make at least ``tasks`` parallel tasks,
    so an untuned default keeps every core busy (a batch axis of 1 alone would not)."""
    total = 1
    for depth, ext in enumerate(outer_extents):
        total *= max(ext, 1)
        if total >= tasks:
            return depth
    return max(len(outer_extents) - 1, 0)


def _vector_choices(extent: int) -> tuple[int, ...]:
    return tuple(v for v in VECTOR_LENGTHS if v <= max(extent, 1)) or (1,)


def reduce_layout(op: ComputeOp) -> str:
    """How a reduction walks its largest read: "row" when its innermost reduce axis steps
    through it contiguously (a softmax, a global pool over NCHW), "column" when its innermost
    data axis does and the reduce axis strides (a sum over the rows of a matrix), else ""."""
    reads = [r for r in _reads(op) if r.indices]
    if not reads:
        return ""

    main = max(reads, key=lambda r: _tensor_size(r.tensor))
    if _stride(main, op.reduce_axis[-1].var.uid) == 1:
        return "row"
    if op.axis and _static_extent(op.axis[-1]) > 1 and _stride(main, op.axis[-1].var.uid) == 1:
        return "column"
    return ""


COLUMN_CHUNK = 1024  # outputs a column reduction accumulates at once (4 KB of float32: L1)


def _reduce_rule(name: str, reader: str | None, sch0: Schedule, lanes: int = 8) -> Rule:
    """A reduction that reuses nothing (a sum, a max, a norm's mean). Untuned, a row
    reduction accumulates in vector partial sums (rfactor, up to two vectors: magika's max
    over 512 rows of 508 took 248 us scalar, 28 us with 32 partials) and a column reduction
    accumulates whole rows into a vector of outputs, the reduce loop outside (its sum of
    512 rows of 256 took 153 us down the columns, 5 us along the rows)."""
    op = sch0.stage(name).compute_op
    pre = f"{name}."
    inner_ext = _static_extent(op.reduce_axis[-1])
    layout = reduce_layout(op)
    vecs = tuple(v for v in (4, 8, 16, 32) if v < inner_ext)
    fits = [i for i, v in enumerate(vecs, 1) if v <= min(2 * lanes, inner_ext // 2)]
    knobs: list[Knob] = [
        ChoiceKnob(f"{pre}rfactor", (0,) + vecs,
                   default_index=fits[-1] if fits and layout == "row" else 0),
        ChoiceKnob(f"{pre}at", (0, 1) if reader else (0,)),
        # its data loops all fused: 1 parallel, 0 serial
        ChoiceKnob(f"{pre}parallel", (0, 1),
                   default_index=0 if _serial_default(sch0) else 1),
    ]
    if layout == "column":  # 1: the reduce loops outside the last data axis, which vectorizes
        knobs.append(ChoiceKnob(f"{pre}rows", (0, 1), default_index=1))

    def apply(sch: Schedule, p: Params) -> None:
        stage = sch.stage(name)
        vec = p[f"{pre}rfactor"]
        at = reader if p[f"{pre}at"] else None
        if p.get(f"{pre}rows") and not vec and at is None:
            *outer, last = stage.compute_op.axis
            lo, li = stage.split(last, factor=min(_static_extent(last), COLUMN_CHUNK))
            stage.reorder(*outer, lo, *stage.compute_op.reduce_axis, li)
            stage.vectorize(li)
            if p[f"{pre}parallel"]:
                _parallel(stage, [*outer, lo], len(outer) + 1)
            return
        rf = None
        if vec:
            ko, ki = stage.split(stage.compute_op.reduce_axis[-1], factor=vec)
            rf = sch[sch.rfactor(stage.op.output(), ki)]
            kf, *rest = rf.compute_op.axis
            rf.reorder(*rest, *rf.compute_op.reduce_axis, kf)
            rf.vectorize(kf)
        if at is not None:
            r = sch.stage(at)
            stage.compute_at(r, r.leaf[0])
        elif stage.compute_op.axis and p[f"{pre}parallel"]:
            axes = list(stage.compute_op.axis)
            _parallel(stage, axes, len(axes))
        data_loops = [iv for iv in stage.leaf if iv.kind == "data"]
        if rf is not None and data_loops:
            rf.compute_at(stage, data_loops[-1])  # the factored partials of one output at a time

    return Rule(name, tuple(knobs), apply, "reduce")


WINDOW_MAX = 64  # reduce extents up to this (a pooling window) reduce inside the data loops


def is_window(op: ComputeOp) -> bool:
    """A reduction over a small window per output element (max / average pooling, a reduce
    over a short axis) whose last data axis is long enough to be the vector."""
    window = math.prod(_static_extent(r) for r in op.reduce_axis)
    return bool(op.reduce_axis and op.axis) and window <= WINDOW_MAX and \
        _static_extent(op.axis[-1]) >= 4


def _window_rule(name: str, sch0: Schedule) -> Rule:
    """A small-window reduction as an elementwise loop nest: outer data axes fused and
    parallel, the window's loops inside them, the last data axis split and vectorized
    innermost (each lane one output, its sum or max kept in a register)."""
    op = sch0.stage(name).compute_op
    pre = f"{name}."
    last = _static_extent(op.axis[-1])
    vector = ChoiceKnob(f"{pre}vector", _vector_choices(last),
                        default_index=min(2, len(_vector_choices(last)) - 1))
    outer = [_static_extent(a) for a in op.axis[:-1]] + [-(-last // vector.default())]
    knobs: list[Knob] = [
        vector,
        parallel_knob(pre, outer, _serial_default(sch0)),
        ChoiceKnob(f"{pre}unroll", UNROLL_STEPS, default_index=1),
    ]

    def apply(sch: Schedule, p: Params) -> None:
        stage = sch.stage(name)
        axes = list(stage.compute_op.axis)
        vec = p[f"{pre}vector"]
        lo, lanes = axes[-1], []
        if vec > 1:
            lo, li = stage.split(axes[-1], factor=vec)
            lanes = [li]
        outer = axes[:-1] + [lo]
        stage.reorder(*outer, *stage.compute_op.reduce_axis, *lanes)
        if lanes:
            stage.vectorize(lanes[0])
        par = _parallel(stage, outer, min(p[f"{pre}parallel"], len(outer)))
        if p[f"{pre}unroll"]:
            stage.pragma(par, "auto_unroll_max_step", p[f"{pre}unroll"])
            stage.pragma(par, "unroll_explicit", True)

    return Rule(name, tuple(knobs), apply, "window")


def _injective_rule(name: str, sch0: Schedule) -> Rule:
    op = sch0.stage(name).compute_op
    pre = f"{name}."
    n = len(op.axis)
    last = _static_extent(op.axis[-1]) if n else 1
    vector = ChoiceKnob(f"{pre}vector", _vector_choices(last), default_index=3)
    outer = [_static_extent(a) for a in op.axis[:-1]] + [-(-last // vector.default())]
    knobs: list[Knob] = [
        vector,
        parallel_knob(pre, outer if n else [], _serial_default(sch0)),
    ]

    def apply(sch: Schedule, p: Params) -> None:
        stage = sch.stage(name)
        axes = list(stage.compute_op.axis)
        if not axes:
            return
        vec = p[f"{pre}vector"]
        lo = axes[-1]
        if vec > 1:
            lo, li = stage.split(axes[-1], factor=vec)
            stage.vectorize(li)
        outer = axes[:-1] + [lo]
        _parallel(stage, outer, min(p[f"{pre}parallel"], len(outer)))

    return Rule(name, tuple(knobs), apply, "injective")


# -- sketches ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sketch:
    """An ordered list of rules; ``apply`` builds a schedule from knob values."""

    rules: tuple[Rule, ...]

    @property
    def knobs(self) -> list[Knob]:
        return [k for r in self.rules for k in r.knobs]

    def violation(self, params: Params) -> str | None:
        """Why these knob values are illegal, where a rule can tell without a schedule."""
        for rule in self.rules:
            why = rule.check(params) if rule.check is not None else None
            if why:
                return why
        return None

    def describe(self) -> str:
        return ", ".join(f"{r.kind}({r.stage})" for r in self.rules)

    @property
    def tensor_cores(self) -> bool:
        return any(r.kind in ("mma", "wgmma") for r in self.rules)

    def apply(self, sch: Schedule, params: Params) -> Schedule:
        for rule in self.rules:
            rule.apply(sch, params)
        return sch


def generate_sketches(sch0: Schedule, target: Target, precision: str = "fp32") -> list[Sketch]:
    """The sketches of a DAG, from a fresh (unscheduled) schedule of it, for a CPU or a GPU;
    on a GPU, matmuls that tensor cores can compute in ``precision`` get a second sketch."""
    gpu = target.device == "gpu"
    if gpu:
        from autosched.search import sketch_gpu as G
        from autosched.search import sketch_mma as TC

        max_threads = target.max_threads_per_block
        tile = lambda n, into, s, order: G.gpu_tile_rule(n, into, s, max_threads)  # noqa: E731
        reduce = lambda n, reader, s: G.gpu_reduce_rule(n, s)  # noqa: E731
        injective = G.gpu_injective_rule
    else:
        lanes = max(target.vector_bits // 32, 1)
        registers = target.vector_registers
        dot = dot_intrin(target)
        tile = lambda n, into, s, order: _tile_rule(  # noqa: E731
            n, into, s, lanes, order, registers, _host(s, info, n, into),
            _covers(s, info, n), dot if dot and dot_form(s.stage(n).compute_op, dot) else None)
        reduce = lambda n, reader, s: _reduce_rule(n, reader, s, lanes)  # noqa: E731
        injective = _injective_rule
    info = DagInfo(sch0)
    tiled = {st.name for st in info.compute if st.name not in info.inlined and has_reuse(st.compute_op)}
    rules: list[Rule] = []
    for st in info.compute:
        if st.name not in info.inlined:
            continue
        pad = not gpu and has_condition(st.compute_op) and _read_only_by(sch0, info, st.name, tiled)
        rules.append(_pad_rule(st.name, sch0, info) if pad else _inline_rule(st.name))
    fused: set[str] = set()
    later: list[Rule] = []
    tensor_core: dict[str, Rule] = {}  # tiled stage -> its tensor-core rule (GPU, half inputs)
    warpgroup: dict[str, Rule] = {}  # tiled stage -> its wgmma rule (sm_90)
    for st in reversed(info.compute):  # consumers first
        name = st.name
        if name in info.inlined or name in fused:
            continue
        op = st.op
        assert isinstance(op, ComputeOp)
        if has_reuse(op):
            into, order = info.fused_reader(name, permuted=not gpu) or (None, None)
            if into is not None:
                fused.add(into)
                later = [r for r in later if r.stage != into]
            later.append(tile(name, into, sch0, order))
            if gpu and TC.offers_mma(sch0, name, precision):
                tensor_core[name] = TC.mma_rule(name, into, sch0, target)
            if gpu and TC.offers_wgmma(sch0, name, precision, target):
                warpgroup[name] = TC.wgmma_rule(name, into, sch0, target)
        elif not gpu and is_window(op):
            later.append(_window_rule(name, sch0))
        elif op.reduce_axis:
            readers = info.readers[name]
            reader = readers[0] if len(readers) == 1 and _outer_match(sch0, name, readers[0]) else None
            later.append(reduce(name, reader, sch0))
        else:
            later.append(injective(name, sch0))
    sketches = [Sketch(tuple(rules + later))]
    rows = G.row_fusion(sch0, rules + later) if gpu else None
    if rows is not None:  # a task normalizing rows leads in one kernel
        out, reductions = rows
        sketches.insert(0, Sketch(tuple(
            rules + [G.gpu_rows_rule(out, reductions, sch0) if r.stage == out
                     else G._no_rule(r.stage) if r.stage in reductions else r
                     for r in later])))
    if tensor_core:  # a second sketch: the search picks; the default where its tiles fill up
        mma = Sketch(tuple(rules + [tensor_core.get(r.stage, r) for r in later]))
        first = all(TC.fills_tiles(sch0, name) for name in tensor_core)
        sketches = [mma, *sketches] if first else [*sketches, mma]
        if warpgroup and settings.flag(settings.WGMMA):  # on sm_90, warpgroups lead where
            # their blocks fill a wave
            wg = Sketch(tuple(rules + [warpgroup.get(r.stage, r) for r in later]))
            lead = first and all(TC.fills_waves(sch0, name) for name in warpgroup)
            sketches = [wg, *sketches] if lead else [*sketches, wg]
    return sketches


def _host(sch: Schedule, info: DagInfo, name: str, into: str | None) -> str | None:
    """The stage whose parallel tiles can compute the tiled reduction ``name`` (see
    HOSTED_TAPS): its one reader's loop owner (that reader, or the stage it is fused into),
    when ``name`` has at most HOSTED_TAPS taps, is fused into nothing and that reader is
    tiled too; else None."""
    op = sch.stage(name).compute_op
    readers = info.readers[name]
    if (into is not None or len(readers) != 1 or sch.stage(name).is_output
            or math.prod(_static_extent(r) for r in op.reduce_axis) > HOSTED_TAPS):
        return None
    reader = readers[0]
    if not has_reuse(sch.stage(reader).compute_op):
        return None
    owner = info.fused_reader(reader, permuted=True)
    return owner[0] if owner is not None else reader


def _covers(sch: Schedule, info: DagInfo, name: str) -> dict[int, int]:
    """For a tiled stage ``name`` that hosts a producer by default (``_host``, over
    HOSTED_MIN_BYTES), the tile length along each of its axes that covers a whole axis of the
    producer's reuse (one that its largest read does not depend on), so that each tile
    computes the producer's region once for all of it: {axis index: length}. A Winograd
    input transform reads its rows at ``t // 6``: 36 (every row of B^T in one tile, each input
    element loaded once); the output transform at ``y % 4``: 4, which its tiles already are."""
    from autosched.tir.evaluate import eval_int
    from autosched.tir.visit import uses_var

    op = sch.stage(name).compute_op
    out: dict[int, int] = {}
    for prod in [p for p, readers in info.readers.items() if name in readers]:
        found = info.fused_reader(prod, permuted=True)
        pst = sch.stage(prod)
        if (not isinstance(pst.op, ComputeOp) or _stage_bytes(pst.compute_op) < HOSTED_MIN_BYTES
                or _host(sch, info, prod, found[0] if found else None) is None):
            continue
        pop = pst.compute_op
        main = max(_reads(pop), key=lambda r: _tensor_size(r.tensor), default=None)
        reuse = [d for d, a in enumerate(pop.axis) if main is not None
                 and _static_extent(a) > 1 and not any(uses_var(i, a.var) for i in main.indices)]
        for r in (r for r in _reads(op) if r.tensor.op.name == prod):
            for d in reuse:
                idx = r.indices[d]
                axes = [j for j, a in enumerate(op.axis) if uses_var(idx, a.var)]
                if len(axes) != 1:
                    continue
                var, ext = op.axis[axes[0]].var, _static_extent(op.axis[axes[0]])
                try:
                    vals = [eval_int(idx, {var.uid: x}) for x in range(ext)]
                except ValueError:  # other variables, or no integer arithmetic
                    continue
                want = len(set(vals))
                cover = next(c for c in divisors(ext)
                             if all(len(set(vals[b:b + c])) == want for b in range(0, ext, c)))
                out[axes[0]] = max(out.get(axes[0], 1), cover)
    return out


def dot_form(op: ComputeOp, dot: str) -> bool:
    """Whether ``op`` is a sum the 8-bit dot-product intrinsic ``dot`` computes (te.ops.quant.
    matmul_dot4's): its last reduce axis the taps, its last data axis whole groups of lanes,
    one operand the same for every lane and contiguous in the taps (the intrinsic's
    ``in_dtype``), the other (its ``b_dtype``) the taps of a lane adjacent and the lanes the
    taps apart."""
    intrin = TENSOR_INTRINS[dot]
    if dot_mismatch(op.body, dot) or not op.axis or not op.reduce_axis:
        return False
    lane, tap = op.axis[-1], op.reduce_axis[-1]
    if _static_extent(tap) != intrin.k or _static_extent(lane) % intrin.n:
        return False
    prod = op.body.source  # type: ignore[attr-defined]
    reads = [x.value for x in (prod.a, prod.b)]
    if not all(isinstance(r, E.TensorRead) for r in reads):
        return False
    strides = [(_stride(r, lane.var.uid), _stride(r, tap.var.uid)) for r in reads]
    if strides[1] == (0, 1):  # the broadcast operand first
        reads, strides = reads[::-1], strides[::-1]
    return (strides == [(0, 1), (intrin.k, 1)] and reads[0].dtype == intrin.in_dtype
            and reads[1].dtype == intrin.b_dtype)


def _tensor_size(t: Any) -> int:
    """Elements of a tensor of static shape (0 when some dimension is symbolic)."""
    dims = [d.value if isinstance(d, E.Const) else d for d in t.shape]
    return math.prod(int(d) for d in dims) if all(isinstance(d, int) for d in dims) else 0


def _stage_bytes(op: ComputeOp) -> int:
    """The bytes of a stage's output."""
    return math.prod(_static_extent(a) for a in op.axis) * dt.bits(op.output(0).dtype) // 8


def _direct_readers(sch: Schedule, info: DagInfo, name: str) -> list[Stage]:
    """The compute stages that read ``name`` themselves (not through inlined ones)."""
    return [st for st in info.compute if any(q.name == name for q in sch.reads_of(st))]


def _read_only_by(sch: Schedule, info: DagInfo, name: str, readers: set[str]) -> bool:
    """Every stage that reads ``name`` directly is one of ``readers`` (none is inlined)."""
    direct = _direct_readers(sch, info, name)
    return bool(direct) and all(r.name in readers for r in direct)


def _outer_match(sch: Schedule, producer: str, reader: str) -> bool:
    """The reader's first axis has the producer's first axis extent (rows of a softmax)."""
    p, r = sch.stage(producer).op, sch.stage(reader).op
    if not (isinstance(p, ComputeOp) and isinstance(r, ComputeOp) and p.axis and r.axis):
        return False
    return _static_extent(p.axis[0]) == _static_extent(r.axis[0])
