"""Tests of the auto-scheduler (autosched/search): sketches, measurement, tuning records and
their hardening, the task scheduler, GPU sketches. test_ops_sketch.py runs sampled sketches of
each operator graph on every backend of ``--targets``."""

from __future__ import annotations

import pytest

from tests.support import backends


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backends.parametrize_target(metafunc)
