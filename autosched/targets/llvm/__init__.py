"""The CPU backend: loop IR to LLVM IR (llvmlite), O3, JIT for the host or an object file /
shared library for any triple.

Example::

    from autosched.targets.target import parse
    from autosched.targets.llvm import build_module
    mod = build_module(func, parse("llvm"))           # func: a lowered PrimFunc
    mod(a, b, c)                                      # numpy arrays; outputs written in place
    cross = build_module(func, parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    cross.export_library("kernel.so")                 # linked with aarch64-linux-gnu-gcc

The exported C signature is described in abi.py.
"""

from __future__ import annotations

from autosched.targets.llvm.codegen import build_ir
from autosched.targets.llvm.compile import compile_ir, target_machine
from autosched.targets.llvm.runtime import CPUModule, HostModule, TimingResult
from autosched.targets.target import Target
from autosched.tir.ir import PrimFunc
from autosched.tir.visit import stored_buffers


def build_module(func: PrimFunc, target: Target) -> CPUModule:
    """Compile ``func`` for ``target``: a callable HostModule for this machine, else a CPUModule
    that can only be saved (save_object / export_library) and printed."""
    tm = target_machine(target)
    module, sig = build_ir(func, target.triple, str(tm.target_data), target.vector_bits)
    ir_text = str(module)
    compiled = compile_ir(ir_text, target)
    uses_threads = sig.num_threads_symbol in module.globals
    written = frozenset(b.uid for b in stored_buffers(func.body))
    cls = HostModule if target.is_host else CPUModule
    return cls(sig, target, ir_text, compiled, uses_threads, written)


__all__ = ["CPUModule", "HostModule", "TimingResult", "build_module"]
