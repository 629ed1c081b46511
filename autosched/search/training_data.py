"""Cost-model training data from tuning logs: each record's steps replayed on its task, lowered,
and featurised for the target it was measured on; and ``build_model``, which trains the
pretrained model from logs (``autosched train-cost-model``, benchmarks/pretrain_cost_model.py).

A record names its workload by key only, so the tasks come from the caller: the tasks of the
models the logs were tuned on (``graph.extract_tasks`` for each target the logs hold) and the
named operators of ``workloads.py``. Records of workloads none of them has, and records whose
steps no longer replay, are counted and skipped.

Example::

    records = read_log("tuning_logs/resnet18_llvm_znver4_3000.jsonl.gz")
    samples, stats = samples_from_records(records, {t.workload_key: t for t in tasks}, "znver4")
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autosched.cost_model.features import extract_features
from autosched.cost_model.pretrain import Samples, workload_of
from autosched.errors import CompileError, LowerError, ScheduleError
from autosched.search.record import MeasureRecord, RecordLog
from autosched.search.task import Task
from autosched.targets.target import Target, parse

MAX_LOG_BYTES = 1 << 30  # decompressed size of a gzipped log: data from outside, bounded

# Target options as the fingerprint fields of a record spell them (every backend's fingerprint
# names its fields; the options a backend does not take are not in its fingerprints).
_OPTION_OF_FIELD = {"triple": "mtriple", "cpu": "mcpu", "features": "mattr",
                    "num_cores": "num-cores", "arch": "arch"}

# Operators the project's cost-model logs measured, at their shapes (the workload key of a
# task does not depend on its target).
OPERATORS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("gemm", (1024, 1024, 1024)),
    ("conv2d", (1, 64, 56, 56, 64, 3, 3, 1, 1)),
)


def read_log(path: str | os.PathLike) -> list[MeasureRecord]:
    """Every record of a log, gzipped (``.gz``) or not; corrupt lines skipped with a warning."""
    path = Path(path)
    if path.suffix != ".gz":
        return RecordLog(path).load()
    with gzip.open(path, "rb") as fh:
        data = fh.read(MAX_LOG_BYTES + 1)
    if len(data) > MAX_LOG_BYTES:
        raise ValueError(f"{path} decompresses to over {MAX_LOG_BYTES >> 30} GiB")
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / path.stem
        plain.write_bytes(data)
        return RecordLog(plain).load()


def target_from_fingerprint(fp: Mapping[str, Any]) -> Target:
    """The Target a record was measured on, rebuilt from its fingerprint (CompileError when no
    backend takes it)."""
    options = [f"-{opt}={fp[f]}" for f, opt in _OPTION_OF_FIELD.items()
               if fp.get(f) not in (None, "")]
    return parse(" ".join([str(fp.get("kind", "")), *options]))


def operator_tasks() -> list[Task]:
    """The named operators the project's logs measured (``OPERATORS``)."""
    from autosched.search.workloads import WORKLOADS

    return [Task(WORKLOADS[name], args=shape, name=name) for name, shape in OPERATORS]


def log_targets(records: Iterable[MeasureRecord]) -> list[Target]:
    """The distinct targets the records were measured on (those a backend here can parse)."""
    known: dict[str, Target | None] = {}
    for r in records:
        _target_of(r, known)
    return [t for t in known.values() if t is not None]


def _target_of(rec: MeasureRecord, known: dict[str, Target | None]) -> Target | None:
    """The record's target, parsed once per target key into ``known`` (None: no backend here
    takes it)."""
    key = rec.target_key
    if key not in known:
        try:
            known[key] = target_from_fingerprint(rec.target)
        except CompileError:
            known[key] = None
    return known[key]


def _short(fp: Mapping[str, Any]) -> str:
    """A target in a few characters for tables: kind, CPU or GPU arch, threads."""
    parts = [str(fp.get(f)) for f in ("kind", "cpu", "arch") if fp.get(f)]
    threads = f"/t{fp['num_cores']}" if fp.get("num_cores") else ""
    return "/".join(parts) + threads


@dataclass
class LogStats:
    """What became of one log's records."""

    path: str
    records: int = 0
    used: int = 0
    unknown_workload: int = 0
    not_replayed: int = 0
    failed: int = 0
    tensor_cores: int = 0  # used records of tensor-core schedules (a tensorize step)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def line(self) -> str:
        return (f"{self.path}: {self.records} records, {self.used} used ({self.unknown_workload} "
                f"of unknown workloads, {self.not_replayed} not replayed, {self.failed} failed "
                "measurements kept as the slowest)")


