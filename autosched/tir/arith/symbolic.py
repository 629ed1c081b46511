"""Symbolic intervals: the range of an index expression while some variables sweep ranges.

Bound inference asks "which elements of A does ``A[io*32 + ii]`` touch while ``ii`` runs over
[0, 31]?" and wants ``[io*32, io*32 + 31]``, an interval whose ends are expressions in the
variables that stay fixed (outer loops, symbolic sizes).
"""

from __future__ import annotations

from collections.abc import Mapping

from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import post_order
from autosched.tir.arith import intervals as iv
from autosched.tir.arith.analyzer import Analyzer, Bounds, finite_pair, is_index
from autosched.tir.arith.linear import Lin

Pair = tuple[Lin, Lin]


class _Sweep:
    """Interval of linear forms while the ranged variables sweep their ranges."""

    def __init__(self, ana: Analyzer, ranges: dict[int, tuple[E.Expr, E.Expr]]) -> None:
        self.ana = ana
        self.ranges = ranges
        self._mentions: dict[int, tuple[E.Expr, bool]] = {}

    def mentions_ranged(self, e: E.Expr) -> bool:
        hit = self._mentions.get(id(e))
        if hit is None:
            found = any(isinstance(n, E.Var) and n.uid in self.ranges for n in post_order(e))
            hit = (e, found)
            self._mentions[id(e)] = hit
        return hit[1]

    def lin(self, lin: Lin) -> Pair | None:
        lo, hi = Lin(lin.dtype, lin.const), Lin(lin.dtype, lin.const)
        for key, k in lin.terms.items():
            pair = self.atom(key.e)
            if pair is None:
                return None
            alo, ahi = pair
            if k > 0:
                lo.iadd(alo, k)
                hi.iadd(ahi, k)
            else:
                lo.iadd(ahi, k)
                hi.iadd(alo, k)
        return lo, hi

    def expr(self, e: E.Expr) -> Pair | None:
        return self.lin(self.ana.lin(e))

    def atom(self, e: E.Expr) -> Pair | None:
        ana = self.ana
        if not self.mentions_ranged(e):
            lin = ana.lin(e)
            return lin, lin
        if isinstance(e, E.Var):
            lo, hi = self.ranges[e.uid]
            return ana.lin(_as(lo, e.dtype)), ana.lin(_as(hi, e.dtype))
        out: Pair | None = None
        if isinstance(e, E.Binary) and isinstance(e.b, E.Const) and e.b.value > 0:
            c = int(e.b.value)
            if e.op is Op.FLOORDIV:
                y = self.expr(e.a)
                if y is not None:
                    out = ana._floordiv(y[0], c), ana._floordiv(y[1], c)
            elif e.op is Op.FLOORMOD:
                out = self._floormod(e.a, c)
        elif isinstance(e, E.Binary) and e.op in (Op.MIN, Op.MAX):
            a, b = self.expr(e.a), self.expr(e.b)
            if a is not None and b is not None:
                out = ana._minmax(e.op, a[0], b[0]), ana._minmax(e.op, a[1], b[1])
        elif isinstance(e, E.Select):
            t, f = self.expr(e.true_value), self.expr(e.false_value)
            if t is not None and f is not None:
                out = ana._minmax(Op.MIN, t[0], f[0]), ana._minmax(Op.MAX, t[1], f[1])
        elif isinstance(e, E.Binary) and e.op is Op.MUL:
            out = self._mul(e)
        elif isinstance(e, E.Cast) and is_index(e.value.dtype):
            widening = e.type == "int64" or e.value.dtype == e.type
            inner = self.expr(e.value) if widening else None
            if inner is not None:
                low, high = inner
                out = ana.lin(E.Cast(e.type, low.to_expr())), ana.lin(E.Cast(e.type, high.to_expr()))
        if out is not None:
            return out
        # data-dependent or non-monotone: constant bounds of the whole atom, if any
        lo, hi = ana.bound(e)
        if finite_pair(lo, hi):
            return Lin(e.dtype, int(lo)), Lin(e.dtype, int(hi))
        return None

    def _floormod(self, a: E.Expr, c: int) -> Pair | None:
        ana = self.ana
        y = self.expr(a)
        if y is not None:
            width = y[1].add(y[0], -1)
            if width.is_const and width.const < c:
                # the sweep covers less than one period: exact when it does not wrap
                start = ana._floormod(y[0], c)
                _, top = ana.lin_bound(start.plus(width.const))
                if top <= c - 1:
                    return start, start.plus(width.const)
        lo, hi = iv.intersect(ana.bound(E.Binary(Op.FLOORMOD, a, E.Const(c, a.dtype))), (0, c - 1))
        return Lin(a.dtype, int(lo)), Lin(a.dtype, int(hi))

    def _mul(self, e: E.Binary) -> Pair | None:
        ana = self.ana
        for fixed, swept in ((e.a, e.b), (e.b, e.a)):
            if self.mentions_ranged(fixed):
                continue
            s = self.expr(swept)
            if s is None:
                return None
            lo, hi = ana.bound(fixed)
            f = ana.lin(fixed)
            if lo >= 0:
                return _times(ana, f, s[0]), _times(ana, f, s[1])
            if hi <= 0:
                return _times(ana, f, s[1]), _times(ana, f, s[0])
            return None
        return None


