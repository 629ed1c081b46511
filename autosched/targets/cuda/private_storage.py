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
from autosched.tir.visit import map_children, map_stmt


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
    return map_children(s, lambda c: _visit(c, in_kernel))


def _rebuffer(s: ir.Stmt, old: ir.Buffer, new: ir.Buffer) -> ir.Stmt:
    def fe(e: E.Expr) -> E.Expr:
        return rewrite(e, lambda n: ir.Load(new, n.indices)
                       if isinstance(n, ir.Load) and n.buffer == old else None)

    def fs(st: ir.Stmt) -> ir.Stmt | None:
        if isinstance(st, ir.Store) and st.buffer == old:
            return ir.Store(new, st.indices, st.value)
        return None

    return map_stmt(s, fe, fs)
