"""LLVM IR text to machine code: verify, optimise at O3 (new pass manager) for the target's
triple / CPU / features, and emit an object file. The host JITs that object with MCJIT.

Compiled objects are cached in memory by a hash of the IR text, the target machine options and
the llvmlite / LLVM versions, so the search does not recompile a schedule it has seen.
"""

from __future__ import annotations

import ctypes.util
import functools
import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import MutableMapping
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm

from autosched.errors import CompileError
from autosched.targets.host import _llvm
from autosched.targets.llvm import threadpool
from autosched.targets.target import Target

OPT_LEVEL = 3
CACHE_SIZE = 256


@dataclass(frozen=True)
class Compiled:
    """The result of compiling one module: its object file and optimised IR."""

    key: str
    triple: str
    object_code: bytes
    optimized_ir: str


def _new_target_machine(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
    binding = _llvm()
    try:
        tgt = binding.Target.from_triple(triple)
    except RuntimeError as exc:
        raise CompileError(f"LLVM has no backend for triple {triple!r}: {exc}") from exc
    return tgt.create_target_machine(cpu=cpu, features=features, opt=OPT_LEVEL, reloc="pic",
                                     codemodel="default")


# The shared machine for optimising and emitting; an MCJIT engine takes ownership of the machine
# it is given, so each engine gets its own.
_target_machine = functools.cache(_new_target_machine)


def target_machine(target: Target) -> llvm.TargetMachine:
    return _target_machine(target.triple, target.cpu, target.features)


def cache_key(ir_text: str, target: Target) -> str:
    h = hashlib.sha256()
    for part in (ir_text, target.triple, target.cpu, target.features, str(OPT_LEVEL),
                 llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


_cache: OrderedDict[str, Compiled] = OrderedDict()
_lock = threading.Lock()


def compile_ir(ir_text: str, target: Target) -> Compiled:
    """Parse, verify, optimise and emit ``ir_text`` for ``target`` (cached)."""
    key = cache_key(ir_text, target)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    tm = target_machine(target)
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
    except RuntimeError as exc:
        raise CompileError(f"generated LLVM IR is invalid: {exc}\n{_numbered(ir_text)}") from exc
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    out = Compiled(key, target.triple, tm.emit_object(mod), str(mod))
    with _lock:
        _cache[key] = out
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return out


def assembly(compiled: Compiled, target: Target) -> str:
    return target_machine(target).emit_assembly(llvm.parse_assembly(compiled.optimized_ir))


_PINNED: list[ctypes.CDLL] = []
_LOADED: set[str] = set()


SPIN_COUNT = str(threadpool.SPIN_COUNT)  # the default of the pool and, set here, of libgomp


def default_wait_policy(env: MutableMapping[str, str]) -> None:
    """GOMP_SPINCOUNT=10000 unless ``env`` already says how threads wait between parallel loops
    (it, or OMP_WAIT_POLICY); the thread pool (threadpool.py) and libgomp both read them.
    Compiled models and the measurement workers both take it, so candidates are timed as the
    model runs them (workers measured passive while models spun: a tuned demo model ran 2x
    slower than untuned). Threads spin that long after a parallel loop, then sleep. The demo
    model on libgomp (2 cores, alternating) with libgomp's own 300,000: 0.15 ms idle, 140 ms a
    run with both cores busy with other jobs (a spinning team waits whole time slices at each
    barrier); passive: 0.64-1.0 ms idle, 0.35 ms busy; 10,000: 0.15-0.18 ms idle, 9 ms busy.
    The pool waits for no thread that has not joined, so busy cores cost it little."""
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env["GOMP_SPINCOUNT"] = SPIN_COUNT


@functools.cache
def load_runtime_libraries() -> None:
    """libm (math calls) and libgcc_s (helpers LLVM calls for conversions the CPU lacks, e.g.
    __truncdfhf2 for float64 -> float16) for the JIT; libgomp too where installed (kernels
    built with AUTOSCHED_PARALLEL=gomp, or for triples the thread pool does not support).

    Each is also opened once through ctypes and never closed: llvmlite dlcloses its
    "permanent" libraries at interpreter exit, and an OpenMP worker still spinning in libgomp
    (OMP_WAIT_POLICY=active) would then run unmapped code and crash the exiting process.
    libgomp reads its settings when it loads: the wait policy is set first."""
    default_wait_policy(os.environ)
    for lib in ("gomp", "m", "gcc_s"):
        path = ctypes.util.find_library(lib)
        if path is None:
            if lib == "gomp":
                continue  # JitEngine says so if a kernel needs it
            raise CompileError(f"lib{lib} is not installed; the LLVM JIT needs it")
        _PINNED.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
        llvm.load_library_permanently(path)
        _LOADED.add(lib)


def pool_ir(target: Target) -> llvm.ModuleRef:
    """The thread pool for ``target``, optimised, to link into an object or library that
    calls ``autosched_parallel``."""
    compiled = compile_ir(str(threadpool.pool_module(target.triple)), target)
    return llvm.parse_assembly(compiled.optimized_ir)


def with_pool(compiled: Compiled, target: Target) -> bytes:
    """``compiled``'s object code with a private copy of the thread pool linked in (hidden:
    each shared library made from it has its own)."""
    module = llvm.parse_assembly(compiled.optimized_ir)
    module.link_in(pool_ir(target))
    module.get_function(threadpool.ENTRY).visibility = "hidden"
    return target_machine(target).emit_object(module)


def thread_libraries(runtime: str | None) -> list[str]:
    """The linker flags for code whose parallel loops run on ``runtime`` ("pool", "gomp" or
    None): the pool needs pthread_create (in libc since glibc 2.34, libpthread before), and its
    library must stay mapped after dlclose(), where its workers wait."""
    return {"pool": ["-pthread", "-Wl,-z,nodelete"], "gomp": ["-lgomp"]}.get(runtime or "", [])


_POOLS: dict[str, tuple[llvm.ExecutionEngine, int]] = {}  # triple -> engine, entry address
_pool_lock = threading.Lock()


def load_thread_pool(triple: str) -> int:
    """Compile the thread pool (threadpool.py) once per process and bind ``autosched_parallel``
    to it for every kernel the JIT loads afterwards; its address.

    Its engine is never disposed (llvmlite skips disposal at interpreter exit, and _POOLS
    holds it until then): workers sleep or spin in its code until the process ends."""
    with _pool_lock:
        if triple not in _POOLS:
            host = Target("llvm", (), device="cpu", triple=triple)
            engine = _mcjit(compile_ir(str(threadpool.pool_module(triple)), host), host)
            _POOLS[triple] = engine, engine.get_function_address(threadpool.ENTRY)
            llvm.add_symbol(threadpool.ENTRY, _POOLS[triple][1])
        return _POOLS[triple][1]


def _mcjit(compiled: Compiled, target: Target) -> llvm.ExecutionEngine:
    tm = _new_target_machine(target.triple, target.cpu, target.features)
    empty = llvm.parse_assembly("")
    empty.triple = target.triple
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.add_object_file(llvm.ObjectFileRef.from_data(compiled.object_code))
    engine.finalize_object()
    return engine


class JitEngine:
    """An MCJIT engine holding one compiled object (kept alive as long as the module)."""

    def __init__(self, compiled: Compiled, target: Target) -> None:
        load_runtime_libraries()
        if threadpool.calls(compiled.optimized_ir, threadpool.ENTRY):
            load_thread_pool(target.triple)
        elif threadpool.calls(compiled.optimized_ir, "GOMP_parallel") and "gomp" not in _LOADED:
            raise CompileError("libgomp is not installed; this kernel's parallel loops need it")
        self._engine = _mcjit(compiled, target)

    def function_address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise CompileError(f"JIT: symbol {name} not found in the compiled object")
        return addr

    def global_address(self, name: str) -> int:
        return self._engine.get_global_value_address(name)


def _numbered(text: str, limit: int = 400) -> str:
    lines = text.splitlines()
    body = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(lines[:limit]))
    return body + ("\n..." if len(lines) > limit else "")
