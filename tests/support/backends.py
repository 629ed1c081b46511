"""Which backends the numeric tests run on: the reference evaluator always, LLVM when its
module is importable, CUDA (GPU schedules) only with a GPU."""

from __future__ import annotations

import importlib
import os

import numpy as np

import autosched as aus


def _has(module: str) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return hasattr(mod, "build_module")


_ALL = ["ref"] + (["llvm"] if _has("autosched.targets.llvm") else [])
# AUTOSCHED_TEST_TARGETS=ref limits the numeric tests to some backends (comma-separated).
_WANT = [t for t in os.environ.get("AUTOSCHED_TEST_TARGETS", "").split(",") if t]
CPU_TARGETS = [t for t in _ALL if not _WANT or t in _WANT]


def tolerance(dtype: str) -> dict[str, float]:
    return {"float16": dict(rtol=2e-2, atol=2e-2), "float32": dict(rtol=1e-4, atol=1e-4),
            "float64": dict(rtol=1e-9, atol=1e-9)}.get(dtype, dict(rtol=0, atol=0))


def random_array(rng: np.random.Generator, shape: tuple, dtype: str = "float32") -> np.ndarray:
    """Fresh random data, never all zeros; ints small enough not to overflow products."""
    if dtype.startswith("float"):
        return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(-20 if not dtype.startswith("u") else 0, 20, size=shape).astype(dtype)


def run(sch, args, inputs: list[np.ndarray], target: str = "ref") -> list[np.ndarray]:
    """Build ``sch`` for ``target``, call it on ``inputs`` plus freshly allocated outputs (filled
    with NaN / garbage so unwritten elements show), return the outputs."""
    n_in = len(inputs)
    outs = []
    for t in args[n_in:]:
        shape = tuple(int(d) for d in t.shape)
        arr = np.empty(shape, dtype=t.dtype)
        arr.fill(np.nan if t.dtype.startswith("float") else 77)
        outs.append(arr)
    mod = aus.build(sch, args, target=target)
    mod(*inputs, *outs)
    return outs
