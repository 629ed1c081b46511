"""How a buffer access moves through a loop nest: strides of its flattened index with respect
to each enclosing loop, and the elements and cache lines it touches inside each loop level.

Everything is computed from the index expressions once per store, never by simulating
iterations. Linear indices (sums of loop variables times constants) give exact strides; a
non-linear piece (floordiv, floormod, min, select, an indirect load) gets its *average* slope
over the loop's range, found by evaluating it at the loop's first and last value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autosched.te import expr as E
from autosched.te.opcodes import Op


@dataclass
class Loop:
    """One enclosing loop on the walk stack (outermost first)."""

    uid: int
    extent: int
    kind: str
    tag: str
    start: int
    annotations: dict


class Linearizer:
    """Strides of index expressions with respect to the loops of the current nest."""

    def __init__(self, loops: list[Loop], lets: dict[int, E.Expr]):
        self.loops = loops
        self.lets = lets
        self.pos = {lp.uid: p for p, lp in enumerate(loops)}

    # -- linear form: ({loop position: coefficient}, constant) -------------------------------
    def linear(self, e: E.Expr) -> tuple[dict[int, float], float]:
        if isinstance(e, E.Const):
            return {}, float(e.value)
        if isinstance(e, E.Var):
            p = self.pos.get(e.uid)
            if p is not None:
                return {p: 1.0}, 0.0
            let = self.lets.get(e.uid)
            return self.linear(let) if let is not None else ({}, 0.0)
        if isinstance(e, E.Cast):
            return self.linear(e.value)
        if isinstance(e, E.Binary) and e.op in (Op.ADD, Op.SUB, Op.MUL):
            ca, ka = self.linear(e.a)
            cb, kb = self.linear(e.b)
            if e.op is Op.MUL:
                if not ca:
                    return {p: c * ka for p, c in cb.items()}, ka * kb
                if not cb:
                    return {p: c * kb for p, c in ca.items()}, ka * kb
                return self._numeric(e)
            sign = 1.0 if e.op is Op.ADD else -1.0
            out = dict(ca)
            for p, c in cb.items():
                out[p] = out.get(p, 0.0) + sign * c
            return out, ka + sign * kb
        return self._numeric(e)

    def _numeric(self, e: E.Expr) -> tuple[dict[int, float], float]:
        """Average slope per loop: (value at last iteration - value at first) / (extent - 1)."""
        env = {lp.uid: lp.start for lp in self.loops}
        base = self.evaluate(e, env)
        coefs: dict[int, float] = {}
        for p, lp in enumerate(self.loops):
            if lp.extent <= 1:
                continue
            env[lp.uid] = lp.start + lp.extent - 1
            slope = (self.evaluate(e, env) - base) / (lp.extent - 1)
            env[lp.uid] = lp.start
            if slope:
                coefs[p] = slope
        # Express the constant relative to the loop starts, as linear() does.
        const = base - sum(c * self.loops[p].start for p, c in coefs.items())
        return coefs, const

    def evaluate(self, e: E.Expr, env: dict[int, int]) -> float:
        if isinstance(e, E.Const):
            return e.value
        if isinstance(e, E.Var):
            if e.uid in env:
                return env[e.uid]
            let = self.lets.get(e.uid)
            return self.evaluate(let, env) if let is not None else 0
        if isinstance(e, E.Binary | E.Compare):
            a, b = self.evaluate(e.a, env), self.evaluate(e.b, env)
            if e.op is Op.POW or (e.op.divides and not b):
                return 0
            return e.op.fold(a, b)
        if isinstance(e, E.Cast):
            return self.evaluate(e.value, env)
        if isinstance(e, E.Select):
            c = self.evaluate(e.cond, env)
            return self.evaluate(e.true_value if c else e.false_value, env)
        if isinstance(e, E.Not):
            return not self.evaluate(e.a, env)
        return 0  # a load inside an index (indirect access) or a call: no stride information

    def flat_strides(self, indices: tuple[E.Expr, ...], strides: tuple[int, ...]) -> list[float]:
        """|stride| in elements of the row-major flattened index, per loop (outer first)."""
        out = [0.0] * len(self.loops)
        for idx, st in zip(indices, strides):
            coefs, _ = self.linear(idx)
            for p, c in coefs.items():
                out[p] += c * st
        return [abs(c) for c in out]

    def fraction_true(self, cond: E.Expr) -> float:
        """Estimated fraction of the nest's iterations where ``cond`` holds (1.0 if unknown),
        assuming the compared quantity is spread uniformly over its range."""
        if type(cond) is E.Binary and cond.op is Op.AND:
            return self.fraction_true(cond.a) * self.fraction_true(cond.b)
        if type(cond) is not E.Compare:
            return 1.0
        ca, ka = self.linear(cond.a)
        cb, kb = self.linear(cond.b)
        diff = dict(ca)
        for p, c in cb.items():
            diff[p] = diff.get(p, 0.0) - c
        lo = hi = ka - kb
        for p, c in diff.items():
            lp = self.loops[p]
            lo += c * lp.start + min(0.0, c * (lp.extent - 1))
            hi += c * lp.start + max(0.0, c * (lp.extent - 1))
        width = hi - lo + 1.0
        op = cond.op
        if op == Op.LT:
            frac = (0.0 - lo) / width
        elif op == Op.LE:
            frac = (1.0 - lo) / width
        elif op == Op.GT:
            frac = hi / width
        elif op == Op.GE:
            frac = (hi + 1.0) / width
        elif op == Op.EQ:
            frac = 1.0 / width if lo <= 0 <= hi else 0.0
        else:
            frac = 1.0 - (1.0 / width if lo <= 0 <= hi else 0.0)
        return min(1.0, max(0.0, frac))


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def footprints(strides: list[float], extents: list[int], itemsize: int, line_bytes: int,
               total_elems: int) -> tuple[list[float], list[float]]:
    """Distinct elements and distinct cache lines touched inside each loop level.

    ``strides`` and ``extents`` list the enclosing loops outer first; level ``l`` of the result
    means "one execution of the ``l`` innermost loops" (level 0: one iteration, level n: the
    whole nest). Elements are min(product of the extents of loops that move the index, the span
    of the index); lines split the loops into those that step a line or more (each iteration a
    new line) and those that walk within lines (their span, in lines).
    """
    line_elems = max(line_bytes / itemsize, 1.0)
    total_lines = math.ceil(total_elems / line_elems)
    elems, lines = [1.0], [1.0]
    prod = span = 1.0
    far = 1.0      # product of extents of loops whose stride is at least a line
    near = 1.0     # span in elements of loops that stay within lines
    for p in range(len(extents) - 1, -1, -1):
        c, e = strides[p], extents[p]
        if c > 0 and e > 1:
            prod *= e
            span += c * (e - 1)
            if c >= line_elems:
                far *= e
            else:
                near += c * (e - 1)
        d = min(prod, span, float(total_elems))
        n_lines = min(far * math.ceil(near / line_elems), d, math.ceil(span / line_elems) + 1.0,
                      float(total_lines))
        elems.append(d)
        lines.append(max(n_lines, 1.0))
    return elems, lines
