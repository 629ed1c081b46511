"""autosched's fork-join runtime for parallel loops, generated as LLVM IR (no C compiler needed).

One entry point::

    void autosched_parallel(void (*fn)(void *data, int32_t nthreads, int32_t rank), void *data,
                            int32_t nthreads);

``fn`` (an outlined parallel loop, parallel.py) takes chunks of the loop from counters in
``data`` until none is left, so one thread alone finishes the loop. The caller

1. publishes the region: ``fn``, ``data`` and, in one 64-bit atomic word (``state``), a new
   generation, an open flag, how many workers may join and how many have (0);
2. wakes the workers only if some sleep (a futex);
3. runs ``fn(data, nthreads, 0)`` itself (a worker runs it with its rank: 1 for the first
   worker made, 2 for the next, ..., the same in every region, so that a loop can give each
   thread the same part of every loop: parallel.py's home ranges);
4. closes the region (clears the open flag) and waits only for the workers still inside it:
   they hold chunks. A worker joins with one compare-and-swap of ``state`` (inside + 1,
   joined + 1), which fails once the region is closed or replaced or ``nthreads - 1`` workers
   have joined, so a worker that comes late never touches the old region's data (which lives
   on the caller's stack); it leaves with an atomic subtract (inside - 1).

Unlike libgomp's ``GOMP_parallel``, whose end barrier waits for every thread of the team, a
worker that is descheduled (another process has its core) costs nothing: the caller does its
share. Workers (``nthreads - 1`` threads, created on first use with pthread_create) spin
``spin`` times with the CPU's pause hint after a region, then sleep on the futex. The spin count
is read once per process from the environment, as libgomp reads it: OMP_WAIT_POLICY=passive is
0, active is unbounded, GOMP_SPINCOUNT=N is N, else SPIN_COUNT; with more threads than cores,
at most SPIN_THROTTLED (libgomp's throttled spin).

The pool is process-wide per copy of this code: one for every JIT-compiled kernel of a process
(compile.py compiles it once and binds the symbol for the kernels), one inside each deployed
library (linked in with internal linkage). A caller that finds the pool busy (another thread's
region, or a parallel loop called from inside one) runs its region alone: correct, not parallel.
After fork() the child has no workers: the pool notices the new pid and starts afresh.

Supported: Linux on x86_64 and aarch64 (``supported``); other triples keep libgomp. Setting
AUTOSCHED_PARALLEL=gomp selects libgomp on every triple (for comparison).
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from autosched import settings
from autosched.targets.llvm import types as T

ENTRY = "autosched_parallel"
PREFIX = "autosched_pool_"  # the pool's globals and helpers
SPIN_COUNT = 10000  # libgomp's GOMP_SPINCOUNT meaning: pause-loop iterations before sleeping
SPIN_ACTIVE = 1 << 62  # OMP_WAIT_POLICY=active: spin for ever
SPIN_THROTTLED = 1000  # the most a worker spins while there are more threads than cores
YIELD_AFTER = 2000  # the caller waiting for joined workers yields its core after this many spins
MAX_WORKERS = 255

# state: workers inside the region in bits 0-7, workers that joined it in bits 8-15 (a worker
# that leaves does not make room for another), how many may join in bits 16-23, open in bit 24,
# the generation above
COUNT_MASK = 0xFF
JOINED_SHIFT = 8
LIMIT_SHIFT = 16
OPEN = 1 << 24
GEN_SHIFT = 25

FUTEX_WAIT_PRIVATE = 128
FUTEX_WAKE_PRIVATE = 129
SC_NPROCESSORS_ONLN = 84  # glibc's sysconf name, the same on x86_64 and aarch64


@dataclass(frozen=True)
class Arch:
    futex: int  # the futex system call's number
    relax: str  # the intrinsic of the spin-wait hint instruction (x86 pause, aarch64 yield)
    relax_args: tuple[int, ...] = ()


ARCHES = {"x86_64": Arch(202, "llvm.x86.sse2.pause"),
          "aarch64": Arch(98, "llvm.aarch64.hint", (1,))}


def supported(triple: str) -> bool:
    """Whether the pool runs on ``triple`` (Linux on x86_64 or aarch64)."""
    arch, *rest = triple.split("-")
    return arch in ARCHES and any(p.startswith("linux") for p in rest)


def uses_pool(triple: str) -> bool:
    """Whether parallel loops for ``triple`` run on this pool (else on libgomp)."""
    return supported(triple) and settings.PARALLEL.value() != "gomp"


def calls(ir_text: str, symbol: str = ENTRY) -> bool:
    """Whether the LLVM IR ``ir_text`` calls ``symbol`` (by default the pool)."""
    return f'@"{symbol}"(' in ir_text or f"@{symbol}(" in ir_text


TEAM_FN = ir.FunctionType(T.VOID, [T.I8P, T.I32, T.I32])  # (data, nthreads, rank)
ENTRY_FN = ir.FunctionType(T.VOID, [TEAM_FN.as_pointer(), T.I8P, T.I32])


def pool_module(triple: str) -> ir.Module:
    """The pool as an LLVM module for ``triple``: ``autosched_parallel``, everything else
    internal."""
    return _PoolGen(triple).module


class _PoolGen:
    def __init__(self, triple: str) -> None:
        self.arch = ARCHES[triple.split("-")[0]]
        self.module = m = ir.Module(name="autosched_pool")
        m.triple = triple
        self.state = self._global("state", T.I64)
        self.fn = self._global("fn", TEAM_FN.as_pointer())
        self.data = self._global("data", T.I8P)
        self.nthreads = self._global("nthreads", T.I32)
        self.lock = self._global("lock", T.I32)
        self.workers = self._global("workers", T.I32)
        self.sleepers = self._global("sleepers", T.I32)
        self.wake = self._global("wake", T.I32)
        self.pid = self._global("pid", T.I32)
        self.spin = self._global("spin", T.I64)
        self.default_threads = self._global("default_threads", T.I32)
        self.cores = self._global("cores", T.I32)
        self.worker = self._worker_main()
        self._entry()

    # -- helpers -------------------------------------------------------------------------
    def _global(self, name: str, ty: ir.Type) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.module, ty, PREFIX + name)
        g.initializer = ir.Constant(ty, None)
        g.linkage = "internal"
        g.align = 8 if ty != T.I32 else 4
        return g

    def _libc(self, name: str, ret: ir.Type, args: list[ir.Type],
              var_arg: bool = False) -> ir.Function:
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ret, args, var_arg=var_arg), name)
        return fn

    def _function(self, name: str, ty: ir.FunctionType) -> tuple[ir.Function, ir.IRBuilder]:
        fn = ir.Function(self.module, ty, name)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        return fn, ir.IRBuilder(fn.append_basic_block("entry"))

    def _relax(self, b: ir.IRBuilder) -> None:
        args = [ir.Constant(T.I32, a) for a in self.arch.relax_args]
        b.call(self._libc(self.arch.relax, T.VOID, [a.type for a in args]), args)

    def _futex(self, b: ir.IRBuilder, op: int, value: ir.Value) -> None:
        syscall = self._libc("syscall", T.I64, [T.I64], var_arg=True)
        value = b.zext(value, T.I64) if value.type != T.I64 else value
        b.call(syscall, [self._const(self.arch.futex), b.bitcast(self.wake, T.I8P),
                         self._const(op), value, ir.Constant(T.I8P, None)])

    @staticmethod
    def _atomic_load(b: ir.IRBuilder, g: ir.GlobalVariable, order: str) -> ir.Value:
        return b.load_atomic(g, order, g.align)

    @staticmethod
    def _const(value: int) -> ir.Constant:
        return ir.Constant(T.I64, value)

    def _joinable(self, b: ir.IRBuilder, s: ir.Value, last: ir.Value) -> ir.Value:
        """Whether a worker that last ran generation ``last`` may join the region in ``s``."""
        c = self._const
        is_open = b.icmp_unsigned("!=", b.and_(s, c(OPEN)), c(0))
        fresh = b.icmp_unsigned("!=", b.lshr(s, c(GEN_SHIFT)), last)
        limit = b.and_(b.lshr(s, c(LIMIT_SHIFT)), c(COUNT_MASK))
        joined = b.and_(b.lshr(s, c(JOINED_SHIFT)), c(COUNT_MASK))
        room = b.icmp_unsigned("<", joined, limit)
        return b.and_(b.and_(is_open, fresh), room)

    # -- the worker thread ---------------------------------------------------------------
    def _worker_main(self) -> ir.Function:
        fn, b = self._function(PREFIX + "worker", ir.FunctionType(T.I8P, [T.I8P]))
        c = self._const
        rank = b.trunc(b.ptrtoint(fn.args[0], T.I64), T.I32)  # 1 for the first worker made
        last = b.alloca(T.I64, name="last")  # the generation this worker last joined
        spins = b.alloca(T.I64, name="spins")
        b.store(c(0), last)
        top, look, join, work, idle, relax, sleep, block, awake = (
            fn.append_basic_block(n) for n in
            ("top", "look", "join", "work", "idle", "relax", "sleep", "block", "awake"))
        b.branch(top)
        b.position_at_end(top)
        b.store(c(0), spins)
        b.branch(look)

        b.position_at_end(look)
        s = self._atomic_load(b, self.state, "acquire")
        b.cbranch(self._joinable(b, s, b.load(last)), join, idle)

        b.position_at_end(join)
        pair = b.cmpxchg(self.state, s, b.add(s, c(1 + (1 << JOINED_SHIFT))), "acq_rel",
                         "monotonic")
        b.cbranch(b.extract_value(pair, 1), work, look)

        b.position_at_end(work)  # joined: the region stays open to us until we leave
        b.store(b.lshr(s, c(GEN_SHIFT)), last)
        b.call(b.load(self.fn), [b.load(self.data), b.load(self.nthreads), rank])
        b.atomic_rmw("sub", self.state, c(1), "release")
        b.branch(top)

        b.position_at_end(idle)  # with more threads than cores, spinning takes the caller's time
        n = b.load(spins)
        spin = b.load(self.spin)
        workers = self._atomic_load(b, self.workers, "monotonic")  # the caller may add one
        crowded = b.icmp_signed(">=", workers, b.load(self.cores))
        throttled = b.select(b.icmp_unsigned("<", spin, c(SPIN_THROTTLED)), spin,
                             c(SPIN_THROTTLED))
        b.cbranch(b.icmp_unsigned("<", n, b.select(crowded, throttled, spin)), relax, sleep)
        b.position_at_end(relax)
        self._relax(b)
        b.store(b.add(n, c(1)), spins)
        b.branch(look)

        # sleep: count ourselves as a sleeper, then check once more for a region before
        # waiting; the caller opens a region, then reads the sleepers (all seq_cst): either it
        # sees us and bumps ``wake`` (our wait returns at once), or we see its region
        b.position_at_end(sleep)
        b.atomic_rmw("add", self.sleepers, ir.Constant(T.I32, 1), "seq_cst")
        seen = self._atomic_load(b, self.wake, "seq_cst")
        s2 = self._atomic_load(b, self.state, "seq_cst")
        b.cbranch(self._joinable(b, s2, b.load(last)), awake, block)
        b.position_at_end(block)
        self._futex(b, FUTEX_WAIT_PRIVATE, seen)
        b.branch(awake)
        b.position_at_end(awake)
        b.atomic_rmw("sub", self.sleepers, ir.Constant(T.I32, 1), "seq_cst")
        b.branch(top)
        return fn

    # -- reading the environment once per process ----------------------------------------
    def _read_settings(self, b: ir.IRBuilder) -> None:
        """``spin`` from OMP_WAIT_POLICY / GOMP_SPINCOUNT, ``default_threads`` from
        OMP_NUM_THREADS or the online cores."""
        getenv = self._libc("getenv", T.I8P, [T.I8P])
        strtol = self._libc("strtol", T.I64, [T.I8P, T.I8P.as_pointer(), T.I32])
        sysconf = self._libc("sysconf", T.I64, [T.I32])
        null = ir.Constant(T.I8P, None)

        def env(name: str) -> ir.Value:
            data = bytearray(name.encode()) + b"\0"
            g = ir.GlobalVariable(self.module, ir.ArrayType(T.I8, len(data)), PREFIX + name)
            g.initializer = ir.Constant(g.type.pointee, data)
            g.global_constant = True
            g.linkage = "private"
            return b.call(getenv, [b.bitcast(g, T.I8P)])

        def number(text: ir.Value, fallback: ir.Value) -> ir.Value:
            """strtol(text) when ``text`` is set and positive or 0, else ``fallback``."""
            is_set = b.icmp_unsigned("!=", text, null)
            with b.if_else(is_set) as (then, otherwise):
                with then:
                    value = b.call(strtol, [text, ir.Constant(T.I8P.as_pointer(), None),
                                            ir.Constant(T.I32, 10)])
                    value = b.select(b.icmp_signed("<", value, self._const(0)), fallback, value)
                    block_set = b.block
                with otherwise:
                    block_unset = b.block
            phi = b.phi(T.I64)
            phi.add_incoming(value, block_set)
            phi.add_incoming(fallback, block_unset)
            return phi

        spin = number(env("GOMP_SPINCOUNT"), self._const(SPIN_COUNT))
        policy = env("OMP_WAIT_POLICY")
        first = b.alloca(T.I8)
        b.store(ir.Constant(T.I8, 0), first)
        with b.if_then(b.icmp_unsigned("!=", policy, null)):
            b.store(b.or_(b.load(policy), ir.Constant(T.I8, 0x20)), first)  # lower case
        letter = b.load(first)
        spin = b.select(b.icmp_unsigned("==", letter, ir.Constant(T.I8, ord("p"))),
                        self._const(0), spin)
        spin = b.select(b.icmp_unsigned("==", letter, ir.Constant(T.I8, ord("a"))),
                        self._const(SPIN_ACTIVE), spin)
        b.store(spin, self.spin)
        cores = b.call(sysconf, [ir.Constant(T.I32, SC_NPROCESSORS_ONLN)])
        cores = b.select(b.icmp_signed("<", cores, self._const(1)), self._const(1), cores)
        b.store(b.trunc(cores, T.I32), self.cores)
        threads = number(env("OMP_NUM_THREADS"), cores)
        threads = b.select(b.icmp_signed("<", threads, self._const(1)), cores, threads)
        b.store(b.trunc(threads, T.I32), self.default_threads)

    # -- the entry point -----------------------------------------------------------------
    def _entry(self) -> None:
        fn = ir.Function(self.module, ENTRY_FN, ENTRY)
        fn.attributes.add("nounwind")
        team, data, asked = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        c = self._const
        i32 = T.I32
        blocks = {n: fn.append_basic_block(n) for n in (
            "fresh", "reset", "ready", "inline", "locked", "grow", "create", "created",
            "publish", "wake", "run", "wait", "relax", "done", "unlock_inline")}
        nthreads = b.alloca(T.I32, name="nthreads")
        b.store(ir.Constant(T.I32, 1), nthreads)
        with b.if_then(b.icmp_signed("==", asked, ir.Constant(T.I32, 1))):
            b.branch(blocks["inline"])  # one thread: no pool, not even a getpid

        # after fork() (or on first use) the pool starts afresh: one thread claims the reset
        # by swapping the old pid for -1; others run alone meanwhile
        pid = b.call(self._libc("getpid", T.I32, []), [])
        old = self._atomic_load(b, self.pid, "acquire")
        b.cbranch(b.icmp_signed("==", old, pid), blocks["ready"], blocks["fresh"])
        b.position_at_end(blocks["fresh"])
        minus1 = ir.Constant(T.I32, -1)
        claim = b.cmpxchg(self.pid, old, minus1, "acq_rel", "monotonic")
        ok = b.and_(b.icmp_signed("!=", old, minus1), b.extract_value(claim, 1))
        b.cbranch(ok, blocks["reset"], blocks["inline"])
        b.position_at_end(blocks["reset"])
        for g in (self.state, self.lock, self.workers, self.sleepers, self.wake):
            b.store(ir.Constant(g.type.pointee, 0), g)
        self._read_settings(b)
        b.store_atomic(pid, self.pid, "release", 4)
        b.branch(blocks["ready"])

        # ready: the thread count (0 or less: the default), then the try-lock
        b.position_at_end(blocks["ready"])
        n = b.select(b.icmp_signed("<", asked, ir.Constant(T.I32, 1)),
                     b.load(self.default_threads), asked)
        b.store(n, nthreads)
        single = b.icmp_signed("<=", n, ir.Constant(T.I32, 1))
        with b.if_then(single):
            b.branch(blocks["inline"])
        taken = b.cmpxchg(self.lock, ir.Constant(T.I32, 0), ir.Constant(T.I32, 1),
                          "acquire", "monotonic")
        b.cbranch(b.extract_value(taken, 1), blocks["locked"], blocks["inline"])

        b.position_at_end(blocks["inline"])
        b.call(team, [data, b.load(nthreads), ir.Constant(i32, 0)])
        b.ret_void()

        # locked: make sure nthreads - 1 workers exist (fewer if pthread_create fails)
        b.position_at_end(blocks["locked"])
        want = b.sub(n, ir.Constant(i32, 1))
        want = b.select(b.icmp_signed(">", want, ir.Constant(i32, MAX_WORKERS)),
                        ir.Constant(i32, MAX_WORKERS), want)
        tid = b.alloca(T.I64, name="tid")
        b.branch(blocks["grow"])
        b.position_at_end(blocks["grow"])
        have = b.load(self.workers)
        b.cbranch(b.icmp_signed("<", have, want), blocks["create"], blocks["publish"])
        b.position_at_end(blocks["create"])
        create = self._libc("pthread_create", T.I32,
                            [T.I64.as_pointer(), T.I8P, self.worker.type, T.I8P])
        rank = b.inttoptr(b.zext(b.add(have, ir.Constant(i32, 1)), T.I64), T.I8P)
        rc = b.call(create, [tid, ir.Constant(T.I8P, None), self.worker, rank])
        b.cbranch(b.icmp_signed("==", rc, ir.Constant(i32, 0)), blocks["created"],
                  blocks["publish"])
        b.position_at_end(blocks["created"])
        b.call(self._libc("pthread_detach", T.I32, [T.I64]), [b.load(tid)])
        b.store_atomic(b.add(have, ir.Constant(i32, 1)), self.workers, "monotonic", 4)
        b.branch(blocks["grow"])

        # publish: fn, data, then the state word that opens the region
        b.position_at_end(blocks["publish"])
        have = b.load(self.workers)
        limit = b.select(b.icmp_signed("<", have, want), have, want)
        with b.if_then(b.icmp_signed("==", limit, ir.Constant(i32, 0))):
            b.branch(blocks["unlock_inline"])
        b.store(team, self.fn)
        b.store(data, self.data)
        b.store(n, self.nthreads)
        s = b.load(self.state)
        gen = b.add(b.lshr(s, c(GEN_SHIFT)), c(1))
        opened = b.or_(b.or_(b.shl(gen, c(GEN_SHIFT)), c(OPEN)),
                       b.shl(b.zext(limit, T.I64), c(LIMIT_SHIFT)))
        b.store_atomic(opened, self.state, "seq_cst", 8)
        sleeping = self._atomic_load(b, self.sleepers, "seq_cst")
        b.cbranch(b.icmp_signed(">", sleeping, ir.Constant(i32, 0)), blocks["wake"],
                  blocks["run"])
        b.position_at_end(blocks["wake"])
        b.atomic_rmw("add", self.wake, ir.Constant(i32, 1), "seq_cst")
        self._futex(b, FUTEX_WAKE_PRIVATE, ir.Constant(T.I64, 2**31 - 1))
        b.branch(blocks["run"])

        # run our share, close, wait for the workers that joined
        b.position_at_end(blocks["run"])
        b.call(team, [data, n, ir.Constant(i32, 0)])
        b.atomic_rmw("and", self.state, c(~OPEN & (2**64 - 1)), "acq_rel")
        spins = b.alloca(T.I64, name="spins")
        b.store(c(0), spins)
        b.branch(blocks["wait"])
        b.position_at_end(blocks["wait"])
        s = self._atomic_load(b, self.state, "acquire")
        b.cbranch(b.icmp_unsigned("==", b.and_(s, c(COUNT_MASK)), c(0)), blocks["done"],
                  blocks["relax"])
        b.position_at_end(blocks["relax"])
        k = b.load(spins)
        b.store(b.add(k, c(1)), spins)
        with b.if_else(b.icmp_unsigned("<", k, c(YIELD_AFTER))) as (then, otherwise):
            with then:
                self._relax(b)
            with otherwise:  # a joined worker shares our core: let it finish its chunk
                b.call(self._libc("sched_yield", T.I32, []), [])
        b.branch(blocks["wait"])
        b.position_at_end(blocks["done"])
        b.store_atomic(ir.Constant(i32, 0), self.lock, "release", 4)
        b.ret_void()

        b.position_at_end(blocks["unlock_inline"])
        b.store_atomic(ir.Constant(i32, 0), self.lock, "release", 4)
        b.branch(blocks["inline"])
