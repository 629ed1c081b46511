"""Small loop-IR helpers the CUDA backend needs: walking statements, substituting variables,
and the integer facts (non-negativity, lane strides, divisibility) that let codegen emit
plain C division and vector accesses only where they are provably right."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from autosched.te import expr as E
from autosched.te.visit import post_order, substitute
from autosched.tir import ir
from autosched.tir.visit import all_exprs, walk


def loads(s: ir.Stmt | E.Expr) -> Iterator[ir.Load]:
    nodes = post_order(s) if isinstance(s, E.Expr) else all_exprs(s)
    for n in nodes:
        if isinstance(n, ir.Load):
            yield n


def stored_buffers(s: ir.Stmt) -> set[ir.Buffer]:
    return {st.buffer for st in walk(s) if isinstance(st, ir.Store)}


def used_buffers(s: ir.Stmt) -> set[ir.Buffer]:
    return stored_buffers(s) | {ld.buffer for ld in loads(s)}


def has_thread_loop(s: ir.Stmt) -> bool:
    return any(isinstance(st, ir.For) and st.kind == "thread" for st in walk(s))


def expr_vars(e: E.Expr) -> set[E.Var]:
    return {n for n in post_order(e) if isinstance(n, E.Var)}


def uses_var(e: E.Expr, v: E.Var) -> bool:
    return any(isinstance(n, E.Var) and n.uid == v.uid for n in post_order(e))


def map_stmt(s: ir.Stmt, fe: Callable[[E.Expr], E.Expr]) -> ir.Stmt:
    """``s`` with ``fe`` applied to every expression it holds (buffers' shapes excluded)."""
    if isinstance(s, ir.Store):
        return ir.Store(s.buffer, tuple(fe(i) for i in s.indices), fe(s.value))
    if isinstance(s, ir.For):
        return ir.For(s.var, fe(s.min), fe(s.extent), s.kind, map_stmt(s.body, fe),
                      s.thread_tag, s.annotations)
    if isinstance(s, ir.Seq):
        return ir.Seq(tuple(map_stmt(c, fe) for c in s.stmts))
    if isinstance(s, ir.IfThenElse):
        other = None if s.else_body is None else map_stmt(s.else_body, fe)
        return ir.IfThenElse(fe(s.cond), map_stmt(s.then_body, fe), other)
    if isinstance(s, ir.Allocate):
        return ir.Allocate(s.buffer, map_stmt(s.body, fe))
    if isinstance(s, ir.LetStmt):
        return ir.LetStmt(s.var, fe(s.value), map_stmt(s.body, fe))
    return s


def substitute_stmt(s: ir.Stmt, mapping: dict[E.Var, E.Expr]) -> ir.Stmt:
    return map_stmt(s, lambda e: substitute(e, mapping))


def const_int(e: E.Expr) -> int | None:
    """The value of ``e`` when it folds to an integer constant."""
    if isinstance(e, E.Const) and not isinstance(e.value, float):
        return int(e.value)
    if isinstance(e, E.Binary) and e.op in ("add", "sub", "mul", "min", "max"):
        a, b = const_int(e.a), const_int(e.b)
        if a is None or b is None:
            return None
        return {"add": a + b, "sub": a - b, "mul": a * b, "min": min(a, b), "max": max(a, b)}[e.op]
    return None


def eval_int(e: E.Expr, env: dict[int, int]) -> int:
    """Evaluate an integer expression over variables given by uid (launch sizes at call time)."""
    if isinstance(e, E.Const):
        return int(e.value)
    if isinstance(e, E.Var):
        return env[e.uid]
    if isinstance(e, E.Cast):
        return eval_int(e.value, env)
    if isinstance(e, E.Binary):
        a, b = eval_int(e.a, env), eval_int(e.b, env)
        ops = {
            "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
            "floordiv": lambda: a // b, "floormod": lambda: a % b,
            "truncdiv": lambda: int(a / b), "truncmod": lambda: a - int(a / b) * b,
            "min": lambda: min(a, b), "max": lambda: max(a, b),
        }
        if e.op in ops:
            return ops[e.op]()
    if isinstance(e, E.Select):
        return eval_int(e.true_value if eval_bool(e.cond, env) else e.false_value, env)
    raise ValueError(f"cannot evaluate {e} on the host")


def eval_bool(e: E.Expr, env: dict[int, int]) -> bool:
    if isinstance(e, E.Compare):
        a, b = eval_int(e.a, env), eval_int(e.b, env)
        return {"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b,
                "ge": a >= b}[e.op]
    if isinstance(e, E.Const):
        return bool(e.value)
    raise ValueError(f"cannot evaluate {e} on the host")


def is_nonneg(e: E.Expr, nonneg_vars: set[int]) -> bool:
    """True when ``e`` is provably >= 0 (variables listed by uid are known non-negative)."""
    if isinstance(e, E.Const):
        return e.value >= 0
    if isinstance(e, E.Var):
        return e.uid in nonneg_vars or e.dtype.startswith("uint")
    if isinstance(e, E.Binary):
        if e.op in ("add", "mul", "min", "max", "floordiv", "truncdiv"):
            return is_nonneg(e.a, nonneg_vars) and is_nonneg(e.b, nonneg_vars)
        if e.op == "floormod":
            return is_nonneg(e.b, nonneg_vars)
        if e.op == "truncmod":
            return is_nonneg(e.a, nonneg_vars)
    if isinstance(e, E.Cast) and not e.type.startswith("float"):
        return is_nonneg(e.value, nonneg_vars)
    return False


def lane_split(e: E.Expr, v: E.Var, lanes: int) -> tuple[E.Expr, int] | None:
    """``(base, c)`` with ``e == base + c * v`` for every ``v`` in ``[0, lanes)``, ``base`` free
    of ``v``; None when no such form is provable.

    Beyond affine terms this sees through ``(b + k*v) // d`` and ``% d`` when ``b`` is a known
    multiple of ``g`` and ``k * lanes <= gcd(g, d)``: the lanes then never cross a multiple of
    ``d`` (the fused-and-split copy loops of cooperative fetching look like that)."""
    if not uses_var(e, v):
        return e, 0
    if isinstance(e, E.Var):
        return E.const(0, e.dtype), 1
    if isinstance(e, E.Cast):
        inner = lane_split(e.value, v, lanes)
        return None if inner is None else (E.cast(e.type, inner[0]), inner[1])
    if not isinstance(e, E.Binary):
        return None
    if e.op in ("add", "sub"):
        a, b = lane_split(e.a, v, lanes), lane_split(e.b, v, lanes)
        if a is None or b is None:
            return None
        return E.binary(e.op, a[0], b[0]), a[1] + b[1] if e.op == "add" else a[1] - b[1]
    if e.op == "mul":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            k = const_int(y)
            if k is not None:
                inner = lane_split(x, v, lanes)
                return None if inner is None else (E.binary("mul", inner[0], y), inner[1] * k)
        return None
    if e.op in ("floordiv", "floormod"):
        d = const_int(e.b)
        inner = lane_split(e.a, v, lanes)
        if d is None or d <= 0 or inner is None:
            return None
        base, k = inner
        if k < 0 or k * lanes > math.gcd(known_divisor(base), d):
            return None
        return E.binary(e.op, base, e.b), (0 if e.op == "floordiv" else k)
    return None


def known_divisor(e: E.Expr, lanes_of: dict[int, int] | None = None) -> int:
    """A positive integer that provably divides ``e`` (1 when nothing is known).

    ``lanes_of`` maps variable uids to a known divisor of that variable."""
    lanes_of = lanes_of or {}
    if isinstance(e, E.Const):
        return abs(int(e.value)) or 1 << 30
    if isinstance(e, E.Var):
        return lanes_of.get(e.uid, 1)
    if isinstance(e, E.Cast):
        return known_divisor(e.value, lanes_of)
    if isinstance(e, E.Binary):
        a, b = known_divisor(e.a, lanes_of), known_divisor(e.b, lanes_of)
        if e.op in ("add", "sub"):
            return math.gcd(a, b)
        if e.op == "mul":
            return min(a * b, 1 << 30)
        if e.op == "floormod" and isinstance(e.b, E.Const):
            return math.gcd(a, b)  # a - d*q with d and a both multiples of gcd(a, d)
    return 1


def flat_offset(buf: ir.Buffer, indices: tuple[E.Expr, ...]) -> E.Expr:
    """Row-major element offset of ``buf[indices]`` (built with the folding builders)."""
    if len(indices) != len(buf.shape):
        raise ValueError(
            f"buffer {buf.name} has {len(buf.shape)} dims but is indexed with {len(indices)}"
        )
    if not indices:
        return E.const(0)
    off: E.Expr = indices[0]
    for dim, idx in zip(buf.shape[1:], indices[1:]):
        off = E.binary("add", E.binary("mul", off, dim), idx)
    return off


def num_elements(buf: ir.Buffer) -> int | None:
    n = 1
    for d in buf.shape:
        c = const_int(d)
        if c is None:
            return None
        n *= c
    return n
