"""Shared test setup. The one GPU marker lives here: tests marked ``gpu`` skip without a GPU."""

from __future__ import annotations

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
def rng() -> np.random.Generator:
    """Fresh random inputs every run (seed printed on failure by pytest's -p randomly if used)."""
    return np.random.default_rng()
