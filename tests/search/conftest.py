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
