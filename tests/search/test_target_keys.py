"""Target keys: records apply where the generated code is the same (another CPU name, the same
vector ISA and threads), seed the search on related targets (another vector ISA, another GPU
arch), and --strict-target asks for the very same fingerprint."""

from __future__ import annotations

import gzip
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched import te
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import MeasureResult
from autosched.search.record import (
    MeasureRecord,
    RecordLog,
    apply_history_best,
    fingerprint_key,
    ir_hash,
    target_fingerprint,
    target_keys,
)
from autosched.search.space import SearchSpace
from autosched.search.task import Task
from autosched.search.tune import TaskTuner, TuneOptions, _train, tune
from autosched.targets.llvm.cpu_features import key_features
from autosched.targets.target import parse
from tests.support import ROOT

X86 = "llvm -mtriple=x86_64-unknown-linux-gnu"
# an AVX-512 machine's whole LLVM feature string, as the host reports it (abridged)
AVX512_FEATURES = ("+64bit,+adx,+aes,+avx,+avx2,+avx512bf16,+avx512bitalg,+avx512bw,+avx512cd,"
                   "+avx512dq,+avx512f,-avx512fp16,+avx512ifma,+avx512vbmi,+avx512vl,"
                   "+avx512vnni,-avxvnni,+bmi,+bmi2,+f16c,+fma,+popcnt,+sha,+sse4.1,+sse4.2")
ZNVER4 = f"{X86} -mcpu=znver4 -mattr={AVX512_FEATURES} -num-cores=2"
ZNVER5 = f"{X86} -mcpu=znver5 -mattr={AVX512_FEATURES} -num-cores=2"
HASWELL = f"{X86} -mcpu=haswell -num-cores=2"
BUNDLED = ROOT / "tuning_logs" / "resnet18_llvm_znver4_3000.jsonl.gz"
LOGGER = "autosched.search.record"


def _matmul(target: str, m: int = 24, n: int = 20, k: int = 12) -> Task:
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return Task(C, target=target)


def _records(task: Task, rng: np.random.Generator, n: int, fit: Task | None = None
             ) -> list[MeasureRecord]:
    """``n`` successful records of random candidates of ``task`` (each one that ``fit``'s space
    takes unchanged, when given), as a tuning job on ``task.target`` writes them."""
    space, other = SearchSpace(task), SearchSpace(fit) if fit is not None else None
    out: list[MeasureRecord] = []
    seen: set[str] = set()
    for _ in range(50 * n):
        c = space.sample(rng)
        low = space.lower(c)
        if low is None or low.ir_hash in seen or other is not None and (
                not other.knows(c) or other.lower(c) is None):
            continue
        seen.add(low.ir_hash)
        cost = float(rng.uniform(1e-4, 1e-2))
        out.append(MeasureRecord(
            workload_key=task.workload_key, task_name=task.name,
            target=target_fingerprint(task.target),
            steps=[s.to_dict() for s in low.schedule.steps], costs=[cost] * 3,
            timestamp=time.time(), autosched_version="0.1.0", ir_hash=low.ir_hash,
            extra={"candidate": c.as_dict()}))
        if len(out) == n:
            return out
    raise AssertionError(f"drew {len(out)} of {n} distinct candidates")


