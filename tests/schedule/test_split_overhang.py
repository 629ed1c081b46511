"""Splits that do not divide, nested in other splits and fuses: every index is computed exactly
once (a split of a split's inner part overhangs that part, which is no root and so has no root
guard), checked against numpy on llvm and on CUDA C run on the host, and by counting stores."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.schedule.schedule import Schedule, Stage
from autosched.targets.cuda.host_emulate import run_on_host, unavailable
from autosched.targets.ref.evaluate import evaluate
from autosched.te import expr as E
from autosched.te import ops
from autosched.te.visit import free_vars, post_order
from autosched.tir import ir
from autosched.tir.evaluate import const_int
from autosched.tir.visit import map_stmt, sub_stmts, walk
from tests.support.backends import CPU_TARGETS, random_array, run, tolerance
from tests.support.nvrtc import needs_nvrtc

CUDA = "cuda -arch=sm_90"


def _chain(st: Stage, axis: E.IterVar, rng: np.random.Generator, steps: int) -> list[E.IterVar]:
    """Split and fuse the loops that come from ``axis`` at random; its leaves in loop order.
    The second step splits the first split's inner part, the case that used to repeat."""
    leaves = [axis]
    for n in range(steps):
        if n > 1 and len(leaves) > 1 and rng.random() < 0.35:
            p = int(rng.integers(len(leaves) - 1))
            leaves[p:p + 2] = [st.fuse(leaves[p], leaves[p + 1])]
            continue
        p = len(leaves) - 1 if n < 2 else int(rng.integers(len(leaves)))
        size = int(rng.integers(2, 6))
        kw = {"factor": size} if rng.random() < 0.5 else {"nparts": size}
        leaves[p:p + 1] = list(st.split(leaves[p], **kw))
    return leaves


def _row_sum(rows: int, cols: int) -> tuple[te.Tensor, E.IterVar, te.Tensor, Schedule]:
    A = te.placeholder((rows, cols), name="A")
    k = te.reduce_axis((0, cols), name="k")
    C = te.compute((rows,), lambda i: te.sum(A[i, k], axis=k), name="C")
    return A, k, C, te.create_schedule(C.op)


def _sum(rng: np.random.Generator) -> tuple[Schedule, list, list[E.IterVar], Callable]:
    A, k, C, s = _row_sum(int(rng.integers(3, 8)), int(rng.choice([10, 11, 13, 17, 23])))
    data = _chain(s[C], C.op.axis[0], rng, int(rng.integers(1, 4)))
    _chain(s[C], k, rng, int(rng.integers(2, 6)))
    return s, [A, C], data, lambda a: a.astype(np.float64).sum(axis=1)


def _elementwise(rng: np.random.Generator) -> tuple[Schedule, list, list[E.IterVar], Callable]:
    rows, cols = int(rng.choice([5, 7, 9])), int(rng.choice([10, 11, 13]))
    A = te.placeholder((rows, cols), name="A")
    C = te.compute((rows, cols), lambda i, j: A[i, j] * 2.0 - 1.0, name="C")
    s = te.create_schedule(C.op)

    def want(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float64) * 2.0 - 1.0

    row_leaves = _chain(s[C], C.op.axis[0], rng, int(rng.integers(2, 5)))
    col_leaves = _chain(s[C], C.op.axis[1], rng, int(rng.integers(2, 5)))
    if rng.random() < 0.5:  # a fuse across the two axes' chains (their leaves are adjacent)
        fused = s[C].fuse(row_leaves[-1], col_leaves[0])
        return s, [A, C], row_leaves[:-1] + [fused] + col_leaves[1:], want
    return s, [A, C], row_leaves + col_leaves, want


CASES = {"sum": _sum, "elementwise": _elementwise}


