"""Hostile log lines and failing log writes: one valid-JSON line never crashes loading, best
selection or a resume, and is never chosen as the best; a write that fails stops the job with
one clear error and leaves no torn record."""

from __future__ import annotations

import errno
import json
import math
import os
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from autosched.schedule import steps as steps_mod
from autosched.schedule.steps import STEP_TYPES
from autosched.search.record import MeasureRecord, RecordLog, records_from, target_ref
from autosched.search.space import SearchSpace
from autosched.search.task import Task
from autosched.search.tune import TaskTuner, TuneOptions, best_schedule, tune
from autosched.search.workloads import make
from tests.support.options import FUZZ


@pytest.fixture(scope="module")
def task() -> Task:
    tensors = make("gemm", [24, 20, 12])
    return Task(lambda: tensors, target="llvm", name="gemm_hard")


def _good_lines(task: Task, rng: np.random.Generator, n: int = 6) -> list[dict[str, Any]]:
    """Records of ``n`` distinct sampled candidates with random positive costs (no measuring
    needed); distinct, because a resumed tuner's seeds are rightly deduplicated."""
    space = SearchSpace(task)
    cands: list[Any] = []
    while len(cands) < n:
        c = space.sample(rng)
        if c not in cands:
            cands.append(c)
    scheds = [space.schedule(c) for c in cands]

    class _Res:  # what records_from reads of a MeasureResult
        def __init__(self, cost: float, h: str):
            from autosched.search.error_codes import ErrorCode

            self.costs, self.error_code, self.error_msg = [cost] * 3, ErrorCode.NO_ERROR, ""
            self.timestamp, self.build_time, self.ir_hash = 1.0, 0.1, h
            self.transient = False

    res = [_Res(float(c), f"{i:032x}") for i, c in enumerate(rng.uniform(1e-4, 1e-3, n))]
    extras = [{"candidate": c.as_dict()} for c in cands]
    return [json.loads(r.to_json_line()) for r in records_from(task, scheds, res, extras)]


def _split_step(d: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in d["steps"] if s["kind"] == "split" and s["factor"] is not None)


def _set_factor(value: Any):  # noqa: ANN202
    return lambda d: _split_step(d).__setitem__("factor", value)


def _drop_params(d: dict[str, Any]) -> None:
    del d["extra"]["candidate"]["params"]


# Each case turns a copy of a good record (made the fastest by a tiny cost) into a bad line.
CASES: dict[str, Any] = {
    "cost 1e400 (inf)": lambda d: d.__setitem__("costs", ["INF"]),
    "cost a 400-digit integer": lambda d: d.__setitem__("costs", ["BIG"]),
    "cost 0": lambda d: d.__setitem__("costs", [0]),
    "cost -1": lambda d: d.__setitem__("costs", [-1e-9, -1e-9]),
    "cost NaN": lambda d: d.__setitem__("costs", [float("nan")]),
    "cost a string": lambda d: d.__setitem__("costs", ["1e-9"]),
    "candidate without params": _drop_params,
    "candidate sketch a string": lambda d: d["extra"]["candidate"].__setitem__("sketch", "0"),
    "candidate knob a dict": lambda d: d["extra"]["candidate"]["params"].__setitem__(
        next(iter(d["extra"]["candidate"]["params"])), {"x": 1}),
    "candidate knob a string": lambda d: d["extra"]["candidate"]["params"].__setitem__(
        next(iter(d["extra"]["candidate"]["params"])), "x"),
    "extra a list": lambda d: d.__setitem__("extra", [1, 2]),
    "split factor a string": _set_factor("8"),
    "split factor a list": _set_factor([8]),
    "split factor a float": _set_factor(2.5),
    "split factor 2**40": _set_factor(2**40),
    "unknown error code": lambda d: d.__setitem__("error_code", "FAST"),
    "NaN inside the target": lambda d: d["target"].__setitem__("num_cores", float("nan")),
    "1e400 inside extra": lambda d: d["extra"].__setitem__("note", "INF"),
    "timestamp a 400-digit integer": lambda d: d.__setitem__("timestamp", "BIG"),
}


def _bad_line(good: dict[str, Any], case: str) -> str:
    d = json.loads(json.dumps(good))
    d["costs"], d["ir_hash"] = [1e-9] * 3, "f" * 32
    CASES[case](d)
    # json.dumps cannot write these literals; a hand-edited or hostile log can
    return json.dumps(d).replace('"INF"', "1e400").replace('"BIG"', "1" + "0" * 400)


