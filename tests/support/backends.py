"""Which backends the numeric tests run on: ``--targets`` names them (comma-separated; by
default the reference evaluator, and LLVM when its module is importable). "interp" is the numpy
TE interpreter (support/te_interp.py, operator tests only: it needs no schedule); "cuda" needs a
GPU (marked gpu, skipped without one); any other name is built as it is written."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import autosched as aus

INTERP = "interp"


def _has(module: str) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    return hasattr(mod, "build_module")


CPU_TARGETS: list = ["ref"] + (["llvm"] if _has("autosched.targets.llvm") else [])
"""What a test that builds a schedule runs on: ``parametrize("target", CPU_TARGETS)``."""
TARGETS: list = []
"""CPU_TARGETS and the interpreter: what a test that takes a ``target`` fixture runs on."""


def configure(names: str | None) -> None:
    """Fill CPU_TARGETS and TARGETS in place (test modules hold the lists): with the targets
    ``--targets`` names, else with the defaults."""
    if names is not None:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        params = [pytest.param(n, marks=pytest.mark.gpu) if n == "cuda" else n for n in wanted]
        CPU_TARGETS[:] = [p for p in params if p != INTERP]
        TARGETS[:] = params
    else:
        TARGETS[:] = CPU_TARGETS


def parametrize_target(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``target`` without parametrizing it runs on every one of TARGETS (a
    ``pytest_generate_tests`` hook: the lists are filled when the options are parsed)."""
    if "target" in metafunc.fixturenames and not any(
            "target" in _argnames(m) for m in metafunc.definition.iter_markers("parametrize")):
        metafunc.parametrize("target", TARGETS)


def _argnames(mark: pytest.Mark) -> list[str]:
    names = mark.args[0]
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def gpu_skip_reason() -> str | None:
    """Why tests marked gpu cannot run here, or None on a machine with a usable GPU."""
    try:
        import pycuda.driver as drv
    except Exception as exc:  # pycuda missing or broken: no GPU tests
        return f"pycuda is not importable ({type(exc).__name__}: {exc})"
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA device"
    except Exception as exc:
        return f"CUDA driver unavailable ({exc})"
    return None


GPU_SKIP = gpu_skip_reason()


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


def garbage(shape: tuple, dtype: str) -> np.ndarray:
    """An output array whose elements show when a kernel forgets to write them (NaN, or 77)."""
    out = np.empty(shape, dtype)
    out.fill(np.nan if dtype.startswith("float") else 77)
    return out


def run(sch, args, inputs: list[np.ndarray], target: str = "ref") -> list[np.ndarray]:
    """Build ``sch`` for ``target``, call it on ``inputs`` plus fresh ``garbage`` outputs, return
    the outputs."""
    outs = [garbage(tuple(int(d) for d in t.shape), t.dtype) for t in args[len(inputs):]]
    mod = aus.build(sch, args, target=target)
    mod(*inputs, *outs)
    return outs