def _store_counts(func: ir.PrimFunc, shape: tuple[int, ...], a: np.ndarray) -> np.ndarray:
    """How often ``func`` stores each element of its output: every store becomes ``+= 1``."""
    out = func.params[-1]

    def count(s: ir.Stmt) -> ir.Stmt | None:
        if isinstance(s, ir.Store) and s.buffer is out:
            return ir.Store(out, s.indices, ir.Load(out, s.indices) + E.const(1.0, out.dtype))
        return None

    counted = ir.PrimFunc(func.name, func.params, map_stmt(func.body, lambda e: e, count))
    counts = np.zeros(shape, out.dtype)  # a counter, not data: it starts at zero
    evaluate(counted, a, counts)
    return counts


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_index_is_stored_exactly_once(case, rng):
    for _ in range(8):
        s, args, _, _ = CASES[case](rng)
        a = random_array(rng, tuple(int(d) for d in args[0].shape))
        shape = tuple(int(d) for d in args[1].shape)
        counts = _store_counts(aus.lower(s, args), shape, a)
        # a reduction stores its init once, then one update per reduced index
        per_element = 1 + int(args[0].shape[1]) if case == "sum" else 1
        assert (counts == per_element).all(), f"{s.to_python()}\nstores per element: {counts}"


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_random_split_fuse_chains_match_numpy(case, target, rng):
    for _ in range(4):
        s, args, _, want = CASES[case](rng)
        a = random_array(rng, tuple(int(d) for d in args[0].shape))
        (c,) = run(s, args, [a], target)
        np.testing.assert_allclose(c, want(a), **tolerance("float32"), err_msg=s.to_python())


@needs_nvrtc
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
@pytest.mark.parametrize("case", sorted(CASES))
def test_random_split_fuse_chains_on_cuda_c_match_numpy(case, rng):
    for _ in range(2):
        s, args, data, want = CASES[case](rng)
        st = s[args[1]]
        st.bind(data[0], te.thread_axis("blockIdx.x"))
        if len(data) > 1:
            st.bind(data[1], te.thread_axis("threadIdx.x"))
        a = random_array(rng, tuple(int(d) for d in args[0].shape))
        c = np.full(tuple(int(d) for d in args[1].shape), np.nan, "float32")
        result = run_on_host(aus.build(s, args, target=CUDA), a, c)
        np.testing.assert_allclose(c, want(a), **tolerance("float32"), err_msg=s.to_python())
        assert result.warnings == ()


def _attached(rng: np.random.Generator) -> tuple[Schedule, list]:
    """B = 2A computed at a random loop of the chained row sum of B, B's columns chained too."""
    rows, cols = int(rng.choice([5, 7, 9])), int(rng.choice([10, 11, 13]))
    A = te.placeholder((rows, cols), name="A")
    B = te.compute((rows, cols), lambda i, j: A[i, j] * 2.0, name="B")
    k = te.reduce_axis((0, cols), name="k")
    C = te.compute((rows,), lambda i: te.sum(B[i, k], axis=k), name="C")
    s = te.create_schedule(C.op)
    _chain(s[C], C.op.axis[0], rng, int(rng.integers(0, 4)))
    _chain(s[C], k, rng, int(rng.integers(2, 5)))
    s[B].compute_at(s[C], s[C].leaf[int(rng.integers(len(s[C].leaf)))])
    _chain(s[B], B.op.axis[1], rng, int(rng.integers(2, 5)))
    return s, [A, C]


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_attached_producer_with_random_chains_matches_numpy(target, rng):
    # the region B computes at its loop is guarded like a root stage's whole domain
    for _ in range(4):
        s, args = _attached(rng)
        a = random_array(rng, tuple(int(d) for d in args[0].shape))
        (c,) = run(s, args, [a], target)
        np.testing.assert_allclose(c, (a.astype(np.float64) * 2.0).sum(axis=1),
                                   **tolerance("float32"), err_msg=s.to_python())

@pytest.mark.parametrize("target", CPU_TARGETS)
def test_rfactor_of_a_split_that_overhangs_its_parent(target, rng):
    # k (10) = ko * 4 + ki, ki (4) in 3 parts of 2 (ki reaches 5): factor out the innermost part
    A, k, C, s = _row_sum(3, 10)
    _, ki = s[C].split(k, factor=4)
    _, kii = s[C].split(ki, nparts=3)
    s.rfactor(C, kii)
    a = random_array(rng, (3, 10))
    (c,) = run(s, [A, C], [a], target)
    np.testing.assert_allclose(c, a.astype(np.float64).sum(axis=1), **tolerance("float32"))


