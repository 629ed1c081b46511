"""Features of a lowered PrimFunc for the cost model: one row per buffer store.

Every ``Store`` in the loop IR (an init, an update, a cache copy, an output write) gets a row
of ``N_FEATURES`` float32 values describing the work it does and how it moves through the
loops around it. The names, in order, are ``FEATURE_NAMES``; the groups are:

* **arithmetic** (``float_addsub`` ... ``cast``): operations in the stored value and the index
  expressions by kind, multiplied by the product of the enclosing loop extents (totals for the
  whole nest). ``float_fma`` counts add/sub nodes with a multiply operand (those adds and
  multiplies are also in ``float_addsub`` / ``float_mul``). ``flops`` is the float total;
  ``arith_intensity*`` divide it by bytes accessed and by the estimated L1 / L2 traffic.
* **loops**: depth, total iterations, the three innermost loops (extent and kind one-hot,
  ``loop0`` is the innermost), vectorize / unroll / parallel lengths (innermost annotated loop),
  products and counts, ``auto_unroll_max_step`` and ``unroll_explicit`` pragmas of enclosing
  loops, vector length against the target's native lanes, parallel load balance over the
  target's cores.
* **gpu**: extents bound to blockIdx / threadIdx / vthread, threads per block, blocks, warp
  utilisation.
* **memory**: bytes allocated in local / shared scope around the store and in the whole
  function, shared memory against the target's limit, barriers.
* **guards**: IfThenElse around the store: count, estimated fraction of iterations that pass,
  how many sit inside the innermost loop (they block vectorization).
* **target** (``target_*``): what one model serving several targets needs to tell them apart:
  float32 lanes, cores, SIMD registers, threads per block and shared memory of the target; and
  the candidate's sizes against them: vector lanes and register tile bytes against the target's
  vector registers, parallel chunks per core, threads against the block limit. A model trained
  on AVX2 and AVX-512 logs sees "8 lanes of 16" rather than "8 lanes".
* **buffers** ``buf0_*`` ... ``buf4_*``: the accessed buffers (reads and the stored one) sorted by
  bytes accessed, largest first, zero-padded: access type, scope, number of accesses, bytes
  accessed and unique bytes, distinct cache lines (64 B on CPUs, 128 B on GPUs) in one run of
  the innermost loop and over the whole nest, estimated line traffic through L1 and L2, strides
  (innermost loop, the lane loop = vectorized loop on CPUs or threadIdx.x on GPUs, innermost loop
  that moves the index), reuse (the innermost loop whose variable is absent from the index, its
  distance in iterations and in bytes of all buffers touched inside it, accesses per element).

Counts, sizes, extents and ratios that span orders of magnitude (``arith_intensity*``,
``parallel_per_core``, ``buf*_reuse_count``) are ``log2(1 + x)``; one-hot flags, fractions
and the bounded ratios (``vec_lanes_ratio``, ``parallel_balance``, ``warp_util``,
``shared_ratio``, ``guard_fraction``, ``target_threads_ratio``) are raw. ``LOG_MASK`` marks the
logged columns.

``FEATURE_VERSION`` changes whenever a column is added, removed or changes meaning: a saved
model records it, and a model trained on another version is not loaded.

Example::

    f = aus.lower(s, [A, B, C])
    x = extract_features(f, parse("llvm"))     # (n_stores, N_FEATURES) float32
    dict(zip(FEATURE_NAMES, x[-1]))["vec_len"]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autosched.cost_model.access import Linearizer, Loop, footprints, row_major_strides
from autosched.targets.target import Target
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.tir import ir

# Bump on any change of the columns or their meaning: saved models record it.
FEATURE_VERSION = 2
MAX_BUFFERS = 5
INNER_LOOPS = 3
KINDS = ir.FOR_KINDS
GPU_TAGS = (*ir.THREAD_TAGS, "vthread")
# Cache sizes used for the traffic estimates. Target has no cache attributes yet; these are
# typical per-core L1d / L2 sizes (CPU) and per-SM L1 / a slice of L2 (GPU).
CACHE_BYTES = {"cpu": (32 * 1024, 1024 * 1024), "gpu": (128 * 1024, 4 * 1024 * 1024)}
LINE_BYTES = {"cpu": 64, "gpu": 128}

OP_NAMES = ("float_addsub", "float_mul", "float_div", "float_fma", "float_minmax", "float_math",
            "float_cmp", "select", "int_addsub", "int_mul", "int_divmod", "int_cmp_minmax",
            "bool_op", "cast")
_OP = {n: i for i, n in enumerate(OP_NAMES)}

BUFFER_FIELDS = ("present", "read", "write", "readwrite", "scope_global", "scope_shared",
                 "scope_local", "accesses", "bytes", "unique_bytes", "lines_inner",
                 "lines_unique", "traffic_l1", "traffic_l2", "stride_inner", "stride_lane",
                 "lane_contiguous", "stride_moving", "reuse_level", "reuse_iters",
                 "reuse_bytes", "reuse_count")


def _names() -> tuple[str, ...]:
    names = list(OP_NAMES) + ["flops", "value_is_const", "arith_intensity",
                              "arith_intensity_l1", "arith_intensity_l2"]
    names += ["num_loops", "outer_prod"]
    for k in range(INNER_LOOPS):
        names += [f"loop{k}_extent"] + [f"loop{k}_{kind}" for kind in KINDS]
    names += ["vec_len", "vec_prod", "vec_num", "vec_innermost", "vec_lanes_ratio",
              "vec_lanes_multiple"]
    names += ["unroll_len", "unroll_prod", "unroll_num", "auto_unroll_max_step",
              "unroll_explicit"]
    names += ["parallel_len", "parallel_prod", "parallel_num", "parallel_balance",
              "parallel_per_core"]
    names += ["is_gpu"] + [t.replace(".", "_") for t in GPU_TAGS]
    names += ["threads_per_block", "num_blocks", "warp_util"]
    names += ["alloc_local_bytes", "alloc_shared_bytes", "func_local_bytes", "func_shared_bytes",
              "shared_ratio", "num_barriers"]
    names += ["guard_num", "guard_fraction", "guard_in_innermost"]
    names += ["target_lanes", "target_cores", "target_vector_registers", "target_max_threads",
              "target_shared_bytes", "target_vec_registers_used", "target_local_registers",
              "target_threads_ratio"]
    for b in range(MAX_BUFFERS):
        names += [f"buf{b}_{f}" for f in BUFFER_FIELDS]
    return tuple(names)


FEATURE_NAMES: tuple[str, ...] = _names()
N_FEATURES = len(FEATURE_NAMES)
_IDX = {n: i for i, n in enumerate(FEATURE_NAMES)}
_BUF0 = _IDX["buf0_present"]
_BUF_WIDTH = len(BUFFER_FIELDS)
_BF = {f: i for i, f in enumerate(BUFFER_FIELDS)}

# Features stored as log2(1 + x): everything that counts or measures, not flags or ratios.
_RAW = {"value_is_const", "vec_innermost", "vec_lanes_multiple", "unroll_explicit",
        "parallel_balance", "is_gpu", "warp_util", "shared_ratio", "guard_fraction",
        "vec_lanes_ratio", "target_threads_ratio"}
_RAW |= {f"loop{k}_{kind}" for k in range(INNER_LOOPS) for kind in KINDS}
_RAW_BUF = {"present", "read", "write", "readwrite", "scope_global", "scope_shared",
            "scope_local", "lane_contiguous", "reuse_level"}
for _b in range(MAX_BUFFERS):
    _RAW |= {f"buf{_b}_{f}" for f in _RAW_BUF}
LOG_MASK = np.array([n not in _RAW for n in FEATURE_NAMES])


def extract_features(func: ir.PrimFunc, target: Target) -> np.ndarray:
    """(n_stores, N_FEATURES) float32 features of ``func`` for ``target``; see the module doc.

    Example::

        x = extract_features(aus.lower(s, [A, B, C]), parse("llvm"))
        assert x.shape[1] == N_FEATURES
    """
    rows = _Walker(func, target).run()
    if not rows:
        return np.zeros((0, N_FEATURES), dtype=np.float32)
    out = np.array(rows, dtype=np.float64)
    out[:, LOG_MASK] = np.log2(1.0 + np.maximum(out[:, LOG_MASK], 0.0))
    return out.astype(np.float32)


def extract_features_batch(funcs: Sequence[ir.PrimFunc], target: Target) -> list[np.ndarray]:
    """``extract_features`` of each function (one matrix per candidate)."""
    return [extract_features(f, target) for f in funcs]


def _const_int(e: E.Expr, default: int = 1) -> int:
    if isinstance(e, E.Const):
        return int(e.value)
    from autosched.tir.arith import const_bound

    hi = const_bound(e)[1]
    return int(hi) if hi is not None else default


class _Walker:
    """One pass over the statement tree with a stack of enclosing loops, guards and
    allocations; a row is made at each Store."""

    def __init__(self, func: ir.PrimFunc, target: Target):
        self.target = target
        self.gpu = target.device == "gpu"
        hw = "gpu" if self.gpu else "cpu"
        self.line = LINE_BYTES[hw]
        self.caches = CACHE_BYTES[hw]
        self.func = func
        self.loops: list[Loop] = []
        self.guards: list[tuple[E.Expr, int]] = []  # condition, number of loops around it
        self.allocs: list[ir.Buffer] = []
        self.lets: dict[int, E.Expr] = {}
        self.rows: list[list[float]] = []
        self.shapes: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = {}
        self.func_alloc = {"local": 0.0, "shared": 0.0}
        self.barriers = 0

    def run(self) -> list[list[float]]:
        self._prescan(self.func.body)
        self._visit(self.func.body)
        return self.rows

    def _prescan(self, s: ir.Stmt) -> None:
        from autosched.tir.visit import walk

        for n in walk(s):
            if isinstance(n, ir.Allocate) and n.buffer.scope in self.func_alloc:
                self.func_alloc[n.buffer.scope] += self._buffer_bytes(n.buffer)
            elif isinstance(n, ir.Barrier):
                self.barriers += 1

    def _shape(self, buf: ir.Buffer) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        got = self.shapes.get(buf.uid)
        if got is None:
            shape = tuple(max(_const_int(d), 1) for d in buf.shape)
            got = (shape, row_major_strides(shape), math.prod(shape))
            self.shapes[buf.uid] = got
        return got

    def _buffer_bytes(self, buf: ir.Buffer) -> float:
        return float(self._shape(buf)[2] * buf.itemsize)

    # -- statements ---------------------------------------------------------------------------
    def _visit(self, s: ir.Stmt) -> None:
        if isinstance(s, ir.For):
            ann = dict(s.annotations)
            threads = int(ann.get("wgmma_epilogue", 0))
            if threads and isinstance(s.body, ir.For):
                # a block tile's epilogue nest, run by each thread for the accumulators it
                # holds: its rows as the block's threads, its columns as each one's share
                share = _const_int(s.extent) * _const_int(s.body.extent) // threads
                self.loops += [Loop(s.var.uid, threads, "thread", "threadIdx.x", 0, ann),
                               Loop(s.body.var.uid, max(share, 1), "serial", "", 0, {})]
                self._visit(s.body.body)
                del self.loops[-2:]
                return
            start = int(s.min.value) if isinstance(s.min, E.Const) else 0
            self.loops.append(Loop(s.var.uid, max(_const_int(s.extent), 1), s.kind,
                                   s.thread_tag, start, ann))
            self._visit(s.body)
            self.loops.pop()
        elif isinstance(s, ir.Seq):
            for c in s.stmts:
                self._visit(c)
        elif isinstance(s, ir.Store):
            self.rows.append(self._row(s))
        elif isinstance(s, ir.IfThenElse):
            self.guards.append((s.cond, len(self.loops)))
            self._visit(s.then_body)
            self.guards.pop()
            if s.else_body is not None:
                self.guards.append((E.Not(s.cond), len(self.loops)))
                self._visit(s.else_body)
                self.guards.pop()
        elif isinstance(s, ir.Allocate):
            self.allocs.append(s.buffer)
            self._visit(s.body)
            self.allocs.pop()
        elif isinstance(s, ir.LetStmt):
            self.lets[s.var.uid] = s.value
            self._visit(s.body)
            del self.lets[s.var.uid]
        # Barrier: counted in the prescan; nothing else to see.

    # -- one row ------------------------------------------------------------------------------
    def _row(self, st: ir.Store) -> list[float]:
        row = [0.0] * N_FEATURES
        loops = self.loops
        extents = [lp.extent for lp in loops]
        total = float(math.prod(extents)) if extents else 1.0

        ops = [0.0] * len(OP_NAMES)
        accesses: list[tuple[ir.Buffer, tuple[E.Expr, ...], bool]] = []
        _count(st.value, ops, accesses)
        value_is_const = not accesses
        for idx in st.indices:
            _count(idx, ops, accesses)
        accesses.append((st.buffer, st.indices, True))
        for name, n in zip(OP_NAMES, ops):
            row[_IDX[name]] = n * total
        flops = total * (ops[_OP["float_addsub"]] + ops[_OP["float_mul"]] + ops[_OP["float_div"]]
                         + ops[_OP["float_minmax"]] + ops[_OP["float_math"]])
        row[_IDX["flops"]] = flops
        row[_IDX["value_is_const"]] = float(value_is_const)

        self._loop_features(row, loops, total)
        self._gpu_features(row, loops)
        self._memory_features(row)
        lin = Linearizer(loops, self.lets)
        self._guard_features(row, lin)
        self._target_features(row)
        bytes_all, traffic = self._buffer_features(row, lin, accesses, extents, total)
        row[_IDX["arith_intensity"]] = flops / max(bytes_all, 1.0)
        row[_IDX["arith_intensity_l1"]] = flops / max(traffic[0], 1.0)
        row[_IDX["arith_intensity_l2"]] = flops / max(traffic[1], 1.0)
        return row

    def _loop_features(self, row: list[float], loops: list[Loop], total: float) -> None:
        # Loops of extent 1 (from tiles of size 1) are no loops at all once compiled.
        real = [lp for lp in loops if lp.extent > 1 or lp.kind == "thread"]
        row[_IDX["num_loops"]] = len(real)
        row[_IDX["outer_prod"]] = total
        for k in range(min(INNER_LOOPS, len(real))):
            lp = real[-1 - k]
            row[_IDX[f"loop{k}_extent"]] = lp.extent
            row[_IDX[f"loop{k}_{lp.kind}"]] = 1.0
        per_kind: dict[str, list[int]] = {"vectorized": [], "unrolled": [], "parallel": []}
        max_step, explicit = 0.0, 0.0
        for lp in loops:
            if lp.kind in per_kind:
                per_kind[lp.kind].append(lp.extent)
            if "auto_unroll_max_step" in lp.annotations:
                max_step = max(max_step, float(lp.annotations["auto_unroll_max_step"]))
            if lp.annotations.get("unroll_explicit"):
                explicit = 1.0
        vec = per_kind["vectorized"]
        if vec:
            row[_IDX["vec_len"]] = vec[-1]
            row[_IDX["vec_prod"]] = math.prod(vec)
            row[_IDX["vec_num"]] = len(vec)
            row[_IDX["vec_innermost"]] = float(real[-1].kind == "vectorized")
            lanes = _lanes(self.target)
            row[_IDX["vec_lanes_ratio"]] = vec[-1] / lanes
            row[_IDX["vec_lanes_multiple"]] = float(vec[-1] % lanes == 0)
        unr = per_kind["unrolled"]
        if unr:
            row[_IDX["unroll_len"]] = unr[-1]
            row[_IDX["unroll_prod"]] = math.prod(unr)
            row[_IDX["unroll_num"]] = len(unr)
        row[_IDX["auto_unroll_max_step"]] = max_step
        row[_IDX["unroll_explicit"]] = explicit
        par = per_kind["parallel"]
        cores = max(self.target.num_cores, 1)
        pprod = math.prod(par) if par else 1
        if par:
            row[_IDX["parallel_len"]] = par[0]
            row[_IDX["parallel_prod"]] = pprod
            row[_IDX["parallel_num"]] = len(par)
        # Busy fraction of the cores when pprod equal chunks are spread over them.
        row[_IDX["parallel_balance"]] = pprod / (math.ceil(pprod / cores) * cores)
        row[_IDX["parallel_per_core"]] = pprod / cores

    def _gpu_features(self, row: list[float], loops: list[Loop]) -> None:
        row[_IDX["is_gpu"]] = float(self.gpu)
        ext = dict.fromkeys(GPU_TAGS, 1)
        bound = False
        for lp in loops:
            if lp.kind == "thread":
                tag = "vthread" if lp.tag.startswith("vthread") else lp.tag
                if tag in ext:
                    ext[tag] *= lp.extent
                    bound = True
        if not bound:
            return
        for tag in GPU_TAGS:
            row[_IDX[tag.replace(".", "_")]] = ext[tag]
        tpb = ext["threadIdx.x"] * ext["threadIdx.y"] * ext["threadIdx.z"]
        warp = max(self.target.warp_size, 1)
        row[_IDX["threads_per_block"]] = tpb
        row[_IDX["num_blocks"]] = ext["blockIdx.x"] * ext["blockIdx.y"] * ext["blockIdx.z"]
        row[_IDX["warp_util"]] = tpb / (math.ceil(tpb / warp) * warp)

    def _memory_features(self, row: list[float]) -> None:
        local = sum(self._buffer_bytes(b) for b in self.allocs if b.scope == "local")
        shared = sum(self._buffer_bytes(b) for b in self.allocs if b.scope == "shared")
        row[_IDX["alloc_local_bytes"]] = local
        row[_IDX["alloc_shared_bytes"]] = shared
        row[_IDX["func_local_bytes"]] = self.func_alloc["local"]
        row[_IDX["func_shared_bytes"]] = self.func_alloc["shared"]
        limit = max(self.target.max_shared_memory_per_block, 1)
        row[_IDX["shared_ratio"]] = self.func_alloc["shared"] / limit
        row[_IDX["num_barriers"]] = self.barriers

    def _target_features(self, row: list[float]) -> None:
        t = self.target
        lanes = _lanes(t)
        register_bytes = max(t.vector_registers * t.vector_bits // 8, 1)
        row[_IDX["target_lanes"]] = lanes
        row[_IDX["target_cores"]] = t.num_cores
        row[_IDX["target_vector_registers"]] = t.vector_registers
        row[_IDX["target_max_threads"]] = t.max_threads_per_block
        row[_IDX["target_shared_bytes"]] = t.max_shared_memory_per_block
        # vector registers an unrolled vector body fills (unrolled copies x lanes), and the
        # register tile (local allocations) in units of the target's whole register file
        unrolled = max(row[_IDX["unroll_prod"]], 1.0)
        row[_IDX["target_vec_registers_used"]] = unrolled * row[_IDX["vec_len"]] / lanes
        row[_IDX["target_local_registers"]] = row[_IDX["alloc_local_bytes"]] / register_bytes
        row[_IDX["target_threads_ratio"]] = (row[_IDX["threads_per_block"]]
                                             / max(t.max_threads_per_block, 1))

    def _guard_features(self, row: list[float], lin: Linearizer) -> None:
        if not self.guards:
            row[_IDX["guard_fraction"]] = 1.0
            return
        frac = 1.0
        inner = 0
        depth = len(self.loops)
        for cond, at in self.guards:
            if isinstance(cond, E.Not):
                frac *= 1.0 - lin.fraction_true(cond.a)
            else:
                frac *= lin.fraction_true(cond)
            inner += int(at == depth and depth > 0)
        row[_IDX["guard_num"]] = len(self.guards)
        row[_IDX["guard_fraction"]] = frac
        row[_IDX["guard_in_innermost"]] = inner

    def _buffer_features(self, row: list[float], lin: Linearizer,
                         accesses: list[tuple[ir.Buffer, tuple[E.Expr, ...], bool]],
                         extents: list[int], total: float) -> tuple[float, tuple[float, float]]:
        # Group accesses by buffer: strides are the largest over its accesses.
        groups: dict[int, dict] = {}
        for buf, idx, is_write in accesses:
            shape, strides, n_elems = self._shape(buf)
            s = lin.flat_strides(idx, strides)
            g = groups.get(buf.uid)
            if g is None:
                groups[buf.uid] = {"buf": buf, "strides": s, "n": 1, "read": not is_write,
                                   "write": is_write, "elems": n_elems}
            else:
                g["strides"] = [max(a, b) for a, b in zip(g["strides"], s)]
                g["n"] += 1
                g["read"] |= not is_write
                g["write"] |= is_write
        n = len(extents)
        infos = []
        for g in groups.values():
            buf = g["buf"]
            elems, lines = footprints(g["strides"], extents, buf.itemsize, self.line, g["elems"])
            infos.append((g, elems, lines, total * g["n"] * buf.itemsize))
        # Total bytes (in whole lines) of all buffers inside each loop level: the working set.
        level_bytes = [sum(inf[2][lvl] for inf in infos) * self.line for lvl in range(n + 1)]
        fits = [[b <= cap for b in level_bytes] for cap in self.caches]
        lane = self._lane_position()
        infos.sort(key=lambda inf: -inf[3])
        bytes_all = 0.0
        traffic = [0.0, 0.0]
        for slot, (g, elems, lines, nbytes) in enumerate(infos):
            buf, strides = g["buf"], g["strides"]
            t1 = _traffic(lines, extents, fits[0])
            t2 = _traffic(lines, extents, fits[1])
            bytes_all += nbytes
            traffic[0] += t1 * self.line
            traffic[1] += t2 * self.line
            if slot >= MAX_BUFFERS:
                continue
            base = _BUF0 + slot * _BUF_WIDTH
            f = [0.0] * _BUF_WIDTH
            f[_BF["present"]] = 1.0
            kind = "readwrite" if g["read"] and g["write"] else "write" if g["write"] else "read"
            f[_BF[kind]] = 1.0
            f[_BF.get("scope_" + buf.scope, _BF["scope_global"])] = 1.0
            f[_BF["accesses"]] = g["n"]
            f[_BF["bytes"]] = nbytes
            f[_BF["unique_bytes"]] = elems[n] * buf.itemsize
            f[_BF["lines_inner"]] = lines[min(1, n)]
            f[_BF["lines_unique"]] = lines[n]
            f[_BF["traffic_l1"]] = t1
            f[_BF["traffic_l2"]] = t2
            if n:
                f[_BF["stride_inner"]] = strides[-1]
            if lane is not None:
                f[_BF["stride_lane"]] = strides[lane]
                f[_BF["lane_contiguous"]] = float(abs(strides[lane] - 1.0) < 1e-9)
            for p in range(n - 1, -1, -1):
                if strides[p] > 0 and extents[p] > 1:
                    f[_BF["stride_moving"]] = strides[p]
                    break
            for lvl in range(1, n + 1):
                p = n - lvl
                if strides[p] == 0 and extents[p] > 1:
                    f[_BF["reuse_level"]] = lvl
                    f[_BF["reuse_iters"]] = math.prod(extents[p + 1:])
                    f[_BF["reuse_bytes"]] = level_bytes[lvl - 1]
                    break
            f[_BF["reuse_count"]] = total * g["n"] / max(elems[n], 1.0)
            row[base:base + _BUF_WIDTH] = f
        return bytes_all, (traffic[0], traffic[1])

    def _lane_position(self) -> int | None:
        """The loop whose iterations run side by side in hardware lanes: threadIdx.x on GPUs,
        the innermost vectorized loop on CPUs, else the innermost loop."""
        want = "thread" if self.gpu else "vectorized"
        for p in range(len(self.loops) - 1, -1, -1):
            lp = self.loops[p]
            if lp.kind == want and (not self.gpu or lp.tag == "threadIdx.x"):
                return p
        return len(self.loops) - 1 if self.loops else None


def _lanes(target: Target) -> int:
    """float32 lanes of the target's vector registers."""
    return max(target.vector_bits // 8 // 4, 1)


def _traffic(lines: list[float], extents: list[int], fits: list[bool]) -> float:
    """Lines a buffer brings into a cache over the nest. Going outwards one loop at a time:
    when everything touched by one iteration of the loop fits in the cache, later iterations
    only miss on lines they have not seen (reuse is caught); otherwise every iteration misses
    again on all of its lines."""
    n = len(extents)
    t = 1.0
    for lvl in range(1, n + 1):
        if fits[lvl - 1]:
            t += max(lines[lvl] - lines[lvl - 1], 0.0)
        else:
            t *= extents[n - lvl]
    return t


def _count(e: E.Expr, ops: list[float], accesses: list) -> None:
    """Add the operations of ``e`` to ``ops`` and its loads to ``accesses``."""
    if isinstance(e, E.Binary):
        op = e.op
        is_f = dt.is_float(e.a.dtype)
        if op in (Op.AND, Op.OR):
            ops[_OP["bool_op"]] += 1
        elif op in (Op.ADD, Op.SUB):
            ops[_OP["float_addsub" if is_f else "int_addsub"]] += 1
            if is_f and (_is_mul(e.a) or _is_mul(e.b)):
                ops[_OP["float_fma"]] += 1
        elif op is Op.MUL:
            ops[_OP["float_mul" if is_f else "int_mul"]] += 1
        elif op in (Op.MIN, Op.MAX):
            ops[_OP["float_minmax" if is_f else "int_cmp_minmax"]] += 1
        elif op is Op.POW:
            ops[_OP["float_math"]] += 1
        else:  # div floordiv floormod truncdiv truncmod
            ops[_OP["float_div" if is_f else "int_divmod"]] += 1
        _count(e.a, ops, accesses)
        _count(e.b, ops, accesses)
    elif isinstance(e, ir.Load):
        accesses.append((e.buffer, e.indices, False))
        for i in e.indices:
            _count(i, ops, accesses)
    elif isinstance(e, E.Compare):
        ops[_OP["float_cmp" if dt.is_float(e.a.dtype) else "int_cmp_minmax"]] += 1
        _count(e.a, ops, accesses)
        _count(e.b, ops, accesses)
    elif isinstance(e, E.Select):
        ops[_OP["select"]] += 1
        _count(e.cond, ops, accesses)
        _count(e.true_value, ops, accesses)
        _count(e.false_value, ops, accesses)
    elif isinstance(e, E.Call):
        ops[_OP["float_math"]] += 1
        for a in e.args:
            _count(a, ops, accesses)
    elif isinstance(e, E.Cast):
        ops[_OP["cast"]] += 1
        _count(e.value, ops, accesses)
    elif isinstance(e, E.Not):
        ops[_OP["bool_op"]] += 1
        _count(e.a, ops, accesses)


def _is_mul(e: E.Expr) -> bool:
    return isinstance(e, E.Binary) and e.op is Op.MUL
