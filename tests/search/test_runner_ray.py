"""Runners: the local default, the Ray runner over a local cluster of two worker nodes (one
killed mid-job), and an aarch64 board emulated by qemu-aarch64 (correctness only).

The Ray tests start their own cluster (ray.cluster_utils.Cluster: a head without resources,
two nodes advertising this machine's target, one advertising aarch64) and skip without ray
(pip install 'autosched[cluster]'); the emulation tests skip without qemu-aarch64 or the
aarch64 cross compiler.
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched.errors import MeasureError
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import Measurer
from autosched.search.runner import check_runner, make_runner, needs_emulation, resource_name
from autosched.search.space import SearchSpace
from autosched.search.tune import TuneOptions, tune
from autosched.targets.target import parse
from tests.search.conftest import (
    AARCH64,
    QUICK,
    gemm_task,
    kill_one_node_mid_job,
    log_records,
    needs_qemu,
    needs_ray,
    tune_gemm_on_board,
)
from tests.support import ROOT

# -- the interface, without ray --------------------------------------------------------------


def test_import_autosched_and_local_tuning_do_not_import_ray() -> None:
    code = ("import sys, autosched, autosched.search.tune, autosched.search.runner\n"
            "from autosched.search.runner import make_runner\n"
            "make_runner('local').close()\n"
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def test_make_runner_local_is_the_measurer_and_bad_names_are_refused() -> None:
    runner = make_runner(None, parse("llvm"), QUICK)
    try:
        assert isinstance(runner, Measurer)
    finally:
        runner.close()
    for bad in ("rai", "ray://", "local:2"):
        with pytest.raises(MeasureError, match=f"unknown runner '{bad}'"):
            check_runner(bad)
    assert check_runner("ray://head:10001") == "ray://head:10001"


def test_resource_name_says_what_the_code_depends_on() -> None:
    assert resource_name(parse(AARCH64)) == "autosched:llvm-aarch64-v128"
    assert resource_name(parse("cuda -arch=sm_90")) == "autosched:cuda-sm_90"
    assert resource_name(parse("llvm -mcpu=skylake -mattr=+avx2,+fma")) == \
        "autosched:llvm-x86_64-v256"
    assert needs_emulation(parse(AARCH64)) != parse(AARCH64).is_host
    assert not needs_emulation(parse("llvm"))


# -- emulated aarch64, without ray -----------------------------------------------------------


@needs_qemu
def test_emulated_board_checks_candidates_against_numpy() -> None:
    from autosched.search.emulated import EmulatedMeasurer

    task = gemm_task(AARCH64)
    space, rng = SearchSpace(task), np.random.default_rng(3)
    schedules = [space.schedule(space.sample(rng)) for _ in range(3)]
    with Measurer(task.target, QUICK) as builder, EmulatedMeasurer(task.target, QUICK) as em:
        built, failed = builder.build(task, schedules)
        assert len(built) == 3 and failed == [None] * 3
        inputs, (ref,) = em._state(task)
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        # the default schedule, run under qemu, is the reference: it must be numpy's product
        np.testing.assert_allclose(ref, a @ b, rtol=1e-4, atol=1e-4)
        results = em.run_artifacts(task, built)
        assert [r.error_code for r in results] == [ErrorCode.NO_ERROR] * 3
        assert all(r.emulated and len(r.costs) == QUICK.repeat for r in results)
        # a reference that is off by one element: every candidate is then a wrong answer
        bad = ref.copy()
        bad[5, 7] += 1.0
        em._states[task.workload_key] = (inputs, [bad])
        wrong = em.run_artifacts(task, built[:1])[0]
        assert wrong.error_code is ErrorCode.WRONG_ANSWER and "(5, 7)" in wrong.error_msg


# -- a local Ray cluster ------------------------------------------------------------------------


@needs_ray
def test_nodes_that_build_their_batches_measure_every_candidate_once(cluster: Any,
                                                                    tmp_path: Path) -> None:
    """MeasureOptions.node_builds: a batch goes whole to one node, which builds and measures
    it, one batch per node at once; the records are those of a job built on the tuner's
    machine: one per trial, all checked."""
    from autosched.search.runner_ray import RayRunner

    task = gemm_task("llvm", 36, 27, 19)
    log = tmp_path / "gemm.jsonl"
    with RayRunner(task.target, replace(QUICK, node_builds=True)) as runner:
        assert runner.lanes(task.target) == 2  # the two host nodes' actors
        best = tune(task, trials=12, log=log, runner=runner,
                    options=TuneOptions(batch_size=6, seed=2, verbose=False))
        nodes_used = {w.split(" node ")[1].split()[0] for w in runner.measured_on}
        assert sorted(runner.measured_on.values()) == [6, 6], runner.measured_on
        assert set(runner.busy_s) == set(runner.measured_on)  # each node's time in its calls
        assert all(s > 0 for s in runner.busy_s.values())
        assert runner.dispatched == 12
        assert runner._builder.default_artifact(task) is None  # nothing was built here
        assert runner.measure(task, []) == [] and runner.dispatched == 12
    assert len(nodes_used) == 2, "both nodes built and measured"
    records = log_records(log)
    assert len(records) == 12 and len({r["ir_hash"] for r in records}) == 12
    assert all(r["error_code"] == "NO_ERROR" for r in records), [r["error_msg"] for r in records]
    assert math.isfinite(best[task.name])


@needs_ray
def test_two_nodes_one_killed_mid_job_loses_and_repeats_nothing(cluster: Any,
                                                                 tmp_path: Path) -> None:
    kill_one_node_mid_job(cluster, tmp_path, QUICK)


@needs_ray
@needs_qemu
def test_aarch64_board_node_under_qemu_tunes_from_the_command_line(
        cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's command (it said "not this machine") tunes on the emulated board: the
    records are checked there and say emulated; no time becomes the board's best."""
    log = tmp_path / "gemm-aarch64.jsonl"
    tune_gemm_on_board("ray", (24, 19, 13), 5, 2, log, capsys)
    task = gemm_task(AARCH64, 24, 19, 13)
    again = tune(task, total_trials=6, log=log, runner="ray", options=TuneOptions(
        batch_size=1, seed=3, verbose=False, measure=QUICK))
    assert again[task.name] == math.inf, "emulated times are never the best"
    assert len(log_records(log)) == 6


@needs_ray
def test_a_target_no_node_advertises_is_one_clear_error(cluster: Any, tmp_path: Path) -> None:
    from autosched.search.runner_ray import RayRunner

    avx2 = "llvm -mcpu=skylake -mattr=+avx2,+fma"
    with RayRunner(parse(avx2), QUICK, start_timeout=1.0) as runner:
        with pytest.raises(MeasureError, match="none advertises autosched:llvm-x86_64-v256.*"
                                               "ray start --resources="):
            runner.measure(gemm_task(avx2), [[]])


@needs_ray
@pytest.mark.gpu
def test_gpu_node_measures_cuda_candidates(cluster: Any, tmp_path: Path) -> None:
    task = gemm_task("cuda", 70, 66, 33)
    log = tmp_path / "gemm-cuda.jsonl"
    best = tune(task, trials=6, log=log, runner="ray", options=TuneOptions(
        batch_size=6, seed=4, verbose=False, measure=QUICK))
    records = log_records(log)
    assert len(records) == 6 and len({r["ir_hash"] for r in records}) == 6
    assert sum(r["error_code"] == "NO_ERROR" for r in records) >= 2, \
        [r["error_msg"] for r in records]
    assert not any(r["extra"].get("emulated") for r in records)
    assert math.isfinite(best[task.name])