def _local_matmul(rng: np.random.Generator, rows: int, cols: int, factors: tuple[int, int]
                  ) -> tuple[Schedule, list]:
    """C = A @ B through a cache_write "local" accumulator computed at C's column tile: the
    tile (``factors`` rows x columns) may overhang C, its reads of B then too."""
    depth = int(rng.integers(3, 9))
    A = te.placeholder((rows, depth), name="A")
    B = te.placeholder((depth, cols), name="B")
    C = ops.matmul(A, B)
    s = te.create_schedule(C.op)
    CL = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, *factors)
    s[CL].compute_at(s[C], jo)
    li, lj = s[CL].op.axis
    s[CL].reorder(s[CL].op.reduce_axis[0], li, lj)
    s[CL].vectorize(lj)
    s[C].vectorize(ji)
    return s, [A, B, C]


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_overhanging_local_accumulator_computes_its_tile_whole(target, rng):
    """A local accumulator whose tile overhangs the tensor updates its whole tile without a
    guard (a guarded vector update kept it in memory: 30 GFLOP/s on a batched matmul over 169
    columns in tiles of 16); its reads of B that reach past the columns are masked to zero
    and A's, which do not depend on the columns, are not. It matches numpy."""
    for rows, cols, factors in ((5, 13, (2, 8)), (7, 19, (3, 16)), (4, 7, (4, 4)), (3, 5, (1, 16))):
        s, args = _local_matmul(rng, rows, cols, factors)
        func = aus.lower(s, args)
        local = f"{args[2].name}.local"
        assert not _stores(func.body, local, guarded=True), f"guarded updates:\n{func}"
        masks = {sel.true_value.buffer.name: {v.name for v in free_vars(sel.cond)}
                 for st in _stores(func.body, local, guarded=False)
                 for sel in post_order(st.value)
                 if isinstance(sel, E.Select) and isinstance(sel.true_value, ir.Load)}
        assert masks["B"] and all(v.startswith("i1") for v in masks["B"]), f"{masks}\n{func}"
        assert all(v.startswith("i0") for v in masks.get("A", ())), f"{masks}\n{func}"
        a, b = (random_array(rng, tuple(int(d) for d in t.shape)) for t in args[:2])
        (c,) = run(s, args, [a, b], target)
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, **tolerance("float32"),
                                   err_msg=s.to_python())


@needs_nvrtc
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_overhanging_local_accumulator_on_cuda_c_matches_numpy(rng):
    s, (A, B, C) = _local_matmul(rng, 6, 21, (2, 8))
    io = s[C].leaf[0]
    s[C].bind(io, te.thread_axis("blockIdx.x"))
    a, b = random_array(rng, (6, int(A.shape[1]))), random_array(rng, (int(B.shape[0]), 21))
    c = np.full((6, 21), np.nan, "float32")
    run_on_host(aus.build(s, [A, B, C], target=CUDA), a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, **tolerance("float32"))


def _stores(body: ir.Stmt, buffer: str, guarded: bool) -> list[ir.Store]:
    """The stores into ``buffer`` (by name), those under an ``if`` only when ``guarded``."""
    out: list[ir.Store] = []

    def visit(st: ir.Stmt, under_if: bool) -> None:
        if isinstance(st, ir.Store) and st.buffer.name == buffer and (under_if or not guarded):
            out.append(st)
        for sub in sub_stmts(st):
            visit(sub, under_if or isinstance(st, ir.IfThenElse))

    visit(body, False)
    return out


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_tile_read_by_threads_that_do_not_divide_it_is_computed_once(target, rng):
    """A tile computed at its reader's block loop, the reader's rows and columns fused and
    split over a count of threads that does not divide the tile (384 over 8 x 32): the fused
    loop overhangs, but its guard keeps the reads inside the tile, so the tile is the block's
    8 x 32 (it was 9 rows, and a second tile of its split computed each block twice). It
    matches numpy."""
    A = te.placeholder((40, 64), name="A")
    T = te.compute((40, 64), lambda i, j: A[i, j] * 2.0, name="T")
    C = te.compute((40, 64), lambda i, j: T[i, j] + 1.0, name="C")
    s = te.create_schedule(C.op)
    io, ii = s[C].split(C.op.axis[0], factor=8)
    jo, ji = s[C].split(C.op.axis[1], factor=32)
    s[C].reorder(io, jo, ii, ji)
    rest, lanes = s[C].split(s[C].fuse(ii, ji), factor=96)
    s[T].compute_at(s[C], jo)
    to, ti = s[T].split(T.op.axis[0], factor=8)
    func = aus.lower(s, [A, C])
    tile = next(st for st in walk(func.body)
                if isinstance(st, ir.Allocate) and st.buffer.name == "T")
    assert [const_int(d) for d in tile.buffer.shape] == [8, 32], f"{func}"
    first = tile.body.stmts[0] if isinstance(tile.body, ir.Seq) else tile.body
    assert isinstance(first, ir.For) and const_int(first.extent) == 1, f"{func}"  # T's rows
    a = random_array(rng, (40, 64))
    (c,) = run(s, [A, C], [a], target)
    np.testing.assert_allclose(c, a * 2.0 + 1.0, **tolerance("float32"))

