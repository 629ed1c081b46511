"""Constant integer intervals with infinite ends, and the arithmetic on them.

An interval is a pair ``(lo, hi)`` of Python ints or ``-inf`` / ``inf`` (floats), inclusive.
Infinite ends stand for "unknown" so that one code path serves bounded and unbounded operands;
the public API turns them into ``None``.
"""

from __future__ import annotations

import math

INF = math.inf
Ival = tuple  # (lo, hi): int or -inf / inf
UNKNOWN: Ival = (-INF, INF)


def point(v: int) -> Ival:
    return (v, v)


def finite(x: int | float) -> bool:
    return not (isinstance(x, float) and math.isinf(x))


def to_public(iv: Ival) -> tuple[int | None, int | None]:
    lo, hi = iv
    return (int(lo) if finite(lo) else None, int(hi) if finite(hi) else None)


def from_public(lo: int | None, hi: int | None) -> Ival:
    return (-INF if lo is None else int(lo), INF if hi is None else int(hi))


def add(a: Ival, b: Ival) -> Ival:
    return (_add(a[0], b[0], -INF), _add(a[1], b[1], INF))


def _add(x: int | float, y: int | float, inf: float) -> int | float:
    if not finite(x) or not finite(y):
        return inf
    return x + y


def scale(a: Ival, k: int) -> Ival:
    if k == 0:
        return (0, 0)
    lo, hi = _mul(a[0], k), _mul(a[1], k)
    return (lo, hi) if k > 0 else (hi, lo)


def _mul(x: int | float, y: int | float) -> int | float:
    # 0 * unknown is still 0: the unknown value is some finite integer
    if x == 0 or y == 0:
        return 0
    return x * y


def mul(a: Ival, b: Ival) -> Ival:
    if a[0] == a[1] and finite(a[0]):
        return scale(b, a[0])
    if b[0] == b[1] and finite(b[0]):
        return scale(a, b[0])
    corners = [_mul(x, y) for x in a for y in b]
    return (min(corners), max(corners))


def union(a: Ival, b: Ival) -> Ival:
    return (min(a[0], b[0]), max(a[1], b[1]))


def vmin(a: Ival, b: Ival) -> Ival:
    return (min(a[0], b[0]), min(a[1], b[1]))


def vmax(a: Ival, b: Ival) -> Ival:
    return (max(a[0], b[0]), max(a[1], b[1]))


def _fdiv(x: int | float, y: int | float) -> int | float:
    """floor(x / y) for y > 0, with infinite operands."""
    if not finite(x):
        return x
    if not finite(y):
        return 0 if x >= 0 else -1
    return x // y


def _tdiv(x: int | float, y: int | float) -> int | float:
    """trunc(x / y) for y > 0, with infinite operands."""
    if not finite(x):
        return x
    if not finite(y):
        return 0
    q = abs(x) // y
    return q if x >= 0 else -q


def floordiv(a: Ival, b: Ival) -> Ival:
    if b[0] > 0:
        # floor(x / y) is monotone in x, and in y for fixed x, so the corners bound it
        corners = [_fdiv(x, y) for x in a for y in b]
        return (min(corners), max(corners))
    if b[1] < 0:
        return floordiv(neg(a), neg(b))
    return UNKNOWN


def floormod(a: Ival, b: Ival) -> Ival:
    if b[0] > 0:
        if b[0] == b[1] and finite(b[0]):
            c = b[0]
            if finite(a[0]) and finite(a[1]) and a[0] // c == a[1] // c:
                return (a[0] % c, a[1] % c)
        hi = _add(b[1], -1, INF)
        if a[0] >= 0:
            hi = min(hi, a[1])
        return (0, hi)
    if b[1] < 0:
        lo, hi = floormod(neg(a), neg(b))
        return (-hi, -lo)
    return UNKNOWN


def truncdiv(a: Ival, b: Ival) -> Ival:
    if b[0] > 0:
        corners = [_tdiv(x, y) for x in a for y in b]
        return (min(corners), max(corners))
    if b[1] < 0:
        return neg(truncdiv(a, neg(b)))
    return UNKNOWN


def truncmod(a: Ival, b: Ival) -> Ival:
    if b[1] < 0:
        b = neg(b)
    if b[0] <= 0:
        return UNKNOWN
    m = _add(b[1], -1, INF)
    if a[0] >= 0:
        return (0, min(m, a[1]))
    if a[1] <= 0:
        return (max(-m, a[0]), 0)
    return (max(-m, a[0]), min(m, a[1]))


def neg(a: Ival) -> Ival:
    return (-a[1], -a[0])


def intersect(a: Ival, b: Ival) -> Ival:
    return (max(a[0], b[0]), min(a[1], b[1]))
