"""Tuning budgets: ``trials`` counts new measurements (TVM's meaning), ``total_trials`` the
job's trials in the log; a rerun with nothing left to do says so in one line. Measurement and
the cost model are stand-ins here (random costs, random search), so the tests take seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched.cli import _parser, main
from autosched.cli.args import trial_budget
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import MeasureResult
from autosched.search.record import RecordLog
from autosched.search.task import Task
from autosched.search.tune import TuneOptions, tune
from autosched.search.workloads import make

OPTS = TuneOptions(batch_size=3, seed=0, verbose=False, population=8, generations=1)


class _RandomCosts:
    """Measures every candidate at a random cost; counts what it was asked to measure."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.count = rng, 0

    def measure(self, task: Task, schedules: Any) -> list[MeasureResult]:
        self.count += len(schedules)
        return [MeasureResult((float(self.rng.uniform(1e-5, 1e-3)),), ErrorCode.NO_ERROR, "",
                              0.0, 0.0, 1.0, "") for _ in schedules]


class _Untrained:
    """A cost model that never learns: the search samples at random."""

    trained = False

    def fit(self, *args: Any, **kwargs: Any) -> None:
        pass


def _task() -> Task:
    tensors = make("softmax", [4, 40])
    return Task(lambda: tensors, target="llvm", name="softmax_4x40")


def _tune(log: Path, rng: np.random.Generator, **budget: Any) -> int:
    measurer = _RandomCosts(rng)
    tune(_task(), log=log, measurer=measurer, model=_Untrained(), options=OPTS, **budget)
    return measurer.count


def _count(log: Path) -> int:
    return len(RecordLog(log).load())


def test_trials_are_new_measurements(tmp_path: Path, rng: np.random.Generator) -> None:
    log = tmp_path / "sm.jsonl"
    assert _tune(log, rng, trials=5) == 5 and _count(log) == 5
    assert _tune(log, rng, trials=4) == 4 and _count(log) == 9  # 4 more, not 4 in all
    hashes = [r.ir_hash for r in RecordLog(log).load()]
    assert len(set(hashes)) == 9  # nothing measured twice across the reruns


def test_total_trials_finish_a_job_and_say_when_done(tmp_path: Path, rng: np.random.Generator,
                                                     capsys: pytest.CaptureFixture) -> None:
    log = tmp_path / "sm.jsonl"
    assert _tune(log, rng, trials=3) == 3
    assert _tune(log, rng, total_trials=7) == 4 and _count(log) == 7  # the rest of the 7
    capsys.readouterr()
    assert _tune(log, rng, total_trials=7) == 0 and _count(log) == 7
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"all 7 trials of this job are already in {log} (7 recorded); nothing to "
                   "measure: pass --trials N (trials=N) for N more"]
    assert _tune(log, rng, trials=10, total_trials=9) == 2  # the smaller of the two
    assert _tune(log, rng, trials=2, total_trials=100) == 2 and _count(log) == 11
    assert _tune(log, rng, trials=0) == 0
    assert "0 trials asked for; nothing to measure (11 already recorded)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="total_trials must be at least 0, got -1"):
        _tune(log, rng, total_trials=-1)


def test_the_command_line_budget(tmp_path: Path, rng: np.random.Generator,
                                 capsys: pytest.CaptureFixture) -> None:
    def budget(*argv: str) -> tuple[int | None, int | None]:
        return trial_budget(_parser().parse_args(list(argv)))

    assert budget("tune-op", "gemm", "8", "8", "8") == (64, None)
    assert budget("tune", "m.onnx") == (200, None)
    assert budget("tune", "m.onnx", "--trials", "5") == (5, None)
    assert budget("tune", "m.onnx", "--total-trials", "300") == (None, 300)
    assert budget("tune-op", "gemm", "8", "8", "8", "--trials", "2", "--total-trials", "9") == (
        2, 9)
    # a rerun of a finished job: one line saying so, then the best schedule as before
    log = tmp_path / "sm.jsonl"
    _tune(log, rng, trials=4)
    capsys.readouterr()
    code = main(["tune-op", "softmax", "4", "40", "--total-trials", "4", "--log", str(log)])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and _count(log) == 4
    assert out[0].startswith(f"all 4 trials of this job are already in {log}")
    assert out[1].startswith("softmax_4x40: best ")
