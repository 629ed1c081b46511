"""The loop-IR toolbox (tir.visit, tir.evaluate) and the op enum (te.opcodes): folding against
numpy, printing that reads back as Python, and the walkers and mappers on hand-built IR."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from autosched.targets.ref.evaluate import evaluate
from autosched.te import expr as E
from autosched.te.opcodes import ARITH, COMPARE, Op, OpKind
from autosched.tir import ir
from autosched.tir.evaluate import const_int, eval_bool, eval_int
from autosched.tir.visit import (
    loads,
    map_children,
    map_stmt,
    stored_buffers,
    substitute_stmt,
    used_buffers,
    used_vars,
    uses_var,
    walk,
)

I32 = "int32"


def _trunc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a - np.fmod(a, b)) // b  # exact: a - fmod(a, b) is a multiple of b


# What each integer op computes, written with numpy (C's fmod truncates, np.mod floors).
NUMPY_INT = {
    Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply,
    Op.FLOORDIV: np.floor_divide, Op.FLOORMOD: np.mod,
    Op.TRUNCDIV: _trunc, Op.TRUNCMOD: np.fmod,
    Op.MIN: np.minimum, Op.MAX: np.maximum,
    Op.EQ: np.equal, Op.NE: np.not_equal, Op.LT: np.less, Op.LE: np.less_equal,
    Op.GT: np.greater, Op.GE: np.greater_equal,
}


def _operands(rng: np.random.Generator, n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    a = rng.integers(-1000, 1000, n)
    b = rng.integers(-40, 40, n)
    b[b == 0] = 7
    b[:3] = (1, -1, 1000)  # and a few that divide or exceed every |a|
    return a, b


# -- the enum -------------------------------------------------------------------------------


def test_ops_are_their_names() -> None:
    """Records, workload keys and printed IR store op names: an entry must be its name."""
    for op in Op:
        assert Op(op.value) is op
        assert op == op.value and hash(op) == hash(op.value)
        assert json.dumps(op) == f'"{op.value}"'
        assert pickle.loads(pickle.dumps(op)) is op
    binary = E.Binary("floordiv", E.Var("x"), E.const(3))  # a name is stored as its entry
    assert binary.op is Op.FLOORDIV


@pytest.mark.parametrize("op", [op for op in NUMPY_INT])
def test_folding_matches_numpy(op: Op, rng: np.random.Generator) -> None:
    a, b = _operands(rng)
    want = NUMPY_INT[op](a, b)
    build = E.compare if op.kind is OpKind.COMPARE else E.binary
    for x, y, w in zip(a.tolist(), b.tolist(), want.tolist()):
        assert op.fold(x, y) == w, (op, x, y)
        assert build(op, x, y).value == w, (op, x, y)  # the te builder folds through it


@pytest.mark.parametrize("op", [op for op in NUMPY_INT if op.kind is OpKind.ARITH])
def test_integer_evaluation_matches_numpy(op: Op, rng: np.random.Generator) -> None:
    a, b = _operands(rng, 50)
    x, y = E.Var("x"), E.Var("y")
    e = E.Binary(op, x, y)
    got = [eval_int(e, {x.uid: p, y.uid: q}) for p, q in zip(a.tolist(), b.tolist())]
    np.testing.assert_array_equal(got, NUMPY_INT[op](a, b))


@pytest.mark.parametrize("op", [op for op in NUMPY_INT if op.kind is OpKind.ARITH])
def test_reference_renderer_matches_numpy(op: Op, rng: np.random.Generator) -> None:
    a, b = _operands(rng, 64)
    n = len(a)
    A, B, C = (ir.Buffer(name, (E.const(n),), I32) for name in "ABC")
    i = E.Var("i")
    body = ir.Store(C, (i,), E.Binary(op, ir.Load(A, (i,)), ir.Load(B, (i,))))
    func = ir.PrimFunc("f", (A, B, C), ir.For(i, E.const(0), E.const(n), "serial", body))
    out = np.full(n, -7, I32)
    evaluate(func, a.astype(I32), b.astype(I32), out)
    np.testing.assert_array_equal(out, NUMPY_INT[op](a, b))


def test_float_floor_division_folds_like_numpy(rng: np.random.Generator) -> None:
    a, b = rng.uniform(-50, 50, 100), rng.uniform(0.5, 9, 100) * rng.choice([-1, 1], 100)
    for x, y, w in zip(a.tolist(), b.tolist(), np.floor(a / b).tolist()):
        assert Op.FLOORDIV.fold(x, y) == w


@pytest.mark.parametrize("op", [*ARITH, *COMPARE, Op.AND, Op.OR])
def test_printed_ops_read_back_as_python(op: Op, rng: np.random.Generator) -> None:
    """Each op prints as its symbol (or as a call), and the text evaluates to the op's value."""
    if op.kind is OpKind.LOGICAL:
        x, y = E.Var("x", "bool"), E.Var("y", "bool")
        values = [(p, q) for p in (False, True) for q in (False, True)]
    else:
        dtype = "float32" if op is Op.DIV else I32
        x, y = E.Var("x", dtype), E.Var("y", dtype)
        a, b = _operands(rng, 20)
        b = np.abs(b) % 5 + 1 if op is Op.POW else b
        values = list(zip(a.tolist(), b.tolist()))
    node = (E.Compare if op.kind is OpKind.COMPARE else E.Binary)(op, x, y)
    text = str(node)
    assert text == (f"x {op.symbol} y" if op.symbol else f"{op}(x, y)")
    calls = {o.value: o.fold for o in Op if o.symbol is None}
    for p, q in values:
        assert eval(text, {**calls, "x": p, "y": q}) == op.fold(p, q), (text, p, q)


