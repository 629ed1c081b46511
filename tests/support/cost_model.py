"""Schedules and scores shared by the cost-model tests and benchmarks/cost_model_ranking.py: a
matmul, random schedules of it (with the choices they made), and the pairwise ranking accuracy
of predictions against the truth."""

from __future__ import annotations

import random

import numpy as np

from autosched import te


def matmul(M: int = 64, N: int = 48, K: int = 32):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


AXES = ("io", "jo", "ko", "ii", "ki", "ji")


def random_matmul_schedule(rng: random.Random, A, B, C):
    """A random schedule of a matmul (splits, order, vectorize / parallel / unroll) and the
    choices it made, for a ground truth computed from the choices themselves."""
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    (k,) = s[C].op.reduce_axis
    fi = rng.choice([1, 2, 4, 8, 16, 32])
    fj = rng.choice([1, 2, 4, 8, 16, 32])
    fk = rng.choice([1, 2, 4, 8, 16])
    io, ii = s[C].split(i, factor=fi)
    jo, ji = s[C].split(j, factor=fj)
    ko, ki = s[C].split(k, factor=fk)
    ax = dict(zip(AXES, (io, jo, ko, ii, ki, ji)))
    order = rng.choice([list(AXES), ["io", "jo", "ko", "ki", "ii", "ji"],
                        ["io", "ko", "jo", "ii", "ki", "ji"], ["jo", "io", "ko", "ki", "ii", "ji"]])
    if rng.random() < 0.3:
        order = rng.sample(order, len(order))
    s[C].reorder(*(ax[a] for a in order))
    ch = {"f": {"i": fi, "j": fj, "k": fk}, "order": order, "vec": False, "par": False,
          "unroll": False}
    if order[-1] in ("ii", "ji") and rng.random() < 0.6:
        s[C].vectorize(ax[order[-1]])
        ch["vec"] = True
    if order[0] in ("io", "jo", "ii", "ji") and rng.random() < 0.5:
        s[C].parallel(ax[order[0]])
        ch["par"] = True
    if rng.random() < 0.3:
        s[C].unroll(ax[order[-2]])
        ch["unroll"] = True
    return s, ch


def pairwise_accuracy(pred: np.ndarray, truth: np.ndarray) -> float:
    good = total = 0
    for a in range(len(truth)):
        for b in range(a + 1, len(truth)):
            if truth[a] == truth[b]:
                continue
            total += 1
            good += (pred[a] - pred[b]) * (truth[a] - truth[b]) > 0
    return good / total
