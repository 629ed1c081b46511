"""The analyzer: one object per call that simplifies expressions and bounds them, with memos.

Simplification and bounding need each other (``(io*8 + ii) // 8`` is ``io`` because ``ii``
lies in [0, 8)), so both live on one class that shares the variable bounds and the caches.

Index arithmetic (int32 / int64) is assumed not to overflow, as lowering assumes. Other integer
types (int8, uint8, ...) wrap in real code, so on them only constant folding (with wrapping)
and trivial identities are applied. Floats are never reassociated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

import numpy as np

from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.tir.arith import intervals as iv
from autosched.tir.arith.intervals import INF, Ival
from autosched.tir.arith.linear import Key, Lin

INDEX_TYPES = ("int32", "int64")
_DIVMOD = (Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD)

Bounds = Mapping[E.Var, tuple[int | None, int | None]]


def is_index(dtype: str) -> bool:
    return dtype in INDEX_TYPES


def _c(v: int, dtype: str) -> E.Const:
    return E.Const(int(v), dtype)


class Analyzer:
    """Simplify and bound integer expressions under inclusive constant bounds of variables."""

    def __init__(self, bounds: Bounds | None = None, lanes: bool = False) -> None:
        # ``lanes``: also take a division of a base that is a multiple of g plus terms
        # provably in [0, g) apart (_small_part: a vector's lanes over panels). Off by
        # default: the CUDA C generator's shared index arithmetic expects the forms without it
        self.lanes = lanes
        self.var_bounds: dict[int, Ival] = {}
        for v, (lo, hi) in (bounds or {}).items():
            self.var_bounds[v.uid] = iv.from_public(lo, hi)
        # memos keyed by id(); the value keeps the key object alive so ids are not reused
        self._simp: dict[int, tuple[E.Expr, E.Expr]] = {}
        self._lin: dict[int, tuple[E.Expr, Lin]] = {}
        self._bnd: dict[int, tuple[E.Expr, Ival]] = {}

    # -----------------------------------------------------------------------------------------
    # simplify

    def simplify(self, e: E.Expr) -> E.Expr:
        if type(e) is E.Const or type(e) is E.Var:  # already canonical
            return e
        hit = self._simp.get(id(e))
        if hit is not None:
            return hit[1]
        if is_index(e.dtype) and not isinstance(e, (E.Reduce,)):
            out = self.lin(e).to_expr()
        elif e.dtype == "bool":
            out = self._simplify_bool(e)
        else:
            out = self._simplify_other(e)
        self._simp[id(e)] = (e, out)
        return out

    def _children(self, e: E.Expr) -> E.Expr:
        """``e`` with its expression children simplified (rebuilt without re-folding)."""
        changes: dict[str, Any] = {}
        for f in fields(e):
            value = getattr(e, f.name)
            if isinstance(value, E.Expr):
                new = self.simplify(value)
                if new is not value:
                    changes[f.name] = new
            elif isinstance(value, tuple) and any(isinstance(v, E.Expr) for v in value):
                new_t = tuple(self.simplify(v) if isinstance(v, E.Expr) else v for v in value)
                if any(a is not b for a, b in zip(new_t, value)):
                    changes[f.name] = new_t
        return replace(e, **changes) if changes else e

    # --- booleans

    def _simplify_bool(self, e: E.Expr) -> E.Expr:
        if isinstance(e, E.Compare):
            return self._compare(e)
        if isinstance(e, E.Not):
            a = self.simplify(e.a)
            if isinstance(a, E.Const):
                return E.Const(not a.value, "bool")
            if isinstance(a, E.Not):
                return a.a
            if isinstance(a, E.Compare) and dt.is_int(a.a.dtype):
                return self._compare(E.Compare(a.op.negated, a.a, a.b))
            return E.Not(a)
        if isinstance(e, E.Binary) and e.op in (Op.AND, Op.OR):
            return self._logical(e)
        if isinstance(e, E.Select):
            return self._select(e)
        if isinstance(e, E.Cast):
            v = self.simplify(e.value)
            if isinstance(v, E.Const):
                return E.Const(bool(v.value), "bool")
            return E.Cast("bool", v)
        return self._children(e) if not isinstance(e, (E.Const, E.Var)) else e

    def _logical(self, e: E.Binary) -> E.Expr:
        """A chain of ``and`` (or ``or``), flattened: constants folded, repeats dropped, and
        of several constant limits on the same index only the one that matters kept."""
        op = e.op
        absorbing = op == Op.OR  # the constant that decides the result
        leaves: list[E.Expr] = []
        stack: list[E.Expr] = [e]
        while stack:
            node = stack.pop()
            if isinstance(node, E.Binary) and node.op == op:
                stack += (node.b, node.a)
                continue
            x = self.simplify(node)
            if isinstance(x, E.Binary) and x.op == op:
                stack += (x.b, x.a)
            else:
                leaves.append(x)
        kept: list[E.Expr] = []
        seen: set[Key] = set()
        for x in leaves:
            if isinstance(x, E.Const):
                if bool(x.value) == absorbing:
                    return x
                continue
            key = Key(x)
            if key not in seen:
                seen.add(key)
                kept.append(x)
        kept_or_const = _tighten(op, kept)
        if isinstance(kept_or_const, E.Const):
            return kept_or_const
        if not kept_or_const:
            return E.Const(not absorbing, "bool")
        out = kept_or_const[0]
        for x in kept_or_const[1:]:
            out = E.Binary(op, out, x)
        return out

    def _compare(self, e: E.Compare) -> E.Expr:
        a, b = e.a, e.b
        if is_index(a.dtype):
            # the difference may pair up a remainder split across the two sides
            d = self._remainder(self._merge_divmod(self.lin(a).add(self.lin(b), -1)))
            if d.is_const:
                return E.Const(bool(e.op.fold(d.const, 0)), "bool")
            lo, hi = self.lin_bound(d)
            decided = _decide(e.op, lo, hi)
            if decided is None:
                # the written form may bound better than the canonical one ((i-3)*(j-1))
                lo, hi = self.bound(E.Binary(Op.SUB, a, b))
                decided = _decide(e.op, lo, hi)
            if decided is not None:
                return E.Const(decided, "bool")
            la, lb = self.lin(a), self.lin(b)
            if la.is_const or lb.is_const or len(d.terms) < len(la.terms) + len(lb.terms):
                # against a constant, or with terms cancelled: "terms op constant" reads best
                return _normal_compare(e.op, d)
        sa, sb = self.simplify(a), self.simplify(b)
        if isinstance(sa, E.Const) and isinstance(sb, E.Const):
            return E.Const(bool(e.op.fold(sa.value, sb.value)), "bool")
        return E.Compare(e.op, sa, sb)

    def _select(self, e: E.Select) -> E.Expr:
        c = self.simplify(e.cond)
        if isinstance(c, E.Const):
            return self.simplify(e.true_value if c.value else e.false_value)
        t, f = self.simplify(e.true_value), self.simplify(e.false_value)
        if E.structural_equal(t, f):
            return t
        return E.Select(c, t, f)

    # --- floats and non-index integers: folding and identities only

    def _simplify_other(self, e: E.Expr) -> E.Expr:
        if isinstance(e, (E.Const, E.Var)):
            return e
        if isinstance(e, E.Select):
            return self._select(e)
        if isinstance(e, E.Cast):
            return self._cast(e)
        if isinstance(e, E.Binary):
            return self._binary_other(e)
        return self._children(e)

    def _binary_other(self, e: E.Binary) -> E.Expr:
        a, b = self.simplify(e.a), self.simplify(e.b)
        dtype, op = e.dtype, e.op
        ca = a.value if isinstance(a, E.Const) else None
        cb = b.value if isinstance(b, E.Const) else None
        if ca is not None and cb is not None:
            folded = _fold(op, ca, cb, dtype)
            if folded is not None:
                return folded
        is_f = dt.is_float(dtype)
        one, zero = (1.0, 0.0) if is_f else (1, 0)
        if op == Op.MUL:
            if cb == one:
                return a
            if ca == one:
                return b
            if not is_f and (ca == zero or cb == zero):
                return _c(0, dtype)
        elif op == Op.ADD:
            if cb == zero:
                return a
            if ca == zero:
                return b
        elif op == Op.SUB:
            if cb == zero:
                return a
            if not is_f and E.structural_equal(a, b):
                return _c(0, dtype)
        elif op in (Op.DIV, Op.FLOORDIV, Op.TRUNCDIV) and cb == one:
            return a
        elif op in (Op.MIN, Op.MAX) and E.structural_equal(a, b):
            return a
        if a is e.a and b is e.b:
            return e
        return E.Binary(op, a, b)

    def _cast(self, e: E.Cast) -> E.Expr:
        v = self.simplify(e.value)
        if v.dtype == e.type:
            return v
        if isinstance(v, E.Const):
            folded = _fold_cast(v.value, e.type)
            if folded is not None:
                return folded
        # int32 -> int64 -> int32 is the identity
        if (
            isinstance(v, E.Cast)
            and v.value.dtype == e.type
            and is_index(e.type)
            and is_index(v.type)
            and dt.bits(v.type) >= dt.bits(e.type)
        ):
            return v.value
        return E.Cast(e.type, v) if v is not e.value else e

    # -----------------------------------------------------------------------------------------
    # linear forms of index expressions

    def lin(self, e: E.Expr) -> Lin:
        hit = self._lin.get(id(e))
        if hit is not None:
            return hit[1]
        out = self._lin_uncached(e)
        self._lin[id(e)] = (e, out)
        return out

    def _lin_uncached(self, e: E.Expr) -> Lin:
        dtype = e.dtype
        if isinstance(e, E.Const):
            return Lin(dtype, int(e.value))
        if isinstance(e, E.Var):
            lo, hi = self.var_bounds.get(e.uid, iv.UNKNOWN)
            if lo == hi:  # a loop of extent 1: its variable is a constant
                return Lin(dtype, int(lo))
            return Lin.atom(e)
        if isinstance(e, E.Binary):
            op = e.op
            if op in (Op.ADD, Op.SUB):
                return self._lin_sum(e)
            if op == Op.MUL:
                la, lb = self.lin(e.a), self.lin(e.b)
                if lb.is_const:
                    return la.scale(lb.const)
                if la.is_const:
                    return lb.scale(la.const)
                return self._product(la, lb)
            if op in _DIVMOD:
                return self._divmod(op, self.lin(e.a), self.lin(e.b))
            if op in (Op.MIN, Op.MAX):
                return self._minmax(op, self.lin(e.a), self.lin(e.b))
            a, b = self.simplify(e.a), self.simplify(e.b)
            if isinstance(a, E.Const) and isinstance(b, E.Const):
                folded = _fold(op, a.value, b.value, dtype)
                if folded is not None:
                    return Lin(dtype, int(folded.value))
            return self._atom(E.Binary(op, a, b))
        if isinstance(e, E.Select):
            c = self.simplify(e.cond)
            if isinstance(c, E.Const):
                return self.lin(e.true_value if c.value else e.false_value)
            lt, lf = self.lin(e.true_value), self.lin(e.false_value)
            d = lt.add(lf, -1)
            if d.is_const and d.const == 0:
                return lt
            return self._atom(E.Select(c, lt.to_expr(), lf.to_expr()))
        if isinstance(e, E.Cast):
            out = self._cast(e)
            if isinstance(out, E.Const):
                return Lin(dtype, int(out.value))
            if is_index(out.dtype) and out is not e and not isinstance(out, E.Cast):
                return self.lin(out)
            return self._atom(out)
        return self._atom(self._children(e))

    def _product(self, la: Lin, lb: Lin) -> Lin:
        """A non-linear product in one canonical form: small sums distributed, constant
        factors pulled out, the factors of each product in name order (``(x*2) * y`` and
        ``y * x * 2`` both become ``x * y * 2``)."""
        if _width(la) * _width(lb) <= _MAX_DISTRIBUTE:
            out = Lin(la.dtype)
            for ka, ca in [*la.terms.items(), (None, la.const)]:
                for kb, cb in [*lb.terms.items(), (None, lb.const)]:
                    if ka is not None and kb is not None:
                        out.iadd(self._mul_atoms(ka.e, kb.e), ca * cb)
                    elif ka is not None:
                        out.iadd(Lin.atom(ka.e), ca * cb)
                    elif kb is not None:
                        out.iadd(Lin.atom(kb.e), ca * cb)
                    else:
                        out.const += ca * cb
            return out
        ga, fa = _content(la)
        gb, fb = _content(lb)
        return self._mul_atoms(fa.to_expr(), fb.to_expr()).scale(ga * gb)

    def _mul_atoms(self, a: E.Expr, b: E.Expr) -> Lin:
        factors = sorted(_factors(a) + _factors(b), key=str)
        out = factors[0]
        for f in factors[1:]:
            out = E.Binary(Op.MUL, out, f)
        return Lin.atom(out)

    def _atom(self, e: E.Expr) -> Lin:
        return Lin.atom(e)

    def _lin_sum(self, e: E.Binary) -> Lin:
        # walk the left spine iteratively: long sums must not recurse once per term
        parts: list[tuple[E.Expr, int]] = []
        node: E.Expr = e
        while (
            isinstance(node, E.Binary) and node.op in (Op.ADD, Op.SUB) and id(node) not in self._lin
        ):
            parts.append((node.b, 1 if node.op is Op.ADD else -1))
            node = node.a
        out = Lin(e.dtype)
        out.iadd(self.lin(node))
        for sub, k in reversed(parts):
            out.iadd(self.lin(sub), k)
        out.dtype = e.dtype
        return self._remainder(self._merge_divmod(out))

    def _merge_divmod(self, lin: Lin) -> Lin:
        """``(y // c) * (k*c) + (z % c) * k`` is ``y * k`` when ``y`` and ``z`` are congruent
        modulo c: the pattern of a fused loop index split back into its axes. With ``z`` a
        quotient ``w // d``, ``(y // (c*d)) * (k*c) + (w // d % c) * k`` is ``(y // d) * k``
        when y and w are congruent modulo c*d: the row-major offset of a flat index split
        into three or more axes (a reshape) merges one axis at a time back into the index."""
        out = lin
        for _ in range(len(lin.terms)):  # at most one merge per term: it ends for certain
            merged = self._merge_one(out)
            if merged is None:
                break
            out = merged
        return out

    def _merge_one(self, lin: Lin) -> Lin | None:
        """A copy of ``lin`` with one quotient term and one remainder term merged, or None."""
        for mkey, k in lin.terms.items():
            mod = _by_const(mkey.e, Op.FLOORMOD)
            if mod is None:
                continue
            for dkey, kd in lin.terms.items():
                div = _by_const(dkey.e, Op.FLOORDIV)
                if div is None or kd != k * mod[1]:
                    continue
                merge = self._merged(div, mod)
                if merge is not None:
                    out = lin.copy()
                    del out.terms[dkey]
                    del out.terms[mkey]
                    out.iadd(merge, k)
                    return out
        return None

    def _merged(self, div: tuple[E.Expr, int], mod: tuple[E.Expr, int]) -> Lin | None:
        """What ``(y // C) * c + z % c`` is, for div (y, C) and mod (z, c), when it is one
        term: y when C == c and y, z are congruent modulo c; y // d when z is ``w // d``
        with C == c*d and y, w congruent modulo C; else None."""
        (y_e, big), (z, c) = div, mod
        inner = z
        if big != c:
            quot = _by_const(z, Op.FLOORDIV)
            if quot is None or quot[1] * c != big:
                return None
            inner = quot[0]
        y = self.lin(y_e)
        diff = y.add(self.lin(inner), -1)
        if diff.const % big or any(v % big for v in diff.terms.values()):
            return None
        return y if big == c else self._floordiv(y, big // c)

    def _remainder(self, lin: Lin) -> Lin:
        """``k*y - (y // c) * (k*c)`` is ``(y % c) * k``: a remainder written out by hand."""
        divs = [(key, m, div) for key, m in lin.terms.items()
                if (div := _by_const(key.e, Op.FLOORDIV)) is not None]
        out = lin
        for dkey, m, (y_e, c) in divs:
            if m % c or out.terms.get(dkey) != m:
                continue
            k = -m // c
            y = self.lin(y_e)
            if not y.terms or any(out.terms.get(t) != k * v for t, v in y.terms.items()):
                continue
            out = out.add(y, -k)
            out.iadd(Lin.atom(dkey.e), -m)
            out.iadd(self._floormod(y, c), k)
        return out

    # --- division and modulus

    def _divmod(self, op: Op, la: Lin, lb: Lin) -> Lin:
        dtype = la.dtype if la.dtype == lb.dtype else "int64"
        if lb.is_const and lb.const != 0:
            c = lb.const
            if op in (Op.TRUNCDIV, Op.TRUNCMOD):
                if c < 0:
                    # trunc(a / -m) = -trunc(a / m); the sign of truncmod follows a alone
                    pos = self._divmod(op, la, Lin(dtype, -c))
                    return pos.scale(-1) if op == Op.TRUNCDIV else pos
                floor_op = Op.FLOORDIV if op == Op.TRUNCDIV else Op.FLOORMOD
                lo, hi = self.lin_bound(la)
                if lo >= 0:
                    op = floor_op
                elif hi <= 0:
                    # trunc(a / c) = -floor(-a / c); truncmod(a, c) = -floormod(-a, c)
                    return self._divmod(floor_op, la.scale(-1), lb).scale(-1)
                else:
                    return self._atom(E.Binary(op, la.to_expr(), _c(c, dtype)))
            if c < 0:
                # floor(a / -m) = floor(-a / m); a mod -m = -((-a) mod m)
                if op == Op.FLOORDIV:
                    return self._floordiv(la.scale(-1), -c)
                return self._floormod(la.scale(-1), -c).scale(-1)
            if op == Op.FLOORDIV:
                return self._floordiv(la, c)
            return self._floormod(la, c)
        # a non-constant divisor: only the range rules (0 <= a < b) apply
        if op in (Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD):
            alo, _ = self.lin_bound(la)
            blo, _ = self.lin_bound(lb)
            if alo >= 0 and blo > 0:
                _, dhi = self.lin_bound(la.add(lb, -1))
                if dhi < 0:
                    return Lin(dtype) if op in (Op.FLOORDIV, Op.TRUNCDIV) else la
        if la.is_const and la.const == 0:
            return Lin(dtype)
        return self._atom(E.Binary(op, la.to_expr(), lb.to_expr()))

    def _split(self, la: Lin, c: int) -> tuple[Lin, Lin]:
        """``la = c * q + r`` where q collects the terms whose coefficient c divides."""
        q, r = Lin(la.dtype), Lin(la.dtype, la.const)
        for key, k in la.terms.items():
            if k % c == 0:
                q.terms[key] = k // c
            else:
                r.terms[key] = k
        return q, r

    def _floordiv(self, la: Lin, c: int) -> Lin:
        if c == 1:
            return la
        if la.is_const:
            return Lin(la.dtype, la.const // c)
        q, r = self._split(la, c)
        lo, hi = self.lin_bound(r)
        if finite_pair(lo, hi) and lo // c == hi // c:
            q.const += lo // c
            return q
        whole = self._small_part(r, c) if self.lanes else None
        if whole is not None:  # floor((g*s + y) / c) = floor(s / (c / g)) for 0 <= y < g
            s, g = whole
            return q.add(self._floordiv(s, c // g))
        q.const += r.const // c
        r.const %= c
        g = math.gcd(c, *r.terms.values())
        if g > 1:
            # floor((g*s + k) / c) = floor((s + k // g) / (c / g)) for integer s
            r = Lin(r.dtype, r.const // g, {key: k // g for key, k in r.terms.items()})
            c //= g
            return q.add(self._floordiv(r, c))
        inner = r.copy()
        inner.const = 0
        atom = inner.single()
        if isinstance(atom, E.Binary) and atom.op is Op.FLOORDIV and isinstance(atom.b, E.Const):
            c2 = int(atom.b.value)
            if c2 > 0:
                # floor((floor(y / c2) + k) / c) = floor((y + k*c2) / (c2*c))
                return q.add(self._floordiv(self.lin(atom.a).plus(r.const * c2), c2 * c))
        return q.add(self._atom(E.Binary(Op.FLOORDIV, r.to_expr(), _c(c, r.dtype))))

    def _small_part(self, r: Lin, c: int) -> tuple[Lin, int] | None:
        """(s, g) with ``r = g * s + y``, g a proper divisor of ``c`` above 1 and y (the
        terms g does not divide, and the constant) provably in [0, g): a tile's lane added
        to its base, ``16 * o + l`` for l < 16 over panels of 32. None when there is none."""
        for g in sorted({math.gcd(c, k) for k in r.terms.values()} - {1, c}, reverse=True):
            s = Lin(r.dtype, r.const // g, {key: k // g for key, k in r.terms.items()
                                            if k % g == 0})
            y = Lin(r.dtype, r.const % g, {key: k for key, k in r.terms.items() if k % g})
            lo, hi = self.lin_bound(y)
            if s.terms and finite_pair(lo, hi) and 0 <= lo and hi < g:
                return s, g
        return None

    def _floormod(self, la: Lin, c: int) -> Lin:
        if c == 1:
            return Lin(la.dtype)
        if la.is_const:
            return Lin(la.dtype, la.const % c)
        _, r = self._split(la, c)
        lo, hi = self.lin_bound(r)
        if finite_pair(lo, hi) and lo // c == hi // c:
            return r.plus(-(lo // c) * c)
        whole = self._small_part(r, c) if self.lanes else None
        if whole is not None:  # (g*s + y) mod c = g * (s mod (c / g)) + y for 0 <= y < g
            s, g = whole
            return self._floormod(s, c // g).scale(g).add(r.add(s, -g))
        # coefficients and constant reduced modulo c (positive coefficients stay positive)
        r = Lin(r.dtype, r.const % c, {key: k % c if k >= c else k for key, k in r.terms.items()})
        lo, hi = self.lin_bound(r)
        if finite_pair(lo, hi) and lo // c == hi // c:
            return r.plus(-(lo // c) * c)
        g = math.gcd(c, *r.terms.values())
        if g > 1:
            # (g*s + k) mod c = g * ((s + k // g) mod (c / g)) + k mod g
            s = Lin(r.dtype, r.const // g, {key: k // g for key, k in r.terms.items()})
            return self._floormod(s, c // g).scale(g).plus(r.const % g)
        inner = r.copy()
        inner.const = 0
        atom = inner.single()
        if isinstance(atom, E.Binary) and atom.op is Op.FLOORMOD and isinstance(atom.b, E.Const):
            c2 = int(atom.b.value)
            if c2 > 0 and c2 % c == 0:
                # (y mod c2 + k) mod c = (y + k) mod c when c divides c2
                return self._floormod(self.lin(atom.a).plus(r.const), c)
        return self._atom(E.Binary(Op.FLOORMOD, r.to_expr(), _c(c, r.dtype)))

    # --- min and max

    def _minmax(self, op: Op, la: Lin, lb: Lin) -> Lin:
        """min / max over a flattened chain: an argument that another provably beats is
        dropped (``min(min(x, 5), 3)`` is ``min(x, 3)``)."""
        args: list[Lin] = []
        for x in (la, lb):
            self._chain_args(x, op, args)
        kept: list[Lin] = []
        for x in args:
            if any(self._beats(op, y, x) for y in kept):
                continue
            kept = [y for y in kept if not self._beats(op, x, y)]
            kept.append(x)
        if len(kept) == 1:
            return kept[0]
        out = kept[0].to_expr()
        for y in kept[1:]:
            out = E.Binary(op, out, y.to_expr())
        return self._atom(out)

    def _chain_args(self, x: Lin, op: Op, out: list[Lin]) -> None:
        atom = x.single()
        if isinstance(atom, E.Binary) and atom.op == op:
            self._chain_args(self.lin(atom.a), op, out)
            self._chain_args(self.lin(atom.b), op, out)
        else:
            out.append(x)

    def _beats(self, op: Op, a: Lin, b: Lin) -> bool:
        """Does ``a`` make ``b`` redundant in a min (a <= b) or a max (a >= b)?"""
        lo, hi = self.lin_bound(a.add(b, -1))
        return hi <= 0 if op == Op.MIN else lo >= 0

    # -----------------------------------------------------------------------------------------
    # constant bounds

    def const_bound(self, e: E.Expr) -> Ival:
        """Bounds of ``e``: of its canonical linear form (exact for independent variables)
        intersected with interval arithmetic on the expression as written (which keeps
        factored products such as ``(i - 3) * (j - 1)`` tight)."""
        if not is_index(e.dtype):
            return self.bound(self.simplify(e))
        return iv.intersect(self.lin_bound(self.lin(e)), self.bound(e))

    def prove(self, cond: E.Expr) -> bool | None:
        out = self.simplify(cond)
        return bool(out.value) if isinstance(out, E.Const) else None

    def lin_bound(self, lin: Lin, depth: int = 0) -> Ival:
        out = self._lin_bound_terms(lin)
        if depth >= _MAX_SPLIT_DEPTH or len(lin.terms) < 2:
            return out
        # a min / max / select term correlated with the other terms: bound each alternative
        # with the rest, e.g. min(i*4 + 4, 99) - max(i*4 - 1, 0) + 1 <= 6
        for key, k in lin.terms.items():
            e = key.e
            if isinstance(e, E.Select):
                alts, pick_min = [self.lin(e.true_value), self.lin(e.false_value)], None
            elif isinstance(e, E.Binary) and e.op in (Op.MIN, Op.MAX):
                alts = []
                self._chain_args(Lin.atom(e), e.op, alts)
                pick_min = (e.op is Op.MIN) == (k > 0)
            else:
                continue
            rest = lin.copy()
            del rest.terms[key]
            parts = [self.lin_bound(rest.add(alt, k), depth + 1) for alt in alts]
            los, his = [p[0] for p in parts], [p[1] for p in parts]
            if pick_min is None:  # select: either branch
                split = (min(los), max(his))
            elif pick_min:
                split = (min(los), min(his))
            else:
                split = (max(los), max(his))
            return iv.intersect(out, split)
        return out

    def _lin_bound_terms(self, lin: Lin) -> Ival:
        out: Ival = (lin.const, lin.const)
        terms = lin.terms
        if sum(1 for key in terms if _by_const(key.e, Op.FLOORDIV) is not None) >= 2:
            terms = dict(terms)
            out = iv.add(out, self._paired_divs(terms))
        for key, k in terms.items():
            out = iv.add(out, iv.scale(self.bound(key.e), k))
            if out == (-INF, INF):
                return out
        return out

    def _paired_divs(self, terms: dict[Key, int]) -> Ival:
        """Bound ``m * (floordiv(y + d, c) - floordiv(y, c))`` as a whole, which is ``m`` times
        ``d // c`` or ``d // c + 1`` whatever y is; removes the paired parts from ``terms``.
        Interval extents of divided indices (``(io*32 + 31) // 7 - io*32 // 7``) need this."""
        out: Ival = (0, 0)
        divs = [(key, div) for key in terms if (div := _by_const(key.e, Op.FLOORDIV)) is not None]
        for ka, (ya, c) in divs:
            for kb, (yb, c_b) in divs:
                ca, cb = terms.get(ka, 0), terms.get(kb, 0)
                if ka is kb or ca <= 0 or cb >= 0:
                    continue
                if c_b != c:
                    continue
                d = self.lin(ya).add(self.lin(yb), -1)
                if not d.is_const:
                    continue
                m = min(ca, -cb)
                out = iv.add(out, iv.scale((d.const // c, (d.const + c - 1) // c), m))
                for key, v in ((ka, ca - m), (kb, cb + m)):
                    if v:
                        terms[key] = v
                    else:
                        del terms[key]
        return out

    def bound(self, e: E.Expr) -> Ival:
        hit = self._bnd.get(id(e))
        if hit is not None:
            return hit[1]
        out = self._bound_uncached(e)
        self._bnd[id(e)] = (e, out)
        return out

    def _bound_uncached(self, e: E.Expr) -> Ival:
        dtype = e.dtype
        if isinstance(e, E.Const):
            if dt.is_float(dtype):
                return iv.UNKNOWN
            return iv.point(int(e.value))
        if dtype == "bool":
            return (0, 1)
        if dt.is_float(dtype):
            return iv.UNKNOWN
        limits = _dtype_ival(dtype)
        if isinstance(e, E.Var):
            return iv.intersect(self.var_bounds.get(e.uid, iv.UNKNOWN), limits)
        if isinstance(e, E.Binary):
            a, b = self.bound(e.a), self.bound(e.b)
            fn = _BOUND_OPS.get(e.op)
            if fn is None:
                return limits
            out = fn(a, b)
            # narrow types wrap: a result outside the type's range says nothing
            return out if limits == iv.UNKNOWN or _inside(out, limits) else limits
        if isinstance(e, E.Select):
            c = self.simplify(e.cond)
            if isinstance(c, E.Const):
                return self.bound(e.true_value if c.value else e.false_value)
            return iv.union(self.bound(e.true_value), self.bound(e.false_value))
        if isinstance(e, E.Cast):
            src = e.value.dtype
            if dt.is_float(src):
                return limits
            inner = self.bound(e.value)
            return inner if _inside(inner, _dtype_ival(dtype, exact=True)) else limits
        return limits


_MAX_DISTRIBUTE = 16


def _width(lin: Lin) -> int:
    return len(lin.terms) + (lin.const != 0)


def _factors(e: E.Expr) -> list[E.Expr]:
    if isinstance(e, E.Binary) and e.op is Op.MUL:
        return _factors(e.a) + _factors(e.b)
    return [e]


def _content(lin: Lin) -> tuple[int, Lin]:
    """``lin = k * rest`` with k the gcd of the coefficients and constant, signed so the
    first term of rest is positive."""
    k = math.gcd(lin.const, *lin.terms.values())
    if next(iter(lin.terms.values())) < 0:
        k = -k
    if k == 1:
        return 1, lin
    return k, Lin(lin.dtype, lin.const // k, {key: c // k for key, c in lin.terms.items()})


def _by_const(e: E.Expr, op: Op) -> tuple[E.Expr, int] | None:
    """(y, c) when ``e`` is ``y op c`` (floordiv or floormod) with c a positive constant."""
    if isinstance(e, E.Binary) and e.op == op and isinstance(e.b, E.Const) and e.b.value > 0:
        return e.a, int(e.b.value)
    return None


def finite_pair(lo: int | float, hi: int | float) -> bool:
    return iv.finite(lo) and iv.finite(hi)


def _inside(a: Ival, b: Ival) -> bool:
    return a[0] >= b[0] and a[1] <= b[1]


def _limit(x: E.Expr) -> tuple[Key, str, int] | None:
    """``L < k`` style comparison of an index with a constant as (L, "hi" | "lo", inclusive k)."""
    if not (isinstance(x, E.Compare) and isinstance(x.b, E.Const) and is_index(x.a.dtype)):
        return None
    k = int(x.b.value)
    side = {Op.LT: ("hi", k - 1), Op.LE: ("hi", k), Op.GT: ("lo", k + 1), Op.GE: ("lo", k)}
    if x.op not in side:
        return None
    which, bound = side[x.op]
    return Key(x.a), which, bound


def _tighten(op: Op, parts: list[E.Expr]) -> list[E.Expr] | E.Const:
    """Of the constant limits on one index, ``and`` needs only the tightest of each side and
    ``or`` the loosest; both sides together may decide the whole chain."""
    best: dict[tuple[Key, str], tuple[int, int]] = {}  # -> (limit, position of the winner)
    for pos, x in enumerate(parts):
        lim = _limit(x)
        if lim is None:
            continue
        key, which, k = lim
        cur = best.get((key, which))
        want_small = (which == "hi") == (op == Op.AND)
        if cur is None or (k < cur[0] if want_small else k > cur[0]):
            best[key, which] = (k, pos)
    drop: set[int] = set()
    for pos, x in enumerate(parts):
        lim = _limit(x)
        if lim is not None and best[lim[0], lim[1]][1] != pos:
            drop.add(pos)
    for (key, which), (k, _) in best.items():
        if which != "lo" or (key, "hi") not in best:
            continue
        hi = best[key, "hi"][0]
        if op == Op.AND and k > hi:
            return E.Const(False, "bool")
        if op == Op.OR and k <= hi + 1:
            return E.Const(True, "bool")
    return [x for pos, x in enumerate(parts) if pos not in drop]


_MAX_SPLIT_DEPTH = 3

def _normal_compare(op: Op, d: Lin) -> E.Expr:
    """``d op 0`` as ``terms op constant``: positive leading terms, coefficients divided by
    their gcd (``x * 4 + 3 < 10`` is ``x < 2``)."""
    terms = Lin(d.dtype, 0, dict(d.terms))
    k = -d.const
    if all(c < 0 for c in terms.terms.values()):
        terms, k, op = terms.scale(-1), -k, op.mirrored
    g = math.gcd(*terms.terms.values())
    if g > 1:
        terms = Lin(d.dtype, 0, {key: c // g for key, c in terms.terms.items()})
        if op in (Op.EQ, Op.NE):
            if k % g:
                return E.Const(op == Op.NE, "bool")
            k //= g
        elif op in (Op.LT, Op.GE):
            k = -((-k) // g)  # g*s < k  <=>  s < ceil(k / g)
        else:
            k //= g  # g*s <= k  <=>  s <= floor(k / g)
    return E.Compare(op, terms.to_expr(), _c(k, d.dtype))


def _decide(op: Op, lo: int | float, hi: int | float) -> bool | None:
    """The truth of ``d op 0`` for every d in [lo, hi], or None."""
    if op == Op.LT:
        return True if hi < 0 else False if lo >= 0 else None
    if op == Op.LE:
        return True if hi <= 0 else False if lo > 0 else None
    if op == Op.GT:
        return True if lo > 0 else False if hi <= 0 else None
    if op == Op.GE:
        return True if lo >= 0 else False if hi < 0 else None
    if op == Op.EQ:
        return True if lo == hi == 0 else False if lo > 0 or hi < 0 else None
    if op == Op.NE:
        return False if lo == hi == 0 else True if lo > 0 or hi < 0 else None
    return None


_BOUND_OPS = {
    Op.ADD: iv.add,
    Op.SUB: lambda a, b: iv.add(a, iv.neg(b)),
    Op.MUL: iv.mul,
    Op.FLOORDIV: iv.floordiv,
    Op.FLOORMOD: iv.floormod,
    Op.TRUNCDIV: iv.truncdiv,
    Op.TRUNCMOD: iv.truncmod,
    Op.MIN: iv.vmin,
    Op.MAX: iv.vmax,
}


def _dtype_ival(dtype: str, exact: bool = False) -> Ival:
    """The range of an integer type; unknown for index types unless ``exact`` (their values
    are assumed not to overflow, so the range adds nothing)."""
    if dtype == "bool":
        return (0, 1)
    if not dt.is_int(dtype) or (is_index(dtype) and not exact):
        return iv.UNKNOWN
    return (dt.min_value(dtype), dt.max_value(dtype))


def _wrap(v: int, dtype: str) -> int:
    bits = dt.bits(dtype)
    v &= (1 << bits) - 1
    if dt.is_signed(dtype) and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


# Float ops folded in the operands' precision (numpy's minimum / maximum keep NaNs, as
# the backends do).
_FLOAT_FOLD = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide,
               Op.MIN: np.minimum, Op.MAX: np.maximum}


def _fold(op: Op, a: Any, b: Any, dtype: str) -> E.Const | None:
    """Fold ``a op b`` exactly as the target computes it in ``dtype``, or None."""
    if dt.is_float(dtype):
        ufunc = _FLOAT_FOLD.get(op)
        if ufunc is None or (op == Op.DIV and b == 0):
            return None
        x, y = np.array(a, dtype=dtype), np.array(b, dtype=dtype)
        with np.errstate(all="ignore"):
            r = ufunc(x, y)
        return E.Const(float(r), dtype)
    if op in _DIVMOD and b == 0:
        return None
    if op == Op.POW and b < 0:
        return None
    r = op.fold(int(a), int(b))
    if not is_index(dtype):
        r = _wrap(int(r), dtype)
    return _c(r, dtype)


def _fold_cast(v: Any, dtype: str) -> E.Const | None:
    if dtype == "bool":
        return E.Const(bool(v), "bool")
    if dt.is_float(dtype):
        return E.Const(float(np.array(v).astype(dtype)), dtype)
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        t = int(v)  # C truncates toward zero
        lo, hi = _dtype_ival(dtype, exact=True)
        return _c(t, dtype) if lo <= t <= hi else None
    return _c(_wrap(int(v), dtype), dtype)