def test_printer_parenthesises_by_precedence() -> None:
    x, y, z = (E.Var(n) for n in "xyz")
    assert str((x + y) * z) == "(x + y) * z"
    assert str(x - (y - z)) == "x - (y - z)"
    assert str(x // y % z) == "x // y % z"
    assert str(E.Binary(Op.TRUNCDIV, x + y, z) < 3) == "truncdiv(x + y, z) < 3"


def test_negated_and_mirrored_comparisons(rng: np.random.Generator) -> None:
    a, b = _operands(rng, 50)
    for op in COMPARE:
        for x, y in zip(a.tolist(), b.tolist()):
            assert op.negated.fold(x, y) == (not op.fold(x, y))
            assert op.mirrored.fold(y, x) == op.fold(x, y)


def test_truncating_ops_agree_on_non_negative_operands(rng: np.random.Generator) -> None:
    a, b = (np.abs(x) for x in _operands(rng, 100))
    for op in (Op.FLOORDIV, Op.FLOORMOD):
        assert op.truncating in (Op.TRUNCDIV, Op.TRUNCMOD)
        for x, y in zip(a.tolist(), b.tolist()):
            assert op.truncating.fold(x, y) == op.fold(x, y)
    assert all(op.truncating is op for op in Op if op not in (Op.FLOORDIV, Op.FLOORMOD))


def test_builders_reject_an_op_of_another_kind() -> None:
    from autosched.errors import TEError

    with pytest.raises(TEError, match="compare"):
        E.binary(Op.LT, E.Var("x"), 1)
    with pytest.raises(ValueError):
        E.binary("rotate", E.Var("x"), 1)


# -- integer evaluation ---------------------------------------------------------------------


def test_const_int() -> None:
    assert const_int(E.const(-5)) == -5
    assert const_int(E.Binary(Op.MUL, E.const(4), E.Binary(Op.MIN, E.const(8), E.const(9)))) == 32
    assert const_int(E.const(2.0)) is None
    assert const_int(E.const(True)) is None
    assert const_int(E.Binary(Op.FLOORDIV, E.const(4), E.const(0))) is None
    assert const_int(E.Var("n")) is None


def test_eval_int_and_bool() -> None:
    n, i = E.Var("n"), E.Var("i")
    env = {n.uid: 1000, i.uid: -3}
    assert eval_int((n + 255) // 256, env) == 4
    assert eval_int(E.select(i < 0, E.cast("int64", -i), n), env) == 3
    assert eval_bool((i < 0) & E.Not(n == 7), env) is True
    with pytest.raises(ValueError, match="has no value"):
        eval_int(n + E.Var("m"), env)
    with pytest.raises(ValueError, match="cannot evaluate"):
        eval_int(E.Call("exp", (E.const(1.0),), "float32"), env)


# -- walkers and mappers --------------------------------------------------------------------


def _nest() -> tuple[ir.Stmt, dict[str, object]]:
    """for i < 8: t = i * 2; if t < 10: C[i] = A[t] + B[0]; D[i] = C[i]"""
    A, B, C, D = (ir.Buffer(n, (E.const(16),), "float32") for n in "ABCD")
    i, t = E.Var("i"), E.Var("t")
    store_c = ir.Store(C, (i,), ir.Load(A, (t,)) + ir.Load(B, (E.const(0),)))
    store_d = ir.Store(D, (i,), ir.Load(C, (i,)))
    body = ir.LetStmt(t, i * 2, ir.Seq((ir.IfThenElse(t < 10, store_c), store_d)))
    nest = ir.For(i, E.const(0), E.const(8), "serial", body)
    return nest, dict(A=A, B=B, C=C, D=D, i=i, t=t)


def test_queries() -> None:
    nest, n = _nest()
    assert stored_buffers(nest) == [n["C"], n["D"]]
    assert used_buffers(nest) == [n["C"], n["D"], n["A"], n["B"]]
    assert {ld.buffer.name for ld in loads(nest)} == {"A", "B", "C"}
    assert used_vars(nest) == {n["i"], n["t"]}
    assert uses_var(n["t"] < 10, n["t"]) and not uses_var(n["i"] * 2, n["t"])
    assert [type(s).__name__ for s in walk(nest)] == [
        "For", "LetStmt", "Seq", "IfThenElse", "Store", "Store"]


def test_flat_offset_is_row_major(rng: np.random.Generator) -> None:
    shape = tuple(int(d) for d in rng.integers(1, 9, 3))
    buf = ir.Buffer("A", tuple(E.const(d) for d in shape), "float32")
    i, j, k = (E.Var(n) for n in "ijk")
    off = ir.flat_offset(buf, (i, j, k))
    for idx in zip(*(rng.integers(0, d, 5) for d in shape)):
        env = {v.uid: int(x) for v, x in zip((i, j, k), idx)}
        assert eval_int(off, env) == np.ravel_multi_index(idx, shape)
    assert const_int(ir.flat_offset(ir.Buffer("s", (), "float32"), ())) == 0
    assert buf.num_elements == int(np.prod(shape))
    assert ir.Buffer("B", (E.const(4), E.Var("n")), "float32").num_elements is None
    with pytest.raises(ValueError, match="indexed with 2"):
        ir.flat_offset(buf, (i, j))


def test_substitute_stmt_reaches_every_expression() -> None:
    nest, n = _nest()
    first = substitute_stmt(nest.body, {n["i"]: E.const(0)})
    assert not uses_var(E.Cast(I32, E.const(0)), n["i"])
    assert n["i"] not in used_vars(first)
    assert str(first).splitlines()[0] == "t = 0"


def test_map_children_keeps_what_it_does_not_change() -> None:
    nest, n = _nest()
    assert map_children(nest, lambda c: c) is nest

    def drop_d(s: ir.Stmt) -> ir.Stmt:
        if isinstance(s, ir.Seq):
            return ir.Seq(tuple(c for c in s.stmts if not isinstance(c, ir.Store)))
        return map_children(s, drop_d)

    out = drop_d(nest)
    assert stored_buffers(out) == [n["C"]]
    assert out.body.value is nest.body.value  # untouched fields stay the same objects


def test_map_stmt_rewrites_expressions_and_statements() -> None:
    nest, n = _nest()
    same = map_stmt(nest, lambda e: e)
    assert same is nest
    doubled = map_stmt(nest, lambda e: E.const(16) if const_int(e) == 8 else e)
    assert const_int(doubled.extent) == 16 and doubled.body is nest.body

    def to_d(s: ir.Stmt) -> ir.Stmt | None:
        return ir.Store(n["D"], s.indices, s.value) if isinstance(s, ir.Store) else None

    assert stored_buffers(map_stmt(nest, lambda e: e, to_d)) == [n["D"]]