def _load_warned(log: RecordLog) -> tuple[list[MeasureRecord], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = log.load()
    return recs, [str(w.message) for w in caught]


def _check_skipped(task: Task, path: Path, good: list[dict[str, Any]], bad_line_no: int) -> None:
    """The bad line is skipped with a warning naming it; best, best_schedule and a resumed
    tuner's seeds and training data work on the good records."""
    log = RecordLog(path)
    recs, msgs = _load_warned(log)
    assert [r.ir_hash for r in recs] == [d["ir_hash"] for d in good]
    assert any(f"line {bad_line_no}: skipping corrupt line" in m for m in msgs), msgs
    fastest = min(good, key=lambda d: d["costs"][0])
    (top,) = log.best(task.workload_key, task.target)
    assert top.ir_hash == fastest["ir_hash"] and math.isfinite(top.cost) and top.cost > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sch = best_schedule(task, path)
        tuner = TaskTuner(task, log, np.random.default_rng(0), TuneOptions(verbose=False))
    assert [s.to_dict() for s in sch.steps] == fastest["steps"]
    assert tuner.trials == len(good) and tuner.best_cost == top.cost
    feats, ys = tuner.training_data()
    assert len(feats) == len(good) and all(0 < y <= 1 for y in ys)
    assert len(tuner.seeds()) == len(good)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_line_is_skipped_never_best(task: Task, tmp_path: Path,
                                          rng: np.random.Generator, case: str) -> None:
    good = _good_lines(task, rng)
    lines = [json.dumps(d) for d in good]
    at = int(rng.integers(0, len(lines) + 1))
    lines.insert(at, _bad_line(good[0], case))
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _check_skipped(task, path, good, at + 1)


def test_a_deeply_nested_line_is_skipped(task: Task, tmp_path: Path,
                                         rng: np.random.Generator) -> None:
    good = _good_lines(task, rng)
    nested = "[" * 100_000 + "]" * 100_000
    deep = {**good[1], "ir_hash": "f" * 32, "costs": [1e-9],
            "extra": {**good[1]["extra"], "x": "DEEP"}}
    deep_extra = json.dumps(deep).replace('"DEEP"', "[" * 5000 + "]" * 5000)
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join([nested, *(json.dumps(d) for d in good), deep_extra]) + "\n")
    _check_skipped(task, path, good, 1)
    _, msgs = _load_warned(RecordLog(path))
    assert any(f"line {len(good) + 2}: skipping" in m for m in msgs), msgs


def test_every_step_field_type_is_checked() -> None:
    # fits knows each annotation the step classes use; a new one must be taught to it
    for cls in STEP_TYPES.values():
        for f in fields(cls):
            for alt in str(f.type).removeprefix("tuple[").removesuffix(", ...]").split("|"):
                assert alt.strip() in steps_mod._SCALARS, (cls.__name__, f.name, f.type)


# -- failing writes ---------------------------------------------------------------------------


def _records(task: Task, rng: np.random.Generator, n: int) -> list[MeasureRecord]:
    return [MeasureRecord.from_json(d) for d in _good_lines(task, rng, n)]


def _fake_disk(monkeypatch: pytest.MonkeyPatch, budget: int | None, chunk: int) -> None:
    """os.write that writes at most ``chunk`` bytes a call, and raises ENOSPC once ``budget``
    bytes (None: unlimited) were written: a full disk reached mid-record."""
    real_write = os.write
    left = [budget]

    def write(fd: int, data: bytes) -> int:
        if left[0] == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(len(data), chunk, left[0] if left[0] is not None else len(data))
        if left[0] is not None:
            left[0] -= n
        return real_write(fd, bytes(data[:n]))

    monkeypatch.setattr(os, "write", write)


