"""Tests of the auto-scheduler (autosched/search): sketches, measurement, tuning records and
their hardening, the task scheduler, GPU sketches. test_ops_sketch.py runs sampled sketches of
each operator graph on every backend of ``--targets``.

Shared by the runner tests (test_runner_ray.py, test_cross_tune.py): the aarch64 target, the
skip marks for Ray and for the emulated board, quick measurement options, and local Ray
clusters (``cluster``: two nodes of this machine's target, an aarch64 board, a GPU node when
there is a GPU; ``board_cluster``: only the aarch64 board), started once per test module.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from autosched.search.protocol import MeasureOptions
from autosched.search.record import HEADER_KEY
from autosched.search.runner import resource_name
from autosched.targets.target import parse
from tests.support import backends

AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
HAS_QEMU = bool(shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"))

needs_ray = pytest.mark.skipif(find_spec("ray") is None,
                               reason="ray is not installed (pip install 'autosched[cluster]')")
needs_qemu = pytest.mark.skipif(
    not HAS_QEMU,
    reason="qemu-aarch64 or aarch64-linux-gnu-gcc is not installed (apt-get install qemu-user "
           "gcc-aarch64-linux-gnu libc6-dev-arm64-cross)")

# quick measurements: the tests check where candidates run and what is recorded, not speed
QUICK = MeasureOptions(build_workers=1, repeat=2, min_repeat_ms=2.0, seed=7, strict=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backends.parametrize_target(metafunc)


def log_records(path: Path) -> list[dict[str, Any]]:
    """The decoded records of a log, in order (its target header lines left out)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [d for d in lines if HEADER_KEY not in d]


def tune_gemm_on_board(runner: str, sizes: tuple[int, int, int], trials: int, seed: int,
                       log: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """``autosched tune-op gemm SIZES --target AARCH64 --runner RUNNER``, one round of
    ``trials``; checks that it says the candidates were checked under emulation and that
    every record is correct and marked emulated; returns the records."""
    from autosched.cli import main

    rc = main(["tune-op", "gemm", *map(str, sizes), "--target", AARCH64, "--trials",
               str(trials), "--batch-size", str(trials), "--seed", str(seed), "--runner",
               runner, "--log", str(log)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{trials} candidates checked under emulation" in out
    records = log_records(log)
    assert len(records) == trials
    assert all(r["error_code"] == "NO_ERROR" and r["extra"].get("emulated") is True
               for r in records), [r["error_msg"] for r in records]
    return records


@contextmanager
def ray_cluster(host_nodes: int, board: bool, gpu: bool) -> Iterator[Any]:
    """A local Ray cluster this process is connected to: a head without resources, and nodes
    of one CPU each that advertise this machine's target (``host_nodes`` of them, listed as
    ``cluster.host_nodes``), the aarch64 board (``board``, with qemu-aarch64 installed) and
    the GPU (``gpu``, with one present)."""
    if find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'autosched[cluster]')")
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    host = resource_name(parse("llvm"))
    nodes = [c.add_node(num_cpus=1, resources={host: 1}) for _ in range(host_nodes)]
    if board and HAS_QEMU:
        c.add_node(num_cpus=1, resources={resource_name(parse(AARCH64)): 1})
    if gpu and backends.GPU_SKIP is None:
        c.add_node(num_cpus=1, resources={resource_name(parse("cuda")): 1})
    ray.init(address=c.address, log_to_driver=False)
    c.host_nodes = nodes
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two nodes of this machine's target, the aarch64 board, the GPU when there is one."""
    with ray_cluster(2, board=True, gpu=True) as c:
        yield c


@pytest.fixture(scope="module")
def board_cluster() -> Iterator[Any]:
    """Only the aarch64 board: a node of this machine that runs candidates under qemu."""
    if not HAS_QEMU:
        pytest.skip(needs_qemu.kwargs["reason"])
    with ray_cluster(0, board=True, gpu=False) as c:
        yield c


def gemm_task(target: str, m: int = 33, n: int = 29, k: int = 17) -> Any:
    from autosched.search.task import Task
    from autosched.search.workloads import gemm

    return Task(lambda: gemm(m, n, k), target=target, name=f"gemm_{m}x{n}x{k}")


def kill_one_node_mid_job(cluster: Any, tmp_path: Path, options: MeasureOptions,
                          batch_size: int = 8) -> None:
    """Tune a gemm over ``cluster``'s two host nodes and kill one with a candidate in flight:
    the job finishes on the other, every trial recorded once, none lost. (With node builds a
    batch goes whole to one node: take batches small enough that a node gets a second one.)"""
    from autosched.search.runner_ray import RayRunner
    from autosched.search.tune import TuneOptions, tune

    task = gemm_task("llvm", 40, 31, 23)
    killed: list[str] = []

    def kill_its_node(n: int, where: str) -> None:
        # from the 4th candidate on, the first one handed to an actor that has measured
        # already: its node dies with the candidate in flight
        if n >= 4 and not killed and runner.measured_on[where] >= 1:
            node = next(x for x in cluster.host_nodes if x.node_id in where)
            cluster.remove_node(node, allow_graceful=False)
            killed.append(node.node_id)

    log = tmp_path / "gemm.jsonl"
    trials = 12
    with RayRunner(task.target, options, on_dispatch=kill_its_node) as runner:
        best = tune(task, trials=trials, log=log, runner=runner,
                    options=TuneOptions(batch_size=batch_size, seed=1, verbose=False))
        nodes_used = {w.split(" node ")[1].split()[0] for w in runner.measured_on}
        requeued = runner.requeued
    assert killed, "no node was killed"
    assert requeued >= 1, "the killed node had a candidate in flight, which must be re-queued"
    assert len(nodes_used) == 2 and killed[0] in nodes_used, "both nodes measured"
    records = log_records(log)
    hashes = [r["ir_hash"] for r in records]
    assert len(records) == trials, "one record per trial: none lost"
    assert len(set(hashes)) == len(hashes), "no candidate recorded twice"
    assert all(r["error_code"] == "NO_ERROR" for r in records), [r["error_msg"] for r in records]
    assert math.isfinite(best[task.name])
    assert min(min(r["costs"]) for r in records) > 0
