"""The Ray runner with nodes that build what they measure (MeasureOptions.node_builds), on a
cluster of its own: each batch goes whole to one node; a node killed with a batch in flight
costs only that batch, which another node builds and measures; no trial lost or repeated."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.search.conftest import QUICK, kill_one_node_mid_job, needs_ray, ray_cluster


@pytest.fixture(scope="module")
def host_cluster() -> Iterator[Any]:
    with ray_cluster(2, board=False, gpu=False) as c:
        yield c


@needs_ray
def test_a_node_killed_with_its_batch_in_flight_loses_nothing(host_cluster: Any,
                                                              tmp_path: Path) -> None:
    kill_one_node_mid_job(host_cluster, tmp_path, replace(QUICK, node_builds=True), batch_size=4)
