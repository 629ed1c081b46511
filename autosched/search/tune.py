"""The tuning loop: search, measure, record, learn; one task or many through the scheduler.

Example::

    task = aus.Task(C, target="llvm")
    aus.tune(task, trials=200, log="tuning_logs/matmul.jsonl")   # 200 new measurements, appended
    f = aus.build_best(task, log="tuning_logs/matmul.jsonl")
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ThreadPoolExecutor, wait
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
from autosched.search.runner import Runner, make_runner
from autosched.search.space import Candidate, Lowered, SearchSpace
from autosched.search.task import Task
from autosched.targets.host import usable_cores


@dataclass(frozen=True)
class TuneOptions:
    """How a tuning job runs. Measurement options go to the Measurer."""

    batch_size: int = 16           # candidates measured per round
    seed: int | None = None
    verbose: bool = True
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    # the evolution (search/evolution.py): 2 generations a round over a population three
    # quarters carried from the task's last round lower a third fewer candidates than 3 over
    # fresh samples, for tuned costs as good (benchmarks/README.md, "The search's rounds")
    population: int = 128
    generations: int = 2
    carry: float = 0.75


def _featurizer(target: Any):  # noqa: ANN202
    from autosched.cost_model.features import extract_features

    return lambda func: extract_features(func, target)


# Records of related targets (another vector ISA or thread count, another GPU arch) seed a task:
# the best SEEDS of their candidates are measured in its first rounds, and up to RELATED_TRAIN
# of them train the cost model (each target its own ranking group).
SEEDS = 8
RELATED_TRAIN = 64


class TaskTuner:
    """The state of one task's search: its space, what the log already measured, the best.
    ``strict``: only records of the very same target fingerprint count as measured here."""

    def __init__(self, task: Task, log: RecordLog, rng: np.random.Generator, opts: TuneOptions,
                 lowerer: Any = None, strict: bool = False):
        self.task = task
        self.log = log
        self.space = SearchSpace(task)
        self.search = EvolutionarySearch(
            self.space, _featurizer(task.target), rng,
            EvolutionConfig(population=opts.population, generations=opts.generations,
                            carry=opts.carry), lowerer)
        self.target_key = fingerprint_key(task.target)
        self.records: list[MeasureRecord] = log.records_for(task.workload_key, task.target,
                                                            strict)
        self.related = log.related_records(task.workload_key, task.target, strict)
        self.related_seeds = _best_candidates(self.space, self.related, SEEDS, fit=True)
        self.measured: set[str] = {r.ir_hash for r in self.records if r.ir_hash}
        self.best_cost = min((r.cost for r in self.records if not r.emulated),
                             default=math.inf)
        self.history: list[float] = [self.best_cost] if self.records else []

    @property
    def trials(self) -> int:
        return len(self.records)

    @property
    def best_gflops(self) -> float:
        return self.task.flop_count / self.best_cost / 1e9 if math.isfinite(self.best_cost) else 0.0

    def seeds(self, k: int = 16) -> list[Candidate]:
        """The evolution's starts: the best measured candidates, then those of related targets."""
        own = _best_candidates(self.space, self.records, k)
        return own + [c for c in self.related_seeds if c not in own][: max(k - len(own), 0)]

    def training_data(self) -> tuple[list[np.ndarray], list[float]]:
        """Features and normalised throughputs (best = 1) of this task's measured records."""
        return self._scored(self.records, self.best_cost)

    def related_training_data(self) -> dict[str, tuple[list[np.ndarray], list[float]]]:
        """{related target key: (features, normalised throughputs)} of up to RELATED_TRAIN
        successful records of related targets, spread from fastest to slowest (their costs
        rank candidates within their target; they are not this target's)."""
        by_key: dict[str, list[MeasureRecord]] = {}
        for r in self.related:
            if r.ok:
                by_key.setdefault(r.target_key, []).append(r)
        out = {}
        for key, recs in by_key.items():
            recs.sort(key=lambda r: r.cost)
            step = max(1, len(recs) * len(by_key) // RELATED_TRAIN)
            out[key] = self._scored(recs[::step], recs[0].cost)
        return out

    def _scored(self, records: Sequence[MeasureRecord], best: float
                ) -> tuple[list[np.ndarray], list[float]]:
        feats, ys = [], []
        cands = [Candidate.from_dict(r.extra["candidate"]) if r.extra.get("candidate") else None
                 for r in records]
        known = [c for c in cands if c is not None and _known(self.space, c)]
        lowered = dict(zip(known, self.search.concrete_many(known)))
        for r, c in zip(records, cands):
            low = lowered.get(c) if c is not None else None
            # transient: not measured; emulated: checked, but its time says nothing of speed
            if low is None or low.features is None or r.transient or r.emulated:
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
        """Search up to ``n`` candidates, measure them and record them (``prepare``, the
        measurer, ``finish``)."""
        batch = self.prepare(n, model)
        if not batch:
            return []
        schedules = self.schedules(batch)
        return self.finish(batch, schedules, measurer.measure(self.task, schedules))

    def prepare(self, n: int, model: Any) -> list[Lowered]:
        """The next batch of up to ``n`` candidates, taken at once: counted as measured, so
        that a batch searched while this one is still measuring never repeats it."""
        batch = self.search.next_batch(n, model, self.measured, self.seeds())
        first: list[Lowered] = []
        if not self.records:
            # the untuned defaults (the sketch's default candidate, and the plain schedule) are
            # measured in the first round, so tuning never ends worse than compiling untuned
            first = [d for d in (self.search.concrete(self.space.default_candidate()),
                                 self._plain()) if d is not None]
        # then the best of related targets, up to half of each round until all are measured
        seeded = [s for s in self.search.concrete_many(self.related_seeds)
                  if s is not None and s.ir_hash not in self.measured]
        first += seeded[: max((n - len(first)) // 2, 1)]
        if first:
            unique: list[Lowered] = []
            for f in first:
                if f.ir_hash not in self.measured and all(f.ir_hash != u.ir_hash
                                                          for u in unique):
                    unique.append(f)
            first, hashes = unique, {f.ir_hash for f in unique}
            batch = first + [b for b in batch if b.ir_hash not in hashes][: max(n - len(first), 0)]
        self.measured.update(b.ir_hash for b in batch)
        return batch

    def schedules(self, batch: Sequence[Lowered]) -> list[Any]:
        return [self.search.schedule_of(b) for b in batch]

    def finish(self, batch: Sequence[Lowered], schedules: Sequence[Any],
               results: Sequence[Any]) -> list[MeasureRecord]:
        """Record the measured ``batch`` (from ``prepare``) in the log and in this task's state."""
        extras = [_extra(self.space, b) | ({"emulated": True} if res.emulated else {})
                  for b, res in zip(batch, results)]
        recs = records_from(self.task, schedules, results, extras)
        recs = [_with_hash(r, b.ir_hash) for r, b in zip(recs, batch)]
        self.log.append(recs)
        self.records.extend(recs)
        for r in recs:
            if r.ok and not r.emulated and r.cost < self.best_cost:
                self.best_cost = r.cost
        self.history.append(self.best_cost)
        return recs


def _known(space: SearchSpace, c: Candidate) -> bool:
    """Whether a candidate read from a log fits ``space``: its sketch and knob names
    (space.knows), and each value one its knob can take (a log line may hold any value)."""
    if not space.knows(c):
        return False
    return all(_admits(k, v) for k, (_, v) in zip(space.sketches[c.sketch].knobs, c.params))


def _best_candidates(space: SearchSpace, records: Sequence[MeasureRecord], k: int,
                     fit: bool = False) -> list[Candidate]:
    """The candidates of the ``k`` fastest successful records that fit ``space`` (``fit``:
    knob values snapped to the space's, for records of another target)."""
    out: list[Candidate] = []
    for r in sorted((r for r in records if r.ok and r.extra.get("candidate")
                     and not r.emulated), key=lambda r: r.cost):
        c = _fitted(space, Candidate.from_dict(r.extra["candidate"]), fit)
        if c is not None and c not in out:
            out.append(c)
            if len(out) >= k:
                break
    return out


def _fitted(space: SearchSpace, c: Candidate, fit: bool) -> Candidate | None:
    """``c`` if it fits ``space``; else, with ``fit``, ``_fit(space, c)``; else None."""
    if _known(space, c):
        return c
    return _fit(space, c) if fit else None


def _fit(space: SearchSpace, c: Candidate) -> Candidate | None:
    """``c`` with each choice its knob does not offer (a vector length of a wider ISA, say)
    replaced by the nearest one it does; None when the sketch or a tile does not fit."""
    from dataclasses import replace

    if not space.knows(c):
        return None
    params = []
    for knob, (name, v) in zip(space.sketches[c.sketch].knobs, c.params):
        if not _admits(knob, v):
            options = getattr(knob, "options", ())
            if not isinstance(v, int) or not options or not all(
                    isinstance(o, int) for o in options):
                return None
            v = min(options, key=lambda o: (abs(o - v), o))
        params.append((name, v))
    return replace(c, params=tuple(params))


def _admits(knob: Any, value: Any) -> bool:
    from autosched.search.knobs import TileKnob

    if isinstance(knob, TileKnob):  # one length per level, each at least 1
        return isinstance(value, tuple) and len(value) == knob.parts and all(
            isinstance(v, int) and v >= 1 for v in value)
    return value in knob.options


def _extra(space: SearchSpace, b: Lowered) -> dict[str, Any]:
    if b.candidate is None:
        return {"sketch": "default"}
    # "untuned": the schedule compiling without a log builds (what a log of emulated records,
    # which are untimed, applies: RecordLog.best)
    untuned = {"untuned": True} if b.candidate == space.default_candidate() else {}
    return {"candidate": b.candidate.as_dict(),
            "sketch": space.sketches[b.candidate.sketch].describe()} | untuned


def _with_hash(r: MeasureRecord, h: str) -> MeasureRecord:
    if r.ir_hash:
        return r
    from dataclasses import replace

    return replace(r, ir_hash=h)


def default_log(tasks: Sequence[Task]) -> Path:
    name = tasks[0].name if len(tasks) == 1 else f"{tasks[0].name}_and_{len(tasks) - 1}_more"
    return RecordLog.default_path(name, tasks[0].target)


def _lowerer(measurer: Any, task: Task) -> Any:
    """Candidates of ``task`` lowered in the measurer's build workers, when it has them."""
    lower = getattr(measurer, "lower_candidates", None)
    return None if lower is None else (lambda cands: lower(task, cands))


def starting_model(device: str = "cpu"):  # noqa: ANN202
    """The pretrained model shipped with autosched for targets of ``device`` (Target.device;
    rounds boost on top of it), or a fresh XGBModel when it cannot be loaded (one warning
    line says why)."""
    from autosched.cost_model.pretrain import load_pretrained
    from autosched.cost_model.xgb_model import XGBModel

    return load_pretrained(device=device) or XGBModel()


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
        data = {"": t.training_data(), **t.related_training_data()}
        for key, (f, y) in data.items():  # a related target's records: a group of their own
            feats += f
            ys += y
            groups += [f"{t.task.workload_key}@{key}" if key else t.task.workload_key] * len(f)
    if len(feats) >= 8:
        model.fit(feats, ys, groups=groups)


DEFAULT_TRIALS = 200


def tune(
    tasks: Task | Sequence[Task],
    trials: int | None = None,
    log: str | os.PathLike | None = None,
    *,
    total_trials: int | None = None,
    weights: Sequence[float] | None = None,
    options: TuneOptions | None = None,
    measurer: Any = None,
    runner: Runner | str | None = None,
    model: Any = None,
    on_round: Callable[[int], None] | None = None,
    strict_target: bool = False,
    precision: str | None = None,
    **measure_kwargs: Any,
) -> dict[str, float]:
    """Make ``trials`` new measurements of ``tasks`` (TVM's meaning; 200 when neither budget is
    given), appending them to ``log``: a rerun resumes from what the log holds and measures
    nothing twice. ``total_trials`` also stops the job once the log holds that many of its
    tasks' trials, so rerunning a killed job with the same ``total_trials`` finishes it. Returns
    the best seconds per task name. Several tasks share the trials through the gradient task
    scheduler; ``on_round(measured)`` is called after each round with the count of new
    measurements so far (e.g. to print a per-task table). ``measure_kwargs`` override fields of
    ``options.measure`` (protocol.MeasureOptions).

    Records of targets with the same key (another CPU name, the same vector ISA and threads)
    count as measured here; records of related targets (another vector ISA or thread count,
    another GPU arch) seed the first rounds and the cost model. ``strict_target``: only records
    of the very same target fingerprint count, all others of its family seed.

    ``runner`` says where candidates are measured (search/runner.py): "local" (the default:
    worker processes on this machine), "ray" or "ray://HOST:PORT" (the nodes of a Ray cluster
    that advertise the target), or a runner object (``measurer`` is its older name). A runner
    this call makes, it closes. Candidates measured only under an emulator (an aarch64 board
    emulated by qemu) are recorded with ``extra.emulated``: they count as checked and measured
    trials, but their times never become the task's best nor train the cost model, so such a
    job returns inf for its tasks.

    ``precision`` (te.dtype.PRECISIONS), when given, is the precision every task is tuned
    under (Task.with_precision): its candidates are checked with that precision's tolerance
    and recorded under its key. Tasks of a model in a half precision come from
    ``extract_tasks(graph, target, precision)``, which also stores their tensors in half.

    Example::

        aus.tune(task, trials=64, log="tuning_logs/gemm.jsonl")          # 64 more
        aus.tune(task, total_trials=256, log="tuning_logs/gemm.jsonl")   # up to 256 in all
        aus.tune(task, trials=64, log="tuning_logs/gemm.jsonl", precision="tf32")
    """
    task_list = [tasks] if isinstance(tasks, Task) else list(tasks)
    if precision is not None:
        task_list = [t.with_precision(precision) for t in task_list]
    opts = options or TuneOptions()
    for name, value in (("trials", trials), ("total_trials", total_trials)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be at least 0, got {value}")
    record_log = RecordLog(log if log is not None else default_log(task_list))
    record_log.check_writable()  # before any measurement: an unwritable log would lose them
    logged = [record_log.records_for(t.workload_key, t.target, strict_target) for t in task_list]
    done = sum(len(recs) for recs in logged)
    budget = _budget(trials, total_trials, done)
    if budget == 0:
        # said even when not verbose: it is the whole answer to a rerun that did nothing
        print(nothing_to_do(done, trials, total_trials, record_log.path), flush=True)
        return {t.name: min((r.cost for r in recs if not r.emulated), default=math.inf)
                for t, recs in zip(task_list, logged)}
    rng = np.random.default_rng(opts.seed)
    if runner is None:
        runner = measurer
    if runner is not None and not isinstance(runner, str):
        return _tune(task_list, budget, record_log, rng, weights, opts, runner, model, on_round,
                     strict_target)
    made = make_runner(runner, task_list[0].target, opts.measure, **measure_kwargs)
    try:
        return _tune(task_list, budget, record_log, rng, weights, opts, made, model, on_round,
                     strict_target)
    finally:
        made.close()



def _tune(task_list: list[Task], budget: int, record_log: RecordLog, rng: np.random.Generator,
          weights: Sequence[float] | None, opts: TuneOptions, measurer: Any, model: Any,
          on_round: Callable[[int], None] | None, strict_target: bool) -> dict[str, float]:
    tuners = [TaskTuner(t, record_log, rng, opts, _lowerer(measurer, t), strict_target)
              for t in task_list]
    device = task_list[0].target.device if task_list else "cpu"
    model = starting_model(device) if model is None else _kept(model)
    _train(model, tuners)
    from autosched.search.task_scheduler import TaskScheduler

    sched = TaskScheduler(tuners, weights)
    bar = _progress(budget, opts.verbose)
    # a runner that measures elsewhere (runner.overlaps: Ray's nodes) measures while the next
    # batch is searched here and the cost model learns from the last one; one that measures
    # several batches at once (runner.lanes: one per node) has one more searched ahead
    overlaps = bool(getattr(measurer, "overlaps", False))
    pool = ThreadPoolExecutor(MAX_LANES, thread_name_prefix="autosched-measure") \
        if overlaps else None
    gate = _Gate()
    taken = measured = stalls = 0
    pending: list[_Round] = []  # taken, not yet finished: in the order they were taken
    try:
        while taken < budget or pending:
            lanes = _lanes(measurer, task_list[0].target) if overlaps else 0
            gate.set(lanes)
            if taken < budget and stalls <= 3 * len(tuners) and len(pending) <= lanes:
                tuner = sched.next_task()
                n = min(sched.round_size(tuner, opts.batch_size), budget - taken)
                t0 = time.perf_counter()
                batch = tuner.prepare(n, model)
                if not batch:
                    stalls += 1
                    sched.exhausted(tuner)
                    if stalls > 3 * len(tuners):
                        warnings.warn("the search space is exhausted: every candidate was "
                                      "measured", stacklevel=2)
                    if not pending:
                        if stalls > 3 * len(tuners):
                            break
                        continue
                else:
                    stalls = 0
                    taken += len(batch)
                    sched.update(tuner)  # a round taken: the next pick looks past it
                    schedules = tuner.schedules(batch)
                    pending.append(_Round(tuner, batch, schedules, t0, _submit(
                        pool, gate.run, measurer.measure, tuner.task, schedules)))
                    if len(pending) <= lanes and taken < budget:
                        continue  # a lane is free: search another batch first
            elif not pending:
                break
            done = _first_done(pending)
            pending.remove(done)
            recs = done.finish()
            measured += len(recs)
            _train(model, tuners)
            if bar is not None:
                bar.update(len(recs))
                bar.set_postfix_str(_status(tuners, sched.weights,
                                            time.perf_counter() - done.t0))
            if on_round is not None:
                on_round(measured)
    finally:
        gate.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
    return {t.task.name: t.best_cost for t in tuners}


MAX_LANES = 64  # batches measured at once, at most (threads are started as needed)


def _lanes(measurer: Any, target: Any) -> int:
    """How many batches an overlapping runner measures at once (``lanes(target)``; 1 if it
    does not say), between 1 and MAX_LANES."""
    lanes = getattr(measurer, "lanes", None)
    return max(1, min(int(lanes(target)) if lanes is not None else 1, MAX_LANES))


class _Gate:
    """Lets at most ``limit`` measurements run at once (the runner's lanes, which change as
    nodes come and go); once closed, those still waiting are cancelled instead of run."""

    def __init__(self) -> None:
        self.limit, self.active, self.closed = 1, 0, False
        self.cv = threading.Condition()

    def set(self, limit: int) -> None:
        with self.cv:
            self.limit = max(limit, 1)
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.cv:
            self.cv.wait_for(lambda: self.closed or self.active < self.limit)
            if self.closed:
                raise CancelledError("the tuning job ended before this batch was measured")
            self.active += 1
        try:
            return fn(*args)
        finally:
            with self.cv:
                self.active -= 1
                self.cv.notify_all()


def _first_done(pending: list[_Round]) -> _Round:
    """The first of ``pending`` whose measuring is done, waiting for one if none is."""
    wait([r.future for r in pending], return_when=FIRST_COMPLETED)
    return next(r for r in pending if r.future.done())


class _Round:
    """One task's batch on its way through the measurer (``future``: its results)."""

    def __init__(self, tuner: TaskTuner, batch: list[Lowered], schedules: list[Any], t0: float,
                 future: Future):
        self.tuner, self.batch, self.schedules, self.t0 = tuner, batch, schedules, t0
        self.future = future

    def finish(self) -> list[MeasureRecord]:
        return self.tuner.finish(self.batch, self.schedules, self.future.result())


def _submit(pool: ThreadPoolExecutor | None, fn: Callable[..., Any], *args: Any) -> Future:
    """``fn(*args)`` in ``pool``, or here and now (its result or error in a done future)."""
    if pool is not None:
        return pool.submit(fn, *args)
    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except BaseException as exc:  # re-raised by result(), where the round is finished
        done.set_exception(exc)
    return done


def _budget(trials: int | None, total_trials: int | None, done: int) -> int:
    """How many new measurements to make: ``trials``, capped by what ``total_trials`` leaves
    over the ``done`` already logged (``trials`` unbounded when only the total is given)."""
    if trials is None and total_trials is None:
        trials = DEFAULT_TRIALS
    left = math.inf if total_trials is None else max(total_trials - done, 0)
    out = min(math.inf if trials is None else trials, left)
    return int(out)


def nothing_to_do(done: int, trials: int | None, total_trials: int | None,
                  log: str | os.PathLike) -> str:
    """The one line a job with no measurement left to make prints."""
    if trials == 0:
        return f"{log}: 0 trials asked for; nothing to measure ({done} already recorded)"
    return (f"all {total_trials} trials of this job are already in {log} ({done} recorded); "
            f"nothing to measure: pass --trials N (trials=N) for N more")


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


def _progress(total: int, verbose: bool):  # noqa: ANN202
    if not verbose:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="new trials", unit="trial")


# The search behind a zero-measurement schedule: each candidate costs a lowering (tens of ms)
# and no random or uncertain picks (nothing is measured). Six generations of 64: on ResNet-18's
# GPU convs two generations left the pick's predicted score below those of most candidates a
# tuning job had measured (the search, not the model, was short); tasks search in parallel.
PICK_ORDER = ("tensor cores first, their default first for a model blind to them; a "
              "cross-thread reduction's default first for a model blind to them")  # how model_candidates orders sketches (part of a pick's key)
MODEL_SEARCH = EvolutionConfig(population=64, generations=6, eps_greedy=0.0, eps_uncertain=0.0)
MODEL_SEARCH_WORKERS: int | None = None  # processes model_schedules searches in (None: cores)


def model_candidates(task: Task, model: Any = None, *, candidates: int = 8, seed: int = 0
                     ) -> list[list[dict[str, Any]]]:
    """The steps (as dicts) of the ``candidates`` schedules the cost model (the pretrained
    one unless given) ranks best for ``task``, best first: the sketches evolved under the
    model; nothing is built or run. Empty when the model is untrained."""
    space = SearchSpace(task)
    model = starting_model(task.target.device) if model is None else model
    if not getattr(model, "trained", True):
        return []
    search = EvolutionarySearch(space, _featurizer(task.target), np.random.default_rng(seed),
                                MODEL_SEARCH)
    batch = search.next_batch(candidates, model, set())
    if batch:  # best predicted first (next_batch gives each sketch a share before the rest)
        scores = np.asarray(model.predict([low.features for low in batch]))
        batch = [batch[i] for i in np.argsort(-scores, kind="stable")]
    mma = next((i for i, sk in enumerate(space.sketches) if sk.tensor_cores), None)
    if mma is not None:
        batch = _tensor_cores_first(space, batch, mma, model)
    batch = _cross_thread_default_first(space, batch)
    return [[st.to_dict() for st in search.schedule_of(low).steps] for low in batch]


def _tensor_cores_first(space: SearchSpace, batch: list[Lowered], mma: int,
                        model: Any) -> list[Lowered]:
    """Where a task can run on tensor cores (sketch ``mma``), those candidates lead, then the
    rest. A model trained on no tensor-core records (the shipped GPU model: float32 logs
    only) can weigh neither a tensor-core tile against a SIMT one (on an H200 its picks of
    ResNet-18's fp16 matmuls were all SIMT, the model no faster than in fp32) nor tensor-core
    tiles among themselves (on an H100 its first tensor-core picks ran ResNet-18's batch-32
    matmuls in blocks of one warp, about 25 TFLOP/s): the sketch's default tile (4 warps,
    128 x 128) leads those, then the model's order. The untuned default keeps SIMT where a
    tensor-core tile would overhang (sketch order); tensor cores multiply half values 8-16
    times faster, so a pick takes them."""
    default = space.lower(space.sketch_defaults()[mma])
    first = [low for low in batch if low.candidate.sketch == mma]
    rest = [low for low in batch if low.candidate.sketch != mma]
    if default is not None:
        first = [low for low in first if low.ir_hash != default.ir_hash]
        blind = getattr(model, "tensor_core_records", 0) == 0
        first = [default, *first] if blind else [*first, default]
    return first + rest


def _cross_thread_default_first(space: SearchSpace, batch: list[Lowered]) -> list[Lowered]:
    """Where the untuned default reduces across the threads of a block (sketch_gpu's
    ``cross`` knob: few outputs over long reductions, or many over long contiguous rows; its
    ``gpu_rows`` sketch: a softmax or a norm in one kernel), it leads: no cost model has been
    trained on such records (pretrain counts tensor-core records, not these), and the
    shipped GPU model, blind to the form, ranked per-thread sums first for each of
    ppocr_v6_rec_small's 6 such reductions, one block of 96 threads adding 960 numbers each
    in a row, and BERT's softmax as three kernels of a thread per row."""
    default = space.default_candidate()
    rows = any(r.kind == "gpu_rows" for r in space.sketches[default.sketch].rules)
    if not rows and not any(k.endswith(".cross") and v for k, v in default.params):
        return batch
    low = space.lower(default)
    if low is None:
        return batch
    return [low, *[b for b in batch if b.ir_hash != low.ir_hash]]


def model_schedule(task: Task, model: Any = None, *, candidates: int = 8, seed: int = 0,
                   check: bool = True, steps: Sequence[Sequence[dict[str, Any]]] | None = None
                   ) -> Any:
    """The schedule the cost model (the pretrained one unless given) ranks best for ``task``,
    with nothing timed (``model_candidates``, or the given ``steps`` lists of them); with
    ``check``, the first whose output matches the default schedule's on random inputs when the
    target runs here (one call each, no timing). The default schedule when the model is
    untrained or no candidate passes.

    Example::

        sch = model_schedule(task)          # zero measurements
        f = task.build(sch)
    """
    from autosched.errors import LowerError, ScheduleError
    from autosched.schedule.steps import step_from_dict

    space = SearchSpace(task)
    if steps is None:
        steps = model_candidates(task, model, candidates=candidates, seed=seed)
    reference = _Reference(task, space.default_schedule(), seed) if check and steps else None
    for dicts in steps:
        try:
            sch = task.schedule([step_from_dict(d) for d in dicts])
        except (ScheduleError, LowerError):  # steps of an older sketch version (a cached pick)
            continue
        if reference is None or reference.agrees(sch):
            return sch
    return space.default_schedule()


def model_schedules(tasks: Sequence[Task], *, workers: int | None = None, seed: int = 0,
                    check: bool = True) -> list[Any]:
    """``model_schedule`` of each task with the pretrained model, the searches spread over
    ``workers`` processes (default: the cores, at most one per task; search_worker.py); the
    checks run here. Picks are read from and written to the on-disk cache (_PickCache;
    ``AUTOSCHED_PICK_CACHE=0`` searches again)."""
    cache = _PickCache(seed)
    found = [cache.read(t) for t in tasks]
    todo = [t for t, f in zip(tasks, found) if f is None]
    workers = min(workers or MODEL_SEARCH_WORKERS or usable_cores(), len(todo))
    searched = iter(_searched_in_workers(todo, workers, seed) if workers > 1
                    else [model_candidates(t, seed=seed) for t in todo])
    for i, t in enumerate(tasks):
        if found[i] is None:
            found[i] = picks = next(searched)
            cache.write(t, picks)
    return [model_schedule(t, seed=seed, check=check, steps=c) for t, c in zip(tasks, found)]


class _PickCache:
    """The pretrained model's picks (model_candidates' steps) by task, target, model and
    search, in the on-disk cache (``picks/``): compiling a model again without a log takes
    no search. A file that is not a list of step lists is a miss; its steps are checked as
    any log's when applied (model_schedule)."""

    def __init__(self, seed: int) -> None:
        from autosched.cache import DiskCache
        from autosched.schedule.steps import STEP_VERSION
        from autosched.version import __version__

        self.disk = DiskCache("picks")
        from autosched import settings

        # the settings that change the sketches (a producer warpgroup only with TMA)
        self.ident = [repr(MODEL_SEARCH), seed, STEP_VERSION, __version__, PICK_ORDER,
                      settings.flag(settings.WGMMA), settings.flag(settings.TMA)]

    def _name(self, task: Task) -> str:
        from autosched.cost_model.pretrain import pretrained_digest

        text = json.dumps([task.workload_key, repr(task.target),
                           pretrained_digest(task.target.device), *self.ident])
        return hashlib.sha256(text.encode()).hexdigest()[:40] + ".json"

    def read(self, task: Task) -> list[list[dict[str, Any]]] | None:
        from autosched import settings

        if not settings.flag(settings.PICK_CACHE):
            return None
        data = self.disk.read(self._name(task))
        try:
            picks = json.loads(data) if data is not None else None
        except ValueError:
            return None
        if (isinstance(picks, list) and picks and all(
                isinstance(p, list) and all(isinstance(d, dict) for d in p) for p in picks)):
            return picks
        return None

    def write(self, task: Task, picks: list[list[dict[str, Any]]]) -> None:
        if picks:  # an untrained model picks nothing: search again once there is one
            self.disk.write(self._name(task), json.dumps(picks).encode())


def _searched_in_workers(tasks: Sequence[Task], workers: int, seed: int
                         ) -> list[list[list[dict[str, Any]]]]:
    """``model_candidates`` of each task, the tasks dealt round-robin to ``workers`` worker
    processes (largest first); a worker that fails leaves its tasks to this process."""
    import pickle
    import subprocess

    from autosched.search.measure import isolated_argv

    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].flop_count)
    shares = [order[w::workers] for w in range(workers)]
    procs = [subprocess.Popen(isolated_argv("autosched.search.search_worker"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
             for _ in shares]
    found: list[Any] = [None] * len(tasks)
    for proc, share in zip(procs, shares):
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(([tasks[i] for i in share], seed)))
        proc.stdin.close()
    for proc, share in zip(procs, shares):
        assert proc.stdout is not None
        data = proc.stdout.read()
        if proc.wait() == 0:  # the worker is our own process, started above
            for i, c in zip(share, pickle.loads(data)):
                found[i] = c
    missing = [i for i, f in enumerate(found) if f is None]
    if missing:
        warnings.warn(f"{len(missing)} of {len(tasks)} zero-measurement searches failed in "
                      "their worker process; searching them here", stacklevel=3)
        for i in missing:
            found[i] = model_candidates(tasks[i], seed=seed)
    return found


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
        from autosched.search.measure_worker import unwritten_output

        # outputs start as NaN (or -1): an element a candidate does not write differs
        arrays = [a.copy() if a is not None else unwritten_output(t)
                  for a, t in zip(self.inputs, self.task.args)]
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
        return all(compare(str(i), g, w, self.task.precision) is None
                   for i, (g, w) in enumerate(zip(got, self.outputs)))


def best_schedule(task: Task, log: str | os.PathLike, strict_target: bool = False) -> Any:
    """The best recorded schedule of ``task`` (the default one, with a warning, if none);
    ``strict_target``: only records of the very same target fingerprint."""
    return ApplyHistoryBest([task], RecordLog(log), strict=strict_target).schedule_for(task)


def build_best(task: Task, log: str | os.PathLike, strict_target: bool = False) -> Any:
    """Build ``task`` with its best recorded schedule from ``log``."""
    return task.build(best_schedule(task, log, strict_target))
