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
from autosched.search.error_codes import ErrorCode
from autosched.search.record import RecordLog
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

    build = tmp_path / "build"
    rc = main(["compile", str(model), "--target", AARCH64, "--log", str(log), "-o", str(build)])
    assert rc == 0, capsys.readouterr().out

    # one line says that the schedules applied were checked but not timed on the target
    assert "checked only under an emulator" in caplog.text
    # the compiled kernels are the logged schedules (RecordLog.best's), not the untuned ones
    compiled = aus.compile(graph, target=AARCH64, log=log)
    assert len(compiled.kernels) == len(tasks)
    untuned = 0
    for kernel in compiled.kernels:
        task = kernel.task
        (best,) = records.best(task.workload_key, task.target)
        assert best.emulated and best.ok
        assert _llvm_ir(kernel.module) == _llvm_ir(task.build(task.schedule(
            best.schedule_steps()))), f"{task.name} does not run its logged schedule"
        untuned += _llvm_ir(kernel.module) == _llvm_ir(task.build(
            SearchSpace(task).default_schedule()))
    assert untuned < len(tasks), "every kernel is what compiling without a log builds"

    # the library runs under qemu-aarch64 from C and matches onnxruntime on the host
    rng = np.random.default_rng(11)
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype) for v in graph.inputs}
    want = ort_run(proto, feeds)
    got = c_runner("aarch64")(build, "small_cnn", list(feeds.values()),
                              [(w.shape, str(w.dtype)) for w in want])
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)


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
    rl = RecordLog(log)
    (best,) = rl.best(task.workload_key, task.target)
    assert best.emulated
    assert best.cost == min(r.cost for r in rl.records_for(task.workload_key, task.target))
    assert "checked only under an emulator" in caplog.text

    with make_runner("qemu", task.target, QUICK) as runner:
        inputs, (ref,) = runner._state(task)
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        np.testing.assert_allclose(ref, a @ b, rtol=1e-4, atol=1e-4)
        runner._states[task.workload_key] = (inputs, [ref + 1e-2])
        (wrong,) = runner.measure(task, [best.schedule_steps()])
        assert wrong.error_code is ErrorCode.WRONG_ANSWER and wrong.emulated
