"""The expression IR: structural equality and hashing, workload keys, dtype rules, division
semantics, reducers and symbolic sizes, and the errors bad expressions get."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import TEError
from tests.support.backends import CPU_TARGETS, random_array, run, tolerance


def test_structural_equality_and_hash():
    i, j = te.var("i"), te.var("j")
    a = (i * 4 + j) // 2
    b = (i * 4 + j) // 2
    assert a is not b and bool(a == b) and hash(a) == hash(b)
    assert not bool(a == (j * 4 + i) // 2)
    assert {a: 1}[b] == 1
    assert bool(pickle.loads(pickle.dumps(a)) == a)


def test_workload_key_ignores_names_and_identity():
    def mm(na: str, nb: str, nk: str):
        A = te.placeholder((8, 4), name=na)
        B = te.placeholder((4, 6), name=nb)
        k = te.reduce_axis((0, 4), name=nk)
        return te.compute((8, 6), lambda x, y: te.sum(A[x, k] * B[k, y], axis=k), name=na + nb)

    assert te.workload_key([mm("A", "B", "k")]) == te.workload_key([mm("P", "Q", "r")])
    A = te.placeholder((8, 4), name="A")
    B = te.placeholder((4, 6), name="B")
    k = te.reduce_axis((0, 4), name="k")
    other = te.compute((8, 6), lambda x, y: te.sum(A[x, k] + B[k, y], axis=k), name="C")
    assert te.workload_key([other]) != te.workload_key([mm("A", "B", "k")])


def test_dtype_rules():
    f = te.placeholder((4,), "float32", name="f")
    h = te.placeholder((4,), "float16", name="h")
    n = te.placeholder((4,), "int32", name="n")
    wide = te.var("w", "int64")
    assert (f[0] * 2).dtype == "float32"        # int literal takes the other dtype
    assert (f[0] + 0.5).dtype == "float32"
    assert (n[0] + 3).dtype == "int32"
    assert (n[0] + wide).dtype == "int64"       # index arithmetic widens
    assert (n[0] < 2).dtype == "bool"
    assert te.cast("float32", n[0]).dtype == "float32"
    with pytest.raises(TEError, match="cannot mix float32 and float16"):
        f[0] + h[0]
    with pytest.raises(TEError, match="cannot mix int32 and float32"):
        n[0] * f[0]
    with pytest.raises(TEError, match="cannot mix a float literal 1.5 with int32"):
        n[0] + 1.5
    with pytest.raises(TEError, match="'/' on int32 operands .* is ambiguous"):
        n[0] / 2
    with pytest.raises(TEError, match="arithmetic add on bool"):
        (n[0] < 1) + (n[0] < 2)
    with pytest.raises(TEError, match="unknown dtype 'float8'"):
        te.placeholder((2,), "float8")


def test_division_semantics_fold_like_python_and_c():
    assert te.floordiv(te.const(-7), 2).value == -4 and te.floormod(te.const(-7), 2).value == 1
    assert te.truncdiv(te.const(-7), 2).value == -3 and te.truncmod(te.const(-7), 2).value == -1
    assert (te.const(-7) // 2).value == -4 and (te.const(-7) % 2).value == 1


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_division_semantics_at_run_time(target, rng):
    X = te.placeholder((40,), "int32", name="X")
    outs = [te.compute((40,), lambda i, f=f: f(X[i], 7), name=n) for n, f in
            (("fd", te.floordiv), ("fm", te.floormod), ("td", te.truncdiv), ("tm", te.truncmod))]
    s = te.create_schedule([o.op for o in outs])
    x = rng.integers(-100, 100, 40).astype("int32")
    fd, fm, td, tm = run(s, [X, *outs], [x], target)
    np.testing.assert_array_equal(fd, x // 7)
    np.testing.assert_array_equal(fm, x % 7)
    np.testing.assert_array_equal(td, np.trunc(x / 7).astype("int32"))
    np.testing.assert_array_equal(tm, np.fmod(x, 7))


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_reducers_select_and_intrinsics(target, rng):
    X = te.placeholder((6, 9), name="X")
    k = te.reduce_axis((0, 9), name="k")
    absmax = te.comm_reducer(lambda a, b: te.max(te.abs(a), te.abs(b)), lambda t: te.const(0, t), name="absmax")
    R = te.compute((6,), lambda i: absmax(X[i, k], axis=k), name="R")
    k2 = te.reduce_axis((0, 9), name="k2")
    P = te.compute((6,), lambda i: te.sum(X[i, k2], axis=k2, where=X[i, k2] > 0), name="P")
    k3 = te.reduce_axis((0, 9), name="k3")
    M = te.compute((6,), lambda i: te.min(X[i, k3], axis=k3), name="M")
    E = te.compute((6, 9), lambda i, j: te.if_then_else(te.any(X[i, j] < -0.5, X[i, j] > 0.5),
                                                          te.exp(X[i, j]), te.sqrt(te.abs(X[i, j]))), name="E")
    s = te.create_schedule([R.op, P.op, M.op, E.op])
    x = random_array(rng, (6, 9))
    r, p, m, e = run(s, [X, R, P, M, E], [x], target)
    np.testing.assert_allclose(r, np.abs(x).max(axis=1), **tolerance("float32"))
    np.testing.assert_allclose(p, np.where(x > 0, x, 0).sum(axis=1), **tolerance("float32"))
    np.testing.assert_allclose(m, x.min(axis=1), **tolerance("float32"))
    want = np.where((x < -0.5) | (x > 0.5), np.exp(x), np.sqrt(np.abs(x)))
    np.testing.assert_allclose(e, want, **tolerance("float32"))


def test_symbolic_size_evaluates():
    n = te.var("n")
    X = te.placeholder((n,), name="X")
    Y = te.compute((n,), lambda i: X[i] * 2.0 + 1.0, name="Y")
    s = te.create_schedule(Y.op)
    f = aus.lower(s, [X, Y])
    assert "X: float32[n]" in str(f)
    for size in (5, 13):
        x = np.random.default_rng().uniform(-1, 1, size).astype("float32")
        y = np.full(size, np.nan, "float32")
        aus.build(s, [X, Y], target="ref")(x, y)
        np.testing.assert_allclose(y, x * 2 + 1, **tolerance("float32"))


def test_bad_expressions():
    A = te.placeholder((4, 5), name="A")
    with pytest.raises(TEError, match="wrong number of indices for A: it has 2 dims .* got 3"):
        A[1, 2, 3]
    with pytest.raises(TEError, match="index 0 of A must be an integer, got float32"):
        A[A[0, 0], 0]
    k = te.reduce_axis((0, 5), name="k")
    with pytest.raises(TEError, match="reduce axis k is used outside a reduction"):
        te.compute((4,), lambda i: A[i, k])
    with pytest.raises(TEError, match="a reduction .sum. must be the whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) * 2.0)
    with pytest.raises(TEError, match="the function takes 1 indices .* but the shape has 2 dims"):
        te.compute((4, 5), lambda i: A[i, 0])
    with pytest.raises(TEError, match="dim 1 of placeholder B is negative: -3"):
        te.placeholder((2, -3), name="B")
    with pytest.raises(TEError, match="truth value of the symbolic expression"):
        bool(A[0, 0] > 1.0)
    with pytest.raises(TEError, match="unknown thread tag 'threadIdx.w'"):
        te.thread_axis("threadIdx.w")


def test_flop_count_counts_float_arithmetic_only() -> None:
    # a padded conv: the index arithmetic of the window and the padding select are not FLOPs
    from autosched.te import ops
    from autosched.te.flops import flop_count

    x = te.placeholder((1, 8, 10, 12), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w")
    y = ops.conv2d_nchw(x, w, stride=1, padding=1)
    dag = te.ComputeDAG([y])
    assert flop_count(dag.ops) == 2 * 16 * 8 * 9 * 10 * 12
    r = ops.relu(y)
    assert flop_count(te.ComputeDAG([r]).ops) == 2 * 16 * 8 * 9 * 10 * 12 + 16 * 10 * 12


def test_hash_follows_fields_and_survives_pickling() -> None:
    """A node's cached hash is built from its fields' own hashes (a tuple field's from its
    items'), so equal trees built apart hash alike and a different leaf deep down changes
    it; unpickled nodes (a process with other string hashes) hash afresh."""
    x, y = te.var("x"), te.var("y")
    a = te.max(x * 3 + y, 0) // 4
    b = te.max(x * 3 + y, 0) // 4
    c = te.max(x * 3 + x, 0) // 4
    assert hash(a) == hash(b) and bool(a == b)
    assert hash(a) != hash(c) and not bool(a == c)
    back = pickle.loads(pickle.dumps(a))
    assert hash(back) == hash(a) and bool(back == a)


def test_rewrite_memo_shares_work_between_calls() -> None:
    """A substituter (one memo for all its calls) rewrites a subexpression that several
    expressions hold once, and gives what separate ``substitute`` calls give."""
    from autosched.te import expr as E
    from autosched.te.visit import rewrite, substitute, substituter

    x, y, z = te.var("x"), te.var("y"), te.var("z")
    shared = (x * 7 + y) // 3
    exprs = [shared + 1, te.max(shared, z), shared * shared]
    mapping = {x: z + 2, y: te.const(5)}
    sub = substituter(mapping)
    got = [sub(e) for e in exprs]
    want = [substitute(e, mapping) for e in exprs]
    assert all(bool(g == w) for g, w in zip(got, want))
    seen: list[E.Expr] = []

    def count(n: E.Expr) -> None:
        seen.append(n)

    memo: dict = {}
    rewrite(exprs[0], count, memo)
    first = len(seen)
    rewrite(exprs[1], count, memo)
    # the second call visits only z and the max: the shared part comes from the memo
    assert len(seen) - first == 2, [str(n) for n in seen[first:]]
