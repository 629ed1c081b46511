"""The search space of a task: its sketches, and candidates (a sketch plus knob values)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from autosched.errors import LowerError, ScheduleError
from autosched.schedule.schedule import Schedule
from autosched.search.record import ir_hash
from autosched.search.sketch import Sketch, generate_sketches
from autosched.search.task import Task
from autosched.tir.ir import PrimFunc

RETRIES = 32  # redraws of a sample or mutation that a sketch rules out statically


@dataclass(frozen=True)
class Candidate:
    sketch: int
    params: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return {"sketch": self.sketch, "params": {k: list(v) if isinstance(v, tuple) else v
                                                  for k, v in self.params}}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Candidate:
        params = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in d["params"].items())
        return Candidate(int(d["sketch"]), params)


@dataclass
class Lowered:
    """A candidate made concrete: its schedule, lowered function and IR hash (schedule and
    function are None when it was lowered in another process: only hash and features came back)."""

    candidate: Candidate
    schedule: Schedule | None
    func: PrimFunc | None
    ir_hash: str
    features: np.ndarray | None = field(default=None, repr=False)


class SearchSpace:
    """Sampling, mutation and crossover over a task's sketches."""

    def __init__(self, task: Task):
        self.task = task
        self.sketches: list[Sketch] = generate_sketches(task.schedule(), task.target,
                                                        task.precision)

    def sample(self, rng: np.random.Generator) -> Candidate:
        """A random candidate; draws that a sketch rules out statically (a register tile
        larger than the register file) are redrawn, up to RETRIES times."""
        idx = int(rng.integers(len(self.sketches)))
        sketch = self.sketches[idx]
        params = _legal(sketch, lambda: {k.name: k.sample(rng) for k in sketch.knobs})
        return Candidate(idx, tuple(params.items()))

    def default_candidate(self) -> Candidate:
        """The untuned default: each knob's preferred value (reasonable, not tuned) in the
        first sketch."""
        return self.sketch_defaults()[0]

    def sketch_defaults(self) -> list[Candidate]:
        """Each sketch's candidate of preferred knob values, in sketch order."""
        return [Candidate(i, tuple((k.name, k.default()) for k in sk.knobs))
                for i, sk in enumerate(self.sketches)]

    def default_schedule(self) -> Schedule:
        """The schedule of the default candidate; if that is illegal here (too many threads,
        too much shared memory) or holds more shared memory than a block gets without opting
        in (save a warpgroup tile's, which needs more by design: its main loop keeps 3 to 6
        operand tiles in flight), the first such legal one of a fixed-seed sample; else the
        plain default."""
        target = self.task.target
        modest = replace(target, max_shared_memory_per_block=min(
            target.max_shared_memory_per_block, target.default_shared_memory_per_block))
        first = self.default_candidate()
        low = self.lower(first)
        limit = target if any(r.kind == "wgmma" for r in self.sketches[first.sketch].rules) \
            else modest
        rng = np.random.default_rng(0)
        for _ in range(64):
            if (low is not None and low.schedule is not None and low.func is not None
                    and target.backend.unfit(low.func, limit) is None):
                return low.schedule
            low = self.lower(self.sample(rng))
            limit = modest
        return self.task.schedule()

    def mutate(self, c: Candidate, rng: np.random.Generator) -> Candidate:
        sketch = self.sketches[c.sketch]
        knobs = sketch.knobs
        if not knobs:
            return c

        def draw() -> dict[str, Any]:
            params = dict(c.params)
            for _ in range(1 + int(rng.random() < 0.3)):
                k = knobs[int(rng.integers(len(knobs)))]
                params[k.name] = k.mutate(rng, params[k.name])
            return params

        params = _legal(sketch, draw)
        return Candidate(c.sketch, tuple((k.name, params[k.name]) for k in knobs))

    def crossover(self, a: Candidate, b: Candidate, rng: np.random.Generator) -> Candidate:
        """Knob values taken from either parent, rule by rule (values of one rule stay together)."""
        if a.sketch != b.sketch:
            return a
        sketch = self.sketches[a.sketch]
        pa, pb = dict(a.params), dict(b.params)
        out: dict[str, Any] = {}
        for rule in sketch.rules:
            src = pa if rng.random() < 0.5 else pb
            out.update({k.name: src[k.name] for k in rule.knobs})
        return Candidate(a.sketch, tuple((k.name, out[k.name]) for k in sketch.knobs))

    def schedule(self, c: Candidate) -> Schedule:
        sch = self.task.schedule()
        return self.sketches[c.sketch].apply(sch, dict(c.params))

    def lower(self, c: Candidate) -> Lowered | None:
        """The lowered candidate, or None when its knob values make an illegal schedule."""
        try:
            sch = self.schedule(c)
            func = self.task.lower(sch)
        except (ScheduleError, LowerError):
            return None
        if self.task.target.backend.unfit(func, self.task.target) is not None:
            return None
        return Lowered(c, sch, func, ir_hash(func))

    def knows(self, c: Candidate) -> bool:
        """Whether ``c`` (say, from a log) fits this space's current sketches."""
        if not 0 <= c.sketch < len(self.sketches):
            return False
        return [k.name for k in self.sketches[c.sketch].knobs] == [k for k, _ in c.params]


def _legal(sketch: Sketch, draw: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Knob values from ``draw``, redrawn while the sketch rules them out statically (up to
    RETRIES draws; the last one is kept, and its schedule is then refused when applied)."""
    for _ in range(RETRIES):
        params = draw()
        if sketch.violation(params) is None:
            break
    return params
