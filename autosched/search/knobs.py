"""Knobs: the tunable parameters of a sketch (tile sizes, unroll depth, compute location, ...).

A candidate is a sketch plus one value per knob; its steps are generated from them, so mutation
is "change one value, regenerate the steps".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


def divisors(n: int) -> list[int]:
    out: set[int] = set()
    for d in range(1, int(math.isqrt(n)) + 1):
        if n % d == 0:
            out.update((d, n // d))
    return sorted(out)


@dataclass(frozen=True)
class TileKnob:
    """Inner tile lengths of one axis: ``parts`` factors, innermost last; the outermost level
    takes whatever is left (ceil-divided, so non-dividing lengths are allowed)."""

    name: str
    extent: int
    parts: int
    max_innermost: int = 64
    nondividing: float = 0.15   # chance that a drawn length need not divide what is left
    prefer: tuple[int, ...] = ()  # the untuned default: wanted length per level, innermost last
    caps: tuple[int, ...] = ()    # largest length per level, innermost last (GPU thread counts)
    exact: bool = False  # prefer was planned against the extent: the default takes it as it is
    exact_inner: bool = False  # the default takes the innermost length as it is (it overhangs)

    def _cap(self, level_from_inner: int) -> int:
        if self.caps:
            return self.caps[len(self.caps) - 1 - level_from_inner]
        return self.max_innermost if level_from_inner == 0 else 1 << 30

    def default(self) -> tuple[int, ...]:
        """Preferred lengths, each shrunk to a divisor of what is left (innermost first), or
        taken as they are when ``exact`` (the outermost level then covers the rest)."""
        want = list(self.prefer) or [1] * self.parts
        if self.exact:
            return tuple(max(1, w) for w in want)
        left = self.extent
        out = []
        for level, w in enumerate(reversed(want)):
            if level == 0 and self.exact_inner and w >= 1:
                out.append(w)
                left = -(-left // w)
                continue
            d = max((x for x in divisors(left) if x <= max(w, 1)), default=1)  # extent 0
            out.append(d)
            left //= d
        return tuple(reversed(out))

    def sample(self, rng: np.random.Generator) -> tuple[int, ...]:
        left = self.extent
        out = []
        for level in range(self.parts):
            cap = min(self._cap(level), left)
            out.append(self._draw(rng, left, cap))
            left = max(1, -(-left // out[-1]))
        return tuple(reversed(out))

    def _draw(self, rng: np.random.Generator, left: int, cap: int) -> int:
        if rng.random() < self.nondividing and left > 2:
            pows = [p for p in (2, 4, 8, 16, 32, 64) if p < left and p <= cap]
            if pows:
                return int(rng.choice(pows))
        choices = [d for d in divisors(left) if d <= cap] or [1]
        return int(rng.choice(choices))

    def mutate(self, rng: np.random.Generator, value: tuple[int, ...]) -> tuple[int, ...]:
        """Move a factor between two levels (Ansor's tile-size mutation), or redraw one level."""
        vals = list(value)
        if len(vals) >= 1 and rng.random() < 0.7:
            src, dst = rng.integers(0, len(vals) + 1, size=2)  # level len(vals) is the outer rest
            if src != dst:
                lengths = [self._outer(vals)] + list(vals)  # outermost first
                s_len = lengths[src]
                fs = [d for d in divisors(s_len) if d > 1]
                if fs:
                    f = int(rng.choice(fs))
                    lengths[src] //= f
                    lengths[dst] *= f
                    new = tuple(lengths[1:])
                    caps = [self._cap(len(new) - 1 - i) for i in range(len(new))]
                    if all(1 <= v <= c for v, c in zip(new, caps)):
                        return new
        return self.sample(rng)

    def _outer(self, vals: list[int]) -> int:
        return max(1, -(-self.extent // int(np.prod(vals))))


@dataclass(frozen=True)
class ChoiceKnob:
    name: str
    options: tuple[Any, ...]
    default_index: int = 0

    def default(self) -> Any:
        return self.options[min(self.default_index, len(self.options) - 1)]

    def sample(self, rng: np.random.Generator) -> Any:
        return self.options[int(rng.integers(len(self.options)))]

    def mutate(self, rng: np.random.Generator, value: Any) -> Any:
        if len(self.options) == 1:
            return value
        others = [o for o in self.options if o != value]
        return others[int(rng.integers(len(others)))]


Knob = TileKnob | ChoiceKnob
