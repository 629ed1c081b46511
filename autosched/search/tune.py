"""The tuning loop: search, measure, record, learn; one task or many through the scheduler.

Example::

    task = aus.Task(C, target="llvm")
    aus.tune(task, trials=200, log="tuning_logs/matmul.jsonl")   # appends; resumes when rerun
    f = aus.build_best(task, log="tuning_logs/matmul.jsonl")
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autosched.search.evolution import EvolutionarySearch, EvolutionConfig
from autosched.search.protocol import MeasureOptions
from autosched.search.record import (
    ApplyHistoryBest,
    MeasureRecord,
    RecordLog,
    fingerprint_key,
    records_from,
)
from autosched.search.space import Candidate, Lowered, SearchSpace
from autosched.search.task import Task


@dataclass(frozen=True)
class TuneOptions:
    """How a tuning job runs. Measurement options go to the Measurer."""

    batch_size: int = 16           # candidates measured per round
    seed: int | None = None
    verbose: bool = True
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    population: int = 128
    generations: int = 3


def _featurizer(target: Any):  # noqa: ANN202
    from autosched.cost_model.features import extract_features

    return lambda func: extract_features(func, target)


class TaskTuner:
    """The state of one task's search: its space, what the log already measured, the best."""

    def __init__(self, task: Task, log: RecordLog, rng: np.random.Generator, opts: TuneOptions,
                 lowerer: Any = None):
        self.task = task
        self.log = log
        self.space = SearchSpace(task)
        self.search = EvolutionarySearch(
            self.space, _featurizer(task.target), rng,
            EvolutionConfig(population=opts.population, generations=opts.generations), lowerer)
        self.target_key = fingerprint_key(task.target)
        self.records: list[MeasureRecord] = log.records_for(task.workload_key, task.target)
        self.measured: set[str] = {r.ir_hash for r in self.records if r.ir_hash}
        self.best_cost = min((r.cost for r in self.records), default=math.inf)
        self.history: list[float] = [self.best_cost] if self.records else []

    @property
    def trials(self) -> int:
        return len(self.records)

    @property
    def best_gflops(self) -> float:
        return self.task.flop_count / self.best_cost / 1e9 if math.isfinite(self.best_cost) else 0.0

    def seeds(self, k: int = 16) -> list[Candidate]:
        ok = sorted((r for r in self.records if r.ok and r.extra.get("candidate")), key=lambda r: r.cost)
        cands = (Candidate.from_dict(r.extra["candidate"]) for r in ok)
        return [c for c in cands if _known(self.space, c)][:k]

    def training_data(self) -> tuple[list[np.ndarray], list[float]]:
        """Features and normalised throughputs (best = 1) of this task's measured records."""
        feats, ys = [], []
        best = self.best_cost
        cands = [Candidate.from_dict(r.extra["candidate"]) if r.extra.get("candidate") else None
                 for r in self.records]
        known = [c for c in cands if c is not None and _known(self.space, c)]
        lowered = dict(zip(known, self.search.concrete_many(known)))
        for r, c in zip(self.records, cands):
            low = lowered.get(c) if c is not None else None
            if low is None or low.features is None or r.transient:  # transient: not measured
                continue
            feats.append(low.features)
            ys.append(best / r.cost if r.ok and math.isfinite(best) else 0.0)
        return feats, ys

    def _plain(self) -> Lowered | None:
        from autosched.errors import LowerError, ScheduleError
        from autosched.search.record import ir_hash

        sch = self.task.schedule()
        try:
            func = self.task.lower(sch)
        except (ScheduleError, LowerError):
            return None
        # the default schedule comes from no sketch, so it has no candidate
        return Lowered(None, sch, func, ir_hash(func))  # type: ignore[arg-type]

    def round(self, n: int, model: Any, measurer: Any) -> list[MeasureRecord]:
        batch = self.search.next_batch(n, model, self.measured, self.seeds())
        if not self.records:
            # the untuned defaults (the sketch's default candidate, and the plain schedule) are
            # measured in the first round, so tuning never ends worse than compiling untuned
            first: list[Lowered] = []
            for d in (self.search.concrete(self.space.default_candidate()), self._plain()):
                if d is not None and all(d.ir_hash != f.ir_hash for f in first):
                    first.append(d)
            hashes = {d.ir_hash for d in first}
            batch = first + [b for b in batch if b.ir_hash not in hashes][: max(n - len(first), 0)]
        if not batch:
            return []
        schedules = [self.search.schedule_of(b) for b in batch]
        results = measurer.measure(self.task, schedules)
        recs = records_from(self.task, schedules, results, [_extra(self.space, b) for b in batch])
        recs = [_with_hash(r, b.ir_hash) for r, b in zip(recs, batch)]
        self.log.append(recs)
        self.records.extend(recs)
        for r, b in zip(recs, batch):
            self.measured.add(b.ir_hash)
            if r.ok and r.cost < self.best_cost:
                self.best_cost = r.cost
        self.history.append(self.best_cost)
        return recs


