"""pytest plugin that runs the operator and schedule tests on the CUDA backend too.

    PYTHONPATH=benchmarks pytest -p gpu_run_plugin tests/test_ops_*.py tests/test_schedule.py

adds "cuda" to the backends of tests/backends.py (on a GPU machine: real runs). Without a GPU,
AUTOSCHED_CUDA_EMULATE picks what the "cuda" module (still generated and compiled with NVRTC)
runs instead:

    AUTOSCHED_CUDA_EMULATE=1     the generated CUDA C itself, compiled with g++ and run on the
                                 CPU with checked buffers (autosched/targets/cuda/host_emulate.py)
    AUTOSCHED_CUDA_EMULATE=ir    the reference evaluator on the bound loop IR (mod.func)

so a machine without a GPU checks that every operator's CUDA compiles and computes the right
numbers. Without g++ (or off x86-64), "1" falls back to "ir" (and says so once).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import tests.backends as backends

if "cuda" not in backends.CPU_TARGETS:
    backends.CPU_TARGETS.append("cuda")

_MODE = os.environ.get("AUTOSCHED_CUDA_EMULATE", "")

if _MODE in ("1", "ir"):
    import autosched.targets.cuda as cuda_pkg
    from autosched.targets.cuda.host_emulate import run_on_host, unavailable
    from autosched.targets.ref.evaluate import evaluate

    if _MODE == "1" and unavailable() is not None:
        print(f"gpu_run_plugin: {unavailable()}; running the loop IR instead of the CUDA C",
              file=sys.stderr)
        _MODE = "ir"

    _real = cuda_pkg.build_module

    class _Emulated:
        def __init__(self, mod: Any) -> None:
            self.mod = mod

        def __call__(self, *arrays: Any) -> None:
            if _MODE == "ir":
                self.mod._bind_shapes(arrays)  # the GPU module's own argument checks
                evaluate(self.mod.func, *arrays)
            else:
                run_on_host(self.mod, *arrays)

    def _emulated_build(func: Any, target: Any) -> Any:
        return _Emulated(_real(func, target))

    cuda_pkg.build_module = _emulated_build