def test_short_writes_are_completed(task: Task, tmp_path: Path, rng: np.random.Generator,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    recs = _records(task, rng, 3)
    log = RecordLog(tmp_path / "log.jsonl")
    _fake_disk(monkeypatch, None, chunk=int(rng.integers(5, 40)))
    log.append(recs)
    monkeypatch.undo()
    back, msgs = _load_warned(log)
    assert back == recs and msgs == []


def test_a_full_disk_stops_with_one_clear_error_and_nothing_torn(
        task: Task, tmp_path: Path, rng: np.random.Generator,
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, batch = _records(task, rng, 1), _records(task, rng, 3)
    log = RecordLog(tmp_path / "log.jsonl")
    log.append(first)
    # the lines as written: the target's header came with the first record
    first_line, second_line = (len(r.to_json_line(target_ref(r.target))) + 1 for r in batch[:2])
    # the disk fills in the middle of the batch's second record
    _fake_disk(monkeypatch, first_line + int(rng.integers(1, second_line - 1)), chunk=1 << 20)
    with pytest.raises(OSError) as info:
        log.append(batch)
    monkeypatch.undo()
    exc = info.value
    assert exc.errno == errno.ENOSPC and exc.filename == str(log.path)
    assert "1 of 3 records written, none torn" in str(exc)
    from autosched.cli import error_line

    text = error_line("tune-op", exc)
    assert "\n" not in text and str(log.path) in text and "No space left" in text
    back, msgs = _load_warned(log)
    assert back == first + batch[:1] and msgs == []
    assert log.path.read_bytes().endswith(b"\n")


class _NoMeasurer:
    """A tuning job must not reach measuring: the log check comes first."""

    def measure(self, task: Task, candidates: Any) -> list:
        raise AssertionError("measured before checking the log")


def test_an_unwritable_log_fails_before_measuring(task: Task, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ro.jsonl"
    path.write_text("")
    path.chmod(0o444)
    if os.geteuid() == 0:  # root writes read-only files: refuse writes as the kernel would
        real_open = os.open

        def open_(p: Any, flags: int, *args: Any) -> int:
            if os.fspath(p) == str(path) and flags & (os.O_WRONLY | os.O_RDWR):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))
            return real_open(p, flags, *args)

        monkeypatch.setattr(os, "open", open_)
    with pytest.raises(PermissionError, match="nothing was measured") as info:
        tune(task, trials=4, log=path, measurer=_NoMeasurer(), model=object(),
             options=TuneOptions(verbose=False))
    assert info.value.filename == str(path)
    with pytest.raises(IsADirectoryError, match="nothing was measured"):
        tune(task, trials=4, log=tmp_path, measurer=_NoMeasurer(), model=object(),
             options=TuneOptions(verbose=False))


def test_a_full_device_fails_before_measuring(task: Task, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    class _Full:
        f_bavail, f_frsize = 3, os.statvfs(tmp_path).f_frsize

    monkeypatch.setattr(os, "fstatvfs", lambda fd: _Full())
    with pytest.raises(OSError, match="free; nothing was measured") as info:
        tune(task, trials=4, log=tmp_path / "l.jsonl", measurer=_NoMeasurer(), model=object(),
             options=TuneOptions(verbose=False))
    assert info.value.errno == errno.ENOSPC


def _first_knob(d: dict[str, Any], tile: bool) -> str:
    params = d["extra"]["candidate"]["params"]
    return next(k for k, v in params.items() if isinstance(v, list) == tile)


ALIENS: dict[str, Any] = {
    "unknown sketch": lambda d: d["extra"]["candidate"].__setitem__("sketch", 999),
    "a tile list too short": lambda d: d["extra"]["candidate"]["params"][
        _first_knob(d, True)].pop(),
    "a tile length 0": lambda d: d["extra"]["candidate"]["params"][
        _first_knob(d, True)].__setitem__(0, 0),
    "a choice no knob offers": lambda d: d["extra"]["candidate"]["params"].__setitem__(
        _first_knob(d, False), 12345),
}


@pytest.mark.parametrize("alien", sorted(ALIENS))
def test_a_candidate_outside_the_space_is_no_seed(task: Task, tmp_path: Path,
                                                  rng: np.random.Generator, alien: str) -> None:
    # a valid record whose candidate this task's space cannot take (another version's
    # sketches, or a hand-edited value): kept as a measurement, but neither a seed nor
    # training data, and resuming does not crash
    good = _good_lines(task, rng)
    bad = json.loads(json.dumps(good[0]))
    ALIENS[alien](bad)
    bad["costs"], bad["ir_hash"] = [1e-9] * 3, "f" * 32
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in [*good, bad]) + "\n")
    tuner = TaskTuner(task, RecordLog(path), rng, TuneOptions(verbose=False))
    assert tuner.trials == len(good) + 1
    seeds = tuner.seeds()
    assert len(seeds) == len(good) and all(c.sketch < 999 for c in seeds)
    feats, _ = tuner.training_data()
    assert len(feats) == len(good)


