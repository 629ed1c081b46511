"""Integer arithmetic for lowering and bound inference: simplification, constant bounds,
proofs of comparisons and symbolic intervals.

``bounds`` everywhere maps a Var to its inclusive constant range ``(lo, hi)`` (either end may be
None for unknown); variables without bounds are unknown. Integer division follows Python
(``floordiv`` / ``floormod`` round toward negative infinity).

Each function builds a fresh ``Analyzer``; a pass that simplifies many expressions under the
same bounds can keep one ``Analyzer(bounds)`` and call its ``simplify`` / ``const_bound`` /
``prove`` to share the memos (``const_bound`` there returns infinite ends, not None).
"""

from __future__ import annotations

from autosched.te import expr as E
from autosched.tir.arith import intervals as _iv
from autosched.tir.arith.analyzer import Analyzer, Bounds
from autosched.tir.arith.symbolic import interval, interval_extent


def simplify(e: E.Expr, bounds: Bounds | None = None, lanes: bool = False) -> E.Expr:
    """``e`` in canonical form: integer index expressions as a linear form with constants
    folded, division and modulus resolved where ``bounds`` allow, comparisons, selects and
    min / max decided where provable. Floats only fold exact constants and ``x*1.0``, ``x+0.0``.
    With ``lanes``, also a division of a base that a divisor g of the divisor divides plus
    terms provably in [0, g) (a vector's lanes over column panels, tensorized nests).

    Example::

        >>> simplify((io * 8 + ii) // 8, {ii: (0, 7)})
        io
        >>> simplify((io * 16 + ii) // 32, {ii: (0, 15)}, lanes=True)
        io // 2
    """
    return Analyzer(bounds, lanes).simplify(E.as_expr(e))


def const_bound(e: E.Expr, bounds: Bounds | None = None) -> tuple[int | None, int | None]:
    """The inclusive constant interval of integer ``e`` (None for an unknown end).

    Example::

        >>> const_bound(i * 4 + j - 1, {i: (0, 7), j: (0, 3)})
        (-1, 30)
    """
    return _iv.to_public(Analyzer(bounds).const_bound(E.as_expr(e)))


def prove(cond: E.Expr, bounds: Bounds | None = None) -> bool | None:
    """True or False when ``bounds`` decide the condition, None when they do not.

    Example::

        >>> prove(i * 4 + j < 32, {i: (0, 7), j: (0, 3)})
        True
    """
    return Analyzer(bounds).prove(E.as_expr(cond))


__all__ = ["Analyzer", "const_bound", "interval", "interval_extent", "prove", "simplify"]
