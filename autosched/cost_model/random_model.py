"""The cost model used before any measurement exists: random scores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class RandomModel:
    """Scores candidates uniformly at random (seeded), so an untrained search still explores.

    Example::

        RandomModel(seed=0).predict([x1, x2, x3])   # three floats in [0, 1)
    """

    trained = False

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def fit(self, features: Sequence[np.ndarray], throughputs: Sequence[float],
            groups: Sequence[str] | None = None) -> RandomModel:
        return self

    def update(self, features: Sequence[np.ndarray], throughputs: Sequence[float],
               groups: Sequence[str] | None = None) -> RandomModel:
        return self

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        return self.rng.random(len(features))
