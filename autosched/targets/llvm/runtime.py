"""Built CPU modules: run on numpy arrays (host), time themselves, print their code, export.

Example::

    mod = build_module(func, parse("llvm"))
    mod(a, b, c)                        # c written in place
    print(mod.time(a, b, c).median)     # seconds per call
    print(mod.get_llvm_ir()[:400]); mod.export_library("mm.so")
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from autosched import settings
from autosched.errors import CompileError, RuntimeError_
from autosched.targets.arrays import aligned_copy
from autosched.targets.backend import Timing, time_repeats
from autosched.targets.llvm import compile as cc
from autosched.targets.llvm import threadpool
from autosched.targets.llvm.abi import PARAM_ALIGN, Signature
from autosched.targets.status import KernelFailure
from autosched.targets.target import Target
from autosched.tir.ir import Buffer
from autosched.tir.params import bind_arrays


def cross_compiler(triple: str, host: bool) -> str:
    """The C compiler that links shared libraries for ``triple`` (AUTOSCHED_CC overrides)."""
    if settings.CC.value():
        return settings.CC.value()
    if host:
        return shutil.which("cc") or shutil.which("gcc") or "cc"
    parts = triple.split("-")
    candidates = [triple + "-gcc"]
    if len(parts) == 4:  # aarch64-unknown-linux-gnu -> aarch64-linux-gnu-gcc
        candidates.append(f"{parts[0]}-{parts[2]}-{parts[3]}-gcc")
    for c in candidates:
        if shutil.which(c):
            return c
    raise CompileError(
        f"no C compiler for {triple} to link a shared library (tried {', '.join(candidates)}); "
        "install the cross toolchain (e.g. apt-get install gcc-aarch64-linux-gnu) or set "
        "AUTOSCHED_CC; save_object() works without one"
    )


class CPUModule:
    """A compiled kernel for any CPU triple: its code, an object file, a shared library."""

    def __init__(self, sig: Signature, target: Target, ir_text: str, compiled: cc.Compiled,
                 uses_threads: bool, written: frozenset[int] = frozenset()) -> None:
        self.signature = sig
        self._written = written
        self.target = target
        self.entry_name = sig.symbol
        self._ir = ir_text
        self._compiled = compiled
        self.uses_threads = uses_threads

    def get_llvm_ir(self, optimized: bool = True) -> str:
        """The module's LLVM IR, after O3 (default) or as generated."""
        return self._compiled.optimized_ir if optimized else self._ir

    def get_assembly(self) -> str:
        return cc.assembly(self._compiled, self.target)

    def get_source(self, fmt: str = "ll") -> str:
        return self.get_assembly() if fmt in ("s", "asm") else self.get_llvm_ir()

    def c_declaration(self) -> str:
        return self.signature.c_declaration()

    @property
    def thread_runtime(self) -> str | None:
        """What runs the kernel's parallel loops: "pool" (threadpool.py), "gomp" (libgomp) or
        None (it has none)."""
        if not self.uses_threads:
            return None
        return "pool" if threadpool.calls(self._compiled.optimized_ir) else "gomp"

    def save_object(self, path: str | os.PathLike) -> str:
        """The kernel's object file; with the thread pool linked in (hidden) when its parallel
        loops use it."""
        code = self._compiled.object_code
        if self.thread_runtime == "pool":
            code = cc.with_pool(self._compiled, self.target)
        with open(path, "wb") as f:
            f.write(code)
        return os.fspath(path)

    def export_library(self, path: str | os.PathLike, cc_path: str | None = None) -> str:
        """Link a shared library exporting the kernel (see abi.py for its C signature)."""
        compiler = cc_path or cross_compiler(self.target.triple, self.target.is_host)
        with tempfile.TemporaryDirectory() as tmp:
            obj = self.save_object(os.path.join(tmp, "kernel.o"))
            libs = cc.thread_libraries(self.thread_runtime)
            cmd = [compiler, "-shared", "-o", os.fspath(path), obj, *libs, "-lm"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CompileError(f"linking failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
        return os.fspath(path)

    def _elsewhere(self) -> RuntimeError_:
        return RuntimeError_(
            f"{self.entry_name} was compiled for {self.target.triple}, which is not this machine; "
            "use export_library() / save_object() and run it there"
        )

    def __call__(self, *arrays: Any) -> None:
        raise self._elsewhere()

    def bind(self, *arrays: Any) -> Callable[[], None]:
        raise self._elsewhere()

    def time(self, *arrays: Any, number: int = 1, repeat: int = 3, warmup: int = 1,
             min_repeat_ms: float = 0.0) -> Timing:
        raise self._elsewhere()


_CTYPES_INT64 = ctypes.c_int64


class HostModule(CPUModule):
    """A kernel JIT-compiled for this machine; call it on numpy arrays."""

    def __init__(self, sig: Signature, target: Target, ir_text: str, compiled: cc.Compiled,
                 uses_threads: bool, written: frozenset[int] = frozenset()) -> None:
        super().__init__(sig, target, ir_text, compiled, uses_threads, written)
        self._engine = cc.JitEngine(compiled, target)
        addr = self._engine.function_address(sig.symbol)
        argtypes = [ctypes.c_void_p] * len(sig.params) + [_CTYPES_INT64] * len(sig.sym_vars)
        self._cfunc = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(addr)
        self._threads = self._ran = None
        if uses_threads:
            self._threads = ctypes.c_int32.from_address(
                self._engine.global_address(sig.num_threads_symbol))
            self._ran = ctypes.c_int32.from_address(
                self._engine.global_address(sig.threads_ran_symbol))
        self.num_threads: int | None = None  # None: the target's cores (llvm -num-cores=N)
        # status bits that do not raise: STATUS_INDEX for runs on random data (measurement),
        # whose out-of-range indices read a clamped element, the same in every schedule
        self.ignored_status = 0

    def __reduce__(self) -> tuple:
        # The JIT engine does not pickle; the object code does, and loading it again takes ~1 ms
        # (measurement workers send built modules between processes this way).
        return (HostModule, (self.signature, self.target, self._ir, self._compiled,
                             self.uses_threads, self._written))

    def portable(self) -> CPUModule:
        """The same compiled code without the JIT engine (picklable, exportable)."""
        return CPUModule(self.signature, self.target, self._ir, self._compiled,
                         self.uses_threads, self._written)

    @property
    def threads(self) -> int:
        """How many threads parallel loops run on (read at each call)."""
        return self.num_threads or self.target.num_cores

    @property
    def address(self) -> int:
        """Where the JIT put the kernel function (valid while this module lives)."""
        return ctypes.cast(self._cfunc, ctypes.c_void_p).value or 0

    @property
    def threads_address(self) -> int | None:
        """Where the kernel's thread-count int32 lives; None without parallel loops."""
        return None if self._threads is None else ctypes.addressof(self._threads)

    @property
    def threads_ran(self) -> int:
        """How many thread bodies of parallel loops have run so far (0 without parallel loops)."""
        return 0 if self._ran is None else self._ran.value

    def _prepare(self, arrays: tuple[Any, ...]) -> tuple[list[Any], list[tuple[Any, Any]]]:
        """Check the arrays against the parameters; the ctypes arguments and the (aligned copy,
        original) pairs to copy back after the call."""
        params = self.signature.params
        sizes = bind_arrays(self.entry_name, params, arrays, self._written)
        args: list[Any] = []
        copies: list[tuple[Any, Any]] = []
        for arr in arrays:
            if arr.ctypes.data % PARAM_ALIGN:
                aligned = aligned_copy(arr)
                copies.append((aligned, arr))
                arr = aligned
            args.append(arr.ctypes.data)
        _check_overlap(self.entry_name, params, arrays, self._written)
        args += [sizes[v.uid] for v in self.signature.sym_vars]
        if self._threads is not None:
            self._threads.value = self.threads
        return args, copies

    def check_status(self, status: int) -> None:
        """Raise for a kernel result that is not 0 (targets/status.py's STATUS_* bits)."""
        if status & ~self.ignored_status:
            raise KernelFailure(self.entry_name, status)

    def __call__(self, *arrays: Any) -> None:
        args, copies = self._prepare(arrays)
        status = self._cfunc(*args)
        for aligned, orig in copies:
            np.copyto(orig, aligned)
        self.check_status(status)

    def bind(self, *arrays: Any) -> Callable[[], None]:
        """A call with no arguments that runs the kernel on these arrays, checked once here
        (``__call__`` checks on every call: ~30 us for five arrays, more than a small kernel
        takes). The arrays must stay alive; their contents may change between calls. The
        thread count is read at each call, as ``__call__`` does. Misaligned arrays are not
        bound: the call then goes through ``__call__``, which copies them each time."""
        args, copies = self._prepare(arrays)
        if copies:
            return lambda: self(*arrays)
        fn, threads, check = self._cfunc, self._threads, self.check_status

        def call() -> None:
            if threads is not None:
                threads.value = self.threads
            check(fn(*args))

        return call

    def time(self, *arrays: Any, number: int = 1, repeat: int = 3, warmup: int = 1,
             min_repeat_ms: float = 0.0) -> Timing:
        """Seconds per call: ``repeat`` means of ``number`` calls each, after ``warmup`` calls.
        With ``min_repeat_ms``, ``number`` grows until one repeat lasts that long."""
        args, copies = self._prepare(arrays)
        fn = self._cfunc
        status = 0

        def run(n: int) -> float:
            nonlocal status
            t0 = time.perf_counter()
            for _ in range(n):
                status |= fn(*args)
            return time.perf_counter() - t0

        timing = time_repeats(run, number=number, repeat=repeat, warmup=warmup,
                              min_repeat_ms=min_repeat_ms)
        self.check_status(status)
        for aligned, orig in copies:
            np.copyto(orig, aligned)
        return timing


def _check_overlap(fname: str, params: tuple[Buffer, ...], arrays: tuple[Any, ...],
                   written: frozenset[int]) -> None:
    for i, (bi, ai) in enumerate(zip(params, arrays)):
        if bi.uid not in written:
            continue
        for j, (bj, aj) in enumerate(zip(params, arrays)):
            if i != j and np.may_share_memory(ai, aj):
                raise RuntimeError_(
                    f"{fname}: parameters {bi.name} and {bj.name} share memory, but "
                    f"{bi.name} is written and parameters are declared noalias; pass a copy"
                )


