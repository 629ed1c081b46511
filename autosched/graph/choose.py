"""Choosing each task's schedule inside the model it runs in.

The tuner times a candidate alone: many calls in a row on inputs that the calling thread
wrote, its own data warm in the caches. In the model, the same kernel reads what the kernel
before it just wrote (a parallel producer leaves part of it in another core's cache), its
pool threads may have gone to sleep during a serial kernel before it, and its neighbours' data
share the caches. On a small model those effects are as large as the gains tuning finds
(a demo kernel measured 23 us alone and 16 us in the model, its tuned rival 21 us alone and 20
in the model), so a log could make a model slower than compiling it untuned.

``choose`` settles it where it matters: the untuned default and the best candidates of every
task run in the model itself, in alternating rounds (a task without a record, where the
compile gives it the cost model's pick, GPUs by default: the default and that pick); each
task keeps the one fastest there;
the mix is checked end to end against all-untuned and all-best; the winners are appended to
the log as chosen records (``MeasureRecord.in_model``), which ``compile`` applies before any
time measured alone. A model compiled with the log is then, as measured, never slower than
the same model untuned.

Example::

    aus.tune_graph(graph, "llvm", trials=200, log=log)   # chooses at the end (choose=True)
    for c in choose(graph, "llvm", log):                # again, e.g. after merging logs
        print(c.task, c.chosen, c.seconds, c.untuned_seconds)
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autosched.graph.executor import random_inputs
from autosched.graph.graph import Graph
from autosched.targets.target import Target, parse
from autosched.te.dtype import DEFAULT_PRECISION

_log = logging.getLogger(__name__)

UNTUNED = "untuned"
PICK = "model pick"  # the cost model's pick, which compile gives a task without a record
UNTUNED_IR = "untuned_ir"  # a choice record's key: the IR hash of the default it was timed against
ROUND_S = 0.02  # seconds of model runs per variant and round (repeat=None)
MAX_REPEAT = 50
# a tuned candidate is kept only where it beats the untuned default in the model by this much
# (the median of its per-round ratios): a tie within the noise keeps the default
KEEP_MARGIN = 0.01


@dataclass
class Choice:
    """One workload's choice: ``chosen`` is "untuned", "record N" (the N-th fastest alone)
    or "model pick" (a task without a record); seconds are its kernels' median time in the
    model (all its occurrences)."""

    task: str
    workload_key: str
    chosen: str
    seconds: float
    untuned_seconds: float


@dataclass
class _Candidate:
    label: str
    steps: list[dict[str, Any]]
    ir_hash: str
    module: Any
    samples: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return float(np.median(self.samples)) if self.samples else float("inf")


def describe_choices(choices: list[Choice]) -> str:
    """One line: how many tasks keep a tuned schedule and what the model's kernels take."""
    tuned = sum(c.chosen != UNTUNED for c in choices)
    ms = sum(c.seconds for c in choices) * 1e3
    untuned = sum(c.untuned_seconds for c in choices) * 1e3
    return (f"chosen in the model: {tuned} of {len(choices)} tasks keep a tuned schedule; "
            f"their kernels {ms:.4g} ms there (untuned {untuned:.4g} ms)")


def choose_after_tuning(graph: Graph, tasks: Sequence[Any], log: str | os.PathLike,
                        precision: str, runner: Any) -> list[Choice]:
    """``choose`` at the end of a model's tuning (``tasks``: the model's tasks, as tuned),
    when the model runs here: a target of this machine (the host CPU or its GPU) whose
    candidates it measured (``runner`` None, "local" or a Measurer); else nothing."""
    from autosched.search.measure import Measurer

    local = runner in (None, "local") or isinstance(runner, Measurer)
    if not tasks or not (local and runs_here(tasks[0].target)) or chosen_since_last_trial(
            tasks, log):
        return []
    return choose(graph, tasks[0].target, log, precision)


def chosen_since_last_trial(tasks: Sequence[Any], log: str | os.PathLike) -> bool:
    """Whether the log's latest choice for the workloads of a model's ``tasks`` is newer than
    every trial of them (a tuning run that measured nothing new, its budget spent, chooses
    nothing again: one choosing covers every workload of the model), and was made against
    the untuned default that compiling gives now: a choice made against another default
    (a compiler whose defaults changed since, or a log that does not say) chooses again."""
    from autosched.search.record import RecordLog

    records = RecordLog(log)
    trials = [r.timestamp for t in tasks for r in records.records_for(t.workload_key, t.target)]
    latest = {}
    for t in tasks:
        mine = records.choices_for(t.workload_key, t.target)
        if mine:
            latest[t.workload_key] = (t, max(mine, key=lambda r: r.timestamp))
    if not latest or max(r.timestamp for _, r in latest.values()) < max(trials, default=0.0):
        return False
    return all(r.extra.get(UNTUNED_IR) == default_ir_hash(t) for t, r in latest.values())


