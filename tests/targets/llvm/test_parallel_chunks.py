"""How a parallel loop's iterations are handed out (targets/llvm/parallel.py ``_take_chunks``):
each thread takes its own contiguous home range first, then what is left of the others', and
every iteration runs exactly once. Driven here on one thread through a small JIT-compiled
function that records the chunks it is given."""

from __future__ import annotations

import ctypes

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
import pytest

from autosched.targets.llvm import parallel
from autosched.targets.llvm import types as T
from autosched.targets.llvm.compile import target_machine
from autosched.targets.target import parse

I64 = ir.IntType(64)
STRIDE = parallel.COUNTER_BYTES // 8
MAX_CHUNKS = 4096


@pytest.fixture(scope="module")
def take() -> object:
    """``take(nthreads, tid, extent, counters, out)``: thread ``tid``'s share of the loop, as
    (begin, count) pairs written to ``out`` after their number."""
    m = ir.Module("chunks")
    m.triple = parse("llvm").triple
    fn = ir.Function(m, ir.FunctionType(T.VOID, [I64, I64, I64, I64.as_pointer(),
                                                   I64.as_pointer()]), "take")
    nthreads, tid, extent, counters, out = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.store(ir.Constant(I64, 0), out)
    array = b.bitcast(counters, ir.ArrayType(I64, parallel.HOME_SLOTS * STRIDE).as_pointer())

    def run(begin: ir.Value, count: ir.Value) -> None:
        n = b.load(out)
        at = b.add(b.mul(n, ir.Constant(I64, 2)), ir.Constant(I64, 1))
        b.store(begin, b.gep(out, [at]))
        b.store(count, b.gep(out, [b.add(at, ir.Constant(I64, 1))]))
        b.store(b.add(n, ir.Constant(I64, 1)), out)

    parallel._take_chunks(b, array, STRIDE, nthreads, tid, extent, run)
    mod = llvm.parse_assembly(str(m))
    mod.verify()
    engine = llvm.create_mcjit_compiler(mod, target_machine(parse("llvm")))
    engine.finalize_object()
    addr = engine.get_function_address("take")
    cfn = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 3, ctypes.c_void_p, ctypes.c_void_p)(addr)
    cfn.engine = engine  # keep the code alive with the function
    return cfn


def _counters() -> np.ndarray:
    return np.zeros(parallel.HOME_SLOTS * STRIDE, np.int64)


def _chunks(take: object, nthreads: int, tid: int, extent: int,
            counters: np.ndarray) -> list[tuple[int, int]]:
    out = np.full(2 * MAX_CHUNKS + 1, -1, np.int64)
    take(nthreads, tid, extent, counters.ctypes.data, out.ctypes.data)  # type: ignore[operator]
    return [(int(out[1 + 2 * i]), int(out[2 + 2 * i])) for i in range(int(out[0]))]


def _homes(nthreads: int, extent: int) -> list[tuple[int, int]]:
    homes = min(max(nthreads, 1), parallel.HOME_SLOTS)
    q, r = divmod(extent, homes)
    starts = [h * q + min(h, r) for h in range(homes + 1)]
    return list(zip(starts, starts[1:]))


def test_a_thread_starts_with_its_home_range_then_takes_the_rest(take: object) -> None:
    counters = _counters()
    got = _chunks(take, 3, 1, 10, counters)  # homes [0, 4), [4, 7), [7, 10)
    assert got[:3] == [(4, 1), (5, 1), (6, 1)]
    assert [b for b, _ in got[3:6]] == [7, 8, 9] and got[6][0] == 0
    # a thread that joins after the loop is done finds nothing left
    assert _chunks(take, 3, 0, 10, counters) == []


def test_every_iteration_runs_once_whatever_the_thread_count(take: object) -> None:
    rng = np.random.default_rng()
    for _ in range(200):
        nthreads = int(rng.integers(1, 2 * parallel.HOME_SLOTS))
        extent = int(rng.integers(0, 600))
        counters = _counters()
        order = rng.permutation(nthreads)  # threads arrive in any order; the first does all
        got = _chunks(take, nthreads, int(order[0]), extent, counters)
        for tid in order[1:4]:
            assert _chunks(take, nthreads, int(tid), extent, counters) == []
        seen = np.zeros(extent, int)
        for begin, count in got:
            assert count >= 1
            seen[begin:begin + count] += 1
        assert (seen == 1).all(), (nthreads, extent)
        homes = _homes(nthreads, extent)
        home = homes[int(order[0]) % len(homes)]
        if home[1] > home[0]:
            assert got[0][0] == home[0], (nthreads, extent, got[:2])
            # chunks of a CHUNKS_PER_THREAD-th of the home range
            assert got[0][1] == -(-(home[1] - home[0]) // parallel.CHUNKS_PER_THREAD)


def test_two_threads_share_a_loop_by_halves(take: object) -> None:
    """The second thread joins while the first is inside its home range: it takes its own
    half, and the first finishes by taking what the second left."""
    counters = _counters()
    counters[0] = 6  # thread 0 has taken [0, 6) of its home range [0, 50)
    mine = _chunks(take, 2, 1, 100, counters)
    assert mine[0] == (50, 13) and sum(c for b, c in mine if b >= 50) == 50
    assert all(b >= 6 for b, _ in mine)