def _known(space: SearchSpace, c: Candidate) -> bool:
    """Whether a candidate read from a log fits ``space``: its sketch and knob names
    (space.knows), and each value one its knob can take (a log line may hold any value)."""
    if not space.knows(c):
        return False
    return all(_admits(k, v) for k, (_, v) in zip(space.sketches[c.sketch].knobs, c.params))


def _admits(knob: Any, value: Any) -> bool:
    from autosched.search.knobs import TileKnob

    if isinstance(knob, TileKnob):  # one length per level, each at least 1
        return isinstance(value, tuple) and len(value) == knob.parts and all(
            isinstance(v, int) and v >= 1 for v in value)
    return value in knob.options


def _extra(space: SearchSpace, b: Lowered) -> dict[str, Any]:
    if b.candidate is None:
        return {"sketch": "default"}
    return {"candidate": b.candidate.as_dict(), "sketch": space.sketches[b.candidate.sketch].describe()}


def _with_hash(r: MeasureRecord, h: str) -> MeasureRecord:
    if r.ir_hash:
        return r
    from dataclasses import replace

    return replace(r, ir_hash=h)


def _default_log(tasks: Sequence[Task]) -> Path:
    name = tasks[0].name if len(tasks) == 1 else f"{tasks[0].name}_and_{len(tasks) - 1}_more"
    return RecordLog.default_path(name, tasks[0].target)


def _lowerer(measurer: Any, task: Task) -> Any:
    """Candidates of ``task`` lowered in the measurer's build workers, when it has them."""
    lower = getattr(measurer, "lower_candidates", None)
    return None if lower is None else (lambda cands: lower(task, cands))


def starting_model():  # noqa: ANN202
    """The pretrained model shipped with autosched (rounds boost on top of it), or a fresh
    XGBModel when it cannot be loaded (one warning line says why)."""
    from autosched.cost_model.pretrain import load_pretrained
    from autosched.cost_model.xgb_model import XGBModel

    return load_pretrained() or XGBModel()


def _kept(model: Any) -> Any:
    """A trained model given to ``tune`` keeps what it knows: its trees become the base that
    each round boosts on top of (refitting would throw them away at the first 8 records)."""
    if getattr(model, "base", False) is None and getattr(model, "trained", False):
        model.keep_as_base()
    return model


def _train(model: Any, tuners: Sequence[TaskTuner]) -> None:
    """Retrain on every task's records; each task is its own ranking group (a model with a
    base, the pretrained one, boosts on top of it)."""
    feats, ys, groups = [], [], []
    for t in tuners:
        f, y = t.training_data()
        feats += f
        ys += y
        groups += [t.task.workload_key] * len(f)
    if len(feats) >= 8:
        model.fit(feats, ys, groups=groups)


def tune(
    tasks: Task | Sequence[Task],
    trials: int = 200,
    log: str | os.PathLike | None = None,
    *,
    weights: Sequence[float] | None = None,
    options: TuneOptions | None = None,
    measurer: Any = None,
    model: Any = None,
    on_round: Callable[[int], None] | None = None,
    **measure_kwargs: Any,
) -> dict[str, float]:
    """Tune ``tasks`` for ``trials`` measurements in all (counting those already in ``log``:
    rerunning the same command resumes and measures nothing twice). Returns the best seconds
    per task name. Several tasks share the trials through the gradient task scheduler;
    ``on_round(trials_done)`` is called after each round (e.g. to print a per-task table).
    ``measure_kwargs`` override fields of ``options.measure`` (protocol.MeasureOptions)."""
    task_list = [tasks] if isinstance(tasks, Task) else list(tasks)
    opts = options or TuneOptions()
    record_log = RecordLog(log if log is not None else _default_log(task_list))
    record_log.check_writable()  # before any measurement: an unwritable log would lose them
    rng = np.random.default_rng(opts.seed)
    if measurer is None:
        from autosched.search.measure import Measurer

        measurer = Measurer(task_list[0].target, opts.measure, **measure_kwargs)
    tuners = [TaskTuner(t, record_log, rng, opts, _lowerer(measurer, t)) for t in task_list]
    model = starting_model() if model is None else _kept(model)
    _train(model, tuners)
    from autosched.search.task_scheduler import TaskScheduler

    sched = TaskScheduler(tuners, weights)
    done = sum(t.trials for t in tuners)
    if done >= trials and opts.verbose:
        print(f"{record_log.path}: {done} trials already recorded (budget {trials}); nothing to do")
    bar = _progress(trials, done, opts.verbose)
    stalls = 0
    try:
        while done < trials:
            tuner = sched.next_task()
            n = min(opts.batch_size, trials - done)
            t0 = time.perf_counter()
            recs = tuner.round(n, model, measurer)
            if not recs:
                stalls += 1
                sched.exhausted(tuner)
                if stalls > 3 * len(tuners):
                    warnings.warn("the search space is exhausted: every candidate was measured",
                                  stacklevel=2)
                    break
                continue
            stalls = 0
            done += len(recs)
            sched.update(tuner)
            _train(model, tuners)
            if bar is not None:
                bar.update(len(recs))
                bar.set_postfix_str(_status(tuners, sched.weights, time.perf_counter() - t0))
            if on_round is not None:
                on_round(done)
    finally:
        if bar is not None:
            bar.close()
    return {t.task.name: t.best_cost for t in tuners}


