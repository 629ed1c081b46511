"""benchmarks/corpus_carry.py: models packed into carry-sized folders."""

from __future__ import annotations

import numpy as np

from benchmarks.corpus_carry import pack


def test_every_model_in_one_group_within_the_limit() -> None:
    rng = np.random.default_rng()
    sizes = {f"m{k}": int(v) for k, v in enumerate(rng.integers(1, 30, 40))}
    sizes["huge"] = 80  # larger than the limit: a group of its own
    groups = pack(sizes, 44)
    assert sorted(n for g in groups for n in g) == sorted(sizes)
    assert ["huge"] in groups
    assert all(sum(sizes[n] for n in g) <= 44 for g in groups if g != ["huge"])
    # first fit, largest first: no two groups' contents would fit in one
    small = [sum(sizes[n] for n in g) for g in groups if g != ["huge"]]
    assert sum(1 for s in small if s <= 22) <= 1
