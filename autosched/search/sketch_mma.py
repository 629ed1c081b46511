"""The tensor-core sketch rule: matmul and batch_matmul through nvcuda::wmma.

A reduction ``C[..., i, j] = sum_k f32(A[..., i, k]) * f32(B[..., k, j])`` whose operands are
float16 or bfloat16 tensors (placeholders, read directly or through an inlined cast to float32,
as graph/compiler.py's fp16 / bf16 tasks read them; either operand may be transposed), or
float32 placeholders in a tf32 task, gets, besides the SIMT tile rule:

* a block tile of ``warps_m x warps_n`` warps (threadIdx.y; the 32 lanes are threadIdx.x), each
  warp ``frags_m x frags_n`` fragments of 16 x 16 float32 accumulators (a ``wmma.accumulator``
  stage computed at the warp loop, its innermost 16 x 16 x 16 nest tensorized as mma); per k
  step a warp loads ``frags_m`` fragments of A and ``frags_n`` of B (``wmma.matrix_a`` /
  ``wmma.matrix_b`` stages, tensorized as loads), each used by a row or column of mmas
* the K loop split into chunks of ``k_chunk`` x 16 (tf32: x 8); per chunk, the operands
  themselves (nothing converted) are staged in shared memory by all threads of the block and zero-filled
  where the tile overhangs the tensor, so shapes that 16 does not divide are padded, not guarded
* the accumulators stored (tensorized as store_matrix_sync) into a shared staging tile, which
  every thread of the block reads element by element for the output (and an elementwise
  epilogue fused into it: bias, activation), guarded at the tensor's edges; or (the direct
  knob, a matmul without epilogue whose output the block tile divides) stored by each warp
  straight into the output, which frees the staging tile's shared memory (64 KB at 128 x 128)

Knobs: warps per block (M, N), fragments per warp (M, N), K chunk, direct store, whether the
rows of the shared tiles are padded by 16 bytes (storage_align), which moves the rows a
fragment load or store reads onto other banks, and the pipeline's stages (Stage.pipeline):
1 copies each chunk in its own iteration of the K loop, 2 or 3 keep that many tiles per
operand and copy chunk k + stages - 1 (cp.async on sm_80 and newer) while the mmas of chunk k
run.

Each thread copies up to 16 bytes of a tile row at a time (copy_lanes: 8 halves, fewer when
the tensor's rows are not a multiple of 8), one vector load and store or one cp.async.

Example::

    rule = mma_rule("T_matmul", None, sch0, target)    # None: no elementwise output fused
    rule.apply(sch, {k.name: k.default() for k in rule.knobs})
"""

from __future__ import annotations

from dataclasses import dataclass

from autosched.errors import ScheduleError
from autosched.schedule.schedule import Schedule, Stage
from autosched.search.knobs import ChoiceKnob, Knob
from autosched.search.sketch import Params, Rule, _static_extent
from autosched.targets.target import Target
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.tensor import ComputeOp, PlaceholderOp, Tensor
from autosched.te.tensor import thread_axis as _thread
from autosched.te.visit import post_order
from autosched.tir.tensor_intrin import (
    ACCUMULATOR_SCOPE,
    BLOCK_FOR_DTYPE,
    MMA_FOR_DTYPE,
    TENSOR_INTRINS,
    load_intrin,
)
from autosched.tir.visit import linear_coeff, uses_var

WARP = 32
PAD_BYTES = 16  # the padding of a shared tile's rows (the pad knob)
VECTOR_BYTES = 16  # the widest copy a thread makes (one uint4)
TILE = 16  # the m and n of the fragments (k: the intrinsic's)
STORE = "wmma_store_16x16"


@dataclass(frozen=True)
class Operand:
    """A tensor a matmul multiplies, the stage that reads it (the matmul, or the inlined cast
    stage between them), and whether K is its last axis (else it is transposed)."""

    tensor: Tensor
    reader: Stage
    k_last: bool


