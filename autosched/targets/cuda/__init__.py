"""The CUDA backend: loop IR -> CUDA C (codegen) -> cubin (NVRTC) -> launches (pycuda).

Building needs cuda-bindings and an NVRTC library but no GPU; running needs pycuda and a GPU.
Neither is imported until used, so ``import autosched`` works without them.

Targets: ``cuda -arch=sm_90`` (arch detected when a GPU is present), ``-fast-math``, and host
emulation for machines without a GPU: the kernels are still generated and compiled with NVRTC,
then ``-emulate=host`` runs the generated CUDA C itself, compiled with g++, on the CPU with
checked buffers (host_emulate.py; without g++ or off x86-64 it falls back to "ir", with a
warning), and ``-emulate=ir`` runs the bound loop IR with the reference evaluator.

Example::

    mod = aus.build(s, [A, B, C], target="cuda -arch=sm_90")
    print(mod.get_source())       # the CUDA C
    mod.cubin                     # bytes, also on a machine without a GPU
    mod(a, b, c)                  # on a GPU: numpy arrays in, c written in place
    aus.build(s, [A, B, C], target="cuda -emulate=host")(a, b, c)   # the same CUDA C, on the CPU
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from autosched.errors import CompileError, RuntimeError_
from autosched.targets.backend import Backend, DeviceMemory, Module, TargetKeys, cpu_names, register
from autosched.targets.host import detect_cuda_arch
from autosched.targets.target import Target
from autosched.tir import ir

EMULATE = ("host", "ir")


def build_module(func: ir.PrimFunc, target: Target):  # noqa: ANN201  (CudaModule, lazily imported)
    """Bind any unbound nest (default schedule), render CUDA C, compile it with NVRTC."""
    from autosched.targets.cuda.codegen import generate
    from autosched.targets.cuda.default_schedule import bind_unbound
    from autosched.targets.cuda.nvrtc import compile_cuda
    from autosched.targets.cuda.private_storage import privatize
    from autosched.targets.cuda.runtime import CudaModule

    threads = min(256, target.max_threads_per_block)
    func = privatize(bind_unbound(func, threads))  # the function codegen renders, as IR
    source = generate(func, target)
    arch = (target.arch or "sm_90") + ("a" if source.arch_specific else "")
    binary = compile_cuda(source.code, arch, nvrtc_options(target),
                          needs_headers=source.uses_half, name=f"{func.name}.cu")
    return CudaModule(func, target, source, binary)


def nvrtc_options(target: Target) -> tuple[str, ...]:
    """The NVRTC options ``target`` asks for (beyond the arch)."""
    return ("--use_fast_math",) if "fast-math" in dict(target.options) else ()


def shared_bytes(func: ir.PrimFunc) -> int:
    """Shared memory the function allocates (an upper bound: nested allocations summed)."""
    from autosched.targets.cuda.codegen import stmt_shared_bytes

    return stmt_shared_bytes(func.body)


# The shared memory a block may use once a kernel opts in (cudaFuncAttributeMaxDynamicShared...),
# by compute capability; an arch not listed keeps the static 48 KB
OPT_IN_SHARED = {70: 96 * 1024, 72: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024,
                 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024,
                 120: 99 * 1024}


def max_shared_bytes(arch: str) -> int:
    from autosched.targets.cuda.codegen import STATIC_SHARED_BYTES, arch_number

    return OPT_IN_SHARED.get(arch_number(arch), STATIC_SHARED_BYTES)


class CudaBackend(Backend):
    """NVIDIA GPUs: CUDA C compiled by NVRTC, launched through pycuda (or emulated on the host)."""

    kind = "cuda"

    def target(self, options: tuple[tuple[str, str], ...]) -> Target:
        opts = dict(options)
        if opts.get("emulate", EMULATE[0]) not in EMULATE:
            raise CompileError(f"cuda -emulate={opts['emulate']}: expected one of {EMULATE}")
        # -arch=sm_80,sm_90: a model library holds code for each; kernels build for the first
        archs = [a for a in opts.get("arch", "").split(",") if a] or [detect_cuda_arch()]
        # a library's kernels run on every arch it names: the smallest limit holds for all
        return Target(self.kind, options, device="gpu", arch=archs[0],
                      max_shared_memory_per_block=min(map(max_shared_bytes, archs)))

    def build(self, func: ir.PrimFunc, target: Target) -> Module:
        mod = build_module(func, target)
        mode = _emulation(target)
        if mode is None:
            return mod
        from autosched.targets.cuda.host_emulate import EmulatedModule

        return EmulatedModule(mod, mode)

    def model_library(self, spec: Any, path: str) -> Any:
        """Build ``spec`` (graph/deploy.py's library_spec) as one shared library over the CUDA
        driver API; returns its header's text and target (cuda/library.py's Built)."""
        from autosched.targets.cuda.library import build_library

        return build_library(spec, path)

    def fingerprint(self, target: Target) -> dict[str, Any]:
        """The arch and the NVRTC and driver versions (when this machine has them)."""
        return {**super().fingerprint(target), "arch": target.arch, **_versions()}

    def target_keys(self, fp: dict[str, Any]) -> TargetKeys:
        """Keyed by the arch (``cuda/sm_90``): NVRTC compiles for it and nothing else about the
        GPU changes the code; every other arch is related (its records seed the search)."""
        key = f"cuda/{fp.get('arch', '')}"
        return TargetKeys(exact=key, key=key, isa=key, family=self.kind)

    def unfit(self, func: ir.PrimFunc, target: Target) -> str | None:
        need = shared_bytes(func)
        if need > target.max_shared_memory_per_block:
            return (f"{need} bytes of shared memory per block; {target} allows "
                    f"{target.max_shared_memory_per_block}")
        return None

    def preload(self) -> None:
        import autosched.targets.cuda.codegen  # noqa: F401
        import autosched.targets.cuda.nvrtc  # noqa: F401

    def device_memory(self, target: Target) -> DeviceMemory | None:
        if _emulation(target) is not None:
            return None
        from autosched.targets.cuda.runtime import CudaMemory

        return CudaMemory()

    def flush_bytes(self, target: Target) -> int:
        return 2 * (64 << 20)  # twice the L2 of the largest GPUs

    def runs_here(self, target: Target) -> bool:
        """On a GPU of this machine (pycuda, a driver and a device), not emulated."""
        if _emulation(target) is not None:
            return False
        from autosched.targets.cuda import runtime

        try:
            runtime.context()
        except RuntimeError_:
            return False
        return True

    def device_names(self, target: Target) -> tuple[str, ...]:
        """The GPU by its PCI address (what CUDA_VISIBLE_DEVICES renumbers stays one name);
        the host's cores for an emulation."""
        if _emulation(target) is not None:
            return cpu_names()
        from autosched.targets.cuda import runtime

        return ("cuda-" + runtime.device_bus_id(),)


def _emulation(target: Target) -> str | None:
    """How the target's kernels run without a GPU: "host", "ir", or None (on the GPU)."""
    mode = target.option("emulate") or None
    if mode == "host":
        from autosched.targets.cuda.host_emulate import unavailable

        if unavailable() is not None:
            _fall_back_once(unavailable())
            return "ir"
    return mode


@functools.cache
def _fall_back_once(why: str) -> None:
    warnings.warn(f"{why}; cuda -emulate=host runs the loop IR instead of the CUDA C",
                  stacklevel=3)


@functools.cache
def _versions() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        from autosched.targets.cuda.nvrtc import nvrtc_version

        out["nvrtc"] = ".".join(map(str, nvrtc_version()))
    except Exception:  # no cuda-bindings or no libnvrtc: the fingerprint just lacks it
        pass
    try:
        # cuDriverGetVersion needs libcuda but no cuInit, so the tuner never owns a context
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if int(err) == 0:
            out["driver"] = f"{version // 1000}.{version % 1000 // 10}"
    except Exception:  # no driver on this machine (compile-only CI)
        pass
    return out


register(CudaBackend())

__all__ = ["CudaBackend", "build_module", "nvrtc_options", "shared_bytes"]
