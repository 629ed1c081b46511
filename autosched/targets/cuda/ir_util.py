"""The integer facts the CUDA backend needs about loop IR (non-negativity, lane strides,
divisibility) to emit plain C division and vector accesses only where they are
provably right. Walking and evaluating the IR is ``autosched.tir``'s."""

from __future__ import annotations

import math

from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.tir import ir
from autosched.tir.evaluate import const_int
from autosched.tir.visit import uses_var, walk


def has_thread_loop(s: ir.Stmt) -> bool:
    return any(isinstance(st, ir.For) and st.kind == "thread" for st in walk(s))


def is_nonneg(e: E.Expr, nonneg_vars: set[int]) -> bool:
    """True when ``e`` is provably >= 0 (variables listed by uid are known non-negative)."""
    if isinstance(e, E.Const):
        return e.value >= 0
    if isinstance(e, E.Var):
        return e.uid in nonneg_vars or e.dtype.startswith("uint")
    if isinstance(e, E.Binary):
        if e.op in (Op.ADD, Op.MUL, Op.MIN, Op.MAX, Op.FLOORDIV, Op.TRUNCDIV):
            return is_nonneg(e.a, nonneg_vars) and is_nonneg(e.b, nonneg_vars)
        if e.op is Op.FLOORMOD:
            return is_nonneg(e.b, nonneg_vars)
        if e.op is Op.TRUNCMOD:
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
    if e.op in (Op.ADD, Op.SUB):
        a, b = lane_split(e.a, v, lanes), lane_split(e.b, v, lanes)
        if a is None or b is None:
            return None
        return E.binary(e.op, a[0], b[0]), a[1] + b[1] if e.op is Op.ADD else a[1] - b[1]
    if e.op is Op.MUL:
        for x, y in ((e.a, e.b), (e.b, e.a)):
            k = const_int(y)
            if k is not None:
                inner = lane_split(x, v, lanes)
                return None if inner is None else (E.binary(Op.MUL, inner[0], y), inner[1] * k)
        return None
    if e.op in (Op.FLOORDIV, Op.FLOORMOD):
        d = const_int(e.b)
        inner = lane_split(e.a, v, lanes)
        if d is None or d <= 0 or inner is None:
            return None
        base, k = inner
        if k < 0 or k * lanes > math.gcd(known_divisor(base), d):
            return None
        return E.binary(e.op, base, e.b), (0 if e.op is Op.FLOORDIV else k)
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
        if e.op in (Op.ADD, Op.SUB):
            return math.gcd(a, b)
        if e.op is Op.MUL:
            return min(a * b, 1 << 30)
        if e.op is Op.FLOORMOD and isinstance(e.b, E.Const):
            return math.gcd(a, b)  # a - d*q with d and a both multiples of gcd(a, d)
    return 1
