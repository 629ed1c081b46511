"""Measurement: valid schedules time, every failure is recorded with its code, none stops the job."""

from __future__ import annotations

import os
import pickle
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched import te
from autosched.errors import MeasureError
from autosched.schedule import steps as S
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import Measurer, UnexpectedWorkerError
from autosched.search.measure_worker import compare, random_inputs
from autosched.search.record import RecordLog, apply_history_best, ir_hash, records_from
from autosched.search.task import Task
from autosched.targets.host import llc_bytes
from autosched.targets.target import parse

REPEAT = 2


def _matmul(m: int = 37, n: int = 29, k: int = 23, target: str = "llvm") -> Task:
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return Task(C, target=target)


def _good_steps() -> list[list[S.Step]]:
    return [
        [],
        [S.Split("C", "i", factor=8), S.Split("C", "j", factor=8),
         S.Reorder("C", ("i.outer", "j.outer", "k", "i.inner", "j.inner")),
         S.Annotate("C", "j.inner", "vectorize")],
        [S.Split("C", "i", factor=5), S.Annotate("C", "i.outer", "parallel"),
         S.Annotate("C", "i.inner", "unroll")],
    ]


@pytest.fixture(scope="module")
def measurer() -> Iterator[Measurer]:
    with Measurer(parse("llvm"), build_workers=2, repeat=REPEAT, min_repeat_ms=5, strict=True,
                  run_timeout=20, build_timeout=60) as m:
        yield m


@pytest.fixture(scope="module")
def task() -> Task:
    return _matmul()


def test_valid_schedules_time(measurer: Measurer, task: Task) -> None:
    cands = _good_steps()
    scheds = [task.schedule(c) for c in cands]
    # Schedules or steps; the last is corrupted: the check is on from the worker's first task
    results = measurer.measure(task, [scheds[0], cands[1], scheds[2], cands[1]],
                               test_hooks={3: "corrupt"})
    assert results[3].error_code is ErrorCode.WRONG_ANSWER, results[3]
    results = results[:3]
    for sch, res in zip(scheds, results):
        assert res.error_code is ErrorCode.NO_ERROR, res.error_msg
        assert len(res.costs) == REPEAT and all(c > 0 for c in res.costs)
        assert 0 < res.cost < 1.0 and res.build_time > 0 and res.run_time > 0
        assert res.ir_hash == ir_hash(task.lower(sch))  # the parent computes the same hash
    assert len({r.ir_hash for r in results}) == 3
    assert measurer.measure(task, []) == []


