"""A loop-IR pass: intermediates allocated inside every thread loop of a kernel are private to
each thread, so a "global" one (from a CPU-style compute_at) becomes a "local" array.

Without it such a buffer would be one allocation shared by all threads, and they would race on
it. A global allocation inside a kernel but outside some thread loop is left alone (codegen then
reports it: sharing between threads needs scope "shared" and barriers).

Example::

    func = privatize(func)
"""

from __future__ import annotations

from autosched.targets.cuda import ir_util as U
from autosched.te import expr as E
from autosched.te.visit import rewrite
from autosched.tir import ir


def privatize(func: ir.PrimFunc) -> ir.PrimFunc:
    body = _visit(func.body, in_kernel=False)
    return func if body is func.body else ir.PrimFunc(func.name, func.params, body, func.attrs)


def _visit(s: ir.Stmt, in_kernel: bool) -> ir.Stmt:
    if isinstance(s, ir.Allocate) and s.buffer.scope == "global" and in_kernel \
            and not U.has_thread_loop(s.body):
        old = s.buffer
        new = ir.Buffer(old.name, old.shape, old.dtype, "local")
        return ir.Allocate(new, _rebuffer(_visit(s.body, in_kernel), old, new))
    if isinstance(s, ir.For) and s.kind == "thread":
        in_kernel = True
    if isinstance(s, ir.Seq):
        parts = tuple(_visit(c, in_kernel) for c in s.stmts)
        return s if all(a is b for a, b in zip(parts, s.stmts)) else ir.Seq(parts)
    if isinstance(s, ir.For):
        body = _visit(s.body, in_kernel)
        return s if body is s.body else ir.For(s.var, s.min, s.extent, s.kind, body,
                                               s.thread_tag, s.annotations)
    if isinstance(s, ir.IfThenElse):
        then = _visit(s.then_body, in_kernel)
        other = None if s.else_body is None else _visit(s.else_body, in_kernel)
        if then is s.then_body and other is s.else_body:
            return s
        return ir.IfThenElse(s.cond, then, other)
    if isinstance(s, ir.Allocate):
        body = _visit(s.body, in_kernel)
        return s if body is s.body else ir.Allocate(s.buffer, body)
    if isinstance(s, ir.LetStmt):
        body = _visit(s.body, in_kernel)
        return s if body is s.body else ir.LetStmt(s.var, s.value, body)
    return s


def _rebuffer(s: ir.Stmt, old: ir.Buffer, new: ir.Buffer) -> ir.Stmt:
    def fe(e: E.Expr) -> E.Expr:
        return rewrite(e, lambda n: ir.Load(new, n.indices)
                       if isinstance(n, ir.Load) and n.buffer == old else None)

    def fs(st: ir.Stmt) -> ir.Stmt:
        if isinstance(st, ir.Store):
            buf = new if st.buffer == old else st.buffer
            return ir.Store(buf, tuple(fe(i) for i in st.indices), fe(st.value))
        if isinstance(st, ir.Seq):
            return ir.Seq(tuple(fs(c) for c in st.stmts))
        if isinstance(st, ir.For):
            return ir.For(st.var, fe(st.min), fe(st.extent), st.kind, fs(st.body), st.thread_tag,
                          st.annotations)
        if isinstance(st, ir.IfThenElse):
            other = None if st.else_body is None else fs(st.else_body)
            return ir.IfThenElse(fe(st.cond), fs(st.then_body), other)
        if isinstance(st, ir.Allocate):
            return ir.Allocate(st.buffer, fs(st.body))
        if isinstance(st, ir.LetStmt):
            return ir.LetStmt(st.var, fe(st.value), fs(st.body))
        return st

    return fs(s)