def mma_operands(sch: Schedule, name: str) -> list[Operand] | None:
    """The operands (A, then B) of the reduction ``name`` when it is a float32 matmul that a
    tensor intrinsic can compute (half operands, or float32 ones as tf32); None otherwise."""
    st = sch.stage(name)
    op = st.compute_op
    body = op.body
    if (not isinstance(body, E.Reduce) or body.combiner.name != "sum" or body.dtype != "float32"
            or body.condition is not None or body.init is not None or len(op.reduce_axis) != 1
            or len(op.axis) < 2 or not isinstance(body.source, E.Binary)
            or body.source.op is not Op.MUL):
        return None
    if any(not isinstance(a.dom.extent, E.Const) for a in op.axis + op.reduce_axis):
        return None
    i, j, k = op.axis[-2].var, op.axis[-1].var, op.reduce_axis[0].var
    out = []
    for factor, row in ((body.source.a, i), (body.source.b, j)):
        found = _operand_read(sch, st, factor)
        if found is None:
            return None
        read, tensor, reader = found
        last = read.indices[-2:]  # (row, k) or (k, row) of the operand: one of two layouts
        if {x.uid for x in last if isinstance(x, E.Var)} != {row.uid, k.uid}:
            return None
        out.append(Operand(tensor, reader, isinstance(last[1], E.Var) and last[1].uid == k.uid))
    dtypes = {op.tensor.dtype for op in out}
    return out if len(dtypes) == 1 else None


def _operand_read(sch: Schedule, st: Stage, factor: E.Expr
               ) -> tuple[E.TensorRead, Tensor, Stage] | None:
    """(the read, the tensor, its reader) of ``f32(T[...])`` or ``f32(S[...])`` where
    ``S = f32(T[...])`` is a computed cast stage, for a tensor ``T`` of a dtype some tensor
    intrinsic multiplies: a placeholder, or a computed stage without reduction whose
    elements the tile copy computes (the im2col patches of an implicit-GEMM convolution,
    passes.gemm_convs). A cast stage is looked through first, so that half tensors cast up
    are multiplied as half."""
    if isinstance(factor, E.Cast):
        factor = factor.value
    if not isinstance(factor, E.TensorRead):
        return None
    producer = sch.stage_of_uid(factor.tensor.op.uid)
    direct = (factor, factor.tensor, st) if factor.tensor.dtype in MMA_FOR_DTYPE else None
    if isinstance(producer.op, PlaceholderOp):
        return direct
    inner = producer.compute_op
    value = inner.body
    if (not inner.reduce_axis and isinstance(value, E.Cast) and value.type == "float32"
            and isinstance(value.value, E.TensorRead)
            and value.value.tensor.dtype in MMA_FOR_DTYPE
            and all(isinstance(ix, E.Var) and ix.uid == a.var.uid
                    for ix, a in zip(value.value.indices, inner.axis))
            and _copyable(sch.stage_of_uid(value.value.tensor.op.uid))):
        return factor, value.value.tensor, producer
    return direct if _copyable(producer) else None


def _copyable(st: Stage) -> bool:
    """Whether a tile copy can read ``st``'s elements: a placeholder, or a computed stage
    without reduction (the copy computes them where it reads them)."""
    return isinstance(st.op, PlaceholderOp) or (isinstance(st.op, ComputeOp)
                                                and not st.op.reduce_axis)