def _times(ana: Analyzer, a: Lin, b: Lin) -> Lin:
    return ana.lin(E.Binary(Op.MUL, a.to_expr(), b.to_expr()))


def _as(e: E.Expr | int, dtype: str) -> E.Expr:
    x = E.as_expr(e, like=dtype)
    return x if x.dtype == dtype else E.Cast(dtype, x)


def interval(
    e: E.Expr,
    ranges: Mapping[E.Var, tuple[E.Expr | int, E.Expr | int]],
    bounds: Bounds | None = None,
) -> tuple[E.Expr, E.Expr] | None:
    """The inclusive symbolic interval of integer ``e`` while each variable of ``ranges`` sweeps
    its inclusive ``(lo, hi)``; every other variable is a fixed symbol (``bounds`` may bound
    those). None when no bound exists (a data-dependent index).

    Example::

        >>> [str(x) for x in interval(io * 32 + ii, {ii: (0, 31)})]
        ['io * 32', 'io * 32 + 31']
    """
    bounds = dict(bounds or {})
    base = Analyzer(bounds)
    swept: dict[int, tuple[E.Expr, E.Expr]] = {}
    augmented = dict(bounds)
    for v, (lo, hi) in ranges.items():
        lo_e, hi_e = E.as_expr(lo, like=v.dtype), E.as_expr(hi, like=v.dtype)
        swept[v.uid] = (lo_e, hi_e)
        # the constant hull of the range helps simplify inside the sweep (floormod, min, ...)
        lo_c = base.lin_bound(base.lin(lo_e))[0]
        hi_c = base.lin_bound(base.lin(hi_e))[1]
        augmented[v] = iv.to_public((lo_c, hi_c))
    ana = Analyzer(augmented)
    pair = _Sweep(ana, swept).expr(e)
    if pair is None:
        return None
    return base.simplify(pair[0].to_expr()), base.simplify(pair[1].to_expr())


def interval_extent(lo: E.Expr, hi: E.Expr, bounds: Bounds | None = None) -> int | None:
    """A constant upper bound of ``hi - lo + 1`` (the length of an interval), or None.

    Example::

        >>> interval_extent(io * 4 - 1, io * 4 + 4)
        6
    """
    ana = Analyzer(bounds)
    d = ana.lin(hi).add(ana.lin(lo), -1).plus(1)
    if d.is_const:
        return d.const
    top = ana.lin_bound(d)[1]
    return int(top) if iv.finite(top) else None
