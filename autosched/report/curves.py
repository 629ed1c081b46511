"""Tuning curves: the best latency found so far, per task and for the whole model, against
the trials spent and the wall time since the first measurement.

A log is read with the record reader. Its records are split by target fingerprint (one log may
hold several machines): each target is one tuning run. Every record counts as a trial, errors
included (they cost a measurement), but only successful ones can lower a best. A model's
estimated end-to-end latency is the weighted sum of its tasks' best latencies (weight = how
often the task occurs in the model), defined once every task of the model has run.

Example::

    runs = tuning_runs("tuning_logs/resnet18-llvm.jsonl", weights={key: 2, ...})
    run = runs[0]
    run.model[-1]            # Step(trial=2870, seconds=2170.4, best=0.0062): the final estimate
    run.tasks[0].best        # seconds, inf when no candidate of the task ran
"""

from __future__ import annotations

import errno
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autosched.errors import AutoschedError
from autosched.search.record import MeasureRecord, RecordLog


class LogError(AutoschedError):
    """A tuning log that holds nothing to report on; the message names the file."""


@dataclass(frozen=True)
class Step:
    """Where a best-so-far curve steps down: the trial (1-based, in log order), the seconds
    since the run's first measurement, and the new best latency in seconds."""

    trial: int
    seconds: float
    best: float


@dataclass(frozen=True)
class TaskCurve:
    """One workload's curve within a run: a step each time its best latency improved."""

    workload_key: str
    name: str
    weight: float
    trials: int
    steps: tuple[Step, ...]

    @property
    def best(self) -> float:
        return self.steps[-1].best if self.steps else math.inf

    @property
    def seconds_to_best(self) -> float:
        return self.steps[-1].seconds if self.steps else math.inf


@dataclass(frozen=True)
class TuningRun:
    """The records of one log on one target: per-task curves and the model's curve (empty
    until every weighted task has a successful record)."""

    log: str
    target: str
    trials: int
    seconds: float
    tasks: tuple[TaskCurve, ...]
    model: tuple[Step, ...]
    missing: tuple[str, ...]  # weighted workloads without a successful record


def tuning_runs(log: str | os.PathLike, weights: Mapping[str, float] | None = None
                ) -> list[TuningRun]:
    """The runs of one log, one per target fingerprint, in the order they first appear.

    ``weights`` maps workload keys to how often each occurs in the model; a workload of the
    log that it leaves out weighs 0. Without it every workload of a run weighs 1. LogError
    when the file does not exist or holds no successful measurement.
    """
    records = _records(log)
    by_target: dict[str, list[MeasureRecord]] = {}
    for rec in records:
        by_target.setdefault(rec.target_key, []).append(rec)
    return [_run(str(log), key, recs, weights) for key, recs in by_target.items()]


def _records(log: str | os.PathLike) -> list[MeasureRecord]:
    if not os.path.exists(log):  # RecordLog reads a missing log as empty: here it is a mistake
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(log))
    records = [r for r in RecordLog(log).load() if not r.transient and not r.in_model]
    if not any(r.ok for r in records):
        found = f"{len(records)} records, none successful" if records else "no valid record"
        raise LogError(f"{log}: {found}: nothing to plot")
    return records


def _run(log: str, target: str, records: Sequence[MeasureRecord],
         weights: Mapping[str, float] | None) -> TuningRun:
    names = _task_names(records)
    weight = {k: (1.0 if weights is None else float(weights.get(k, 0))) for k in names}
    if weights is not None:
        weight.update((k, float(w)) for k, w in weights.items() if w)
    start = records[0].timestamp
    best: dict[str, float] = {}
    steps: dict[str, list[Step]] = {k: [] for k in names}
    model: list[Step] = []
    for trial, rec in enumerate(records, start=1):
        key = rec.workload_key
        if rec.cost >= best.get(key, math.inf):  # a failed record costs inf
            continue
        best[key] = rec.cost
        step = Step(trial, rec.timestamp - start, rec.cost)
        steps[key].append(step)
        total = _weighted_total(best, weight)
        if weight[key] and math.isfinite(total):
            model.append(Step(trial, step.seconds, total))
    counts = Counter(rec.workload_key for rec in records)
    tasks = tuple(TaskCurve(k, names[k], weight[k], counts[k], tuple(steps[k])) for k in names)
    missing = tuple(k for k, w in weight.items() if w and k not in best)
    return TuningRun(log, target, len(records), records[-1].timestamp - start, tasks,
                     tuple(model), missing)


def _weighted_total(best: Mapping[str, float], weight: Mapping[str, float]) -> float:
    """The estimated end-to-end latency: inf while a weighted task has no best yet."""
    return sum(w * best.get(k, math.inf) for k, w in weight.items() if w)


def _task_names(records: Sequence[MeasureRecord]) -> dict[str, str]:
    """{workload key: label} in order of first appearance; a task name that several workloads
    share (the conv_relu of each ResNet stage) gets the key's first digits."""
    first: dict[str, str] = {}
    for rec in records:
        first.setdefault(rec.workload_key, rec.task_name or rec.workload_key[:8])
    uses = Counter(first.values())
    return {k: f"{n} [{k[:6]}]" if uses[n] > 1 else n for k, n in first.items()}
