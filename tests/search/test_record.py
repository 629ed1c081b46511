"""Tuning records: JSON-lines round trip, torn and corrupt lines, lookups, apply_history_best."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from autosched import te
from autosched.schedule import steps as S
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import MeasureResult
from autosched.search.record import (
    ApplyHistoryBest,
    MeasureRecord,
    RecordLog,
    apply_history_best,
    fingerprint_key,
    ir_hash,
    records_from,
    target_fingerprint,
)
from autosched.search.task import Task
from autosched.targets.target import parse
from tests.support import ROOT


def _matmul_task(m: int = 24, n: int = 20, k: int = 12, name: str = "C") -> Task:
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name=name)
    return Task(C, target="llvm")


def _record(task: Task, cost: float | None, steps: list | None = None, ir: str = "",
            target: dict | None = None) -> MeasureRecord:
    ok = cost is not None
    return MeasureRecord(
        workload_key=task.workload_key, task_name=task.name,
        target=target or target_fingerprint(task.target),
        steps=[s.to_dict() for s in (steps or [])], costs=[cost] * 3 if ok else [],
        error_code="NO_ERROR" if ok else "RUN_TIMEOUT", error_msg="" if ok else "too slow",
        timestamp=time.time(), build_time=0.1, autosched_version="0.1.0",
        ir_hash=ir or f"h{cost}", extra={"params": [1, 2]},
    )


def test_fingerprint_llvm_and_cuda() -> None:
    fp = target_fingerprint(parse("llvm"))
    for key in ("triple", "cpu", "features", "num_cores", "llvmlite", "llvm"):
        assert key in fp, key
    assert fingerprint_key(fp) == fingerprint_key(parse("llvm")) == fingerprint_key(json.loads(
        json.dumps(fp)))
    # keyed by architecture and vector ISA, not the CPU's name (tests/search/test_target_keys.py)
    assert fingerprint_key(fp).startswith(f"llvm/{fp['triple'].split('-')[0]}-")
    assert fp["cpu"] not in fingerprint_key(fp)
    # the thread count is part of the key: schedules tuned for 1 thread differ from 2
    assert target_fingerprint(parse("llvm -num-cores=7"))["num_cores"] == 7
    assert fingerprint_key(parse("llvm -num-cores=7")).endswith("/t7")
    cross = fingerprint_key(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    assert "aarch64" in cross and cross != fingerprint_key(parse("llvm"))
    cuda = target_fingerprint(parse("cuda -arch=sm_80"))
    assert cuda["arch"] == "sm_80" and fingerprint_key(cuda) == "cuda/sm_80"


def test_append_load_round_trip(tmp_path: Path) -> None:
    task = _matmul_task()
    log = RecordLog(tmp_path / "deep" / "dir" / "mm.jsonl")  # parent dirs are made
    recs = [_record(task, 2e-3, [S.Split("C", "i", factor=4)]), _record(task, None)]
    log.append(recs)
    third = _record(task, 1e-3)
    log.append([third])
    back = log.load()
    assert back == [*recs, third]
    assert back[0].schedule_steps() == [S.Split("C", "i", factor=4)]
    assert back[1].error_code == "RUN_TIMEOUT" and back[1].cost == float("inf")
    assert back[0].source.endswith("mm.jsonl:1") and back[2].source.endswith(":3")
    lines = log.path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["version"] == 1
    assert set(json.loads(lines[0])) >= {"workload_key", "target", "steps", "costs",
                                        "error_code", "timestamp", "autosched_version"}


def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert RecordLog(tmp_path / "none.jsonl").load() == []


def test_a_log_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jsonl")  # reading it blocked forever
    with pytest.raises(OSError, match="not a regular file"):
        RecordLog(tmp_path / "pipe.jsonl").load()


def test_truncated_and_corrupt_lines_are_skipped_with_warnings(tmp_path: Path) -> None:
    task = _matmul_task()
    log = RecordLog(tmp_path / "mm.jsonl")
    good = [_record(task, c) for c in (3e-3, 2e-3, 1e-3)]
    log.append(good)
    lines = log.path.read_text().splitlines()
    lines.insert(1, '{"version": 1, "workload_key": "x", "steps": [')  # corrupt middle (line 2)
    lines.insert(2, json.dumps({**json.loads(lines[0]), "version": 99}))  # newer format (line 3)
    torn = lines[-1][: len(lines[-1]) // 2]                             # torn tail (line 6)
    log.path.write_text("\n".join(lines) + "\n" + torn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = log.load()
    assert back == good
    msgs = [str(w.message) for w in caught]
    assert any("line 2" in m and "corrupt" in m and str(log.path) in m for m in msgs), msgs
    assert any("line 6" in m and "truncated" in m for m in msgs), msgs
    assert any("version 1" in m and "3 (version 99)" in m for m in msgs), msgs
    # appending after a torn tail starts a fresh line, so the new record is whole
    log.append([_record(task, 5e-4)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = log.load()
    assert [r.cost for r in back] == [3e-3, 2e-3, 1e-3, 5e-4]


def test_best_matches_target_and_ignores_errors(tmp_path: Path) -> None:
    task = _matmul_task()
    other = _matmul_task(24, 20, 13)  # another workload
    log = RecordLog(tmp_path / "mm.jsonl")
    aarch64 = target_fingerprint(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    log.append([
        _record(task, 3e-3, ir="a"), _record(task, None, ir="b"), _record(task, 1e-3, ir="c"),
        _record(task, 1e-4, ir="d", target=aarch64),  # fastest, but on another machine
        _record(other, 1e-5, ir="e"), _record(task, 2e-3, ir="f"),
    ])
    (top,) = log.best(task.workload_key, task.target)
    assert top.ir_hash == "c"
    assert [r.ir_hash for r in log.best(task.workload_key, task.target, k=5)] == ["c", "f", "a"]
    assert [r.ir_hash for r in log.best(task.workload_key, aarch64, k=5)] == ["d"]
    assert log.best("no-such-key", task.target) == []
    assert log.measured_ir_hashes(task.workload_key, task.target) == {"a", "b", "c", "f"}


def test_records_from_measure_results() -> None:
    task = _matmul_task()
    sch = task.schedule([S.Split("C", "j", factor=8)])
    h = ir_hash(task.lower(sch))
    results = [MeasureResult((1e-3, 2e-3, 3e-3), ErrorCode.NO_ERROR, "", 0.2, 0.5, 1.0, h),
               MeasureResult((), ErrorCode.WRONG_ANSWER, "x" * 5000, 0.2, 0.1, 2.0, "h2")]
    recs = records_from(task, [sch, [S.Split("C", "i", factor=2)]], results,
                        extras=[{"p": 1}, {"p": 2}])
    assert recs[0].steps == [S.Split("C", "j", factor=8).to_dict()] and recs[0].cost == 2e-3
    assert recs[0].ir_hash == h and recs[0].target_key == fingerprint_key(parse("llvm"))
    assert recs[1].error_code == "WRONG_ANSWER" and len(recs[1].error_msg) == 2000
    assert recs[1].extra == {"p": 2} and recs[0].workload_key == task.workload_key
    back = MeasureRecord.from_json(json.loads(recs[1].to_json_line()))
    assert back == recs[1]


def test_from_json_rejects_non_records() -> None:
    with pytest.raises(ValueError, match="lacks"):
        MeasureRecord.from_json({"version": 1, "workload_key": "k"})
    with pytest.raises(ValueError, match="costs"):
        MeasureRecord.from_json({"version": 1, "workload_key": "k", "target": {}, "steps": [],
                                 "costs": ["fast"], "error_code": "NO_ERROR"})


def test_apply_history_best_replays_and_warns_on_missing(tmp_path: Path) -> None:
    task = _matmul_task()
    untuned = _matmul_task(8, 8, 8)
    log = RecordLog(tmp_path / "mm.jsonl")
    best_steps = [S.Split("C", "i", factor=4), S.Annotate("C", "j", "vectorize")]
    broken = [S.Split("C", "no_such_axis", factor=4)]
    log.append([_record(task, 3e-3, [S.Split("C", "j", factor=2)]),
                _record(task, 1e-4, broken),  # fastest but does not replay: skipped
                _record(task, 1e-3, best_steps)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = apply_history_best([task, untuned], log)
    msgs = [str(w.message) for w in caught]
    assert any("mm.jsonl:2" in m and "does not replay" in m for m in msgs), msgs
    missing = [m for m in msgs if "no tuning record" in m]
    assert len(missing) == 1 and untuned.name in missing[0] and untuned.workload_key in missing[0]
    assert "using the default schedule" in missing[0] and "1 of 2" in missing[0]
    assert out[task.workload_key].steps == best_steps
    assert out[untuned.workload_key].steps == []  # the default schedule
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        best = ApplyHistoryBest([task, untuned], str(log.path))
    assert best.missing == [untuned] and best.record_for(task).cost == 1e-3
    assert best.schedule_for(untuned).steps == []


def test_killed_writer_loses_at_most_the_line_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "kill.jsonl"
    script = f"""
import time
from autosched.search.record import MeasureRecord, RecordLog
log = RecordLog({str(path)!r})
n = 0
while True:
    log.append([MeasureRecord("k", "t", {{"kind": "llvm"}}, [], [1e-3 * (n + 1)],
                              ir_hash=str(n), extra={{"pad": "x" * 3000}})])
    n += 1
    if n == 20:
        print("go", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "go"
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        recs = RecordLog(path).load()
    lines = path.read_bytes().split(b"\n")
    complete = [ln for ln in lines[:-1] if ln]
    assert len(recs) >= 20 and len(recs) == len(complete)
    assert [r.ir_hash for r in recs] == [str(i) for i in range(len(recs))]  # none lost
