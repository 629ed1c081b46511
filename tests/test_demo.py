"""The demo's timing: the untuned and the tuned model run interleaved, so that a slow spell of
a shared machine cannot land on one of them only."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from autosched import demo


def test_runs_interleave_and_a_spell_lands_on_both(monkeypatch) -> None:
    """A fake machine twice as slow from 0.05 s to 0.15 s: run by run, b stays 0.95 of a (its
    true ratio), and the calls take turns a, b, a, b."""
    now = [0.0]
    order: list[str] = []

    def work(label: str, seconds: float):
        def call() -> None:
            order.append(label)
            now[0] += seconds * (2.0 if 0.05 <= now[0] < 0.15 else 1.0)
        return call

    monkeypatch.setattr(demo.time, "perf_counter", lambda: now[0])
    seen = demo._runs({"a": work("a", 1e-3), "b": work("b", 0.95e-3)}, 0.2)
    assert order[:6] == ["a", "b"] * 3 and abs(len(seen["a"]) - len(seen["b"])) <= 1
    assert max(seen["a"]) == pytest.approx(2e-3) and min(seen["a"]) == pytest.approx(1e-3)
    assert demo.paired_ratio([seen["a"]], [seen["b"]]) == pytest.approx(0.95)
    assert demo.summary([seen["a"], [5e-4, 9e-4]])[1] == pytest.approx(5e-4)


def test_models_turn_times_both_models_and_restores_threads(monkeypatch) -> None:
    import autosched as aus
    from autosched.graph.executor import random_inputs
    from importers.onnx import from_onnx

    g = from_onnx(demo.small_cnn(image=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = aus.compile(g, target="llvm -num-cores=2", schedule="default")
    b = aus.compile(g, target="llvm -num-cores=2", schedule="default")
    feeds = random_inputs(g, seed=None)
    monkeypatch.setattr(demo, "TURN_S", 0.01)
    seen = demo.alternating([demo._models_turn({"a": a, "b": b}, feeds, threads=1)], rounds=2)
    assert sorted(seen) == ["a", "b"] and all(len(v) == 2 for v in seen.values())
    assert all(len(r) >= 5 and min(r) > 0 for v in seen.values() for r in v)
    assert a.num_threads is None and b.num_threads is None
    want = a.run(feeds)[0]
    np.testing.assert_allclose(b.run(feeds)[0], want, rtol=1e-5, atol=1e-6)
