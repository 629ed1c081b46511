"""Parallel loops on autosched's thread pool (threadpool.py), or on libgomp where the pool
does not run (other triples, or AUTOSCHED_PARALLEL=gomp).

``for i in range(lo, lo + n): body  # parallel`` becomes three pieces:

* ``NAME__parK_body(status, p..., x..., begin, count)``: the loop over ``[begin, begin + count)``,
  taking the kernel's status slot (failures are or-ed into it atomically), the buffers it uses
  as noalias pointers (so outlining loses no alias information) and the scalars it uses (outer
  loop variables, lets, symbolic sizes) by value;
* ``NAME__parK(void *data, int32_t nthreads, int32_t rank)``: what each thread that joins
  runs; it unpacks the captured values from ``data`` and works through home ranges: the loop
  is cut into ``min(nthreads, MAX_HOMES)`` contiguous homes, each with its own counter in
  ``data`` (a cache line each), and the thread of rank r (the caller 0, workers their fixed
  rank; libgomp: ``omp_get_thread_num``) takes chunks of ``ceil(home / CHUNKS_PER_THREAD)``
  iterations from home r first (an atomic add each), then from the homes after it until none
  is left. The same thread gets the same part of every loop of a model, so a kernel finds what
  the kernel before it wrote in its own core's cache; a thread whose core is slow does less,
  and one thread alone finishes the loop;
* at the loop's place: the captured values packed into a stack struct and
  ``autosched_parallel(NAME__parK, &data, NAME__num_threads)`` (libgomp:
  ``GOMP_parallel(NAME__parK, &data, NAME__num_threads, 0)``, the count from
  ``omp_get_num_threads``).

A parallel loop inside another runs serially (its body is already on a worker thread). Each
thread that runs part of a loop adds one to ``NAME__threads_ran`` so tests and users can see it:
with the pool, the caller and the workers that joined in time (1 to NAME__num_threads); with
libgomp, the whole team.
"""

from __future__ import annotations

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
# busy sibling, a descheduled vCPU) leaves its rest to the others. Home ranges against one
# shared counter (chunks in the order threads come), ResNet-18 untuned on 2 cores (znver4
# vCPUs): 17.4 -> 16.3 ms while the two cores share a cache, 25.1 -> 21.2 ms while a cache line
# takes 350 ns from one to the other (the host moves vCPUs; memory-bound kernels reading what
# the other core wrote ran 2-2.7x slower with the shared counter).
CHUNKS_PER_THREAD = 4
MAX_HOMES = 16  # more threads share homes (rank mod homes)
LINE = 64  # bytes: each home's counter on its own cache line


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

    # NAME__parK: unpack, then take chunks from the home ranges, its own first
    assert gen.status is not None
    captured = ([gen.status] + [gen.ptrs[u] for u in buf_uids] + [gen.env[u] for u in var_uids]
                + [lo, extent])
    line_ty = ir.ArrayType(idx_ty, LINE // (idx_ty.width // 8))
    counters_ty = ir.ArrayType(line_ty, MAX_HOMES)
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
        nt, rank = team_fn.args[1], team_fn.args[2]
    else:
        nt = b.call(state.function("omp_get_num_threads", T.I32, []), [])
        rank = b.call(state.function("omp_get_thread_num", T.I32, []), [])
    b.atomic_rmw("add", threads_ran, ir.Constant(T.I32, 1), "monotonic")
    one = ir.Constant(idx_ty, 1)
    homes = _to(b, nt, idx_ty)
    homes = b.select(b.icmp_signed(">", homes, ir.Constant(idx_ty, MAX_HOMES)),
                     ir.Constant(idx_ty, MAX_HOMES), homes)
    homes = b.select(b.icmp_signed("<", homes, one), one, homes)
    home_len = _ceil_div(b, t_ext, homes)
    chunk = _ceil_div(b, home_len, ir.Constant(idx_ty, CHUNKS_PER_THREAD))
    chunk = b.select(b.icmp_signed("<", chunk, one), one, chunk)
    own = b.urem(_to(b, rank, idx_ty), homes)
    visit, grab, run, step, done = (team_fn.append_basic_block(n) for n in
                                    ("visit", "grab", "run", "step", "done"))
    entry = b.block
    b.branch(visit)
    b.position_at_end(visit)  # the j-th home after our own
    j = b.phi(idx_ty, "j")
    j.add_incoming(ir.Constant(idx_ty, 0), entry)
    h = b.add(own, j)
    h = b.select(b.icmp_signed(">=", h, homes), b.sub(h, homes), h)
    start = b.mul(h, home_len)
    left = b.sub(t_ext, start)
    length = b.select(b.icmp_signed("<", left, home_len), left, home_len)
    counter = b.gep(data, [zero, ir.Constant(T.I32, len(captured)), _to(b, h, T.I32), zero],
                    inbounds=True)
    b.branch(grab)
    b.position_at_end(grab)
    first = b.atomic_rmw("add", counter, chunk, "monotonic")
    b.cbranch(b.icmp_signed("<", first, length), run, step)
    b.position_at_end(run)
    last = b.add(first, chunk)
    last = b.select(b.icmp_signed("<", last, length), last, length)
    b.call(body_fn, vals[:-2] + [b.add(t_lo, b.add(start, first)), b.sub(last, first)])
    b.branch(grab)
    b.position_at_end(step)
    j_next = b.add(j, one)
    j.add_incoming(j_next, step)
    b.cbranch(b.icmp_signed("<", j_next, homes), visit, done)
    b.position_at_end(done)
    b.ret_void()

    # at the loop's place: pack and fork
    slot = gen.allocas.alloca(struct_ty, name=base + ".data")
    slot.align = LINE
    for j, v in enumerate(captured):
        gen.b.store(v, gen.b.gep(slot, [zero, ir.Constant(T.I32, j)], inbounds=True))
    for h in range(MAX_HOMES):
        gen.b.store(ir.Constant(idx_ty, 0), gen.b.gep(
            slot, [zero, ir.Constant(T.I32, len(captured)), ir.Constant(T.I32, h), zero],
            inbounds=True))
    threads = gen.b.load(num_threads, align=4)
    if pool:
        fork = state.function(threadpool.ENTRY, T.VOID, threadpool.ENTRY_FN.args)
        gen.b.call(fork, [team_fn, gen.b.bitcast(slot, T.I8P), threads])
    else:
        fork = state.function("GOMP_parallel", T.VOID, [team_fn.type, T.I8P, T.I32, T.I32])
        gen.b.call(fork, [team_fn, gen.b.bitcast(slot, T.I8P), threads, zero])


def _ceil_div(b: ir.IRBuilder, n: ir.Value, d: ir.Value) -> ir.Value:
    """ceil(n / d) for n >= 0, d >= 1."""
    return b.sdiv(b.add(n, b.sub(d, ir.Constant(d.type, 1))), d)


def _to(b: ir.IRBuilder, v: ir.Value, ty: ir.Type) -> ir.Value:
    if v.type == ty:
        return v
    return b.sext(v, ty) if ty.width > v.type.width else b.trunc(v, ty)
