"""Parallel loops on autosched's thread pool (threadpool.py), or on libgomp where the pool
does not run (other triples, or AUTOSCHED_PARALLEL=gomp).

``for i in range(lo, lo + n): body  # parallel`` becomes three pieces:

* ``NAME__parK_body(status, p..., x..., begin, count)``: the loop over ``[begin, begin + count)``,
  taking the kernel's status slot (failures are or-ed into it atomically), the buffers it uses
  as noalias pointers (so outlining loses no alias information) and the scalars it uses (outer
  loop variables, lets, symbolic sizes) by value;
* ``NAME__parK(void *data, int32_t nthreads, int32_t index)``: what each thread that joins
  runs; it unpacks the captured values from ``data``. The loop is cut into one contiguous home
  range per thread, each with a counter in ``data``: thread ``index`` takes its home range in
  chunks of a CHUNKS_PER_THREAD-th (an atomic add each), then chunks of the other ranges in
  turn until none is left. So a thread works on the same part of the data in consecutive
  kernels (where their loops split the data alike, what it wrote is in its core's cache), a
  thread whose core is slow or that joins late leaves its rest to the others, and one thread
  alone finishes the loop;
* at the loop's place: the captured values packed into a stack struct, the counters zeroed,
  and ``autosched_parallel(NAME__parK, &data, NAME__num_threads)`` (libgomp:
  ``GOMP_parallel(NAME__parK, &data, NAME__num_threads, 0)``, the count and index from
  ``omp_get_num_threads`` and ``omp_get_thread_num``).

A parallel loop inside another runs serially (its body is already on a worker thread). Each
thread that runs part of a loop adds one to ``NAME__threads_ran`` so tests and users can see it:
with the pool, the caller and the workers that joined in time (1 to NAME__num_threads); with
libgomp, the whole team.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import llvmlite.ir as ir

from autosched.targets.llvm import threadpool
from autosched.targets.llvm import types as T
from autosched.targets.llvm.abi import ALLOC_ALIGN, PARAM_ALIGN
from autosched.tir import ir as lir
from autosched.tir.visit import used_buffers, used_vars

if TYPE_CHECKING:
    from autosched.targets.llvm.codegen import FuncGen, ModuleState


# each thread takes its home range in about this many chunks, so a core that falls behind (a
# busy sibling, a descheduled vCPU) leaves the rest of its range to the others
CHUNKS_PER_THREAD = 4
HOME_SLOTS = 32  # home ranges at most (more threads share them: thread t starts at t % 32)
COUNTER_BYTES = 64  # one cache line per home range's counter: no false sharing between them


def _globals(state: ModuleState) -> tuple[ir.GlobalVariable, ir.GlobalVariable]:
    if state.num_threads is None:
        for attr, name in (("num_threads", state.sig.num_threads_symbol),
                           ("threads_ran", state.sig.threads_ran_symbol)):
            g = ir.GlobalVariable(state.module, T.I32, name)
            g.initializer = ir.Constant(T.I32, 0)
            g.align = 4
            setattr(state, attr, g)
    assert state.num_threads is not None and state.threads_ran is not None
    return state.num_threads, state.threads_ran


def emit_parallel_for(gen: FuncGen, s: lir.For) -> None:
    from autosched.targets.llvm.codegen import FuncGen

    state = gen.state
    num_threads, threads_ran = _globals(state)
    var_uids = [u for u in sorted(v.uid for v in used_vars(s)) if u in gen.env]
    buf_uids = [b.uid for b in used_buffers(s) if b.uid in gen.ptrs]
    param_uids = {b.uid for b in state.sig.params}
    lo = gen._loop_value(s.min, s.var)
    extent = gen._loop_value(s.extent, s.var)
    idx_ty = lo.type

    # NAME__parK_body: the loop over this thread's share
    k = state.outlined
    state.outlined += 1
    base = f"{state.sig.symbol}__par{k}"
    ptr_types = [gen.ptrs[u].type for u in buf_uids]
    var_types = [gen.env[u].type for u in var_uids]
    status_ty = T.I32.as_pointer()
    body_fn = ir.Function(state.module, ir.FunctionType(
        T.VOID, [status_ty] + ptr_types + var_types + [idx_ty, idx_ty]), base + "_body")
    body_fn.linkage = "internal"
    body_fn.attributes.add("nounwind")
    sub = FuncGen(state, body_fn, in_parallel=True)
    sub.status, *args = body_fn.args
    for uid, arg in zip(buf_uids, args):
        arg.add_attribute("noalias")
        arg.attributes.align = PARAM_ALIGN if uid in param_uids else ALLOC_ALIGN
        sub.ptrs[uid] = arg
    for uid, arg in zip(var_uids, args[len(buf_uids):]):
        sub.env[uid] = arg
    begin, count = args[-2], args[-1]

    def iteration(i: ir.Value) -> None:
        sub.env[s.var.uid] = i
        sub.stmt(s.body)

    sub.loop(begin, count, iteration)
    sub.finish()

    # NAME__parK: unpack, then take chunks of the home range first, then of the others'
    assert gen.status is not None
    captured = ([gen.status] + [gen.ptrs[u] for u in buf_uids] + [gen.env[u] for u in var_uids]
                + [lo, extent])
    stride = COUNTER_BYTES // (idx_ty.width // 8)
    counters_ty = ir.ArrayType(idx_ty, HOME_SLOTS * stride)
    struct_ty = ir.LiteralStructType([v.type for v in captured] + [counters_ty])
    pool = threadpool.uses_pool(state.module.triple)
    team_ty = threadpool.TEAM_FN if pool else ir.FunctionType(T.VOID, [T.I8P])
    team_fn = ir.Function(state.module, team_ty, base)
    team_fn.linkage = "internal"
    team_fn.attributes.add("nounwind")
    b = ir.IRBuilder(team_fn.append_basic_block("entry"))
    data = b.bitcast(team_fn.args[0], struct_ty.as_pointer())
    zero = ir.Constant(T.I32, 0)
    vals = [b.load(b.gep(data, [zero, ir.Constant(T.I32, j)], inbounds=True))
            for j in range(len(captured))]
    t_lo, t_ext = vals[-2], vals[-1]
    if pool:
        nt, tid = team_fn.args[1], team_fn.args[2]
    else:
        nt = b.call(state.function("omp_get_num_threads", T.I32, []), [])
        tid = b.call(state.function("omp_get_thread_num", T.I32, []), [])
    b.atomic_rmw("add", threads_ran, ir.Constant(T.I32, 1), "monotonic")
    counters = b.gep(data, [zero, ir.Constant(T.I32, len(captured))], inbounds=True)

    def run(begin: ir.Value, count: ir.Value) -> None:
        b.call(body_fn, vals[:-2] + [b.add(t_lo, begin), count])

    _take_chunks(b, counters, stride, _to(b, nt, idx_ty), _to(b, tid, idx_ty), t_ext, run)

    # at the loop's place: pack and fork
    slot = gen.allocas.alloca(struct_ty, name=base + ".data")
    for j, v in enumerate(captured):
        gen.b.store(v, gen.b.gep(slot, [zero, ir.Constant(T.I32, j)], inbounds=True))
    threads = gen.b.load(num_threads, align=4)
    # every slot: the thread count the team sees may be the pool's default (``threads`` 0)
    for h in range(HOME_SLOTS):
        gen.b.store(ir.Constant(idx_ty, 0), gen.b.gep(
            slot, [zero, ir.Constant(T.I32, len(captured)), ir.Constant(T.I32, h * stride)],
            inbounds=True))
    if pool:
        fork = state.function(threadpool.ENTRY, T.VOID, threadpool.ENTRY_FN.args)
        gen.b.call(fork, [team_fn, gen.b.bitcast(slot, T.I8P), threads])
    else:
        fork = state.function("GOMP_parallel", T.VOID, [team_fn.type, T.I8P, T.I32, T.I32])
        gen.b.call(fork, [team_fn, gen.b.bitcast(slot, T.I8P), threads, zero])


def _homes(b: ir.IRBuilder, nthreads: ir.Value) -> ir.Value:
    """How many home ranges a loop run by ``nthreads`` threads is cut into (1 to HOME_SLOTS)."""
    ty = nthreads.type
    n = b.select(b.icmp_signed("<", nthreads, ir.Constant(ty, 1)), ir.Constant(ty, 1), nthreads)
    return b.select(b.icmp_signed(">", n, ir.Constant(ty, HOME_SLOTS)),
                    ir.Constant(ty, HOME_SLOTS), n)


def _take_chunks(b: ir.IRBuilder, counters: ir.Value, stride: int, nthreads: ir.Value,
                 tid: ir.Value, extent: ir.Value, run: Callable[[ir.Value, ir.Value], None]
                 ) -> None:
    """Thread ``tid``'s share of ``[0, extent)``: the range is cut into ``_homes`` contiguous
    home ranges, each with its counter (``counters[h * stride]``, a cache line apart); the
    thread takes chunks of its home range, then of the next ones in turn (the shares of
    threads that came late or not at all) until every range is used up. ``run(begin, count)``
    runs one chunk. Chunks are a CHUNKS_PER_THREAD-th of a home range."""
    ty = extent.type
    fn = b.function
    c0, c1 = ir.Constant(ty, 0), ir.Constant(ty, 1)
    extent = b.select(b.icmp_signed("<", extent, c0), c0, extent)
    homes = _homes(b, nthreads)
    q, r = b.sdiv(extent, homes), b.srem(extent, homes)
    start = b.urem(tid, homes)
    k_slot = b.alloca(ty, name="k")
    b.store(c0, k_slot)
    head, home, grab, work, done = (fn.append_basic_block(n)
                                    for n in ("home.next", "home", "grab", "work", "done"))
    b.branch(head)
    b.position_at_end(head)  # the k-th range after the home range
    k = b.load(k_slot)
    b.cbranch(b.icmp_signed("<", k, homes), home, done)
    b.position_at_end(home)
    h = b.add(start, k)
    h = b.select(b.icmp_signed(">=", h, homes), b.sub(h, homes), h)
    below_r = b.icmp_signed("<", h, r)
    begin = b.add(b.mul(h, q), b.select(below_r, h, r))
    length = b.add(q, b.select(below_r, c1, c0))
    per = ir.Constant(ty, CHUNKS_PER_THREAD)
    chunk = b.sdiv(b.add(length, ir.Constant(ty, CHUNKS_PER_THREAD - 1)), per)
    chunk = b.select(b.icmp_signed("<", chunk, c1), c1, chunk)
    counter = b.gep(counters, [c0, b.mul(h, ir.Constant(ty, stride))], inbounds=True)
    b.store(b.add(k, c1), k_slot)
    b.branch(grab)
    b.position_at_end(grab)
    taken = b.atomic_rmw("add", counter, chunk, "monotonic")
    b.cbranch(b.icmp_signed("<", taken, length), work, head)
    b.position_at_end(work)
    count = b.sub(length, taken)
    run(b.add(begin, taken), b.select(b.icmp_signed("<", chunk, count), chunk, count))
    b.branch(grab)
    b.position_at_end(done)
    b.ret_void()


def _to(b: ir.IRBuilder, v: ir.Value, ty: ir.Type) -> ir.Value:
    if v.type == ty:
        return v
    return b.sext(v, ty) if ty.width > v.type.width else b.trunc(v, ty)