# -- fuzzing: random log lines ------------------------------------------------------------------

FUZZ_CASES = max(1, FUZZ.cases // 8)
FUZZ_SEED = FUZZ.seed

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 1, 2**31, 2**63, 10**400, 0.0, -0.0, 1e-320, 1e308])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=3),
    max_leaves=6)


_edges = st.sampled_from([0, -1, -1e-9, 2**31, 2**63, 10**400, float("nan"), float("inf"),
                          -float("inf"), 1e-320, True, "1e-3", None, [], {}])


_numbers = st.one_of(_edges, st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(-(2**70), 2**70))
_HOT = ["costs", "costs", "costs", "steps", "steps", "steps", "extra", "extra", "extra",
        "error_code", "version"]


def _mutate(data: st.DataObject, d: Any, top: bool = False) -> Any:
    """``d`` with one value somewhere inside replaced by a random JSON value (numbers mostly
    by edge values), or deleted."""
    go_in = top or data.draw(st.integers(0, 3)) > 0
    if isinstance(d, dict) and d and go_in:
        # at the top, mostly the fields that decide what is measured and what is best
        key = data.draw(st.sampled_from([*_HOT, *sorted(d)] if top else sorted(d)))
        if data.draw(st.integers(0, 7)) == 0:
            return {k: v for k, v in d.items() if k != key}
        return {**d, key: _mutate(data, d[key])}
    if isinstance(d, list) and d and go_in:
        i = data.draw(st.integers(0, len(d) - 1))
        return [*d[:i], _mutate(data, d[i]), *d[i + 1:]]
    if isinstance(d, list) and d and all(type(x) is int for x in d) and data.draw(
            st.booleans()):
        return [data.draw(st.integers(-3, 2**40)) for _ in d]  # a knob's tile lengths
    if isinstance(d, (int, float)) and not isinstance(d, bool) and data.draw(
            st.integers(0, 3)) > 0:
        return data.draw(_edges)
    return data.draw(_json)


def _line(data: st.DataObject, good: list[dict[str, Any]]) -> str:
    kind = data.draw(st.sampled_from(["mutate", "mutate", "mutate", "truncate", "garbage"]))
    base = dict(data.draw(st.sampled_from(good)), ir_hash="e" * 32, costs=[1e-9])
    if kind == "mutate":
        if data.draw(st.booleans()):  # a number-valued field set to edge values
            base["costs"] = data.draw(st.lists(_numbers, min_size=1, max_size=3))
            base[data.draw(st.sampled_from(["timestamp", "build_time"]))] = data.draw(_numbers)
        return json.dumps(_mutate(data, base, top=True))  # NaN / Infinity literals included
    if kind == "truncate":
        text = json.dumps(base)
        return text[:data.draw(st.integers(0, len(text) - 1))]
    return data.draw(st.text(max_size=40)).replace("\n", " ")


@pytest.fixture(scope="module")
def fuzz_good(task: Task) -> list[dict[str, Any]]:
    return _good_lines(task, np.random.default_rng(FUZZ_SEED))


@seed(FUZZ_SEED)
@settings(max_examples=FUZZ_CASES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_random_log_lines(task: Task, fuzz_good: list[dict[str, Any]],
                               tmp_path_factory: pytest.TempPathFactory,
                               data: st.DataObject) -> None:
    lines = [json.dumps(d) for d in fuzz_good]
    for _ in range(data.draw(st.integers(1, 6))):
        lines.insert(data.draw(st.integers(0, len(lines))), _line(data, fuzz_good))
    path = tmp_path_factory.mktemp("fuzz") / "log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    log = RecordLog(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recs = log.load()
        for r in recs:
            assert all(math.isfinite(c) and c > 0 for c in r.costs), r.costs
            json.loads(r.to_json_line())
            r.schedule_steps()
        for top in log.best(task.workload_key, task.target, k=3):
            assert math.isfinite(top.cost) and top.cost > 0
        best_schedule(task, path)
        tuner = TaskTuner(task, log, np.random.default_rng(0), TuneOptions(verbose=False))
        tuner.seeds()
        feats, ys = tuner.training_data()
    assert all(math.isfinite(y) and 0 <= y <= 1 for y in ys)
