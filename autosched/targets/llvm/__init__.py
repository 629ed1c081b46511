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

from autosched.targets.backend import Backend, TargetKeys, register
from autosched.targets.host import cpu_target_fields, vector_bits, vector_registers
from autosched.targets.llvm.codegen import build_ir
from autosched.targets.llvm.compile import compile_ir, load_runtime_libraries, target_machine
from autosched.targets.llvm.cpu_features import key_features
from autosched.targets.llvm.library import InProcess, LibrarySpec, jit_library
from autosched.targets.llvm.runtime import CPUModule, HostModule
from autosched.targets.target import Target
from autosched.tir.ir import PrimFunc
from autosched.tir.visit import stored_buffers


def build_module(func: PrimFunc, target: Target) -> CPUModule:
    """Compile ``func`` for ``target``: a callable HostModule for this machine, else a CPUModule
    that can only be saved (save_object / export_library) and printed."""
    tm = target_machine(target)
    module, sig = build_ir(func, target.triple, str(tm.target_data), target.vector_bits,
                           key_features(target.triple, target.cpu, target.features) or ())
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
        fields = cpu_target_fields(dict(options))
        feats = key_features(fields["triple"], fields["cpu"], fields["features"])
        if feats is not None:  # the vector ISA LLVM generates for: what the CPU implies too
            isa = ",".join(f"+{f}" for f in feats)
            fields.update(vector_bits=vector_bits(fields["triple"], fields["cpu"], isa),
                          vector_registers=vector_registers(fields["triple"], isa))
        return Target(self.kind, options, device="cpu", **fields)

    def build(self, func: PrimFunc, target: Target) -> CPUModule:
        return build_module(func, target)

    def fingerprint(self, target: Target) -> dict[str, Any]:
        """The triple, CPU, features, thread count and the llvmlite / LLVM versions."""
        return {**super().fingerprint(target), "triple": target.triple, "cpu": target.cpu,
                "features": target.features, "num_cores": target.num_cores,
                **_versions()}

    def target_keys(self, fp: dict[str, Any]) -> TargetKeys:
        """The key: the triple's architecture and OS, the vector width and key features
        (cpu_features.KEY_FEATURES) and the thread count, e.g.
        ``llvm/x86_64-linux/v512/avx,avx2,avx512bf16,...,fma,sse4.2/t16``. The exact key adds
        the triple, CPU name and whole feature string."""
        return _target_keys(str(fp.get("triple", "")), str(fp.get("cpu", "")),
                            str(fp.get("features", "")), str(fp.get("num_cores", 0)))

    def jit_library(self, spec: LibrarySpec) -> InProcess | None:
        """A whole model's glue JIT-compiled over its kernels' code in this process (the
        executor's one call per run); None when the kernels are not for this machine."""
        return jit_library(spec)

    def runs_here(self, target: Target) -> bool:
        return target.is_host

    def preload(self) -> None:
        load_runtime_libraries()


# the OS part of a triple (darwin and macosx versions dropped); vendor and environment are left
# out of keys: they do not change a kernel's code
_OSES = ("linux", "windows", "darwin", "macos", "ios", "freebsd", "netbsd", "openbsd", "android",
         "none")


@functools.lru_cache(maxsize=256)
def _target_keys(triple: str, cpu: str, features: str, threads: str) -> TargetKeys:
    parts = triple.split("-")
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(parts[0], parts[0])
    os_name = next((o for p in parts[1:] for o in _OSES if p.startswith(o)), "unknown")
    family = f"llvm/{arch}-{'macos' if os_name == 'darwin' else os_name}"
    feats = key_features(triple, cpu, features)
    if feats is None:  # a CPU named without features that the table does not know
        isa = f"{family}/cpu={cpu}"
    else:
        bits = vector_bits(triple, cpu, ",".join(f"+{f}" for f in feats))
        isa = f"{family}/v{bits}/{','.join(feats) or 'base'}"
    listed = ",".join(sorted(f for f in features.split(",") if f))
    fhash = hashlib.sha256(listed.encode()).hexdigest()[:9]
    return TargetKeys(exact=f"llvm/{triple}/{cpu}/f{fhash}/t{threads}", key=f"{isa}/t{threads}",
                      isa=isa, family=family)


@functools.cache
def _versions() -> dict[str, str]:
    import llvmlite
    import llvmlite.binding as llvm

    return {"llvmlite": llvmlite.__version__,
            "llvm": ".".join(map(str, llvm.llvm_version_info))}


register(LLVMBackend())

__all__ = ["CPUModule", "HostModule", "LLVMBackend", "build_module"]
