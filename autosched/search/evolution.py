"""Evolutionary search: a population evolved under the cost model's predictions.

Each round starts from the best measured candidates, the last round's best predicted ones that
were not taken (``carry``: three quarters of the population, rescored under the retrained
model, already lowered) and fresh random samples for the rest, runs a few generations of
mutation and crossover (parents drawn with probability rising with their predicted score),
and returns the best predicted candidates not measured before, plus a share of those the model
is least sure of (where the pretrained and the fine-tuned model disagree most, when the model
says) and an epsilon of random ones, so the model keeps seeing unexplored parts of the space.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from autosched.search.space import Candidate, Lowered, SearchSpace


class Model(Protocol):
    def predict(self, features: list[np.ndarray]) -> np.ndarray: ...


# lowers candidates elsewhere (the Measurer's workers): for each index it managed, the IR hash and
# features, or None for an illegal candidate; indices it leaves out are lowered here
Lowerer = Callable[[Sequence[Candidate]], dict[int, "tuple[str, np.ndarray] | None"]]
REMOTE_MIN = 8  # fewer new candidates than this are lowered here: a round trip costs more


@dataclass
class EvolutionConfig:
    population: int = 128
    generations: int = 2
    mutation_prob: float = 0.85
    eps_greedy: float = 0.1
    eps_uncertain: float = 0.125  # share of a batch for the candidates the model is least sure of
    elite: int = 16
    carry: float = 0.75  # share of a round's population carried from the last round's best


class EvolutionarySearch:
    def __init__(self, space: SearchSpace, featurize, rng: np.random.Generator,  # noqa: ANN001
                 config: EvolutionConfig | None = None, lowerer: Lowerer | None = None):
        self.space = space
        self.featurize = featurize
        self.rng = rng
        self.cfg = config or EvolutionConfig()
        self.lowerer = lowerer
        self._cache: dict[Candidate, Lowered | None] = {}
        self._carried: list[Lowered] = []  # the last round's best predicted, not taken

    def concrete(self, c: Candidate) -> Lowered | None:
        return self.concrete_many([c])[0]

    def concrete_many(self, cands: Sequence[Candidate]) -> list[Lowered | None]:
        """Each candidate lowered with its features (None when illegal), cached. New ones go to
        the lowerer when there is one and enough of them; those lowered remotely carry no
        schedule or function (``schedule_of`` rebuilds the schedule)."""
        got = {c: self._cache[c] for c in cands if c in self._cache}
        todo = list(dict.fromkeys(c for c in cands if c not in got))
        if self.lowerer is not None and len(todo) >= REMOTE_MIN:
            for i, r in self.lowerer(todo).items():
                got[todo[i]] = None if r is None else Lowered(todo[i], None, None, r[0], r[1])
        for c in todo:
            if c not in got:
                low = self.space.lower(c)
                if low is not None:
                    low.features = self.featurize(low.func)
                got[c] = low
        for c in todo:
            self._cache[c] = got[c]
        while len(self._cache) > 20000:
            self._cache.pop(next(iter(self._cache)))
        return [got[c] for c in cands]

    def schedule_of(self, low: Lowered):  # noqa: ANN201
        return low.schedule if low.schedule is not None else self.space.schedule(low.candidate)

    def _valid(self, cands: list[Candidate]) -> list[Lowered]:
        out, seen = [], set()
        for low in self.concrete_many(cands):
            if low is not None and low.ir_hash not in seen:
                seen.add(low.ir_hash)
                out.append(low)
        return out

    def _sample_valid(self, n: int) -> list[Lowered]:
        out: list[Lowered] = []
        for _ in range(4):  # draws in batches, up to 4n in all
            if len(out) >= n:
                break
            draws = [self.space.sample(self.rng) for _ in range(n - len(out))]
            out += [low for low in self.concrete_many(draws) if low is not None]
        return out[:n]

    def next_batch(self, n: int, model: Model, measured: set[str],
                   seeds: Sequence[Candidate] = ()) -> list[Lowered]:
        """Up to ``n`` unmeasured candidates: the best predicted, plus eps-greedy random ones."""
        cfg = self.cfg
        # each sketch's default joins the first population: sane starts before the model learns
        starts = [s for s in seeds if self.space.knows(s)] + self.space.sketch_defaults()
        if not getattr(model, "trained", True):
            # a model that has seen nothing scores at random: evolving under it only costs
            # lowerings, so a cold round measures the starts and plain random samples
            return self._cold_batch(n, starts, measured)
        carried = [p for p in self._carried if p.ir_hash not in measured]
        pop = self._valid(starts) + carried + self._sample_valid(cfg.population - len(carried))
        best: dict[str, tuple[float, Lowered]] = {}
        for gen in range(cfg.generations + 1):
            if not pop:
                break
            # concrete_many featurizes every candidate it returns
            feats = [cast(np.ndarray, p.features) for p in pop]
            scores = np.asarray(model.predict(feats), dtype=np.float64)
            for p, sc in zip(pop, scores):
                if p.ir_hash not in measured and (p.ir_hash not in best or best[p.ir_hash][0] < sc):
                    best[p.ir_hash] = (float(sc), p)
            if gen == cfg.generations:
                break
            pop = self._next_generation(pop, scores)
        ranked = [p for _, p in sorted(best.values(), key=lambda t: -t[0])]
        n_rand = int(round(n * cfg.eps_greedy))
        n_unsure = int(round(n * cfg.eps_uncertain))
        chosen: list[Lowered] = []
        sketches = len(self.space.sketches)
        if sketches > 1:  # each sketch keeps a share: a model can rank one it has seen little of
            share = max(1, n // (4 * sketches))  # (a tensor-core tile) blind
            for idx in range(sketches):
                _take(chosen, [p for p in ranked if p.candidate.sketch == idx],
                      len(chosen) + share, measured)
        _take(chosen, ranked, max(n - n_rand - n_unsure, 0), measured)
        _take(chosen, _least_sure(model, ranked), max(n - n_rand, 0), measured)
        _take(chosen, ranked, max(n - n_rand, 0), measured)  # a model that cannot say
        _take(chosen, self._sample_valid(n_rand * 3 + 3), n, measured)
        _take(chosen, ranked, n, measured)  # if random draws were all seen
        taken = {p.ir_hash for p in chosen}
        self._carried = [p for p in ranked if p.ir_hash not in taken][
            : int(cfg.population * cfg.carry)]
        return chosen

    def _cold_batch(self, n: int, starts: list[Candidate], measured: set[str]) -> list[Lowered]:
        return _take([], self._valid(starts) + self._sample_valid(2 * n), n, measured)

    def _next_generation(self, pop: list[Lowered], scores: np.ndarray) -> list[Lowered]:
        cfg = self.cfg
        order = np.argsort(-scores)
        elite = [pop[i] for i in order[: cfg.elite]]
        ranks = np.empty(len(pop))
        ranks[order] = np.arange(len(pop))
        weights = np.exp(-ranks / max(len(pop) / 4, 1.0))
        weights /= weights.sum()
        children: list[Candidate] = []
        for _ in range(cfg.population):
            a = pop[int(self.rng.choice(len(pop), p=weights))].candidate
            if self.rng.random() < cfg.mutation_prob:
                children.append(self.space.mutate(a, self.rng))
            else:
                b = pop[int(self.rng.choice(len(pop), p=weights))].candidate
                children.append(self.space.crossover(a, b, self.rng))
        return elite + self._valid(children)


def _least_sure(model: Model, pool: list[Lowered]) -> list[Lowered]:
    """``pool`` ordered by the model's uncertainty, most unsure first; empty when the model
    has no ``uncertainty`` or no answer yet."""
    unsure = getattr(model, "uncertainty", None)
    u = unsure([cast(np.ndarray, p.features) for p in pool]) if unsure and pool else None
    if u is None:
        return []
    return [pool[i] for i in np.argsort(-np.asarray(u), kind="stable")]


def _take(chosen: list[Lowered], more: Sequence[Lowered], n: int,
          measured: set[str]) -> list[Lowered]:
    """``chosen`` extended in place, up to ``n``, by those of ``more`` neither measured nor
    already chosen (by IR hash)."""
    taken = {p.ir_hash for p in chosen}
    for low in more:
        if len(chosen) >= n:
            break
        if low.ir_hash not in measured and low.ir_hash not in taken:
            chosen.append(low)
            taken.add(low.ir_hash)
    return chosen
