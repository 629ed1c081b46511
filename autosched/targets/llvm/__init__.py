"""The CPU backend: loop IR to LLVM IR (llvmlite), O3, JIT for the host or an object file /
shared library for any triple.

Example::

    from autosched.targets.target import parse
    from autosched.targets.llvm import build_module
    mod = build_module(func, parse("llvm"))           # func: a lowered PrimFunc
    mod(a, b, c)                                      # numpy arrays; outputs written in place
    cross = build_module(func, parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    cross.export_library("kernel.so")                 # linked with aarch64-linux-gnu-gcc

The exported C signature is described in abi.py. Targets: ``llvm -mtriple=... -mcpu=...
-mattr=... -num-cores=N`` (host CPU, features and cores detected when not given).
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from autosched.targets.backend import Backend, register
from autosched.targets.host import cpu_target_fields
from autosched.targets.llvm.codegen import build_ir
from autosched.targets.llvm.compile import compile_ir, load_runtime_libraries, target_machine
from autosched.targets.llvm.library import InProcess, LibrarySpec, jit_library
from autosched.targets.llvm.runtime import CPUModule, HostModule
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


class LLVMBackend(Backend):
    """CPUs through LLVM: the host (JIT) or any triple (object files, shared libraries)."""

    kind = "llvm"
    exports = True

    def target(self, options: tuple[tuple[str, str], ...]) -> Target:
        return Target(self.kind, options, device="cpu", **cpu_target_fields(dict(options)))

    def build(self, func: PrimFunc, target: Target) -> CPUModule:
        return build_module(func, target)

    def fingerprint(self, target: Target) -> dict[str, Any]:
        """The triple, CPU, features, thread count and the llvmlite / LLVM versions."""
        return {**super().fingerprint(target), "triple": target.triple, "cpu": target.cpu,
                "features": target.features, "num_cores": target.num_cores,
                **_versions()}

    def fingerprint_key(self, fp: dict[str, Any]) -> str:
        """llvm/<triple>/<cpu>/f<hash of the sorted features>/t<threads>"""
        feats = ",".join(sorted(f for f in str(fp.get("features", "")).split(",") if f))
        fhash = hashlib.sha256(feats.encode()).hexdigest()[:9]
        return f"llvm/{fp.get('triple', '')}/{fp.get('cpu', '')}/f{fhash}/t{fp.get('num_cores', 0)}"

    def jit_library(self, spec: LibrarySpec) -> InProcess | None:
        """A whole model's glue JIT-compiled over its kernels' code in this process (the
        executor's one call per run); None when the kernels are not for this machine."""
        return jit_library(spec)

    def preload(self) -> None:
        load_runtime_libraries()


@functools.cache
def _versions() -> dict[str, str]:
    import llvmlite
    import llvmlite.binding as llvm

    return {"llvmlite": llvmlite.__version__,
            "llvm": ".".join(map(str, llvm.llvm_version_info))}


register(LLVMBackend())

__all__ = ["CPUModule", "HostModule", "LLVMBackend", "build_module"]
