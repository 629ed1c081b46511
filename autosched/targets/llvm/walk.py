"""What the vectorizer asks of loop IR: the dependence of expressions on the vectorized loop
variable made visible (lets inlined), and the constant stride of an index in it."""

from __future__ import annotations

from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.tir import ir
from autosched.tir.visit import map_children, substitute_stmt, uses_var


def inline_lets_on(s: ir.Stmt, var: E.Var) -> ir.Stmt:
    """Substitute every LetStmt whose value depends on ``var`` (directly or through an earlier
    such let) into its body, so that dependence on ``var`` is visible in each expression.
    The vectorizer needs this to see that ``x = v * 2; A[x]`` is strided in ``v``."""
    if isinstance(s, ir.LetStmt) and uses_var(s.value, var):
        return inline_lets_on(substitute_stmt(s.body, {s.var: s.value}), var)
    return map_children(s, lambda c: inline_lets_on(c, var))


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