def _status(tuners: Sequence[TaskTuner], weights: Sequence[float], secs: float) -> str:
    """The progress bar's note. For several tasks: the weighted sum of the best latencies, over
    the tasks measured so far (a plain sum over them grew as each new task got its first
    measurement, which read as tuning making the model slower)."""
    if len(tuners) == 1:
        t = tuners[0]
        return f"best {t.best_gflops:.1f} GFLOPS ({t.best_cost * 1e3:.3f} ms), round {secs:.1f}s"
    measured = [(w, t.best_cost) for w, t in zip(weights, tuners) if math.isfinite(t.best_cost)]
    total = sum(w * c for w, c in measured)
    if len(measured) < len(tuners):
        return (f"{len(measured)} of {len(tuners)} tasks measured, their weighted best "
                f"{total * 1e3:.3f} ms")
    return f"estimated model latency {total * 1e3:.3f} ms"


def _progress(total: int, done: int, verbose: bool):  # noqa: ANN202
    if not verbose:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=min(done, total), desc="trials", unit="trial")


# The search behind a zero-measurement schedule: each candidate costs a lowering (tens of ms),
# so smaller than a tuning round's, and no random or uncertain picks (nothing is measured).
MODEL_SEARCH = EvolutionConfig(population=64, generations=2, eps_greedy=0.0, eps_uncertain=0.0)


def model_schedule(task: Task, model: Any = None, *, candidates: int = 8, seed: int = 0,
                   check: bool = True) -> Any:
    """The schedule the cost model (the pretrained one unless given) ranks best for ``task``,
    with nothing timed: candidates from the sketches evolved under the model, the best
    predicted first; with ``check``, the first whose output matches the default schedule's on
    random inputs when the target runs here (one call each, no timing). The default schedule
    when the model is untrained or no candidate passes.

    Example::

        sch = model_schedule(task)          # zero measurements
        f = task.build(sch)
    """
    space = SearchSpace(task)
    model = starting_model() if model is None else model
    if not getattr(model, "trained", True):
        return space.default_schedule()
    search = EvolutionarySearch(space, _featurizer(task.target), np.random.default_rng(seed),
                                MODEL_SEARCH)
    batch = search.next_batch(candidates, model, set())
    reference = _Reference(task, space.default_schedule(), seed) if check else None
    for low in batch:
        sch = search.schedule_of(low)
        if reference is None or reference.agrees(sch):
            return sch
    return space.default_schedule()


class _Reference:
    """The default schedule's outputs on random inputs, built and run once on the target (when
    it runs here), to check the model's picks against."""

    def __init__(self, task: Task, default: Any, seed: int):
        from autosched.errors import CompileError, RuntimeError_
        from autosched.search.measure_worker import random_inputs

        self.task = task
        self.inputs = random_inputs(task, np.random.default_rng(seed))
        self.outputs: list[np.ndarray] | None
        try:
            self.outputs = self._run(default)
        except (CompileError, RuntimeError_):
            # built for another machine (a cross target), or no device to run on here: the
            # picks are not checked (compiling the model says what failed, if anything)
            self.outputs = None

    def _run(self, sch: Any) -> list[np.ndarray]:
        # outputs start as NaN (or -1): an element a candidate does not write differs
        arrays = [a.copy() if a is not None else np.full(shape, _unwritten(dtype), dtype)
                  for a, (shape, dtype) in zip(self.inputs, self.task.shapes())]
        self.task.build(sch)(*arrays)
        return [arrays[i] for i, a in enumerate(self.inputs) if a is None]

    def agrees(self, sch: Any) -> bool:
        from autosched.errors import CompileError, RuntimeError_
        from autosched.search.measure_worker import compare

        if self.outputs is None:
            return True
        try:
            got = self._run(sch)
        except (CompileError, RuntimeError_):
            return False
        return all(compare(str(i), g, w) is None for i, (g, w) in enumerate(zip(got, self.outputs)))


def _unwritten(dtype: str) -> Any:
    kind = np.dtype(dtype).kind
    return np.nan if kind in "fc" else (True if kind == "b" else -1 if kind == "i" else 1)


def best_schedule(task: Task, log: str | os.PathLike) -> Any:
    """The best recorded schedule of ``task`` (the default one, with a warning, if none)."""
    return ApplyHistoryBest([task], RecordLog(log)).schedule_for(task)


def build_best(task: Task, log: str | os.PathLike) -> Any:
    """Build ``task`` with its best recorded schedule from ``log``."""
    return task.build(best_schedule(task, log))
