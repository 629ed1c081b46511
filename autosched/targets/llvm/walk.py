"""Small traversals of loop IR that the code generator needs (used variables and buffers,
expression rewriting inside statements)."""

from __future__ import annotations

from collections.abc import Callable

from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.visit import post_order, substitute
from autosched.tir import ir
from autosched.tir.visit import all_exprs
from autosched.tir.visit import walk as all_stmts


def used_var_uids(s: ir.Stmt) -> set[int]:
    return {e.uid for e in all_exprs(s) if isinstance(e, E.Var)}


def used_buffers(s: ir.Stmt) -> dict[int, ir.Buffer]:
    """Buffers loaded or stored under ``s``, by uid."""
    out: dict[int, ir.Buffer] = {}
    for st in all_stmts(s):
        if isinstance(st, ir.Store):
            out[st.buffer.uid] = st.buffer
    for e in all_exprs(s):
        if isinstance(e, ir.Load):
            out[e.buffer.uid] = e.buffer
    return out


def stored_buffers(s: ir.Stmt) -> set[int]:
    return {st.buffer.uid for st in all_stmts(s) if isinstance(st, ir.Store)}


def depends_on(e: E.Expr, uid: int) -> bool:
    return any(isinstance(n, E.Var) and n.uid == uid for n in post_order(e))


def has_load(e: E.Expr) -> bool:
    return any(isinstance(n, ir.Load) for n in post_order(e))


def map_exprs(s: ir.Stmt, fn: Callable[[E.Expr], E.Expr]) -> ir.Stmt:
    """``s`` with ``fn`` applied to every expression it holds (statements rebuilt)."""
    if isinstance(s, ir.Store):
        return ir.Store(s.buffer, tuple(fn(i) for i in s.indices), fn(s.value))
    if isinstance(s, ir.Seq):
        return ir.Seq(tuple(map_exprs(c, fn) for c in s.stmts))
    if isinstance(s, ir.For):
        return ir.For(s.var, fn(s.min), fn(s.extent), s.kind, map_exprs(s.body, fn),
                      s.thread_tag, s.annotations)
    if isinstance(s, ir.IfThenElse):
        other = None if s.else_body is None else map_exprs(s.else_body, fn)
        return ir.IfThenElse(fn(s.cond), map_exprs(s.then_body, fn), other)
    if isinstance(s, ir.LetStmt):
        return ir.LetStmt(s.var, fn(s.value), map_exprs(s.body, fn))
    if isinstance(s, ir.Allocate):
        return ir.Allocate(s.buffer, map_exprs(s.body, fn))
    return s


def inline_lets_on(s: ir.Stmt, uid: int) -> ir.Stmt:
    """Substitute every LetStmt whose value depends on variable ``uid`` (directly or through an
    earlier such let) into its body, so that dependence on ``uid`` is visible in each expression.
    The vectorizer needs this to see that ``x = v * 2; A[x]`` is strided in ``v``."""
    if isinstance(s, ir.LetStmt):
        if depends_on(s.value, uid):
            body = map_exprs(s.body, lambda e: substitute(e, {s.var: s.value}))
            return inline_lets_on(body, uid)
        return ir.LetStmt(s.var, s.value, inline_lets_on(s.body, uid))
    if isinstance(s, ir.Seq):
        return ir.Seq(tuple(inline_lets_on(c, uid) for c in s.stmts))
    if isinstance(s, ir.For):
        return ir.For(s.var, s.min, s.extent, s.kind, inline_lets_on(s.body, uid),
                      s.thread_tag, s.annotations)
    if isinstance(s, ir.IfThenElse):
        other = None if s.else_body is None else inline_lets_on(s.else_body, uid)
        return ir.IfThenElse(s.cond, inline_lets_on(s.then_body, uid), other)
    if isinstance(s, ir.Allocate):
        return ir.Allocate(s.buffer, inline_lets_on(s.body, uid))
    return s


def linear_coeff(e: E.Expr, uid: int) -> int | None:
    """The integer ``c`` such that ``e == c * v + (terms without v)`` for the variable ``v``
    with id ``uid``, or None when ``e`` is not affine in ``v`` with a constant coefficient."""
    if not depends_on(e, uid):
        return 0
    if isinstance(e, E.Var):
        return 1
    if isinstance(e, E.Cast) and dt.is_int(e.type) and dt.is_int(e.value.dtype):
        # index widening (int32 -> int64); lowering keeps indices far from overflow
        return linear_coeff(e.value, uid)
    if isinstance(e, E.Binary) and e.op in ("add", "sub"):
        ca, cb = linear_coeff(e.a, uid), linear_coeff(e.b, uid)
        if ca is None or cb is None:
            return None
        return ca + cb if e.op == "add" else ca - cb
    if isinstance(e, E.Binary) and e.op == "mul":
        if isinstance(e.a, E.Const):
            c = linear_coeff(e.b, uid)
            return None if c is None else int(e.a.value) * c
        if isinstance(e.b, E.Const):
            c = linear_coeff(e.a, uid)
            return None if c is None else int(e.b.value) * c
    return None
