"""A tuning job (``autosched tune-op``) killed with SIGKILL at random moments and resumed each
time: no record once written is ever lost, and no candidate is measured twice.

CI kills it 3 times; the soak version (20 kills) runs with ``--slow``. The seed is
printed; ``--seed`` replays the kill moments."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from autosched.search.record import MeasureRecord, RecordLog
from tests.support import ROOT


def _start(log: Path, trials: int, out: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "autosched", "tune-op", "gemm", "24", "20",
           "28", "--total-trials", str(trials), "--batch-size", "2", "--log", str(log)]
    with open(out, "ab") as f:
        return subprocess.Popen(cmd, cwd=log.parent, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _kill_at_a_random_moment(proc: subprocess.Popen, log: Path,
                             rng: np.random.Generator) -> bool:
    """SIGKILL the job: a quarter of the time at any moment of its first seconds (imports,
    worker start), else a random moment after it appended something (mid-round, mid-append).
    False when it finished first."""
    if rng.random() < 0.25:
        deadline = time.monotonic() + rng.uniform(0.0, 4.0)
    else:
        size = _size(log)
        limit = time.monotonic() + 300
        while _size(log) == size and proc.poll() is None and time.monotonic() < limit:
            time.sleep(0.01)
        deadline = time.monotonic() + rng.uniform(0.0, 1.5)
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


def _records(log: Path) -> tuple[list[MeasureRecord], int]:
    """The log's records and how many lines it skipped (torn by a kill)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = RecordLog(log).load()
    skipped = [w for w in caught if "skipping" in str(w.message)]
    return recs, len(skipped)


def _soak(tmp_path: Path, rng: np.random.Generator, kills: int, trials: int) -> None:
    log, out = tmp_path / "gemm.jsonl", tmp_path / "job.out"
    seen: list[str] = []  # every record line seen so far, in order
    killed = 0
    t0 = time.monotonic()
    while killed < kills:
        proc = _start(log, trials, out)
        if not _kill_at_a_random_moment(proc, log, rng):
            break  # it finished the budget before this kill
        killed += 1
        recs, torn = _records(log)
        lines = [r.to_json_line() for r in recs]
        assert lines[:len(seen)] == seen, f"a record written before kill {killed} was lost"
        assert torn <= killed, f"{torn} skipped lines after {killed} kills"
        seen = lines
    proc = _start(log, trials, out)  # the last resume runs to the end of the budget
    assert proc.wait(timeout=600) == 0, out.read_text()[-3000:]
    recs, torn = _records(log)
    assert [r.to_json_line() for r in recs][:len(seen)] == seen, "a record was lost"
    assert torn <= killed
    measured = [r.ir_hash for r in recs if not r.transient]
    dupes = {h for h in measured if measured.count(h) > 1}
    assert not dupes, f"measured twice: {sorted(dupes)}"
    assert len(measured) == trials and all(measured)
    print(f"soak: {killed} kills, {len(measured)} records, {torn} torn lines skipped, "
          f"{time.monotonic() - t0:.0f} s")


def test_killed_and_resumed_job_loses_and_repeats_nothing(tmp_path: Path,
                                                          rng: np.random.Generator) -> None:
    _soak(tmp_path, rng, kills=3, trials=12)


@pytest.mark.slow
def test_soak_20_kills(tmp_path: Path, rng: np.random.Generator) -> None:
    _soak(tmp_path, rng, kills=20, trials=96)