class _Measurer:
    """Times nothing: every candidate 'runs' in a random time; remembers what it was given."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.batches: list[list[str]] = []

    def measure(self, task: Task, schedules: list[Any]) -> list[MeasureResult]:
        self.batches.append([ir_hash(task.lower(s)) for s in schedules])
        return [MeasureResult((float(self.rng.uniform(1e-4, 1e-2)),) * 3, ErrorCode.NO_ERROR)
                for _ in schedules]


class _Untrained:
    """A cost model that learns nothing: the search draws cold batches."""

    trained = False

    def fit(self, feats: list, ys: list, groups: list) -> None:
        pass


class _Random(_Untrained):
    """A cost model that has learnt to guess: the search evolves under random scores."""

    trained = True

    def predict(self, feats: list) -> np.ndarray:
        return np.random.default_rng().random(len(feats))


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


# -- the key -------------------------------------------------------------------------------


def test_key_is_what_changes_the_code() -> None:
    avx512 = target_keys(parse(ZNVER4))
    assert avx512.key == ("llvm/x86_64-linux/v512/avx,avx2,avx512bf16,avx512bw,avx512dq,"
                          "avx512f,avx512vl,avx512vnni,f16c,fma,sse4.2/t2")
    assert avx512.isa == avx512.key.removesuffix("/t2") and avx512.family == "llvm/x86_64-linux"
    # another CPU name, features outside the key (sha, aes), vendor and environment: same key
    for same in (ZNVER5, f"{X86} -mcpu=znver5 -num-cores=2",  # znver5's own features
                 f"llvm -mtriple=x86_64-pc-linux-musl -mcpu=znver4 -mattr="
                 f"{AVX512_FEATURES.replace('+sha', '-sha').replace('+aes', '-aes')} -num-cores=2"):
        keys = target_keys(parse(same))
        assert keys.key == avx512.key and keys.exact != avx512.exact, same
    # what does change it: threads, the vector ISA, another OS or architecture
    assert target_keys(parse(ZNVER4.replace("-num-cores=2", "-num-cores=8"))).isa == avx512.isa
    no512 = ZNVER4.replace(AVX512_FEATURES, AVX512_FEATURES + ",-avx512f")
    assert fingerprint_key(parse(no512)) == fingerprint_key(parse(HASWELL))
    assert fingerprint_key(parse(HASWELL)) == "llvm/x86_64-linux/v256/avx,avx2,f16c,fma,sse4.2/t2"
    assert fingerprint_key(parse(f"{X86} -mcpu=skylake-avx512 -num-cores=2")) != avx512.key
    assert target_keys(parse(ZNVER4.replace("linux-gnu", "windows-msvc"))).family == \
        "llvm/x86_64-windows"
    a72 = target_keys(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    n1 = target_keys(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1"))
    assert a72.key == "llvm/aarch64-linux/v128/neon/t4" and a72.family == n1.family
    assert n1.key == "llvm/aarch64-linux/v128/dotprod,fullfp16,neon/t4"
    # a CPU the table does not know, named without features: only its own name matches
    assert fingerprint_key(parse(f"{X86} -mcpu=futurecpu9 -num-cores=3")).endswith(
        "/cpu=futurecpu9/t3")
    assert key_features("x86_64-linux-gnu", "znver4", "-avx2") == ("avx", "f16c", "fma",
                                                                    "sse4.2")
    cuda = target_keys(parse("cuda -arch=sm_80"))
    assert cuda.key == "cuda/sm_80" and cuda.family == target_keys(parse("cuda -arch=sm_90")).family


def test_a_bare_cpu_name_brings_its_vector_isa() -> None:
    from autosched.targets.llvm.cpu_features import required

    # LLVM generates AVX-512 for -mcpu=znver5: the search's vector width and registers, and the
    # CPU check a deployed library runs, say so too
    znver5, znver3 = parse(f"{X86} -mcpu=znver5"), parse(f"{X86} -mcpu=znver3")
    assert (znver5.vector_bits, znver5.vector_registers) == (512, 32)
    assert (znver3.vector_bits, znver3.vector_registers) == (256, 16)
    assert {"avx512f", "avx512bw", "fma"} <= set(required(znver5))
    assert "avx512f" not in required(znver3) and "avx2" in required(znver3)
    assert parse(f"{X86} -mcpu=znver4 -mattr=-avx512f").vector_bits == 256


def test_bundled_znver4_log_keys_as_any_cpu_with_its_avx512() -> None:
    with gzip.open(BUNDLED, "rt") as f:
        fp = json.loads(f.readline())["target"]
    assert fp["cpu"] == "znver4" and fp["num_cores"] == 2
    znver5 = parse(f"{X86} -mcpu=znver5 -mattr={fp['features']} -num-cores=2")
    assert fingerprint_key(fp) == fingerprint_key(znver5)
    assert fingerprint_key(fp) == fingerprint_key(parse(f"{X86} -mcpu=znver5 -num-cores=2"))
    assert fingerprint_key(fp) != fingerprint_key(parse(f"{X86} -mcpu=znver3 -num-cores=2"))


def test_bundled_znver4_log_applies_on_another_avx512_cpu(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = RecordLog(tmp_path / "resnet18.jsonl")
    with gzip.open(BUNDLED, "rb") as f:
        log.path.write_bytes(b"".join(f.readline() for _ in range(300)))
    recs = log.load()
    wk = min(r.workload_key for r in recs if r.ok)
    best = min((r for r in recs if r.ok and r.workload_key == wk), key=lambda r: r.cost)
    caplog.set_level(logging.WARNING, LOGGER)
    for cores in (2, 16):  # 16: no record has 16 threads; the 2-thread ones still apply
        target = parse(f"{X86} -mcpu=znver5 -num-cores={cores}")
        assert log.best(wk, target) == [best]
        assert log.best(wk, target, strict=True) == []
    assert log.best(wk, parse(f"{X86} -mcpu=znver3 -num-cores=2")) == []
    assert best in log.related_records(wk, parse(f"{X86} -mcpu=znver3 -num-cores=2"))
    lines = _lines(caplog)
    assert len(lines) == 2 and "the same code" in lines[0] and "thread count" in lines[1]


# -- applying records ------------------------------------------------------------------------


def test_records_of_a_renamed_cpu_apply_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng()
    tasks = [_matmul(ZNVER4), _matmul(ZNVER4, 17, 9, 33)]
    log = RecordLog(tmp_path / "mm.jsonl")
    written = {t.workload_key: _records(t, rng, 3) for t in tasks}
    log.append([r for recs in written.values() for r in recs])
    caplog.set_level(logging.WARNING, LOGGER)
    for t in tasks:  # on the very same target: nothing to say
        assert log.records_for(t.workload_key, t.target) == written[t.workload_key]
    assert _lines(caplog) == []
    renamed = [_matmul(ZNVER5), _matmul(ZNVER5, 17, 9, 33)]
    for _ in range(3):
        for t in renamed:
            fastest = min(written[t.workload_key], key=lambda r: r.cost)
            assert log.best(t.workload_key, t.target) == [fastest]
            assert log.records_for(t.workload_key, t.target) == written[t.workload_key]
    (line,) = _lines(caplog)  # once per log and target, not per workload or lookup
    assert str(log.path) in line and "/znver4/" in line and "/znver5/" in line
    schedules = apply_history_best(renamed, log)
    for t in renamed:
        fastest = min(written[t.workload_key], key=lambda r: r.cost)
        assert ir_hash(t.lower(schedules[t.workload_key])) == fastest.ir_hash


def _renamed_log(path: Path, n: int) -> tuple[Task, Task, RecordLog, list[MeasureRecord]]:
    """A log of ``n`` records of a task tuned on znver4, and the task for a renamed CPU."""
    task, renamed = _matmul(ZNVER4), _matmul(ZNVER5)
    log = RecordLog(path)
    recs = _records(task, np.random.default_rng(), n)
    log.append(recs)
    return task, renamed, log, recs


def test_strict_target_refuses_a_renamed_cpu(tmp_path: Path) -> None:
    task, renamed, log, recs = _renamed_log(tmp_path / "mm.jsonl", 2)
    assert log.best(task.workload_key, task.target, strict=True) != []
    assert log.best(renamed.workload_key, renamed.target, strict=True) == []
    assert log.records_for(renamed.workload_key, renamed.target, strict=True) == []
    assert log.measured_ir_hashes(renamed.workload_key, renamed.target, strict=True) == set()
    # refused as best, it still seeds
    assert log.related_records(renamed.workload_key, renamed.target, strict=True) == recs
    with pytest.warns(UserWarning, match="no tuning record"):
        sch = apply_history_best([renamed], log, strict_target=True)[renamed.workload_key]
    assert sch.steps == renamed.schedule().steps


def test_tune_counts_a_renamed_cpus_records_unless_strict(tmp_path: Path) -> None:
    _, renamed, log, recs = _renamed_log(tmp_path / "mm.jsonl", 3)
    measurer = _Measurer(np.random.default_rng())
    opts = TuneOptions(verbose=False, batch_size=8)
    tune(renamed, total_trials=3, log=log.path, measurer=measurer, model=_Untrained(),
         options=opts)
    assert measurer.batches == []  # the budget is spent: the records count as this target's
    tune(renamed, total_trials=8, log=log.path, measurer=measurer, model=_Untrained(), options=opts,
         strict_target=True)
    (batch,) = measurer.batches  # strict: they only seed, and are measured again first
    assert len(batch) == 8
    assert {r.ir_hash for r in recs} <= set(batch)


def test_strict_target_on_the_command_line() -> None:
    from autosched.cli import _parser

    for argv in (["tune", "m.onnx"], ["compile", "m.onnx", "-o", "b"], ["run", "m.onnx"],
                 ["bench", "m.onnx"], ["tune-op", "gemm", "8", "8", "8"],
                 ["best-op", "gemm", "8", "8", "8"]):
        assert _parser().parse_args([*argv, "--strict-target"]).strict_target is True
        assert _parser().parse_args(argv).strict_target is False


# -- seeding ---------------------------------------------------------------------------------


def _first_round(task: Task, log: RecordLog, model: Any, n: int = 8
                 ) -> tuple[TaskTuner, list[str]]:
    rng = np.random.default_rng()
    tuner = TaskTuner(task, log, rng, TuneOptions(verbose=False, population=16, generations=1))
    measurer = _Measurer(rng)
    tuner.round(n, model, measurer)
    (batch,) = measurer.batches
    return tuner, batch


@pytest.mark.parametrize("model", [_Untrained(), _Random()], ids=["cold", "evolving"])
def test_an_avx2_record_seeds_an_avx512_target(tmp_path: Path, model: Any) -> None:
    rng = np.random.default_rng()
    avx2, avx512 = _matmul(HASWELL), _matmul(ZNVER4)
    log = RecordLog(tmp_path / "mm.jsonl")
    recs = _records(avx2, rng, 10, fit=avx512)
    log.append(recs)
    assert log.best(avx512.workload_key, avx512.target) == []
    assert log.records_for(avx512.workload_key, avx512.target) == []
    tuner, batch = _first_round(avx512, log, model)
    assert tuner.related == recs
    fastest = min(recs, key=lambda r: r.cost)
    # the record's schedule, replayed for the AVX-512 target, is among the first measured
    replayed = ir_hash(avx512.lower(avx512.schedule(fastest.schedule_steps())))
    assert replayed in batch
    assert tuner.trials == len(batch)  # the related records do not count as measured here

    # the cost model trains on the related records too, as a ranking group of their own
    class _Model:
        def fit(self, feats: list, ys: list, groups: list) -> None:
            self.groups = groups
            self.ys = ys

    model = _Model()
    _train(model, [tuner])
    seeded = [y for y, g in zip(model.ys, model.groups) if "@" in g]
    assert len(seeded) == len(recs) and max(seeded) == 1.0
    assert {g for g in model.groups if "@" in g} == {
        f"{avx512.workload_key}@{fingerprint_key(avx2.target)}"}


def test_a_cuda_sm80_record_seeds_sm90(tmp_path: Path) -> None:
    rng = np.random.default_rng()
    sm80, sm90 = _matmul("cuda -arch=sm_80"), _matmul("cuda -arch=sm_90")
    log = RecordLog(tmp_path / "mm.jsonl")
    recs = _records(sm80, rng, 3, fit=sm90)
    log.append(recs)
    assert log.best(sm90.workload_key, sm90.target) == []
    assert log.related_records(sm90.workload_key, sm90.target) == recs
    tuner, batch = _first_round(sm90, log, _Random())
    for r in recs:
        assert ir_hash(sm90.lower(sm90.schedule(r.schedule_steps()))) in batch


def test_a_related_candidate_is_snapped_to_the_knobs_of_this_target() -> None:
    from autosched.search.tune import _fit

    space = SearchSpace(_matmul(ZNVER4))
    c = space.sample(np.random.default_rng())
    (unroll,) = [k for k in space.sketches[c.sketch].knobs if k.name.endswith(".unroll")]
    assert 32 not in unroll.options and 16 in unroll.options and 64 in unroll.options
    odd = replace(c, params=tuple((k, 32 if k == unroll.name else v) for k, v in c.params))
    fitted = _fit(space, odd)
    assert fitted is not None and dict(fitted.params)[unroll.name] == 16
    assert {k: v for k, v in fitted.params if k != unroll.name} == {
        k: v for k, v in c.params if k != unroll.name}
    assert _fit(space, replace(c, sketch=len(space.sketches))) is None  # no such sketch


def test_a_malformed_fingerprint_keys_without_crashing(tmp_path: Path) -> None:
    # a log is data from outside: a fingerprint's fields may be of any JSON type
    task = _matmul(ZNVER4)
    odd = {"kind": "llvm", "triple": 5, "cpu": None, "features": ["+avx512f"], "num_cores": [2]}
    keys = target_keys(odd)
    assert keys.family == "llvm/5-unknown" and keys.key != target_keys(task.target).key
    assert target_keys({"kind": "no-such-backend"}).key == "no-such-backend"
    (good,) = _records(task, np.random.default_rng(), 1)
    log = RecordLog(tmp_path / "mm.jsonl")
    log.append([replace(good, target=odd, ir_hash="odd"), good])
    assert log.best(task.workload_key, task.target, k=5) == [good]
    assert log.related_records(task.workload_key, task.target) == []
