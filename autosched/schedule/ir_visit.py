"""Generic traversal of loop-IR statements."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields, replace

from autosched.schedule import ir
from autosched.te import expr as E


def walk(s: ir.Stmt) -> Iterator[ir.Stmt]:
    """Every statement of ``s``, parents before children."""
    yield s
    for f in fields(s):  # type: ignore[arg-type]
        v = getattr(s, f.name)
        if isinstance(v, ir.Stmt):
            yield from walk(v)
        elif isinstance(v, tuple):
            for c in v:
                if isinstance(c, ir.Stmt):
                    yield from walk(c)


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