def samples_from_records(records: Sequence[MeasureRecord], tasks: Mapping[str, Task],
                         label: str, samples: Samples | None = None
                         ) -> tuple[Samples, LogStats]:
    """Add each record of a known workload to ``samples`` (a new Samples if None): features of
    its replayed, lowered steps on the record's target, its median cost (inf when it failed),
    group ``workload key @ target key``. Transient failures (a killed worker) say nothing and
    are skipped."""
    samples = samples if samples is not None else Samples()
    stats = LogStats(label, records=len(records))
    targets: dict[str, Target | None] = {}
    for rec in records:
        task = tasks.get(rec.workload_key)
        if task is None:
            stats.unknown_workload += 1
            continue
        if rec.transient or rec.in_model:  # not a candidate measured alone
            continue
        target = _target_of(rec, targets)
        if target is None:
            stats.unknown_workload += 1
            continue
        try:
            steps = rec.schedule_steps()
            func = task.lower(task.schedule(steps))
        except (ScheduleError, LowerError):
            stats.not_replayed += 1
            continue
        stats.failed += int(not rec.ok)
        stats.tensor_cores += any(st.kind == "tensorize" for st in steps)
        key = rec.target_key
        name = f"{task.name} {rec.workload_key[:8]} on {_short(rec.target)}"
        samples.add(extract_features(func, target), rec.cost, f"{rec.workload_key}@{key}", name)
        stats.used += 1
    return samples, stats


def _held_share(share: float) -> Callable[[str], bool]:
    """Whether a group's workload is in the held-out share (by a hash of its key: the same
    workloads on every run and every target)."""
    def held(group: str) -> bool:
        h = int(hashlib.sha256(workload_of(group).encode()).hexdigest()[:8], 16)
        return h / 16**8 < share
    return held


def _held_workloads(samples: Samples) -> Callable[[str], bool]:
    """Whether a group's workload is one of those ``samples`` hold (on any target)."""
    keys = {workload_of(g) for g in samples.groups}
    return lambda group: workload_of(group) in keys


def build_model(logs: Sequence[str | os.PathLike], output: str | os.PathLike,
                tasks_for: Callable[[Target], Iterable[Task]] = lambda target: (), *,
                hold_out: Sequence[str | Sequence[str]] = (), hold_out_share: float = 0.0,
                rounds: int | None = None, report: Callable[[str], None] = print,
                evaluated: Callable[[str, Any, Any], None] | None = None,
                device: str | None = None) -> Path:
    """Train a model on ``logs`` and write it with its manifest into ``output``; returns the
    manifest's path. The records' tasks: the named operators, and ``tasks_for(target)`` for
    each target the logs hold (the tasks of the models they tuned). Before, for each of
    ``hold_out`` (a log, or several logs held out together) and ``hold_out_share``, print how
    a model trained without those workloads ranks them, and pass ``evaluated`` (what was held
    out, that model, the held-out samples), e.g. to plot them. ``device`` ("cpu", "gpu"):
    only the records of targets of that kind (a log left with none is skipped, and so is a
    hold-out of such logs)."""
    from autosched.cost_model import pretrain

    t0 = time.perf_counter()
    records = {str(path): read_log(path) for path in logs}
    if device is not None:
        known: dict[str, Target | None] = {}
        records = {path: kept for path, recs in records.items() if (kept := [
            r for r in recs if getattr(_target_of(r, known), "device", None) == device])}
        hold_out = [h for h in hold_out if all(
            str(p) in records for p in ([h] if isinstance(h, (str, os.PathLike)) else h))]
    tasks = {t.workload_key: t for t in operator_tasks()}
    targets = log_targets(r for recs in records.values() for r in recs)
    for target in targets:  # a workload key does not depend on the target: one catalogue
        tasks.update((t.workload_key, t) for t in tasks_for(target))
    per_log: dict[str, Samples] = {}
    stats = []
    for path, recs in records.items():
        per_log[path], st = samples_from_records(recs, tasks, Path(path).name)
        stats.append(st)
        report(st.line())
    everything = pretrain.Samples()
    for s in per_log.values():
        everything.extend(s)
    report(f"{len(everything)} samples in {len(set(everything.groups))} groups "
           f"({time.perf_counter() - t0:.0f} s)")
    rounds = rounds or pretrain.DEFAULT_ROUNDS
    held_out: list[tuple[str, Callable[[str], bool]]] = []
    for paths in hold_out:
        group = [str(paths)] if isinstance(paths, (str, os.PathLike)) else [str(p) for p in paths]
        together = pretrain.Samples()
        for path in group:
            together.extend(per_log[path])
        names = ", ".join(Path(path).name for path in group)
        held_out.append((f"workloads of {names}", _held_workloads(together)))
    if hold_out_share > 0:
        held_out.append((f"{hold_out_share:.0%} of the workloads", _held_share(hold_out_share)))
    for what, held in held_out:
        train_part, test_part = everything.split(held)
        report(f"\nheld out: {what} ({len(test_part)} samples in "
               f"{len(set(test_part.groups))} groups; trained on {len(train_part)})")
        if len(train_part) < 2 or not len(test_part):
            report("  nothing to train on or to evaluate")
            continue
        model = pretrain.train(train_part, rounds)
        report(pretrain.ranking_table(pretrain.evaluate(model, test_part),
                                      pretrain.random_rankings(test_part)))
        report("a tuning job on these workloads after k measurements:\n"
               + pretrain.finetune_table(model, test_part))
        if evaluated is not None:
            evaluated(what, model, test_part)
    model = pretrain.train(everything, rounds)
    info = {"logs": [st.as_dict() for st in stats], "samples": len(everything),
            "groups": len(set(everything.groups)),
            "held_out_evaluations": [what for what, _ in held_out]}
    manifest = pretrain.save_pretrained(model, Path(output), info)
    report(f"\nwrote {pretrain.MODEL_FILE} ({model.num_trees} trees) and {manifest.name} in "
           f"{output}")
    return manifest
