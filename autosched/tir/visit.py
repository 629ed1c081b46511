"""Generic traversal of loop-IR statements."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields, replace

from autosched.te import expr as E
from autosched.tir import ir


def sub_stmts(s: ir.Stmt) -> Iterator[ir.Stmt]:
    """The direct child statements of ``s``."""
    if isinstance(s, ir.Seq):
        yield from s.stmts
    elif isinstance(s, (ir.For, ir.Allocate, ir.LetStmt)):
        yield s.body
    elif isinstance(s, ir.IfThenElse):
        yield s.then_body
        if s.else_body is not None:
            yield s.else_body


def walk(s: ir.Stmt) -> Iterator[ir.Stmt]:
    """Every statement of ``s``, parents before children."""
    yield s
    for c in sub_stmts(s):
        yield from walk(c)


def stmt_exprs(s: ir.Stmt) -> Iterator[E.Expr]:
    """The expressions held directly by ``s`` (not those of its child statements)."""
    if isinstance(s, ir.Store):
        yield from s.indices
        yield s.value
    elif isinstance(s, ir.For):
        yield s.min
        yield s.extent
    elif isinstance(s, ir.IfThenElse):
        yield s.cond
    elif isinstance(s, ir.LetStmt):
        yield s.value
    elif isinstance(s, ir.Allocate):
        yield from s.buffer.shape


def all_exprs(s: ir.Stmt) -> Iterator[E.Expr]:
    """Every expression node under ``s``, sub-expressions included."""
    from autosched.te.visit import post_order

    for st in walk(s):
        for e in stmt_exprs(st):
            yield from post_order(e)


def map_stmt(s: ir.Stmt, fexpr: Callable[[E.Expr], E.Expr],
             fstmt: Callable[[ir.Stmt], ir.Stmt | None] | None = None) -> ir.Stmt:
    """Rebuild ``s`` bottom-up with ``fexpr`` applied to every expression field (loop bounds,
    indices, values, conditions) and ``fstmt`` (if given) to every rebuilt statement."""
    changes = {}
    for f in fields(s):  # type: ignore[arg-type]
        v = getattr(s, f.name)
        if isinstance(v, ir.Stmt):
            nv = map_stmt(v, fexpr, fstmt)
        elif isinstance(v, E.Expr) and not isinstance(v, E.Var):
            nv = fexpr(v)
        elif isinstance(v, E.Var) and f.name != "var":
            nv = fexpr(v)
        elif isinstance(v, tuple) and v and isinstance(v[0], ir.Stmt):
            nv = tuple(map_stmt(c, fexpr, fstmt) for c in v)
        elif isinstance(v, tuple) and v and isinstance(v[0], E.Expr):
            nv = tuple(fexpr(c) for c in v)
        else:
            continue
        if nv is not v:
            changes[f.name] = nv
    out = replace(s, **changes) if changes else s  # type: ignore[type-var]
    if fstmt is not None:
        new = fstmt(out)
        if new is not None:
            return new
    return out


def loop_vars(s: ir.Stmt) -> list[E.Var]:
    """Variables bound by For and LetStmt, in program order."""
    return [n.var for n in walk(s) if isinstance(n, (ir.For, ir.LetStmt))]
