"""The loop-IR toolbox: walkers, mappers and queries over statements.

Every pass and backend walks statements with these, so a new statement kind is taught here
once. Expressions are te's; their own walkers live in ``autosched.te.visit``.

Example::

    body = substitute_stmt(loop.body, {loop.var: loop.min})   # the first iteration
    outs = stored_buffers(body)                               # buffers it writes, in order
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import post_order, substitute
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
    for st in walk(s):
        for e in stmt_exprs(st):
            yield from post_order(e)


def map_children(s: ir.Stmt, fn: Callable[[ir.Stmt], ir.Stmt]) -> ir.Stmt:
    """``s`` with ``fn`` applied to each direct child statement; ``s`` itself when no child
    changes. A pass that rewrites a few statement kinds handles those and leaves the rest
    to this."""
    if isinstance(s, ir.Seq):
        new = tuple(fn(c) for c in s.stmts)
        return s if all(a is b for a, b in zip(new, s.stmts)) else ir.Seq(new)
    if isinstance(s, (ir.For, ir.Allocate, ir.LetStmt)):
        body = fn(s.body)
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, ir.IfThenElse):
        then = fn(s.then_body)
        other = None if s.else_body is None else fn(s.else_body)
        if then is s.then_body and other is s.else_body:
            return s
        return ir.IfThenElse(s.cond, then, other)
    return s


def map_stmt(s: ir.Stmt, fexpr: Callable[[E.Expr], E.Expr],
             fstmt: Callable[[ir.Stmt], ir.Stmt | None] | None = None) -> ir.Stmt:
    """Rebuild ``s`` bottom-up with ``fexpr`` applied to every expression field (loop bounds,
    indices, values, conditions; not bound variables nor buffer shapes) and ``fstmt`` (if
    given, None keeps the statement) to every rebuilt statement. What no function changes
    stays the same object."""
    out = _map_own_exprs(map_children(s, lambda c: map_stmt(c, fexpr, fstmt)), fexpr)
    new = None if fstmt is None else fstmt(out)
    return out if new is None else new


def _map_own_exprs(s: ir.Stmt, fexpr: Callable[[E.Expr], E.Expr]) -> ir.Stmt:
    changes: dict[str, object] = {}
    for name in E.field_names(type(s)):
        v = getattr(s, name)
        if isinstance(v, E.Expr) and name != "var":
            nv: object = fexpr(v)
        elif type(v) is tuple and v and isinstance(v[0], E.Expr):
            new = tuple(fexpr(c) for c in v)
            nv = v if all(a is b for a, b in zip(new, v)) else new
        else:
            continue
        if nv is not v:
            changes[name] = nv
    # every statement class is a dataclass; their base is not
    return replace(s, **changes) if changes else s  # type: ignore[type-var]


def substitute_stmt(s: ir.Stmt, mapping: dict[E.Var, E.Expr]) -> ir.Stmt:
    """``s`` with variables replaced by expressions in every expression it holds."""
    return map_stmt(s, lambda e: substitute(e, mapping))


def loop_vars(s: ir.Stmt) -> list[E.Var]:
    """Variables bound by For and LetStmt, in program order."""
    return [n.var for n in walk(s) if isinstance(n, (ir.For, ir.LetStmt))]


def loads(node: ir.Stmt | E.Expr) -> Iterator[ir.Load]:
    """Every load under a statement or an expression."""
    nodes = post_order(node) if isinstance(node, E.Expr) else all_exprs(node)
    for n in nodes:
        if isinstance(n, ir.Load):
            yield n


def stored_buffers(s: ir.Stmt) -> list[ir.Buffer]:
    """Buffers stored to under ``s``, without repeats, in program order."""
    return list(dict.fromkeys(st.buffer for st in walk(s) if isinstance(st, ir.Store)))


def used_buffers(s: ir.Stmt) -> list[ir.Buffer]:
    """Buffers stored to or loaded under ``s``, without repeats: the stored ones first."""
    return list(dict.fromkeys([*stored_buffers(s), *(ld.buffer for ld in loads(s))]))


def used_vars(s: ir.Stmt) -> set[E.Var]:
    """Variables read by any expression under ``s``."""
    return {e for e in all_exprs(s) if isinstance(e, E.Var)}


def uses_var(e: E.Expr, v: E.Var) -> bool:
    """Whether ``e`` reads the variable ``v``."""
    return any(isinstance(n, E.Var) and n.uid == v.uid for n in post_order(e))


def linear_coeff(e: E.Expr, var: E.Var) -> int | None:
    """The integer ``c`` such that ``e == c * var + (terms without var)``, or None when ``e``
    is not affine in ``var`` with a constant coefficient."""
    if not uses_var(e, var):
        return 0
    if isinstance(e, E.Var):
        return 1
    if isinstance(e, E.Cast) and dt.is_int(e.type) and dt.is_int(e.value.dtype):
        # index widening (int32 -> int64); lowering keeps indices far from overflow
        return linear_coeff(e.value, var)
    if isinstance(e, E.Binary) and e.op in (Op.ADD, Op.SUB):
        ca, cb = linear_coeff(e.a, var), linear_coeff(e.b, var)
        if ca is None or cb is None:
            return None
        return ca + cb if e.op is Op.ADD else ca - cb
    if isinstance(e, E.Binary) and e.op is Op.MUL:
        if isinstance(e.a, E.Const):
            c = linear_coeff(e.b, var)
            return None if c is None else int(e.a.value) * c
        if isinstance(e.b, E.Const):
            c = linear_coeff(e.a, var)
            return None if c is None else int(e.b.value) * c
    return None
