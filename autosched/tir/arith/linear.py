"""Linear forms: ``const + sum(coef * atom)`` over integer atoms.

An atom is any simplified integer expression that is not itself a sum or a constant multiple:
a variable, ``floordiv(x, 3)``, a Load, ``min(a, b)``, a non-linear product. Terms keep the
order in which they first appeared, so the printed form follows the input (``io * 8 + ii``).
"""

from __future__ import annotations

from autosched.te import expr as E
from autosched.te.opcodes import Op


class Key:
    """A dict key for an atom: structural hash and structural equality (``==`` on expressions
    builds a comparison node, so expressions cannot be compared directly)."""

    __slots__ = ("e", "h")

    def __init__(self, e: E.Expr) -> None:
        self.e = e
        self.h = hash(e)

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and (
            self.e is other.e or (self.h == other.h and E.structural_equal(self.e, other.e))
        )


class Lin:
    """An integer linear form. Treat as immutable once built: analyses share and cache them."""

    __slots__ = ("dtype", "const", "terms")

    def __init__(self, dtype: str, const: int = 0, terms: dict[Key, int] | None = None) -> None:
        self.dtype = dtype
        self.const = const
        self.terms: dict[Key, int] = terms if terms is not None else {}

    @staticmethod
    def atom(e: E.Expr) -> Lin:
        return Lin(e.dtype, 0, {Key(e): 1})

    @property
    def is_const(self) -> bool:
        return not self.terms

    def copy(self) -> Lin:
        return Lin(self.dtype, self.const, dict(self.terms))

    def add(self, other: Lin, k: int = 1) -> Lin:
        """``self + k * other`` as a new form."""
        out = self.copy()
        out.iadd(other, k)
        return out

    def iadd(self, other: Lin, k: int = 1) -> None:
        """In place ``self += k * other``; only on a form this caller built itself."""
        if other.dtype == "int64":
            self.dtype = "int64"
        self.const += k * other.const
        terms = self.terms
        for key, c in other.terms.items():
            v = terms.get(key, 0) + k * c
            if v:
                terms[key] = v
            else:
                terms.pop(key, None)

    def scale(self, k: int) -> Lin:
        if k == 0:
            return Lin(self.dtype)
        return Lin(self.dtype, self.const * k, {key: c * k for key, c in self.terms.items()})

    def plus(self, c: int) -> Lin:
        return Lin(self.dtype, self.const + c, dict(self.terms))

    def single(self) -> E.Expr | None:
        """The atom when the form is exactly one atom with coefficient 1 and no constant."""
        if self.const == 0 and len(self.terms) == 1:
            ((key, c),) = self.terms.items()
            if c == 1:
                return key.e
        return None

    def to_expr(self) -> E.Expr:
        """The form as an expression: positive terms lead, the constant comes last."""
        dtype = self.dtype
        items = list(self.terms.items())
        if not items:
            return E.Const(self.const, dtype)
        lead = next((i for i, (_, c) in enumerate(items) if c > 0), None)
        if lead is None and self.const > 0:
            acc: E.Expr = E.Const(self.const, dtype)
            rest = items
            const = 0
        else:
            first = 0 if lead is None else lead
            key, c = items[first]
            acc = _term(key.e, c, dtype)
            rest = items[:first] + items[first + 1 :]
            const = self.const
        for key, c in rest:
            if c > 0:
                acc = E.Binary(Op.ADD, acc, _term(key.e, c, dtype))
            else:
                acc = E.Binary(Op.SUB, acc, _term(key.e, -c, dtype))
        if const > 0:
            acc = E.Binary(Op.ADD, acc, E.Const(const, dtype))
        elif const < 0:
            acc = E.Binary(Op.SUB, acc, E.Const(-const, dtype))
        return acc


def _term(e: E.Expr, c: int, dtype: str) -> E.Expr:
    return e if c == 1 else E.Binary(Op.MUL, e, E.Const(c, dtype))
