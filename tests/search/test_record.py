"""Tuning records: JSON-lines round trip, torn and corrupt lines, lookups, apply_history_best."""

from __future__ import annotations

import gzip
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
    target_ref,
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
    # line 1: the target's header, written once; each record names it by reference
    assert back[0].source.endswith("mm.jsonl:2") and back[2].source.endswith(":4")
    lines = [json.loads(line) for line in log.path.read_text().splitlines()]
    ref = target_ref(target_fingerprint(task.target))
    assert len(lines) == 4 and lines[0] == {"version": 2, "target_header": ref,
                                            "fingerprint": target_fingerprint(task.target)}
    assert all(d["version"] == 2 and d["target"] == ref for d in lines[1:])
    assert set(lines[1]) >= {"workload_key", "target", "steps", "costs",
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
    lines = log.path.read_text().splitlines()  # the header, then the three records
    lines.insert(2, '{"version": 1, "workload_key": "x", "steps": [')  # corrupt middle (line 3)
    lines.insert(3, json.dumps({**json.loads(lines[1]), "version": 99}))  # newer format (line 4)
    torn = lines[-1][: len(lines[-1]) // 2]                             # torn tail (line 7)
    log.path.write_text("\n".join(lines) + "\n" + torn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = log.load()
    assert back == good
    msgs = [str(w.message) for w in caught]
    assert any("line 3" in m and "corrupt" in m and str(log.path) in m for m in msgs), msgs
    assert any("line 7" in m and "truncated" in m for m in msgs), msgs
    assert any("version 1 or 2" in m and "4 (version 99)" in m for m in msgs), msgs
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
    assert any("mm.jsonl:3" in m and "does not replay" in m for m in msgs), msgs
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
    complete = [ln for ln in lines[:-1] if ln and b"target_header" not in ln]
    assert len(recs) >= 20 and len(recs) == len(complete)
    assert [r.ir_hash for r in recs] == [str(i) for i in range(len(recs))]  # none lost


# -- the file format: target headers, old logs, gzipped logs --------------------------------


def _v1_line(rec: MeasureRecord) -> str:
    """``rec`` as a version-1 line: the whole fingerprint on the line."""
    return json.dumps({**json.loads(rec.to_json_line()), "version": 1})


def _load_warned(log: RecordLog) -> tuple[list[MeasureRecord], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        back = log.load()
    return back, [str(w.message) for w in caught]


def test_the_fingerprint_is_written_once_per_target(tmp_path: Path) -> None:
    task = _matmul_task()
    arm = target_fingerprint(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    log = RecordLog(tmp_path / "mm.jsonl")
    recs = [_record(task, 1e-3 * (i + 1), ir=f"x{i}", target=arm if i % 3 == 1 else None)
            for i in range(9)]
    log.append(recs[:4])
    log.append(recs[4:])
    RecordLog(log.path).append([_record(task, 5e-3, ir="y")])  # another writer: no new header
    lines = log.path.read_text().splitlines()
    headers = [json.loads(ln) for ln in lines if "target_header" in ln]
    assert sorted(h["target_header"] for h in headers) == sorted(
        {target_ref(arm), target_ref(target_fingerprint(task.target))})
    back = log.load()
    assert [r.ir_hash for r in back] == [*(f"x{i}" for i in range(9)), "y"]
    assert [r.target for r in back] == [r.target for r in recs] + [recs[0].target]
    # the records' lines are shorter than the fingerprint they no longer repeat
    record_lines = [ln for ln in lines if "target_header" not in ln]
    for ln, rec in zip(record_lines, [*recs, back[-1]]):
        fp_size = len(json.dumps(rec.target, separators=(",", ":")))
        assert len(ln) <= len(rec.to_json_line()) - fp_size + len(target_ref(rec.target)) + 2


def test_old_new_and_mixed_logs_load(tmp_path: Path) -> None:
    task = _matmul_task()
    old = [_record(task, c, ir=f"o{c}") for c in (3e-3, 1e-3)]
    new = [_record(task, c, ir=f"n{c}") for c in (2e-3, 4e-3)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(_v1_line(r) + "\n" for r in old))  # a log of version 1
    log = RecordLog(path)
    assert [r.ir_hash for r in log.load()] == ["o0.003", "o0.001"]
    assert [r.version for r in log.load()] == [1, 1]
    log.append(new)  # new-format lines after old ones: one header, short lines
    with open(path, "a") as f:
        f.write(_v1_line(_record(task, 5e-3, ir="o2")) + "\n")
    back, msgs = _load_warned(log)
    assert not msgs
    assert [r.ir_hash for r in back] == ["o0.003", "o0.001", "n0.002", "n0.004", "o2"]
    assert all(r.target == target_fingerprint(task.target) for r in back)
    (top,) = log.best(task.workload_key, task.target)
    assert top.ir_hash == "o0.001"


def test_a_record_whose_header_is_missing_is_skipped(tmp_path: Path) -> None:
    task = _matmul_task()
    log = RecordLog(tmp_path / "mm.jsonl")
    log.append([_record(task, c, ir=f"h{c}") for c in (3e-3, 2e-3)])
    lines = log.path.read_text().splitlines()
    # a record copied out of another log without its header (line 4)
    stray = {**json.loads(lines[1]), "target": "llvm-0123456789ab", "ir_hash": "stray"}
    log.path.write_text("\n".join([*lines, json.dumps(stray)]) + "\n")
    back, msgs = _load_warned(log)
    assert [r.ir_hash for r in back] == ["h0.003", "h0.002"]
    assert any("line 4" in m and "without its target header" in m and "llvm-0123456789ab" in m
               and str(log.path) in m for m in msgs), msgs
    # the same records with the header dropped: each is skipped, naming its line
    log.path.write_text("\n".join(lines[1:]) + "\n")
    back, msgs = _load_warned(log)
    assert back == [] and sum("without its target header" in m for m in msgs) == 2
    assert any("line 1" in m for m in msgs) and any("line 2" in m for m in msgs), msgs


def test_a_torn_header_costs_only_its_records_and_is_written_again(tmp_path: Path) -> None:
    task = _matmul_task()
    log = RecordLog(tmp_path / "mm.jsonl")
    log.append([_record(task, 1e-3, ir="a")])
    header, line = log.path.read_text().splitlines()
    # a writer killed inside the header line, then another job's record of that target
    log.path.write_text(header[: len(header) // 2] + "\n" + line + "\n")
    back, msgs = _load_warned(log)
    assert back == []
    assert any("line 1" in m and "corrupt" in m for m in msgs), msgs
    assert any("line 2" in m and "without its target header" in m for m in msgs), msgs
    fresh = RecordLog(log.path)
    fresh.append([_record(task, 2e-3, ir="b")])  # the torn header is not taken as written
    back, msgs = _load_warned(fresh)
    # the new header is anywhere in the file, so the record it orphaned loads again
    assert [r.ir_hash for r in back] == ["a", "b"]
    assert [m for m in msgs if "without its target header" in m] == []


def test_a_header_written_twice_is_harmless_and_a_forged_one_is_refused(tmp_path: Path) -> None:
    task = _matmul_task()
    log = RecordLog(tmp_path / "mm.jsonl")
    log.append([_record(task, 1e-3, ir="a")])
    header, line = log.path.read_text().splitlines()
    forged = json.loads(header)
    forged["fingerprint"] = {**forged["fingerprint"], "cpu": "other"}  # same ref, other value
    second = json.dumps({**json.loads(line), "ir_hash": "b"})
    log.path.write_text("\n".join([header, line, header, second, json.dumps(forged)]) + "\n")
    back, msgs = _load_warned(log)
    assert [r.ir_hash for r in back] == ["a", "b"]
    assert all(r.target["cpu"] == target_fingerprint(task.target)["cpu"] for r in back)
    assert any("line 5" in m and "does not match its fingerprint" in m for m in msgs), msgs


def test_concurrent_writers_keep_every_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    script = """
import sys
from autosched.search.record import MeasureRecord, RecordLog
who = sys.argv[1]
log = RecordLog(sys.argv[2])
for n in range(60):
    log.append([MeasureRecord("k", "t", {"kind": "llvm", "cpu": "c" + str(n % 3)}, [],
                              [1e-3], ir_hash=who + str(n), extra={"pad": "x" * 2000})])
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script, who, str(path)], env=env)
             for who in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    back, msgs = _load_warned(RecordLog(path))
    assert not msgs
    assert sorted(r.ir_hash for r in back) == sorted(f"{w}{n}" for w in "ab" for n in range(60))
    headers = [ln for ln in path.read_text().splitlines() if "target_header" in ln]
    assert 3 <= len(headers) <= 6  # one per target, at most once per writer


def test_gzipped_logs_load_and_refuse_appends(tmp_path: Path) -> None:
    task = _matmul_task()
    recs = [_record(task, c, ir=f"g{c}") for c in (2e-3, 1e-3)]
    plain = RecordLog(tmp_path / "mm.jsonl")
    plain.append(recs)
    gz = RecordLog(tmp_path / "mm.jsonl.gz")
    gz.path.write_bytes(gzip.compress(plain.path.read_bytes()))
    assert gz.load() == recs
    (top,) = gz.best(task.workload_key, task.target)
    assert top.ir_hash == "g0.001"
    before = gz.path.read_bytes()
    for refuse in (lambda: gz.append([_record(task, 5e-4)]), gz.check_writable):
        with pytest.raises(OSError, match="gzipped tuning log is read-only") as info:
            refuse()
        assert info.value.filename == str(gz.path)
    assert gz.path.read_bytes() == before
    # a tuning job refuses it before measuring anything
    from autosched.search.tune import TuneOptions, tune

    with pytest.raises(OSError, match="read-only"):
        tune(task, trials=4, log=gz.path, measurer=object(), model=object(),
             options=TuneOptions(verbose=False))
    # gzipped under another name: read as gzip, and not appended to either
    disguised = RecordLog(tmp_path / "disguised.jsonl")
    disguised.path.write_bytes(before)
    assert disguised.load() == recs
    with pytest.raises(OSError, match="read-only"):
        disguised.append([_record(task, 5e-4)])
    assert disguised.path.read_bytes() == before
    gz.path.write_bytes(before[: len(before) // 2])  # a truncated download
    with pytest.raises(OSError, match="cannot be read") as info:
        RecordLog(gz.path).load()
    assert info.value.filename == str(gz.path)


def test_a_bundled_gzipped_log_loads() -> None:
    log = RecordLog(ROOT / "tuning_logs" / "mobilenet_v2_cuda_h200.jsonl.gz")
    back, msgs = _load_warned(log)
    assert len(back) == 464 and not msgs
    assert {r.target_key for r in back} == {"cuda/sm_90"}


def test_rewrite_is_atomic_and_writes_gzip(tmp_path: Path) -> None:
    task = _matmul_task()
    recs = [_record(task, c, ir=f"r{c}") for c in (3e-3, 1e-3)]
    for name in ("out.jsonl", "out.jsonl.gz"):
        log = RecordLog(tmp_path / name)
        log.rewrite(recs)
        assert RecordLog(log.path).load() == recs
        log.rewrite(recs[1:])  # replaces, never appends
        assert RecordLog(log.path).load() == recs[1:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.jsonl.gz"]


def test_a_text_log_whose_first_line_starts_like_gzip_still_loads(tmp_path: Path) -> None:
    """A corrupt first line that happens to begin with gzip's magic bytes is one bad line of a
    text log (skipped with a warning), not an unreadable gzip file; a .gz name still is."""
    task = _matmul_task()
    good = RecordLog(tmp_path / "good.jsonl")
    good.append([_record(task, 1e-3, ir="ok")])
    log = RecordLog(tmp_path / "mixed.jsonl")
    log.path.write_bytes(b"\x1f\x8b not a record\n" + good.path.read_bytes())
    with pytest.warns(UserWarning, match="line 1: skipping"):
        (rec,) = log.load()
    assert rec.ir_hash == "ok"
    named = RecordLog(tmp_path / "mixed.jsonl.gz")
    named.path.write_bytes(log.path.read_bytes())
    with pytest.raises(OSError, match="cannot be read"):
        named.load()
