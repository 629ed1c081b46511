"""``autosched logs summary|best|distill|merge|prune``: on mixed, corrupt, gzipped, old-format
and empty logs; what each keeps is checked against the records computed here."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched.cli import main
from autosched.search.record import (
    MeasureRecord,
    RecordLog,
    fingerprint_key,
    target_fingerprint,
)
from autosched.targets.target import parse

HOST = target_fingerprint(parse("llvm"))
ARM = target_fingerprint(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
GPU = target_fingerprint(parse("cuda -arch=sm_80"))
ERRORS = ["RUN_TIMEOUT", "WRONG_ANSWER", "COMPILE_ERROR", "WORKER_KILLED"]


def _records(rng: np.random.Generator, n: int, prefix: str = "r") -> list[MeasureRecord]:
    """``n`` records over three workloads and three targets, a fifth of them failed."""
    out = []
    for i in range(n):
        wl = int(rng.integers(3))
        failed = rng.random() < 0.2
        cost = float(rng.uniform(1e-5, 1e-2))
        out.append(MeasureRecord(
            workload_key=f"wk{wl}", task_name=f"task{wl}",
            target=[HOST, ARM, GPU][int(rng.integers(3))], steps=[],
            costs=[] if failed else [cost * 1.01, cost, cost * 0.99],
            error_code=str(rng.choice(ERRORS)) if failed else "NO_ERROR",
            timestamp=float(i), ir_hash=f"{prefix}{i}"))
    return out


def _key(r: MeasureRecord) -> tuple[str, str]:
    return r.workload_key, r.target_key


def _expected_best(recs: list[MeasureRecord], k: int) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[MeasureRecord]] = {}
    for r in recs:
        if r.ok:
            out.setdefault(_key(r), []).append(r)
    return {g: [r.ir_hash for r in sorted(rs, key=lambda r: r.cost)[:k]] for g, rs in out.items()}


def _by_group(recs: list[MeasureRecord]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for r in recs:
        out.setdefault(_key(r), []).append(r.ir_hash)
    return out


def _run(capsys: pytest.CaptureFixture, *argv: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["logs", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _load(path: Path) -> list[MeasureRecord]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what the tools write loads without a warning
        return RecordLog(path).load()


def _mixed_log(tmp_path: Path, recs: list[MeasureRecord]) -> Path:
    """A log of old-format lines (the fingerprint on each), new-format lines, a corrupt line
    and a torn last line, in that order."""
    path = tmp_path / "mixed.jsonl"
    half = len(recs) // 2
    path.write_text("".join(json.dumps({**json.loads(r.to_json_line()), "version": 1}) + "\n"
                            for r in recs[:half]))
    RecordLog(path).append(recs[half:])
    with open(path, "a") as f:
        f.write('{"version": 2, "workload_key": "wk0", "steps": [\n{"version": 2, "work')
    return path


def test_summary_of_a_mixed_corrupt_log(tmp_path: Path, rng: np.random.Generator,
                                        capsys: pytest.CaptureFixture) -> None:
    recs = _records(rng, 60)
    path = _mixed_log(tmp_path, recs)
    code, out, err = _run(capsys, "summary", path, "--json")
    assert code == 0
    (log,) = json.loads(out)
    assert log["records"] == 60 and log["skipped_lines"] == 2
    n = path.read_text().count("\n")  # the corrupt line is the last whole one, then the torn
    assert f"line {n}: skipping corrupt" in err and f"line {n + 1}: skipping truncated" in err
    groups = _by_group(recs)
    assert {(row["workload_key"], row["target"]) for row in log["rows"]} == set(groups)
    for row in log["rows"]:
        mine = [r for r in recs if _key(r) == (row["workload_key"], row["target"])]
        ok = [r.cost for r in mine if r.ok]
        assert row["records"] == len(mine) and row["ok"] == len(ok)
        assert row["best_seconds"] == (min(ok) if ok else None)
        want: dict[str, int] = {}
        for r in mine:
            if not r.ok:
                want[r.error_code] = want.get(r.error_code, 0) + 1
        assert row["errors"] == want and row["task"] == mine[0].task_name
    assert sorted(log["targets"]) == sorted({fingerprint_key(t) for t in (HOST, ARM, GPU)}
                                            & {r.target_key for r in recs})
    code, out, _ = _run(capsys, "summary", path)
    assert code == 0
    assert out.splitlines()[0] == f"{path}: 60 records, 3 workloads, 3 targets, 2 lines skipped"
    for key in (fingerprint_key(t) for t in (HOST, ARM, GPU)):
        assert f"target {key}" in out


def test_best_prints_and_writes_the_best_of_each_group(tmp_path: Path, rng: np.random.Generator,
                                                       capsys: pytest.CaptureFixture) -> None:
    recs = _records(rng, 50)
    path = _mixed_log(tmp_path, recs)
    want = _expected_best(recs, 1)
    code, out, _ = _run(capsys, "best", path)
    assert code == 0
    for (wk, _), (h,) in want.items():
        top = next(r for r in recs if r.ir_hash == h)
        # printed with its cost and the line it came from
        assert any(wk in line and f"{top.cost * 1e3:.4g} ms" in line and f"{path}:" in line
                   for line in out.splitlines())
    code, out, _ = _run(capsys, "best", path, "-o", tmp_path / "best.jsonl")
    assert code == 0 and f"wrote {len(want)} records" in out
    assert _by_group(_load(tmp_path / "best.jsonl")) == want


def test_distill_keeps_the_best_k(tmp_path: Path, rng: np.random.Generator,
                                  capsys: pytest.CaptureFixture) -> None:
    recs = _records(rng, 80)
    path = _mixed_log(tmp_path, recs)
    for k in (1, 3):
        out_path = tmp_path / f"k{k}.jsonl.gz"
        assert _run(capsys, "distill", path, "-k", k, "-o", out_path)[0] == 0
        kept = _load(out_path)
        assert _by_group(kept) == _expected_best(recs, k)
        assert all(r.ok for r in kept)
        assert gzip.decompress(out_path.read_bytes()).count(b"target_header") == len(
            {r.target_key for r in kept})


def test_merge_dedupes_by_ir_hash_workload_and_target(tmp_path: Path, rng: np.random.Generator,
                                                      capsys: pytest.CaptureFixture) -> None:
    a, b = _records(rng, 40, "a"), _records(rng, 30, "b")
    # the same IR measured again in the second log: dropped; the same hash on another
    # target or workload is another measurement: kept
    again = MeasureRecord(**{**a[3].__dict__, "timestamp": 99.0, "source": ""})
    other_target = MeasureRecord(**{**a[4].__dict__, "target": GPU if a[4].target is not GPU
                                    else HOST, "source": ""})
    other_wl = MeasureRecord(**{**a[5].__dict__, "workload_key": "wk9", "source": ""})
    b += [again, other_target, other_wl]
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    RecordLog(pa).append(a)
    pb.write_bytes(gzip.compress(b"".join(
        (json.dumps({**json.loads(r.to_json_line()), "version": 1}) + "\n").encode() for r in b)))
    out_path = tmp_path / "all.jsonl"
    code, out, _ = _run(capsys, "merge", pa, pb, pa, "-o", out_path)
    assert code == 0 and "41 duplicates dropped" in out  # all of a once more, and `again`
    merged = _load(out_path)
    assert [r.ir_hash for r in merged] == [r.ir_hash for r in a + b if r is not again]
    assert [r.timestamp for r in merged if r.ir_hash == a[3].ir_hash] == [a[3].timestamp]
    assert [(r.costs, r.target, r.error_code) for r in merged[:40]] == [
        (r.costs, r.target, r.error_code) for r in a]


def test_prune_drops_what_it_is_told(tmp_path: Path, rng: np.random.Generator,
                                     capsys: pytest.CaptureFixture) -> None:
    recs = _records(rng, 90)
    path = _mixed_log(tmp_path, recs)
    out_path = tmp_path / "pruned.jsonl"
    assert _run(capsys, "prune", path, "-o", out_path)[0] == 0
    assert [r.ir_hash for r in _load(out_path)] == [r.ir_hash for r in recs if r.ok]
    code, out, _ = _run(capsys, "prune", path, "-o", out_path, "--keep-failed", "--target",
                        "cuda", "--workload", "task1", "--workload", "wk2")
    assert code == 0 and "2 unparseable" in out
    assert [r.ir_hash for r in _load(out_path)] == [
        r.ir_hash for r in recs if not r.transient and r.target_key != "cuda/sm_80"
        and r.workload_key == "wk0"]
    arm = fingerprint_key(ARM)
    assert _run(capsys, "prune", path, "-o", out_path, "--target", arm.rsplit("/", 2)[0])[0] == 0
    assert [r.ir_hash for r in _load(out_path)] == [
        r.ir_hash for r in recs if r.ok and r.target_key != arm]


def test_writing_over_an_input_is_atomic(tmp_path: Path, rng: np.random.Generator,
                                         capsys: pytest.CaptureFixture) -> None:
    recs = _records(rng, 40)
    path = _mixed_log(tmp_path, recs)
    assert _run(capsys, "prune", path, "-o", path)[0] == 0  # in place
    assert [r.ir_hash for r in _load(path)] == [r.ir_hash for r in recs if r.ok]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.jsonl"]  # no temporary left
    before = path.read_bytes()
    (tmp_path / "dir.jsonl").mkdir()
    code, _, err = _run(capsys, "distill", path, "-o", tmp_path / "dir.jsonl")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "dir.jsonl" in err
    assert path.read_bytes() == before


def test_bad_inputs_give_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, out, _ = _run(capsys, "summary", empty)
    assert code == 0 and out == f"{empty}: 0 records, 0 workloads, 0 targets\n"
    code, out, _ = _run(capsys, "merge", empty, "-o", tmp_path / "out.jsonl")
    assert code == 0 and "wrote 0 records" in out and _load(tmp_path / "out.jsonl") == []
    code, out, _ = _run(capsys, "best", empty)
    assert code == 0 and out.strip() == "no successful record"
    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    for argv in (["summary", tmp_path / "missing.jsonl"], ["summary", tmp_path],
                 ["best", garbage], ["distill", empty, "-k", "0", "-o", tmp_path / "x.jsonl"]):
        try:
            code, _, err = _run(capsys, *argv)
        except SystemExit as exc:  # argparse refuses -k 0 itself
            code, err = int(exc.code or 0), capsys.readouterr().err
        assert code == 2, argv
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith("usage:")]
        assert len(lines) == 1, (argv, err)
    assert not (tmp_path / "x.jsonl").exists()
