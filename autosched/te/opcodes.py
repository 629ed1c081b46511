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

    kind: OpKind
    symbol: str | None
    precedence: int
    fold: Callable[[Any, Any], Any]

    def __new__(cls, name: str, kind: OpKind, symbol: str | None, precedence: int,
                fold: Callable[[Any, Any], Any]) -> Op:
        op = str.__new__(cls, name)
        op._value_ = name
        op.kind = kind
        op.symbol = symbol          # the Python infix spelling the printer uses
        op.precedence = precedence  # of that infix form (higher binds tighter)
        op.fold = fold
        return op

    ADD = "add", OpKind.ARITH, "+", 4, operator.add
    SUB = "sub", OpKind.ARITH, "-", 4, operator.sub
    MUL = "mul", OpKind.ARITH, "*", 5, operator.mul
    DIV = "div", OpKind.ARITH, "/", 5, operator.truediv
    FLOORDIV = "floordiv", OpKind.ARITH, "//", 5, _floor_div
    FLOORMOD = "floormod", OpKind.ARITH, "%", 5, operator.mod
    TRUNCDIV = "truncdiv", OpKind.ARITH, None, 10, _trunc_div
    TRUNCMOD = "truncmod", OpKind.ARITH, None, 10, lambda a, b: a - _trunc_div(a, b) * b
    MIN = "min", OpKind.ARITH, None, 10, min
    MAX = "max", OpKind.ARITH, None, 10, max
    POW = "pow", OpKind.ARITH, None, 10, operator.pow
    AND = "and", OpKind.LOGICAL, "and", 1, lambda a, b: a and b
    OR = "or", OpKind.LOGICAL, "or", 0, lambda a, b: a or b
    EQ = "eq", OpKind.COMPARE, "==", 3, operator.eq
    NE = "ne", OpKind.COMPARE, "!=", 3, operator.ne
    LT = "lt", OpKind.COMPARE, "<", 3, operator.lt
    LE = "le", OpKind.COMPARE, "<=", 3, operator.le
    GT = "gt", OpKind.COMPARE, ">", 3, operator.gt
    GE = "ge", OpKind.COMPARE, ">=", 3, operator.ge

    @property
    def divides(self) -> bool:
        """A zero right operand is undefined (not folded; integer division traps)."""
        return self in _DIVIDES

    @property
    def int_only(self) -> bool:
        """Defined on integers only (truncation and floor modulo of floats are not IR ops)."""
        return self in (Op.TRUNCDIV, Op.TRUNCMOD, Op.FLOORMOD)

    @property
    def negated(self) -> Op:
        """The comparison that is true exactly when this one is false."""
        return _NEGATED[self]

    @property
    def mirrored(self) -> Op:
        """The comparison with the operands swapped: ``a op b`` is ``b op.mirrored a``."""
        return _MIRRORED[self]


_DIVIDES = frozenset((Op.DIV, Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD))
_NEGATED = {Op.EQ: Op.NE, Op.NE: Op.EQ, Op.LT: Op.GE, Op.GE: Op.LT, Op.LE: Op.GT, Op.GT: Op.LE}
_MIRRORED = {Op.EQ: Op.EQ, Op.NE: Op.NE, Op.LT: Op.GT, Op.GT: Op.LT, Op.LE: Op.GE, Op.GE: Op.LE}

ARITH = tuple(op for op in Op if op.kind is OpKind.ARITH)
COMPARE = tuple(op for op in Op if op.kind is OpKind.COMPARE)
