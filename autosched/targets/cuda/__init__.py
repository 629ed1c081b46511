"""The CUDA backend: loop IR -> CUDA C (codegen) -> cubin (NVRTC) -> launches (pycuda).

Building needs cuda-bindings and an NVRTC library but no GPU; running needs pycuda and a GPU.
Neither is imported until used, so ``import autosched`` works without them.

Example::

    mod = aus.build(s, [A, B, C], target="cuda -arch=sm_90")
    print(mod.get_source())       # the CUDA C
    mod.cubin                     # bytes, also on a machine without a GPU
    mod(a, b, c)                  # on a GPU: numpy arrays in, c written in place
"""

from __future__ import annotations

from autosched.targets.target import Target
from autosched.tir.ir import PrimFunc


def build_module(func: PrimFunc, target: Target):  # noqa: ANN201  (CudaModule, lazily imported)
    """Bind any unbound nest (default schedule), render CUDA C, compile it with NVRTC."""
    from autosched.targets.cuda.codegen import generate
    from autosched.targets.cuda.default_schedule import bind_unbound
    from autosched.targets.cuda.nvrtc import compile_cuda
    from autosched.targets.cuda.private_storage import privatize
    from autosched.targets.cuda.runtime import CudaModule

    threads = min(256, target.max_threads_per_block)
    func = privatize(bind_unbound(func, threads))  # the function codegen renders, as IR
    source = generate(func, target)
    options = ("--use_fast_math",) if "fast-math" in dict(target.options) else ()
    binary = compile_cuda(source.code, target.arch or "sm_90", options,
                          needs_headers=source.uses_half, name=f"{func.name}.cu")
    return CudaModule(func, target, source, binary)


__all__ = ["build_module"]
