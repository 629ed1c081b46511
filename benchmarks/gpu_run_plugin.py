"""pytest plugin that runs the operator and schedule tests on the CUDA backend too.

    PYTHONPATH=benchmarks pytest -p gpu_run_plugin tests/test_ops_*.py tests/test_schedule.py

adds "cuda" to the backends of tests/backends.py (on a GPU machine: real runs). With
AUTOSCHED_CUDA_EMULATE=1 the "cuda" module is still generated and compiled with NVRTC, but
called through the reference evaluator on the bound loop IR, so a machine without a GPU checks
that every operator's CUDA compiles and that its GPU schedule computes the right numbers.
"""

from __future__ import annotations

import os
from typing import Any

import tests.backends as backends

if "cuda" not in backends.CPU_TARGETS:
    backends.CPU_TARGETS.append("cuda")

if os.environ.get("AUTOSCHED_CUDA_EMULATE") == "1":
    import autosched.targets.cuda as cuda_pkg
    from autosched.schedule.evaluate import evaluate

    _real = cuda_pkg.build_module

    class _Emulated:
        def __init__(self, mod: Any) -> None:
            self.mod = mod

        def __call__(self, *arrays: Any) -> None:
            self.mod._bind_shapes(arrays)  # the GPU module's own argument checks
            evaluate(self.mod.func, *arrays)

    def _emulated_build(func: Any, target: Any) -> Any:
        return _Emulated(_real(func, target))

    cuda_pkg.build_module = _emulated_build