def test_the_reference_runs_the_default_built_with_the_first_batch(measurer: Measurer) -> None:
    """A task's first batch builds its default schedule too, in the build workers (first, so
    that a node measuring elsewhere gets it with the first candidates): the run worker runs
    it for the reference instead of compiling it itself. Its outputs are numpy's."""
    task = _matmul(19, 33, 21)
    assert measurer.default_artifact(task) is None
    (res,) = measurer.measure(task, [_good_steps()[1]], test_hooks={0: "corrupt"})
    assert res.error_code is ErrorCode.WRONG_ANSWER  # the hook is still the candidate's
    built = measurer.default_artifact(task)
    assert built is not None
    a, b = random_inputs(task, np.random.default_rng())[:2]
    c = np.zeros((19, 33), "float32")
    pickle.loads(built)(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    # another Measurer (a node) given it measures against it
    with Measurer(parse("llvm"), build_workers=1, repeat=REPEAT, min_repeat_ms=5, strict=True
                  ) as node:
        arts, _ = measurer.build(task, [_good_steps()[2]])
        (ok,) = node.run_artifacts(task, arts, reference=built)
        assert ok.error_code is ErrorCode.NO_ERROR, ok.error_msg


def test_failures_are_recorded_and_the_job_goes_on(measurer: Measurer, task: Task,
                                                  tmp_path: Path) -> None:
    good = _good_steps()[1]
    cands = [
        [S.Split("C", "no_such_axis", factor=4)],  # 0 LOWER_ERROR
        good,                                      # 1 segfault in the run worker -> CRASH
        good,                                      # 2 the worker calls os._exit -> CRASH
        good,                                      # 3 after two crashes: still measured
        good,                                      # 4 a corrupted output -> WRONG_ANSWER
        [S.Annotate("C", "k", "vectorize")],       # 5 vectorizing a reduce axis: an error
        _good_steps()[2],                          # 6 fine
    ]
    hooks = {1: "run_segfault", 2: "run_exit", 4: "corrupt"}
    starts = measurer.worker_starts
    results = measurer.measure(task, cands, test_hooks=hooks)
    codes = [r.error_code for r in results]
    assert codes[0] is ErrorCode.LOWER_ERROR and "no_such_axis" in results[0].error_msg
    assert codes[1] is ErrorCode.CRASH and "SIGSEGV" in results[1].error_msg
    assert "Segmentation fault" in results[1].error_msg  # the worker's faulthandler output
    assert codes[2] is ErrorCode.CRASH and "exited with status 3" in results[2].error_msg
    assert codes[3] is ErrorCode.NO_ERROR and codes[6] is ErrorCode.NO_ERROR
    assert codes[4] is ErrorCode.WRONG_ANSWER and "max abs error 1" in results[4].error_msg
    assert codes[5] in (ErrorCode.LOWER_ERROR, ErrorCode.COMPILE_ERROR), results[5]
    assert all(r.costs == () for r, c in zip(results, codes) if c is not ErrorCode.NO_ERROR)
    assert measurer.worker_starts - starts >= 2  # the run worker was replaced after each crash

    log = RecordLog(tmp_path / "mm.jsonl")
    log.append(records_from(task, cands, results))
    loaded = log.load()
    assert [r.error_code for r in loaded] == [c.name for c in codes]
    (best,) = log.best(task.workload_key, task.target)
    assert best.cost == min(results[3].cost, results[6].cost)
    assert log.measured_ir_hashes(task.workload_key, task.target) >= {results[3].ir_hash}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the task has a record: no fallback warning
        sch = apply_history_best([task], log)[task.workload_key]
    assert [s.to_dict() for s in sch.steps] == best.steps


def test_unexpected_worker_error_surfaces_in_strict_mode(measurer: Measurer, task: Task) -> None:
    with pytest.raises(UnexpectedWorkerError, match="test hook build_raise"):
        measurer.measure(task, [[]], test_hooks={0: "build_raise"})
    with pytest.raises(UnexpectedWorkerError, match="test hook run_raise"):
        measurer.measure(task, [[]], test_hooks={0: "run_raise"})
    (res,) = measurer.measure(task, [[]])  # and the measurer still works
    assert res.ok


def test_timeouts_kill_the_worker_and_the_job_goes_on() -> None:
    task = _matmul(16, 16, 16)
    with Measurer(parse("llvm"), build_workers=1, build_timeout=3, run_timeout=2, repeat=1,
                  min_repeat_ms=1, strict=False) as m:
        t0 = time.monotonic()
        results = m.measure(task, [[], [], [], []],
                            test_hooks={0: "build_hang", 2: "run_hang", 3: "build_raise"})
        assert time.monotonic() - t0 < 40
    codes = [r.error_code for r in results]
    assert codes[0] is ErrorCode.COMPILE_TIMEOUT and "3 s" in results[0].error_msg
    assert codes[1] is ErrorCode.NO_ERROR  # built by the replacement worker
    assert codes[2] is ErrorCode.RUN_TIMEOUT
    assert codes[3] is ErrorCode.UNKNOWN and "ValueError" in results[3].error_msg  # not strict


def test_wrong_target_is_refused(task: Task) -> None:
    m = Measurer(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    with pytest.raises(MeasureError, match="aarch64"):
        m.measure(task, [[]])
    m.close()


def test_bad_options() -> None:
    with pytest.raises(MeasureError, match="repeat"):
        Measurer(repeat=0)
    with pytest.raises(MeasureError, match="number"):
        Measurer(number=0)


def test_random_inputs_are_fresh_and_never_zero() -> None:
    A = te.placeholder((33, 5), name="A", dtype="float32")
    B = te.placeholder((33, 5), name="B", dtype="int8")
    C = te.compute((33, 5), lambda i, j: A[i, j] + te.cast("float32", B[i, j]), name="C")
    task = Task(C, target="llvm")
    rng = np.random.default_rng()
    a, b, c = random_inputs(task, rng)
    a2, _, _ = random_inputs(task, rng)
    assert c is None and a.dtype == np.float32 and b.dtype == np.int8
    assert np.count_nonzero(a) == a.size and not np.array_equal(a, a2)
    assert np.abs(b).max() > 0 and a.flags.c_contiguous


def test_compare_is_dtype_aware() -> None:
    rng = np.random.default_rng()
    want = rng.uniform(-1, 1, (40, 7)).astype(np.float32) * 10
    assert compare("C", want + np.float32(1e-5), want) is None  # reordered-sum noise passes
    bad = want.copy()
    bad[3, 4] += 0.5
    msg = compare("C", bad, want)
    assert msg is not None and "max abs error 0.5" in msg and "(3, 4)" in msg
    unwritten = want.copy()
    unwritten[0, 0] = np.nan
    assert "NaN" in (compare("C", unwritten, want) or "")
    ints = rng.integers(-100, 100, (9,)).astype(np.int32)
    assert compare("I", ints.copy(), ints) is None
    off = ints.copy()
    off[8] += 1
    assert "1 of 9" in (compare("I", off, ints) or "")
    half = want.astype(np.float16)
    assert compare("H", (want * (1 + 2e-3)).astype(np.float16), half) is None
    assert compare("S", want[:3], want) is not None
    double = want.astype(np.float64)  # fp32, the default precision, keeps float64's bound
    assert compare("D", double * (1 + 1e-5), double) is not None
    assert compare("D", double * (1 + 1e-5), double, "fp16") is None


def test_llc_bytes_is_plausible() -> None:
    assert (1 << 18) <= llc_bytes() <= (1 << 31)


@pytest.mark.gpu
def test_cuda_measure() -> None:
    task = _matmul(70, 66, 33, target="cuda")
    i_split = [S.Split("C", "i", factor=16), S.Split("C", "j", factor=16),
               S.Bind("C", "i.outer", "blockIdx.y"), S.Bind("C", "j.outer", "blockIdx.x"),
               S.Bind("C", "i.inner", "threadIdx.y"), S.Bind("C", "j.inner", "threadIdx.x")]
    with Measurer(parse("cuda"), repeat=3, min_repeat_ms=5, strict=True) as m:
        results = m.measure(task, [[], i_split, i_split, i_split, [S.Split("C", "x", 2)]],
                            test_hooks={2: "corrupt", 3: "run_segfault"})
    codes = [r.error_code for r in results]
    assert codes[:2] == [ErrorCode.NO_ERROR, ErrorCode.NO_ERROR], [r.error_msg for r in results]
    assert all(c > 0 for c in results[1].costs)
    assert codes[2:] == [ErrorCode.WRONG_ANSWER, ErrorCode.CRASH, ErrorCode.LOWER_ERROR]
    # the lock of the GPU is named by its PCI address; an emulation locks the host CPU
    import re
    (name,) = parse("cuda").backend.device_names(parse("cuda"))
    assert re.fullmatch(r"cuda-[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", name)
    emulated = parse("cuda -emulate=host")
    assert emulated.backend.device_names(emulated) == parse("llvm").backend.device_names(
        parse("llvm"))


def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    from tests.support.backends import GPU_SKIP

    if GPU_SKIP is None:
        pytest.skip("this machine has a GPU")
    with Measurer(parse("cuda -arch=sm_90"), strict=True) as m:
        with pytest.raises(MeasureError, match="cannot check candidates of C: .*(pycuda|GPU)"):
            m.measure(_matmul(8, 8, 8, target="cuda -arch=sm_90"), [[]])


def test_candidates_lowered_in_workers_match_local_lowering(measurer: Measurer) -> None:
    from autosched.cost_model.features import extract_features
    from autosched.search.space import SearchSpace
    from autosched.search.workloads import make

    tensors = make("conv2d", [1, 4, 9, 9, 8, 3, 3, 1, 1])
    task = Task(lambda: tensors, target="llvm")
    space = SearchSpace(task)
    rng = np.random.default_rng(3)
    cands = [space.sample(rng) for _ in range(12)]
    got = measurer.lower_candidates(task, cands)
    assert sorted(got) == list(range(12))
    for i, c in enumerate(cands):
        low = space.lower(c)
        assert (low is None) == (got[i] is None), i
        if low is not None:
            h, feats = got[i]
            assert h == low.ir_hash, i
            np.testing.assert_array_equal(feats, extract_features(low.func, task.target))


def test_workers_start_isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a module planted where the tuner runs, named after one every worker imports
    (tmp_path / "traceback.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('planted_ran').write_text('ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOSCHED_CACHE_DIR", "rel-cache")  # relative: must stay ours
    with Measurer(parse("llvm"), build_workers=1, repeat=1, min_repeat_ms=1, strict=True) as m:
        (res,) = m.measure(_matmul(9, 7, 5), [[]])
        assert m._runner is not None
        cwd = Path(os.readlink(f"/proc/{m._runner.proc.pid}/cwd"))
        environ = Path(f"/proc/{m._runner.proc.pid}/environ").read_bytes().split(b"\0")
    assert res.ok, res.error_msg
    assert not (tmp_path / "planted_ran").exists(), "a worker imported the planted module"
    assert cwd != tmp_path and cwd.name.startswith("autosched-measure-")
    assert not cwd.exists()  # private, and removed with the measurer
    assert f"AUTOSCHED_CACHE_DIR={tmp_path / 'rel-cache'}".encode() in environ


def test_a_worker_killed_from_outside_is_retried_once(measurer: Measurer, task: Task,
                                                      tmp_path: Path) -> None:
    good = _good_steps()
    cands = [good[0], good[2], good[1], good[1], good[0], good[1]]
    hooks = {0: "run_sigkill_once", 1: "run_sigkill", 2: "build_sigkill_once",
             3: "build_sigkill", 4: "run_sigterm_once", 5: "run_segfault"}
    results = measurer.measure(task, cands, test_hooks=hooks)
    for i in (0, 2, 4):  # killed once from outside: measured on the retry
        assert results[i].ok and not results[i].transient, (i, results[i].error_msg)
    for i in (1, 3):  # killed twice: not measured, and says so
        r = results[i]
        assert r.transient and r.error_code is ErrorCode.CRASH, (i, r)
        assert "SIGKILL" in r.error_msg and "not counted as measured" in r.error_msg
    assert results[5].error_code is ErrorCode.CRASH and not results[5].transient  # its own fault
    assert "SIGSEGV" in results[5].error_msg

    log = RecordLog(tmp_path / "mm.jsonl")
    log.append(records_from(task, cands, results))
    loaded = log.load()
    assert [r.error_code for r in loaded] == [
        "NO_ERROR", "WORKER_KILLED", "NO_ERROR", "WORKER_KILLED", "NO_ERROR", "CRASH"]
    # a resumed job does not count the killed ones as measured: it measures them again
    assert results[1].ir_hash and results[1].ir_hash not in log.measured_ir_hashes(
        task.workload_key, task.target)
    assert len(log.records_for(task.workload_key, task.target)) == 4


def test_a_stopped_worker_is_retried_not_timed_out() -> None:
    task = _matmul(16, 16, 16)
    with Measurer(parse("llvm"), build_workers=1, build_timeout=3, run_timeout=2, repeat=1,
                  min_repeat_ms=1, strict=True) as m:
        once, always, hang, build_once = m.measure(task, [[]] * 4, test_hooks={
            0: "run_sigstop_once", 1: "run_sigstop", 2: "run_hang", 3: "build_sigstop_once"})
    assert once.ok and build_once.ok, (once.error_msg, build_once.error_msg)
    assert always.transient and "stopped from outside" in always.error_msg
    assert hang.error_code is ErrorCode.RUN_TIMEOUT and not hang.transient  # its own fault


@pytest.mark.parametrize("kills", [1, 2])
def test_a_run_worker_killed_while_preparing_is_replaced_once(
        monkeypatch: pytest.MonkeyPatch, kills: int) -> None:
    real = Measurer._prepare
    killed: list[int] = []

    def prepare(self: Measurer, w: Any, token: int) -> None:
        if w is self._runner and len(killed) < kills:  # the OOM killer strikes
            os.kill(w.proc.pid, signal.SIGKILL)
            w.proc.wait()
            killed.append(w.proc.pid)
        real(self, w, token)

    monkeypatch.setattr(Measurer, "_prepare", prepare)
    with Measurer(parse("llvm"), build_workers=1, repeat=1, min_repeat_ms=1, strict=True) as m:
        if kills == 1:
            (res,) = m.measure(_matmul(9, 7, 5), [[]])
            assert res.ok, res.error_msg
        else:
            with pytest.raises(MeasureError, match="killed by SIGKILL"):
                m.measure(_matmul(9, 7, 5), [[]])
    assert len(killed) == kills


@pytest.mark.parametrize("user", [{}, {"OMP_WAIT_POLICY": "passive"}, {"GOMP_SPINCOUNT": "7"}])
def test_workers_wait_like_the_models_they_time(user, monkeypatch):
    """Workers measured with OMP_WAIT_POLICY=passive while compiled models spun: small parallel
    kernels timed slow in the tuner and a tuned demo model ran 2x slower than untuned. Both
    now take one policy: the user's, else a short spin."""
    from autosched.search.measure import _worker_env
    from autosched.targets.llvm.compile import SPIN_COUNT, default_wait_policy

    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in user.items():
        monkeypatch.setenv(key, value)
    model_env = dict(user)
    default_wait_policy(model_env)
    worker = _worker_env(None)
    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        assert worker.get(key) == model_env.get(key)
    if not user:
        assert model_env == {"GOMP_SPINCOUNT": SPIN_COUNT}


@pytest.mark.parametrize("target", ["llvm", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_scalar_input_is_measured(target: str) -> None:
    """A 0-d placeholder (a Gather's scalar index) gets a 0-d random input: the default
    schedule's check failed on "expects shape (), given (1,)" (np.ascontiguousarray makes 0-d
    arrays 1-d), so no model with a scalar constant could be tuned."""
    a = te.placeholder((64,), name="A")
    s = te.placeholder((), name="s")
    b = te.compute((64,), lambda i: a[i] * s[()], name="B")
    with Measurer(parse(target), repeat=3, min_repeat_ms=5, strict=True) as m:
        (r,) = m.measure(Task(b, target=target), [[]])
    assert r.error_code == ErrorCode.NO_ERROR, r.error_msg


def test_no_ascontiguousarray_in_the_package() -> None:
    """np.ascontiguousarray returns at least 1-d: a 0-d value (a scalar constant, a scalar
    input) silently becomes shape (1,). The package uses np.asarray(x, order="C")."""
    root = Path(__file__).resolve().parents[2]
    found = [f"{p.relative_to(root)}:{n}" for d in ("autosched", "importers")
             for p in sorted((root / d).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "np.ascontiguousarray(" in line]
    assert not found, found


def _timing_wait(task: Task, hold: str, hold_s: float = 1.5) -> float:
    """Seconds a candidate's measurement takes while another process (a descriptor of this
    one, closed after ``hold_s``) holds the lock of the device ``hold``; checks the result."""
    import fcntl
    import threading

    from autosched.search.device_lock import lock_path

    with Measurer(task.target, build_workers=1, repeat=1, min_repeat_ms=1, strict=True,
                  run_timeout=1.0) as m:
        (res,) = m.measure(task, [[]])  # workers started, reference taken: no wait is theirs
        assert res.error_code is ErrorCode.NO_ERROR and res.run_time < hold_s / 2
        fd = os.open(lock_path(hold), os.O_RDONLY | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)  # this descriptor plays the other process
        timer = threading.Timer(hold_s, os.close, (fd,))
        timer.start()
        t0 = time.perf_counter()
        (res,) = m.measure(task, [_good_steps()[1]])
        waited = time.perf_counter() - t0
        timer.join()
        assert res.error_code is ErrorCode.NO_ERROR, res.error_msg
        if waited >= hold_s - 0.1:
            assert res.run_time >= hold_s - 0.3, (waited, res.run_time)
        (res,) = m.measure(task, [_good_steps()[2]])  # and once free, no wait
        assert res.error_code is ErrorCode.NO_ERROR and res.run_time < hold_s / 2
    return waited


def test_timing_waits_for_the_device_while_another_process_times_on_it(task: Task) -> None:
    """Two jobs on one machine take turns in their timed loops: while another process holds
    the lock of one of the cores the worker may run on, a candidate's timing waits (sending
    beats, so a run timeout shorter than the wait is no timeout), and is measured once the
    lock is free."""
    target = parse("llvm")
    names = target.backend.device_names(target)
    assert names == tuple(f"cpu{c}" for c in sorted(os.sched_getaffinity(0)))
    assert _timing_wait(task, names[-1], hold_s=1.5) >= 1.4


def test_jobs_pinned_to_disjoint_cores_time_side_by_side(task: Task) -> None:
    """Simulated cluster nodes on one host, each pinned to its own cores, measure at once:
    a core outside a job's affinity is not its device. (One lock for the whole CPU made two
    one-core Ray nodes on two cores take turns, halving their throughput.)"""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: no two jobs can be pinned apart")
    os.sched_setaffinity(0, cores[:1])  # the measurer's workers inherit it
    try:
        waited = _timing_wait(task, f"cpu{cores[1]}", hold_s=1.5)
        assert waited < 0.75, f"a job pinned to core {cores[0]} waited for core {cores[1]}"
        assert _timing_wait(task, f"cpu{cores[0]}", hold_s=1.5) >= 1.4
    finally:
        os.sched_setaffinity(0, cores)
