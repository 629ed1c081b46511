"""Shared test setup. The one GPU marker lives here: tests marked ``gpu`` skip without a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest


def _gpu_reason() -> str | None:
    try:
        import pycuda.driver as drv  # noqa: F401
    except Exception as exc:  # pycuda missing or broken: no GPU tests
        return f"pycuda is not importable ({type(exc).__name__}: {exc})"
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA device"
    except Exception as exc:
        return f"CUDA driver unavailable ({exc})"
    return None


_GPU_SKIP = _gpu_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _GPU_SKIP is None:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU: {_GPU_SKIP}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Fresh random inputs every run. The seed is printed (pytest shows it with a failure) and
    ``AUTOSCHED_TEST_SEED`` replays it."""
    seed = int(os.environ.get("AUTOSCHED_TEST_SEED") or np.random.SeedSequence().entropy % 2**63)
    print(f"{request.node.nodeid}: AUTOSCHED_TEST_SEED={seed}")
    return np.random.default_rng(seed)
