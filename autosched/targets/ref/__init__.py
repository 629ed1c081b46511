"""The "ref" target: run loop IR with the reference evaluator (slow, exact, needs no backend).

CPU schedules run as plain Python loops and GPU schedules with CUDA semantics (blocks, threads
in lockstep at barriers, shared memory per block), so CI can check the numerics of any
schedule without LLVM or a GPU.

Target options: ``ref -check-bounds=0`` turns bounds checks off, ``ref -check-races=0`` the GPU
data-race checker (both are on by default).

Example::

    mod = aus.build(s, [A, B, C], target="ref")   # or build_module(func, parse("ref"))
    mod(a, b, c)                                  # c written in place
    print(mod.get_source())                       # the Python it runs
    seconds = mod.time(a, b, c, repeat=3).median
"""

from __future__ import annotations

import numpy as np

from autosched.errors import CompileError
from autosched.targets.backend import Backend, WallClockModule, register
from autosched.targets.host import usable_cores
from autosched.targets.ref.evaluate import Program, compile_func
from autosched.targets.ref.pyrender import kernels
from autosched.targets.target import Target
from autosched.tir.ir import PrimFunc


class RefModule(WallClockModule):
    """A PrimFunc ready to run on numpy arrays (outputs written in place)."""

    def __init__(
        self, func: PrimFunc, target: Target, check_bounds: bool = True, check_races: bool = True
    ) -> None:
        self.func = func
        self.target = target
        self.flags = (check_bounds, check_races)
        self._program: Program = compile_func(func, check_bounds, check_races)

    def __reduce__(self) -> tuple:
        # The compiled Python does not pickle; a worker process renders the function again.
        return (RefModule, (self.func, self.target, *self.flags))

    def __call__(self, *arrays: np.ndarray) -> None:
        self._program(*arrays)


    def get_source(self) -> str:
        """The generated Python source."""
        return self._program.source

    def __repr__(self) -> str:
        return f"RefModule({self.func.name}, target={self.target})"


def check_launch_limits(func: PrimFunc, target: Target) -> None:
    """Refuse kernels a GPU could not launch: more threads per block or more shared memory per
    block than ``target`` allows (where the sizes are constants)."""
    for k in kernels(func):
        threads = k.threads_per_block
        if threads is not None and threads > target.max_threads_per_block:
            dims = "x".join(str(k.launch.get(f"threadIdx.{a}", 1)) for a in "xyz")
            raise CompileError(
                f"kernel {k.name} launches {threads} threads per block ({dims}); target "
                f"{target} allows {target.max_threads_per_block}"
            )
        if k.shared_bytes is not None and k.shared_bytes > target.max_shared_memory_per_block:
            raise CompileError(
                f"kernel {k.name} needs {k.shared_bytes} bytes of shared memory per block; "
                f"target {target} allows {target.max_shared_memory_per_block}"
            )


def build_module(func: PrimFunc, target: Target) -> RefModule:
    """Compile ``func`` for the reference evaluator (the "ref" target of aus.build); kernels
    must fit the target's GPU limits (threads and shared memory per block)."""
    check_launch_limits(func, target)

    def on(option: str) -> bool:
        return target.option(option, "1").lower() not in ("0", "false", "off", "no")

    return RefModule(func, target, check_bounds=on("check-bounds"), check_races=on("check-races"))


class RefBackend(Backend):
    """The reference evaluator: any schedule, CPU or GPU, as plain Python on numpy arrays."""

    kind = "ref"

    def target(self, options: tuple[tuple[str, str], ...]) -> Target:
        return Target(self.kind, options, num_cores=usable_cores())

    def build(self, func: PrimFunc, target: Target) -> RefModule:
        return build_module(func, target)


register(RefBackend())
