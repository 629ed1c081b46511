"""What the vectorizer asks of loop IR: the dependence of expressions on the vectorized loop
variable made visible (lets inlined), and the constant stride of an index in it."""

from __future__ import annotations

from autosched.te import expr as E
from autosched.tir import ir
from autosched.tir.visit import map_children, substitute_stmt, uses_var


def inline_lets_on(s: ir.Stmt, var: E.Var) -> ir.Stmt:
    """Substitute every LetStmt whose value depends on ``var`` (directly or through an earlier
    such let) into its body, so that dependence on ``var`` is visible in each expression.
    The vectorizer needs this to see that ``x = v * 2; A[x]`` is strided in ``v``."""
    if isinstance(s, ir.LetStmt) and uses_var(s.value, var):
        return inline_lets_on(substitute_stmt(s.body, {s.var: s.value}), var)
    return map_children(s, lambda c: inline_lets_on(c, var))


