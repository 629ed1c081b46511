"""A runner that measures elsewhere (``overlaps``: Ray's nodes) measures one batch while the
tuner searches the next and trains on the last, and as many at once as it has ``lanes``: the
budget holds, nothing is measured twice, an error in the measuring thread reaches the caller. Stand-in measurements (random costs
after a pause) and an untrained model keep these to seconds."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched.errors import MeasureError
from autosched.search.error_codes import ErrorCode
from autosched.search.evolution import EvolutionarySearch
from autosched.search.measure import MeasureResult
from autosched.search.record import RecordLog
from autosched.search.task import Task
from autosched.search.tune import TuneOptions, tune
from autosched.search.workloads import make

OPTS = TuneOptions(batch_size=3, seed=0, verbose=False, population=8, generations=1)


class _Remote:
    """Measures at random costs after ``pause`` seconds, as a node would; keeps when each
    batch was measured and from which thread."""

    overlaps = True

    def __init__(self, rng: np.random.Generator, pause: float = 0.15, fail_at: int = -1):
        self.rng, self.pause, self.fail_at = rng, pause, fail_at
        self.spans: list[tuple[float, float]] = []
        self.threads: set[int] = set()
        self.lock = threading.Lock()
        self.now = self.most = 0  # batches measuring at once: now, and the most seen

    def measure(self, task: Task, schedules: Any) -> list[MeasureResult]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return self._measure(schedules)
        finally:
            with self.lock:
                self.now -= 1

    def _measure(self, schedules: Any) -> list[MeasureResult]:
        t0 = time.monotonic()
        self.threads.add(threading.get_ident())
        if len(self.spans) == self.fail_at:
            raise MeasureError("node gone")
        time.sleep(self.pause)
        self.spans.append((t0, time.monotonic()))
        return [MeasureResult((float(self.rng.uniform(1e-5, 1e-3)),), ErrorCode.NO_ERROR, "",
                              0.0, 0.0, 1.0, "") for _ in schedules]

    def close(self) -> None:
        pass


class _Untrained:
    trained = False

    def fit(self, *args: Any, **kwargs: Any) -> None:
        pass


def _tasks() -> list[Task]:
    a, b = make("softmax", [4, 40]), make("gemm", [8, 16, 8])
    return [Task(lambda: a, target="llvm", name="softmax_4x40"),
            Task(lambda: b, target="llvm", name="gemm_8x16x8")]


def test_next_batch_is_searched_while_the_last_measures(tmp_path: Path, rng: np.random.Generator,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    searched: list[float] = []
    next_batch = EvolutionarySearch.next_batch

    def timed(self: EvolutionarySearch, *args: Any, **kwargs: Any) -> Any:
        searched.append(time.monotonic())
        return next_batch(self, *args, **kwargs)

    monkeypatch.setattr(EvolutionarySearch, "next_batch", timed)
    runner, log = _Remote(rng), tmp_path / "t.jsonl"
    tune(_tasks(), trials=15, log=log, runner=runner, model=_Untrained(), options=OPTS)
    records = RecordLog(log).load()
    assert len(records) == 15 and all(r.ok for r in records)
    hashes = [(r.workload_key, r.ir_hash) for r in records]
    assert len(set(hashes)) == 15  # a batch searched during another's measuring repeats none
    assert threading.get_ident() not in runner.threads  # measured from the tuner's own thread
    during = [t for t in searched if any(a < t < b for a, b in runner.spans)]
    assert during, "no batch was searched while another was measuring"


def test_one_task_in_flight_and_searched_again(tmp_path: Path, rng: np.random.Generator) -> None:
    log = tmp_path / "t.jsonl"
    tune(_tasks()[0], trials=12, log=log, runner=_Remote(rng, pause=0.05), model=_Untrained(),
         options=OPTS)
    hashes = [r.ir_hash for r in RecordLog(log).load()]
    assert len(hashes) == 12 and len(set(hashes)) == 12


def test_an_error_while_measuring_reaches_the_caller(tmp_path: Path,
                                                      rng: np.random.Generator) -> None:
    log = tmp_path / "t.jsonl"
    with pytest.raises(MeasureError, match="node gone"):
        tune(_tasks(), trials=15, log=log, runner=_Remote(rng, pause=0.05, fail_at=2),
             model=_Untrained(), options=OPTS)
    assert len(RecordLog(log).load()) == 6  # the two batches measured before it are kept


def test_every_task_gets_its_first_round(tmp_path: Path, rng: np.random.Generator) -> None:
    """The next task is picked while the last one's batch still measures: each task's
    warm-up round counts from when it is taken, so a budget of one round per task reaches
    every task (not the first again)."""
    log = tmp_path / "t.jsonl"
    tasks = _tasks()
    tune(tasks, trials=6, log=log, runner=_Remote(rng, pause=0.05), model=_Untrained(),
         options=OPTS)
    records = RecordLog(log).load()
    assert sorted(r.workload_key for r in records) == sorted(
        [t.workload_key for t in tasks for _ in range(3)])


class _Nodes(_Remote):
    """Two nodes: two batches measure at once."""

    def lanes(self, target: Any) -> int:
        return 2


def test_a_runner_with_two_lanes_measures_two_batches_at_once(tmp_path: Path,
                                                                rng: np.random.Generator) -> None:
    log = tmp_path / "t.jsonl"
    runner = _Nodes(rng, pause=0.1)
    tune(_tasks(), trials=21, log=log, runner=runner, model=_Untrained(), options=OPTS)
    records = RecordLog(log).load()
    assert len(records) == 21 and len({(r.workload_key, r.ir_hash) for r in records}) == 21
    assert runner.most == 2, f"{runner.most} batches measured at once, not the runner's 2 lanes"
    one = _Remote(rng, pause=0.1)
    tune(_tasks(), trials=21, log=tmp_path / "u.jsonl", runner=one, model=_Untrained(),
         options=OPTS)
    assert one.most == 1, "a runner without lanes measures one batch at a time"
