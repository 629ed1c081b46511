"""The operators of Binary and Compare expressions, one entry each with what every layer needs
to know about it: its kind, how it prints, and what it computes.

``Op`` is a ``str`` enum whose values are the names the IR has always stored ("add",
"floordiv", "lt" ...): an entry equals and hashes as its name, so workload keys, printed IR and
tuning records read the same, and ``Op("floormod")`` parses a name.

Semantics (``fold``) are Python's on Python numbers, the reference every backend must match:
``div`` is true division (floats only); ``floordiv`` / ``floormod`` round toward negative
infinity (Python's ``//`` and ``%``); ``truncdiv`` / ``truncmod`` round toward zero (C's ``/``
and ``%``); ``and`` / ``or`` are logical on bools.

Example::

    Op.FLOORMOD.fold(-7, 2)      # 1
    Op.TRUNCMOD.fold(-7, 2)      # -1
    Op.LT.negated, Op.LT.mirrored    # Op.GE, Op.GT:  not (a < b) is a >= b;  a < b is b > a
    Op.FLOORDIV.symbol           # "//" (None: printed as a call, ``truncdiv(a, b)``)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class OpKind(StrEnum):
    ARITH = "arith"        # numbers to a number of the operands' dtype
    COMPARE = "compare"    # numbers to a bool
    LOGICAL = "logical"    # bools to a bool


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _floor_div(a: Any, b: Any) -> Any:
    return a // b if isinstance(a, int) and isinstance(b, int) else float(math.floor(a / b))


class Op(StrEnum):
    """One binary operator; see the module docstring."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    FLOORDIV = "floordiv"
    FLOORMOD = "floormod"
    TRUNCDIV = "truncdiv"
    TRUNCMOD = "truncmod"
    MIN = "min"
    MAX = "max"
    POW = "pow"
    AND = "and"
    OR = "or"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"

    @property
    def kind(self) -> OpKind:
        return _INFO[self].kind

    @property
    def symbol(self) -> str | None:
        """The Python infix spelling the printer uses; None: printed as a call, ``op(a, b)``."""
        return _INFO[self].symbol

    @property
    def precedence(self) -> int:
        """How tightly the infix form binds (higher binds tighter)."""
        return _INFO[self].precedence

    def fold(self, a: Any, b: Any) -> Any:
        """``a op b`` on Python numbers (bools for the logical ops)."""
        return _INFO[self].fold(a, b)

    @property
    def divides(self) -> bool:
        """A zero right operand is undefined (not folded; integer division traps)."""
        return self in _DIVIDES

    @property
    def int_only(self) -> bool:
        """Defined on integers only (truncation and floor modulo of floats are not IR ops)."""
        return self in (Op.TRUNCDIV, Op.TRUNCMOD, Op.FLOORMOD)

    @property
    def truncating(self) -> Op:
        """The op that agrees with this one on non-negative operands and rounds toward zero
        (C's ``/`` and ``%`` for floordiv and floormod; any other op itself)."""
        return _TRUNCATING.get(self, self)

    @property
    def negated(self) -> Op:
        """The comparison that is true exactly when this one is false."""
        return _NEGATED[self]

    @property
    def mirrored(self) -> Op:
        """The comparison with the operands swapped: ``a op b`` is ``b op.mirrored a``."""
        return _MIRRORED[self]


@dataclass(frozen=True)
class _Info:
    kind: OpKind
    symbol: str | None
    precedence: int
    fold: Callable[[Any, Any], Any]


_ARITH, _CMP, _LOGIC = OpKind.ARITH, OpKind.COMPARE, OpKind.LOGICAL
_CALL = 10  # the precedence of the call form: an atom
_INFO = {
    Op.ADD: _Info(_ARITH, "+", 4, operator.add),
    Op.SUB: _Info(_ARITH, "-", 4, operator.sub),
    Op.MUL: _Info(_ARITH, "*", 5, operator.mul),
    Op.DIV: _Info(_ARITH, "/", 5, operator.truediv),
    Op.FLOORDIV: _Info(_ARITH, "//", 5, _floor_div),
    Op.FLOORMOD: _Info(_ARITH, "%", 5, operator.mod),
    Op.TRUNCDIV: _Info(_ARITH, None, _CALL, _trunc_div),
    Op.TRUNCMOD: _Info(_ARITH, None, _CALL, lambda a, b: a - _trunc_div(a, b) * b),
    Op.MIN: _Info(_ARITH, None, _CALL, min),
    Op.MAX: _Info(_ARITH, None, _CALL, max),
    Op.POW: _Info(_ARITH, None, _CALL, operator.pow),
    Op.AND: _Info(_LOGIC, "and", 1, lambda a, b: a and b),
    Op.OR: _Info(_LOGIC, "or", 0, lambda a, b: a or b),
    Op.EQ: _Info(_CMP, "==", 3, operator.eq),
    Op.NE: _Info(_CMP, "!=", 3, operator.ne),
    Op.LT: _Info(_CMP, "<", 3, operator.lt),
    Op.LE: _Info(_CMP, "<=", 3, operator.le),
    Op.GT: _Info(_CMP, ">", 3, operator.gt),
    Op.GE: _Info(_CMP, ">=", 3, operator.ge),
}
_DIVIDES = frozenset((Op.DIV, Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD))
_TRUNCATING = {Op.FLOORDIV: Op.TRUNCDIV, Op.FLOORMOD: Op.TRUNCMOD}
_NEGATED = {Op.EQ: Op.NE, Op.NE: Op.EQ, Op.LT: Op.GE, Op.GE: Op.LT, Op.LE: Op.GT, Op.GT: Op.LE}
_MIRRORED = {Op.EQ: Op.EQ, Op.NE: Op.NE, Op.LT: Op.GT, Op.GT: Op.LT, Op.LE: Op.GE, Op.GE: Op.LE}

ARITH = tuple(op for op in Op if op.kind is OpKind.ARITH)
COMPARE = tuple(op for op in Op if op.kind is OpKind.COMPARE)