def mma_rule(name: str, fused_into: str | None, sch0: Schedule, target: Target) -> Rule:
    """The tensor-core rule of the reduction ``name`` (mma_operands must have found its
    operands), with ``fused_into`` its elementwise output when it has one."""
    pre = f"{name}."
    operands = mma_operands(sch0, name)
    assert operands is not None, f"{name} is no half matmul"
    intrin = MMA_FOR_DTYPE[operands[0].tensor.dtype]
    itemsize = dt.nbytes(operands[0].tensor.dtype)
    knobs: list[Knob] = [
        ChoiceKnob(f"{pre}warps_m", (1, 2, 4), default_index=1),
        ChoiceKnob(f"{pre}warps_n", (1, 2, 4), default_index=1),
        ChoiceKnob(f"{pre}frags_m", (1, 2, 4), default_index=1),
        ChoiceKnob(f"{pre}frags_n", (1, 2, 4), default_index=1),
        ChoiceKnob(f"{pre}k_chunk", (1, 2, 4), default_index=1),
        ChoiceKnob(f"{pre}pad", (0, 1), default_index=1),
        # the default tile at 4096^3 fp16 on an H100: 1.023 ms with 1 stage, 0.980 with 2,
        # 1.010 with 3 (benchmarks/gpu_hgemm_stages.py)
        ChoiceKnob(f"{pre}stages", (1, 2, 3), default_index=1),
        # 1: the warps store their accumulators straight into the output (no staging tile:
        # 64 KB less shared memory for a 128 x 128 tile); only without an epilogue and where
        # the tile divides the output, as a fragment is stored whole
        ChoiceKnob(f"{pre}direct", (0, 1), default_index=0),
    ]
    *_, out_i, out_j = sch0.stage(name).compute_op.axis

    def check(p: Params) -> str | None:
        wm, wn, fm, fn, kc, pad, stages, direct = (p[k.name] for k in knobs)
        threads = WARP * wm * wn
        if threads > target.max_threads_per_block:
            return f"{threads} threads per block exceed the limit {target.max_threads_per_block}"
        bm, bn, bk = wm * fm * TILE, wn * fn * TILE, kc * TENSOR_INTRINS[intrin].k
        if direct and (fused_into is not None or _static_extent(out_i) % bm
                       or _static_extent(out_j) % bn):
            return (f"a direct store needs no epilogue and a {bm} x {bn} tile that divides "
                    "the output")
        tiles = [((bm, bk) if operands[0].k_last else (bk, bm), itemsize),
                 ((bn, bk) if operands[1].k_last else (bk, bn), itemsize), ((bm, bn), 4)]
        shared = sum(rows * (cols + pad * PAD_BYTES // size) * size * copies
                     for ((rows, cols), size), copies in zip(tiles, (stages, stages, 1 - direct)))
        if shared > target.max_shared_memory_per_block:
            return f"{shared} bytes of shared memory exceed {target.max_shared_memory_per_block}"
        return None

    def apply(sch: Schedule, p: Params) -> None:
        why = check(p)
        if why:
            raise ScheduleError(f"tensor-core tile of {name}: {why}")
        wm, wn, fm, fn, kc, pad, stages, direct = (p[k.name] for k in knobs)
        schedule_mma(sch, name, fused_into, (wm, wn), (fm, fn), kc, intrin, bool(pad), stages,
                     bool(direct))

    return Rule(name, tuple(knobs), apply, "mma", check)


def schedule_mma(sch: Schedule, name: str, fused_into: str | None, warps: tuple[int, int],
                 frags: tuple[int, int], k_chunk: int, intrin: str, pad: bool = False,
                 stages: int = 1, direct: bool = False) -> None:
    """The steps of the tensor-core tile (see the module docstring) on ``sch``; ``direct``:
    the warps store their fragments into the output itself (no epilogue, whole tiles)."""
    operands = mma_operands(sch, name)
    if operands is None:
        raise ScheduleError(f"{name} is not a float32 sum of products of half tensors")
    if fused_into is None:
        consumer = sch.stage(name)
        acc = sch[sch.cache_write(consumer.op.output(), ACCUMULATOR_SCOPE)]
    else:
        if direct:
            raise ScheduleError(f"{name}: a direct store leaves no place for the epilogue "
                                f"{fused_into}")
        consumer, acc = sch.stage(fused_into), sch.stage(name)
        acc.set_scope(ACCUMULATOR_SCOPE)
    rows, cols = (w * f * TILE for w, f in zip(warps, frags))
    if direct:
        warp = _store_tiles(consumer, rows, cols, frags, block=True)
        anchor = consumer
    else:
        # the epilogue reads the accumulators directly or through inlined stages (a bias
        # added by its own node): those are the staging tile's readers
        epilogue = [st for st in sch.stages if acc in sch.reads_of(st)]
        staging = sch[sch.cache_read(acc.op.output(), "shared", epilogue)]
        anchor = staging
    readers = [acc if op.reader.name == name else op.reader for op in operands]
    caches = [sch[sch.cache_read(op.tensor, "shared", [r])] for op, r in zip(operands, readers)]
    # the operand fragments of one k step, loaded once for every mma of their row or column
    frags_ab = [sch[sch.cache_read(c.op.output(), scope, [r])]
                for c, r, scope in zip(caches, readers, ("wmma.matrix_a", "wmma.matrix_b"))]
    if not direct:
        # the output: blocks over (batch, row tiles, column tiles), every thread of a block on
        # elements of the tile, read from the staging tile
        block, ii, jj = _output_blocks(consumer, rows, cols)
        _bind_block_threads(consumer, [ii, jj], warps[0] * warps[1])
        # the staging tile: each warp stores its fragments (threadIdx.y is the warp)
        staging.compute_at(consumer, block)
        warp = _store_tiles(staging, rows, cols, frags, block=False)

    # the accumulators of one warp, over K in chunks of k_chunk fragments
    acc.compute_at(anchor, warp)
    *abatch, ai, aj = acc.compute_op.axis
    (ak,) = acc.compute_op.reduce_axis
    fi, ti = acc.split(ai, factor=TILE)
    fj, tj = acc.split(aj, factor=TILE)
    depth = TENSOR_INTRINS[intrin].k
    ko, kr = acc.split(ak, factor=k_chunk * depth)
    kc, tk = acc.split(kr, factor=depth)
    acc.reorder(*abatch, ko, kc, fi, fj, ti, tj, tk)
    _unroll(acc, [kc, fi, fj])
    acc.tensorize(ti, intrin)
    for cache, op in zip(caches, operands):
        cache.compute_at(acc, ko)
        _copy_tile(cache, copy_lanes(op.tensor), warps[0] * warps[1])
        if stages > 1:
            cache.pipeline(stages)
    if pad:  # the operand tiles, and the staging tile where there is one
        for st in caches if direct else [*caches, staging]:
            _pad_rows(st)
    for frag, op, kind in zip(frags_ab, operands, ("load_a", "load_b")):
        frag.compute_at(acc, kc)
        *fbatch, x, y = frag.compute_op.axis
        row, k = (x, y) if op.k_last else (y, x)
        fr, tr = frag.split(row, factor=TILE)
        fk, tk = frag.split(k, factor=depth)
        first, second = (tr, tk) if kind == "load_a" else (tk, tr)  # (m, k) or (k, n) tiles
        frag.reorder(*fbatch, fr, fk, first, second)
        _unroll(frag, [fr, fk])
        frag.tensorize(first, load_intrin(intrin, kind))


def _output_blocks(consumer: Stage, rows: int, cols: int, vector: bool = True
                   ) -> tuple[E.IterVar, E.IterVar, E.IterVar]:
    """The output read from a staging tile: blocks over (batch, row tiles, column tiles) of
    ``rows`` x ``cols`` bound to blockIdx.x, four elements of a row a thread (one float4 of
    the tile read, _try_vector; outputs of four bytes or two written as one access); returns the block loop and the tile's row and column loops (the
    columns without their vector lanes; without ``vector``, the whole columns)."""
    *batch, ax_i, ax_j = consumer.compute_op.axis
    bi, ii = consumer.split(ax_i, factor=rows)
    bj, jj = consumer.split(ax_j, factor=cols)
    consumer.reorder(*batch, bi, bj, ii, jj)
    block = consumer.fuse(*batch, bi, bj)
    consumer.bind(block, _thread("blockIdx.x"))
    # four lanes (one float4 of the float32 tile) for outputs of four bytes and of two (their
    # four values stored as one 8-byte access)
    out_lanes = VECTOR_BYTES // 4 if dt.nbytes(consumer.op.output().dtype) in (2, 4) else 1
    if out_lanes > 1 and vector:
        jj, lane = consumer.split(jj, factor=out_lanes)
        consumer.vectorize(lane)
    return block, ii, jj


def _store_tiles(st: Stage, rows: int, cols: int, frags: tuple[int, int],
                 block: bool) -> E.IterVar:
    """Tile ``st`` (the staging tile, or with ``block`` the output itself over blocks of
    ``rows`` x ``cols``) by warp (threadIdx.y) and fragment, each fragment's 16 x 16 nest
    tensorized as a store of the warp's accumulator; returns the warp loop."""
    *lead, si, sj = st.compute_op.axis
    if block:  # the block loops lead: batch, row tiles, column tiles
        bi, si = st.split(si, factor=rows)
        bj, sj = st.split(sj, factor=cols)
        lead = [*lead, bi, bj]
    wi, ri = st.split(si, factor=frags[0] * TILE)
    wj, rj = st.split(sj, factor=frags[1] * TILE)
    fi, ti = st.split(ri, factor=TILE)
    fj, tj = st.split(rj, factor=TILE)
    st.reorder(*lead, wi, wj, fi, fj, ti, tj)
    if block:
        st.bind(st.fuse(*lead), _thread("blockIdx.x"))
    warp = st.fuse(wi, wj)
    st.bind(warp, _thread("threadIdx.y"))
    _unroll(st, [fi, fj])
    st.tensorize(ti, STORE)
    return warp


def copy_lanes(tensor: Tensor) -> int:
    """Elements per thread and copy of an operand tile: 16 bytes' worth when the tensor's
    rows (its last dimension) are a multiple of that, so every copy is 16-byte aligned; else
    the most (8 or 4 bytes, one element) that divides them. Tile rows are multiples of 16
    elements, which every choice divides. A computed operand (gathered patches) computes
    16 bytes' worth of a tile row a thread, each element alone (they are not consecutive in
    memory) but with the index arithmetic they share done once, and stores them as one."""
    if not isinstance(tensor.op, PlaceholderOp):
        return vector_lanes(tensor.dtype)
    return vector_lanes(tensor.dtype, tensor.shape[-1])


def vector_lanes(dtype: str, extent: object = None) -> int:
    """The most elements of ``dtype`` that VECTOR_BYTES hold and that divide ``extent`` (a
    power of two, at least 1; any count when ``extent`` is None, none but 1 when it is not a
    static int)."""
    lanes = max(1, VECTOR_BYTES // dt.nbytes(dtype))
    while extent is not None and lanes > 1 and (not isinstance(extent, int) or extent % lanes):
        lanes //= 2
    return lanes


def _copy_tile(st: Stage, lanes: int, warps: int) -> None:
    """The global -> shared copy of an operand tile by every thread of the block, ``lanes``
    consecutive elements of a row each (one vector load and store)."""
    *outer, last = st.compute_op.axis
    if lanes > 1:
        last, lane = st.split(last, factor=lanes)
        st.vectorize(lane)
    rest = _bind_block_threads(st, [*outer, last], warps)
    st.unroll(rest)  # all loads of a thread issued before their stores wait on them


def _pad_rows(st: Stage) -> None:
    """Rows of the stage's buffer PAD_BYTES longer than a multiple of 2 x PAD_BYTES (the rows
    of wmma tiles are multiples of 32 bytes, so fragment pointers stay 32-byte aligned)."""
    per = PAD_BYTES // dt.nbytes(st.op.output().dtype)
    st.storage_align(st.compute_op.axis[-2], 2 * per, per)


def _unroll(st: Stage, axes: list[E.IterVar]) -> None:
    """Unroll the loops over fragments: an array of fragments indexed by a loop variable would
    live in local memory, not in registers."""
    for ax in axes:
        st.unroll(ax)


def _bind_block_threads(st: Stage, axes: list[E.IterVar], warps: int) -> E.IterVar:
    """Spread ``axes`` (fused) over the block: 32 lanes on threadIdx.x, ``warps`` warps on
    threadIdx.y; returns the serial loop around them."""
    f = st.fuse(*axes) if len(axes) > 1 else axes[0]
    rest, lane = st.split(f, factor=WARP)
    outer, warp = st.split(rest, factor=warps)
    st.bind(warp, _thread("threadIdx.y"))
    st.bind(lane, _thread("threadIdx.x"))
    return outer


def offers_mma(sch0: Schedule, name: str, precision: str) -> bool:
    """Whether the tensor-core rule applies to the tiled reduction ``name``: a float32 matmul
    with static shapes whose K is at least one fragment deep, of two half tensors, or of two
    float32 tensors under the tf32 precision (the only one that lets multiplies round)."""
    ops = mma_operands(sch0, name)
    if ops is None or (ops[0].tensor.dtype == "float32" and precision != "tf32"):
        return False
    op = sch0.stage(name).compute_op
    assert isinstance(op, ComputeOp)
    return _static_extent(op.reduce_axis[0]) >= TENSOR_INTRINS[MMA_FOR_DTYPE[ops[0].tensor.dtype]].k


FILL_ROWS = 128  # output rows and columns from which the tensor-core tile is the default


def fills_tiles(sch0: Schedule, name: str) -> bool:
    """Whether the matmul ``name`` has at least FILL_ROWS output rows and columns: blocks of
    the default tensor-core tile are then full, and it runs faster than the SIMT default
    (fp16 4096^3 on an H100: 1.29 against 5.65 ms). Smaller outputs keep the SIMT default."""
    op = sch0.stage(name).compute_op
    assert isinstance(op, ComputeOp)
    *_, i, j = op.axis
    return min(_static_extent(i), _static_extent(j)) >= FILL_ROWS


# -- Hopper: the block tile on warpgroups (wgmma) ----------------------------------------------

def offers_wgmma(sch0: Schedule, name: str, precision: str, target: Target) -> bool:
    """Whether the warpgroup rule applies to ``name``: offers_mma's matmuls on sm_90 whose
    operands are tensors (no gathered patches) with rows of whole 16-byte chunks, both K-major
    under tf32."""
    from autosched.targets.cuda.codegen import target_arch
    from autosched.targets.cuda.wgmma import ARCH

    if target.device != "gpu" or target_arch(target) != ARCH \
            or not offers_mma(sch0, name, precision):
        return False
    ops = mma_operands(sch0, name)
    assert ops is not None
    lanes = vector_lanes(ops[0].tensor.dtype)
    for op in ops:
        tensor = view_of(op.tensor)
        if (tensor is None or copy_lanes(tensor) < lanes
                or vector_lanes(op.tensor.dtype, _static_extent(op.tensor.op.axis[-1])
                                if isinstance(op.tensor.op, ComputeOp) else None) < lanes):
            return False
    return ops[0].tensor.dtype != "float32" or all(op.k_last for op in ops)


def view_of(t: Tensor) -> Tensor | None:
    """The placeholder ``t`` is, or reads through a chain of pure index maps that keep its
    rows (reshapes splitting the last dim, transposes keeping it last; no division): the K
    split's slices of a MatMul's input, attention's heads of Q and V. Such an operand is read
    in place, at an affine offset of the placeholder; None for any other tensor."""
    while isinstance(t.op, ComputeOp):
        op, body = t.op, t.op.body
        if op.reduce_axis or not op.axis or not isinstance(body, E.TensorRead):
            return None
        last = op.axis[-1].var
        if any(uses_var(i, last) for i in body.indices[:-1]) \
                or linear_coeff(body.indices[-1], last) != 1 \
                or any(isinstance(n, E.Binary) and n.op in _DIVISIONS
                       for i in body.indices for n in post_order(i)):
            return None
        t = body.tensor
    return t if isinstance(t.op, PlaceholderOp) else None


_DIVISIONS = (Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD)


# blocks of the default warpgroup tile (128 x 128) from which it leads the warp tiles. On an
# H100 in fp16 with the warpgroup tile leading wherever tensor cores led: a BERT layer ran
# faster at batch 8 (0.253 -> 0.218 ms; its GEMMs 96 to 384 such blocks) and 32, ResNet-18 at
# batch 8 and 32 (2.127 -> 1.934 ms), but ResNet-18 at batch 1 slower (0.304 -> 0.332 ms:
# its GEMMs 7 to 28 blocks, a quarter of the warp tiles' 64 x 64 blocks, most SMs idle)
WGMMA_LEAD_BLOCKS = 48


def fills_waves(sch0: Schedule, name: str) -> bool:
    """Whether the matmul ``name`` has at least WGMMA_LEAD_BLOCKS blocks of 128 x 128
    outputs (its batch axes counted)."""
    op = sch0.stage(name).compute_op
    assert isinstance(op, ComputeOp)
    *batch, i, j = op.axis
    blocks = -(-_static_extent(i) // 128) * -(-_static_extent(j) // 128)
    for ax in batch:
        blocks *= _static_extent(ax)
    return blocks >= WGMMA_LEAD_BLOCKS


def wgmma_rule(name: str, fused_into: str | None, sch0: Schedule, target: Target) -> Rule:
    """The warpgroup rule of ``name`` (offers_wgmma holds), ``fused_into`` its elementwise
    output when it has one: a block tile of ``block_m`` x ``block_n`` computed by the wgmma
    main loop (targets/cuda/wgmma.py) of ``warpgroups`` warpgroups and ``stages`` operand
    tiles into a shared tile whose rows are padded by 16 bytes, which every thread reads for
    the output (and the epilogue fused into it). With AUTOSCHED_TMA on, the main loop copies
    by TMA, and knob ``producer`` adds a warpgroup that only copies."""
    from autosched import settings
    from autosched.targets.cuda.wgmma import MainLoop

    pre = f"{name}."
    operands = mma_operands(sch0, name)
    assert operands is not None, f"{name} is no half matmul"
    dtype = operands[0].tensor.dtype
    tma = settings.flag(settings.TMA)
    knobs: list[Knob] = [
        ChoiceKnob(f"{pre}block_m", (64, 128, 256), default_index=1),
        ChoiceKnob(f"{pre}block_n", (64, 128, 192, 256), default_index=1),
        ChoiceKnob(f"{pre}warpgroups", (1, 2), default_index=1),
        ChoiceKnob(f"{pre}stages", (3, 4, 5, 6), default_index=1),
        ChoiceKnob(f"{pre}epilogue", (0, 1), default_index=1),
        *([ChoiceKnob(f"{pre}producer", (0, 1))] if tma else []),
    ]

    def loop(p: Params) -> MainLoop:
        bm, bn, wg, st = (p[k.name] for k in knobs[:4])
        producer = bool(p.get(f"{pre}producer", 0))
        return MainLoop(dtype, bm, bn, wg, st, operands[0].k_last, operands[1].k_last, tma,
                        producer)

    def check(p: Params) -> str | None:
        ml = loop(p)
        why = ml.check()
        if why:
            return why
        tile = ml.block_m * (ml.block_n + PAD_BYTES // 4) * 4
        shared = max(tile, ml.shared_bytes())
        if shared > target.max_shared_memory_per_block:
            return f"{shared} bytes of shared memory exceed {target.max_shared_memory_per_block}"
        return None

    def apply(sch: Schedule, p: Params) -> None:
        why = check(p)
        if why:
            raise ScheduleError(f"wgmma tile of {name}: {why}")
        ml = loop(p)
        schedule_wgmma(sch, name, fused_into, ml.block_m, ml.block_n, ml.warpgroups, ml.stages,
                       BLOCK_FOR_DTYPE[dtype], ml.producer, bool(p[f"{pre}epilogue"]))

    return Rule(name, tuple(knobs), apply, "wgmma", check)


def schedule_wgmma(sch: Schedule, name: str, fused_into: str | None, block_m: int,
                   block_n: int, warpgroups: int, stages: int, intrin: str,
                   producer: bool = False, registers: bool = False) -> None:
    """The steps of the warpgroup tile (wgmma_rule) on ``sch``: the output (and the epilogue
    fused into it) read from the shared tile by every thread, or with ``registers`` computed
    by each thread of the computing warpgroups from the accumulators it holds (the nest over
    the tile's rows and columns marked EPILOGUE_PRAGMA, its extent the block's threads)."""
    from autosched.targets.cuda.wgmma import EPILOGUE_PRAGMA

    if fused_into is None:
        consumer = sch.stage(name)
        acc = sch[sch.cache_write(consumer.op.output(), "shared")]
    else:
        consumer, acc = sch.stage(fused_into), sch.stage(name)
        acc.set_scope("shared")
    block, ii, jj = _output_blocks(consumer, block_m, block_n, vector=not registers)
    threads = WARP * 4 * (warpgroups + producer)
    if registers:
        consumer.pragma(ii, EPILOGUE_PRAGMA, threads)
    else:
        rest, thread = consumer.split(consumer.fuse(ii, jj), factor=threads)
        consumer.bind(thread, _thread("threadIdx.x"))
    acc.compute_at(consumer, block)
    *abatch, ai, aj = acc.compute_op.axis
    (ak,) = acc.compute_op.reduce_axis
    io, ti = acc.split(ai, factor=block_m)
    jo, tj = acc.split(aj, factor=block_n)
    acc.reorder(*abatch, io, jo, ti, tj, ak)
    acc.tensorize(ti, intrin)
    acc.pragma(ti, "wgmma_stages", stages)
    if producer:
        acc.pragma(ti, "wgmma_producer", 1)
    _pad_rows(acc)
