"""A cross target tuned end to end: a small CNN tuned for aarch64 with ``--runner ray`` over a
local Ray cluster whose only measuring node is an aarch64 board emulated by qemu-aarch64; every
task has checked records in the log; ``autosched compile --log`` builds one library from those
records, which runs under qemu from the C driver and matches onnxruntime on the host.

Skips without ray, qemu-aarch64 or the aarch64 cross compiler (conftest.py's marks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import autosched as aus
from autosched.cli import main
from autosched.errors import MeasureError
from autosched.graph.compiler import extract_tasks
from autosched.graph.deploy import export
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import MeasureResult
from autosched.search.record import RecordLog, ir_hash, records_from
from autosched.search.runner import check_runner, make_runner
from autosched.search.space import SearchSpace
from autosched.search.task import Task
from autosched.search.workloads import gemm
from autosched.targets.target import parse
from autosched.testing.models import ort_run, small_cnn
from importers.onnx import from_onnx
from tests.deploy.conftest import c_runner  # noqa: F401  the C driver fixture
from tests.search.conftest import AARCH64, QUICK, needs_qemu, needs_ray, tune_gemm_on_board

IMAGE = 10        # small_cnn at 10x10: eight tasks, each a second or less under qemu
PER_TASK = 3      # trials per task, one round each: the two untuned defaults and one searched


def _llvm_ir(module: Any) -> str:
    return module.get_llvm_ir(optimized=False)


@needs_ray
@needs_qemu
def test_small_cnn_tuned_on_an_emulated_board_deploys_its_records(
        board_cluster: Any, tmp_path: Path, c_runner: Any,  # noqa: F811
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    proto = small_cnn(image=IMAGE)
    model = tmp_path / "small_cnn.onnx"
    onnx.save(proto, str(model))
    graph = from_onnx(str(model))
    tasks, _ = extract_tasks(graph, AARCH64)
    log = tmp_path / "small_cnn-a72.jsonl"

    rc = main(["tune", str(model), "--target", AARCH64, "--runner", "ray", "--log", str(log),
               "--trials", str(PER_TASK * len(tasks)), "--batch-size", str(PER_TASK),
               "--seed", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    # emulated times are no latency: the tasks' table says so instead of estimating one
    table = out[out.rindex("new trials"):]
    assert table.count("untimed") == len(tasks), table
    assert "estimated end-to-end latency: n/a" in table, table

    # every task has records, all checked on the board (under qemu) and marked as emulated
    records = RecordLog(log)
    for task in tasks:
        recs = records.records_for(task.workload_key, task.target)
        assert recs, f"no record of {task.name}"
        assert all(r.emulated for r in recs)
        assert any(r.ok for r in recs), [r.error_msg for r in recs]

    rng = np.random.default_rng(11)
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype) for v in graph.inputs}
    want = ort_run(proto, feeds)

    def deployed_matches_onnxruntime(build: Path) -> None:
        """The library in ``build`` runs under qemu-aarch64 from C and matches onnxruntime
        on the host."""
        got = c_runner("aarch64")(build, "small_cnn", list(feeds.values()),
                                  [(w.shape, str(w.dtype)) for w in want])
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)

    def kernels_are_logged(log: Path) -> int:
        """Compiled with ``log``, each kernel is the schedule of RecordLog.best's record of its
        task, a logged one; returns how many are what compiling without a log builds."""
        records = RecordLog(log)
        compiled = aus.compile(graph, target=AARCH64, log=log)
        assert len(compiled.kernels) == len(tasks)
        untuned = 0
        for kernel in compiled.kernels:
            task = kernel.task
            (best,) = records.best(task.workload_key, task.target)
            logged = {r.ir_hash for r in records.records_for(task.workload_key, task.target)}
            sch = task.schedule(best.schedule_steps())
            assert best.emulated and best.ir_hash in logged
            assert ir_hash(task.lower(sch)) == best.ir_hash
            assert _llvm_ir(kernel.module) == _llvm_ir(task.build(sch)), \
                f"{task.name} does not run its logged schedule"
            untuned += sch.steps == SearchSpace(task).default_schedule().steps
        return untuned

    build = tmp_path / "build"
    rc = main(["compile", str(model), "--target", AARCH64, "--log", str(log), "-o", str(build)])
    assert rc == 0, capsys.readouterr().out
    # one line says that the schedules applied were checked but not timed on the target
    assert "checked only under an emulator, untimed" in caplog.text
    # among untimed records the untuned default's applies (checked on the board), not the
    # one that ran fastest under qemu
    assert kernels_are_logged(log) == len(tasks)
    deployed_matches_onnxruntime(build)

    # without the untuned defaults' records, the searched schedules apply and deploy as well
    searched = tmp_path / "searched.jsonl"
    searched.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                                if '"untuned":true' not in line.replace(" ", "")))
    assert kernels_are_logged(searched) < len(tasks)
    export(aus.compile(graph, target=AARCH64, log=searched), tmp_path / "build2",
           name="small_cnn")
    deployed_matches_onnxruntime(tmp_path / "build2")


# -- without Ray: the qemu runner --------------------------------------------------------------


def test_local_runner_refuses_another_architecture_and_qemu_refuses_the_host() -> None:
    with pytest.raises(MeasureError, match="runner local cannot run .*aarch64.*runner qemu"):
        make_runner("local", parse(AARCH64))
    with pytest.raises(MeasureError, match="runner qemu runs a CPU target of another arch"):
        make_runner("qemu", parse("llvm"))
    assert check_runner("qemu") == "qemu"


@needs_qemu
def test_qemu_runner_checks_candidates_here_and_their_best_is_said_untimed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """``--runner qemu``: built and run on this machine under qemu-aarch64, no cluster; a
    wrong reference makes every candidate a wrong answer (the check is real)."""
    log = tmp_path / "gemm-a72.jsonl"
    tune_gemm_on_board("qemu", (21, 18, 11), 4, 3, log, capsys)
    task = Task(lambda: gemm(21, 18, 11), target=AARCH64, name="gemm_21x18x11")
    (best,) = RecordLog(log).best(task.workload_key, task.target)
    assert best.emulated and best.untuned
    assert "checked only under an emulator" in caplog.text

    with make_runner("qemu", task.target, QUICK) as runner:
        inputs, (ref,) = runner._state(task)
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        np.testing.assert_allclose(ref, a @ b, rtol=1e-4, atol=1e-4)
        runner._states[task.workload_key] = (inputs, [ref + 1e-2])
        (wrong,) = runner.measure(task, [best.schedule_steps()])
        assert wrong.error_code is ErrorCode.WRONG_ANSWER and wrong.emulated


def test_untimed_records_rank_the_untuned_default_first_and_timed_ones_win(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Emulated times do not rank schedules (docs/REMOTE.md): among records checked only under
    an emulator the untuned default's applies, else the emulated fastest; a timed record of
    the target beats them all."""
    task = Task(lambda: gemm(20, 16, 12), target=AARCH64, name="gemm_20x16x12")
    space, rng = SearchSpace(task), np.random.default_rng(4)
    schedules = [space.default_schedule(), *(space.schedule(space.sample(rng)) for _ in range(2))]
    extras = [{"emulated": True, "untuned": True}, {"emulated": True}, {"emulated": True}]

    def logged(costs: list[float], extra: list[dict[str, Any]]) -> RecordLog:
        log = RecordLog(tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl")
        results = [MeasureResult((c,), ErrorCode.NO_ERROR, ir_hash=f"h{n}")
                   for n, c in enumerate(costs)]
        log.append(records_from(task, schedules[: len(costs)], results, extra))
        return log

    def best(log: RecordLog) -> str:
        (top,) = log.best(task.workload_key, task.target)
        return top.ir_hash

    assert best(logged([3.0, 1.0, 2.0], extras)) == "h0"   # slowest under qemu, yet untuned
    assert "the untuned default's where it is logged" in caplog.text
    assert best(logged([3.0, 1.0, 2.0], [{}, *extras[1:]])) == "h0"   # timed: it wins
    assert best(logged([3.0, 1.0, 2.0], [{"emulated": True}, *extras[1:]])) == "h1"
    assert best(logged([2.0, 1.0], [extras[0], {}])) == "h1"   # timed beats untimed
