"""A CPU model without a fixed thread count runs on the count its own runs find faster."""

from __future__ import annotations

import numpy as np
import pytest

from autosched.graph import threads as T
from autosched.graph.threads import AdaptiveThreads


def _drive(pick: AdaptiveThreads, seconds_of: dict[int, float], runs: int,
           rng: np.random.Generator) -> list[int]:
    """The counts ``pick`` asks for over ``runs`` runs taking ``seconds_of[count]`` (+-3%)."""
    used = []
    for _ in range(runs):
        n = pick.next()
        used.append(n)
        pick.observe(seconds_of[n] * rng.uniform(0.97, 1.03))
    return used


def test_moves_to_one_thread_while_it_is_faster_and_back_when_it_is_not() -> None:
    rng = np.random.default_rng()
    pick = AdaptiveThreads(2)
    used = _drive(pick, {2: 0.236e-3, 1: 0.132e-3}, 200, rng)  # the cores far apart
    first = used.index(1)
    assert first <= T.FIRST_INTERVAL + 4 and pick.current == 1
    assert used[first + T.BURST:].count(2) <= 3 * T.BURST  # tries of 2 threads only
    used = _drive(pick, {2: 0.108e-3, 1: 0.145e-3}, 200, rng)  # close again
    assert pick.current == 2 and used[-100:].count(1) <= 3 * T.BURST  # tries of 1 thread
    assert pick.switches == 2


def test_a_model_that_gains_from_its_cores_tries_ever_more_rarely() -> None:
    rng = np.random.default_rng()
    pick = AdaptiveThreads(2)
    used = _drive(pick, {2: 16e-3, 1: 31e-3}, 6000, rng)  # ResNet-18
    assert pick.current == 2 and pick.switches == 0
    assert used.count(1) / len(used) < 0.01 and pick.interval == T.MAX_INTERVAL


def test_noise_does_not_switch() -> None:
    rng = np.random.default_rng()
    pick = AdaptiveThreads(4)
    _drive(pick, {4: 1e-3, 1: 0.96e-3}, 3000, rng)  # within the margin: stay
    assert pick.current == 4 and pick.switches == 0


def test_one_core_never_tries() -> None:
    pick = AdaptiveThreads(1)
    assert _drive(pick, {1: 1e-3}, 100, np.random.default_rng()) == [1] * 100


@pytest.fixture(scope="module")
def demo_model():
    import warnings

    import autosched as aus
    from autosched.demo import small_cnn
    from autosched.graph.executor import random_inputs
    from importers.onnx import from_onnx

    g = from_onnx(small_cnn())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return aus.compile(g, target="llvm -num-cores=2"), random_inputs(g, seed=None)


def test_the_model_runs_on_the_count_its_runs_pick(demo_model, monkeypatch) -> None:
    """The native entry's context gets the count the picker asks for, run by run, and the
    outputs stay those of a fixed count; set_threads(n) fixes the count again."""
    model, feeds = demo_model
    if model._entry is None:
        pytest.skip("no native entry point on this machine")
    asked: list[int] = []

    class Alternating(AdaptiveThreads):
        def next(self) -> int:
            asked.append(1 + len(asked) % 2)
            return asked[-1]

    monkeypatch.setattr("autosched.graph.executor.AdaptiveThreads", Alternating)
    seen: list[int] = []
    entry = model._entry
    real = type(entry).set_threads
    monkeypatch.setattr(type(entry), "set_threads",
                        staticmethod(lambda ctx, n: (seen.append(n), real(ctx, n))[1]))
    model.set_threads(2)
    want = model.run(feeds)[0]
    model.set_threads(None)
    for _ in range(4):
        np.testing.assert_allclose(model.run(feeds)[0], want, rtol=1e-5, atol=1e-6)
    model.time(feeds, repeat=6, min_s=0)
    assert asked[:2] == [1, 2] and len(asked) >= 10
    assert seen[-4:] == [1, 2, 1, 2][-4:] or seen[-4:] == [2, 1, 2, 1]
    n_asked = len(asked)
    model.set_threads(2)
    model.run(feeds)
    assert len(asked) == n_asked  # a fixed count is not picked
    monkeypatch.setenv("AUTOSCHED_ADAPTIVE_THREADS", "0")
    model.set_threads(None)
    model.run(feeds)
    assert len(asked) == n_asked
    model.set_threads(None)