def default_ir_hash(task: Any) -> str:
    """The IR hash of ``task``'s untuned default schedule."""
    return _untuned(task)[1]


def _untuned(task: Any) -> tuple[Any, str]:
    """``task``'s untuned default schedule and the hash of its IR."""
    from autosched.search.record import ir_hash
    from autosched.search.space import SearchSpace

    sch = SearchSpace(task).default_schedule()
    return sch, ir_hash(task.lower(sch))


def runs_here(tgt: Target) -> bool:
    """Whether a model compiled for ``tgt`` runs on this machine's own hardware: the host
    CPU, or a GPU that is here (not the CUDA C emulated on the host, whose times say
    nothing)."""
    return tgt.backend.runs_here(tgt)


def choose(graph: Graph, target: str | Target, log: str | os.PathLike,
           precision: str = DEFAULT_PRECISION, top: int = 2, rounds: int = 9,
           repeat: int | None = None, seed: int = 0, schedule: str | None = None
           ) -> list[Choice]:
    """Time the untuned default and the ``top`` best records of every task in the model
    (of a task without a record, the default and the cost model's pick where ``schedule``,
    as compile resolves it, gives that task the pick), ``rounds`` alternating rounds of
    ``repeat`` runs each (None: as many as last about ``ROUND_S``, at least 3); append the
    winners to ``log`` (records with ``in_model``); return one Choice per workload that had
    two candidates or more."""
    tgt = parse(target)
    if not runs_here(tgt):
        raise ValueError(f"choosing schedules in the model runs the model here; {tgt} is not "
                         "this machine")
    model, cands = candidates(graph, tgt, log, precision, top, schedule=schedule)
    inputs = random_inputs(graph, seed=seed)
    kernels = model.kernels
    if all(len(c) < 2 for c in cands.values()):
        return []
    if repeat is None:
        once = float(np.sum(model.kernel_seconds(inputs, 1)))
        repeat = int(np.clip(ROUND_S / max(once, 1e-9), 3, MAX_REPEAT))
    variants = max(len(c) for c in cands.values())

    def modules(pick: dict[str, int]) -> list[Any]:
        return [cands[k.task.workload_key][pick[k.task.workload_key]].module for k in kernels]

    def seconds_per_kernel(pick: dict[str, int]) -> np.ndarray:
        return model.kernel_seconds(inputs, repeat, modules(pick))

    keys = list(cands)
    for _ in range(rounds):
        for v in range(variants):
            pick = {key: min(v, len(cands[key]) - 1) for key in keys}
            times = seconds_per_kernel(pick)
            for key in keys:
                if v < len(cands[key]):
                    cands[key][v].samples.append(
                        float(sum(t for k, t in zip(kernels, times)
                                  if k.task.workload_key == key)))
    def seconds_whole(pick: dict[str, int]) -> float:
        return float(model.run_seconds(inputs, repeat, modules(pick)))

    mix = {key: fastest([c.samples for c in cands[key]]) for key in keys}
    pick = _end_to_end(seconds_whole, keys, cands, mix, rounds)
    return _append(log, kernels, cands, pick, tgt)


def candidates(graph: Graph, target: str | Target, log: str | os.PathLike,
               precision: str = DEFAULT_PRECISION, top: int = 2, executor: bool = True,
               schedule: str | None = None) -> tuple[Any, dict[str, list[_Candidate]]]:
    """The model compiled with ``log`` (tasks without a record get ``schedule``, resolved as
    compile does) and, per workload, what ``choose`` times: the untuned default and the
    ``top`` best records, or the cost model's pick that compile gave a task without one,
    each built (so that, with ``executor`` false, a machine without the device fills the
    compile cache for a later choosing on it)."""
    from autosched.graph.compiler import compile as compile_graph
    from autosched.graph.compiler import resolve_schedule
    from autosched.search.record import RecordLog
    from autosched.search.tune import model_schedules

    tgt = parse(target)
    schedule = resolve_schedule(schedule, tgt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no tuning record for ...": those stay untuned
        model = compile_graph(graph, tgt, log=log, precision=precision, executor=executor,
                              schedule=schedule)
    records = RecordLog(log)
    first: dict[str, Any] = {}  # each workload's first kernel: a recurring one is built once
    for k in model.kernels:
        first.setdefault(k.task.workload_key, k)
    picked: dict[str, Any] = {}
    if schedule == "model":  # as compile: the picks of the tasks without a record (cached)
        bare = [k.task for key, k in first.items() if not records.best(key, tgt)]
        picked = {t.workload_key: p for t, p in zip(bare, model_schedules(bare))}
    cands = {key: _candidates(k, tgt, records, top, picked.get(key))
             for key, k in first.items()}
    return model, cands


def _candidates(kernel: Any, tgt: Target, records: Any, top: int, pick: Any = None
                ) -> list[_Candidate]:
    """The untuned default, then the ``top`` best records (a previous choice first), or the
    cost model's ``pick`` (the schedule compile gave a task without a record), each built
    once (the same IR only once; the first record, or the pick, is the kernel's compiled
    module)."""
    from autosched.search.record import ir_hash

    task = kernel.task
    untuned, untuned_hash = _untuned(task)
    out = [_Candidate(UNTUNED, [s.to_dict() for s in untuned.steps], untuned_hash,
                      task.build(untuned))]
    if pick is not None:
        h = ir_hash(task.lower(pick))
        if h != untuned_hash:
            out.append(_Candidate(PICK, [s.to_dict() for s in pick.steps], h, kernel.module))
        return out
    for n, rec in enumerate(records.best(task.workload_key, tgt, k=top), 1):
        if any(rec.ir_hash and rec.ir_hash == c.ir_hash for c in out):
            continue
        try:
            sch = task.schedule(rec.schedule_steps())
        except Exception as exc:  # noqa: BLE001  compile warns about it too
            _log.info("%s: record %d does not replay (%s)", task.name, n, exc)
            continue
        module = kernel.module if n == 1 else task.build(sch)
        out.append(_Candidate(f"record {n}", list(rec.steps), rec.ir_hash, module))
    return out


def fastest(samples: Sequence[Sequence[float]], margin: float = KEEP_MARGIN) -> int:
    """The index of the fastest of candidates timed in the same alternating rounds (one
    sample each per round; index 0 the untuned default): by the median over rounds of each
    one's time over the default's in that round, so that a busy spell that lands on part of
    the rounds cannot move one candidate's median into the spell and another's out of it.
    A candidate is kept only where that median ratio is below 1 - ``margin``; else 0."""
    base = np.asarray(samples[0], dtype=float)
    ratios = [float(np.median(np.asarray(s, dtype=float) / base)) for s in samples]
    best = int(np.argmin(ratios))
    return best if ratios[best] < 1.0 - margin else 0


def _end_to_end(seconds_whole: Any, keys: list[str], cands: dict[str, list[_Candidate]],
                mix: dict[str, int], rounds: int) -> dict[str, int]:
    """The fastest end to end, in alternating rounds, of all untuned, the mix and all best
    alone (``fastest``), each timed as a whole run (``seconds_whole``): a task's time in the
    model also depends on its neighbours' schedules, and on a GPU a run's kernels go back to
    back where the per-kernel times have events between them."""
    options = {"untuned": dict.fromkeys(keys, 0), "mix": mix,
               "best alone": {key: min(1, len(cands[key]) - 1) for key in keys}}
    unique: dict[tuple, str] = {}
    for name, p in options.items():
        unique.setdefault(tuple(sorted(p.items())), name)
    if len(unique) == 1:
        return mix
    totals: dict[str, list[float]] = {name: [] for name in unique.values()}
    for _ in range(rounds):
        for name in totals:
            totals[name].append(seconds_whole(options[name]))
    names = list(totals)  # "untuned" first
    best = names[fastest([totals[name] for name in names])]
    _log.info("in the model, end to end: %s", ", ".join(
        f"{name} {np.median(t) * 1e3:.4g} ms" for name, t in totals.items()))
    return options[best]


def _append(log: str | os.PathLike, kernels: list[Any], cands: dict[str, list[_Candidate]],
            pick: dict[str, int], tgt: Target) -> list[Choice]:
    from autosched.search.record import MeasureRecord, RecordLog, target_fingerprint
    from autosched.version import __version__

    fp = target_fingerprint(tgt)
    records, choices = [], []
    names = {k.task.workload_key: k.task.name for k in kernels}
    for key, cs in cands.items():
        if len(cs) < 2:
            continue
        c = cs[pick[key]]
        records.append(MeasureRecord(
            workload_key=key, task_name=names[key], target=fp, steps=c.steps,
            costs=list(c.samples), timestamp=time.time(), autosched_version=__version__,
            ir_hash=c.ir_hash, extra={"in_model": True, "chosen": c.label,
                                      UNTUNED_IR: cs[0].ir_hash}))
        choices.append(Choice(names[key], key, c.label, c.seconds, cs[0].seconds))
    RecordLog(log).append(records)
    return choices
