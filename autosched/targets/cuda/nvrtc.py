"""Compile CUDA C with NVRTC (through cuda-bindings) to a cubin, or to PTX as a fallback.

NVRTC needs no GPU, so every generated kernel compiles in CI. A cubin is preferred: an NVRTC
newer than the driver emits PTX that the driver refuses to JIT, while a cubin of the same CUDA
major version loads on any driver of that major version. PTX is produced only when this NVRTC
cannot generate machine code for the requested arch (it then targets the newest virtual arch it
knows below it).

Results are cached in memory and on disk (``$AUTOSCHED_CACHE_DIR/cuda`` or
``~/.cache/autosched/cuda``), keyed by a hash of source, options, NVRTC version and arch; a
cached file is used only after the checks of autosched/cache.py (owner, mode, SHA-256).

Example::

    binary = compile_cuda(src_code, "sm_90")
    binary.kind            # "cubin" (or "ptx")
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from typing import Any

from autosched.cache import DiskCache
from autosched.errors import CompileError

INSTALL_HINT = "pip install autosched[cuda]  (or: pip install cuda-bindings nvidia-cuda-nvrtc)"


@dataclass(frozen=True)
class CompiledBinary:
    kind: str  # "cubin" or "ptx"
    data: bytes
    arch: str  # the arch actually compiled for: sm_90, or compute_90 for PTX
    log: str
    nvrtc_version: tuple[int, int]


def _nvrtc():  # noqa: ANN202
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise CompileError(
            f"compiling for a cuda target needs NVRTC through cuda-bindings ({exc}); "
            f"install it with: {INSTALL_HINT}"
        ) from None
    return nvrtc


def _check(result: Any, what: str) -> None:
    code = result[0] if isinstance(result, tuple) else result
    if int(code) != 0:
        raise CompileError(f"NVRTC {what} failed: {code}")


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library cuda-bindings loads; CompileError when none."""
    nvrtc = _nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings are there but libnvrtc.so is not
        raise CompileError(
            f"cuda-bindings could not load the NVRTC library ({type(exc).__name__}: {exc}); "
            "install it with: pip install nvidia-cuda-nvrtc (match the driver's CUDA major "
            "version)"
        ) from None
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


@functools.cache
def supported_archs() -> tuple[int, ...]:
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Directories holding cuda_fp16.h (needed only by kernels that use half)."""
    dirs: list[str] = []
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            dirs.append(str(found))
    except Exception:  # pathfinder missing or too old: fall back to the usual places
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "include"))
    dirs.append("/usr/local/cuda/include")
    return tuple(d for d in dict.fromkeys(dirs) if os.path.exists(os.path.join(d, "cuda_fp16.h")))


def _arch_number(arch: str) -> int:
    digits = "".join(ch for ch in arch if ch.isdigit())
    if not arch.startswith(("sm_", "compute_")) or not digits:
        raise CompileError(f"cuda arch {arch!r} must look like sm_90")
    return int(digits)


_MEMORY: dict[str, CompiledBinary] = {}


def compile_cuda(source: str, arch: str, options: tuple[str, ...] = (),
                 needs_headers: bool = False, name: str = "kernel.cu",
                 ptx: bool = False) -> CompiledBinary:
    """Compile ``source`` for ``arch`` (e.g. "sm_90", or "sm_90a" for the arch-specific
    instructions such as wgmma); CompileError carries the NVRTC log. ``ptx``: PTX for the
    virtual arch instead of a cubin (to read what NVRTC made of it)."""
    version = nvrtc_version()
    number = _arch_number(arch)
    suffix = "a" if arch.endswith("a") else ""
    archs = supported_archs()
    if number in archs and (not ptx or suffix):
        target_arch = f"{'compute' if ptx else 'sm'}_{number}{suffix}"
    else:
        lower = [a for a in archs if a <= number]
        if not lower:
            raise CompileError(
                f"NVRTC {version[0]}.{version[1]} supports archs {archs}, none at or below {arch}"
            )
        target_arch = f"compute_{max(lower)}"
    opts = [f"-arch={target_arch}", "--std=c++17", *options]
    if needs_headers:
        dirs = include_dirs()
        if not dirs:
            raise CompileError(
                "this kernel uses float16 or bfloat16, which need cuda_fp16.h / cuda_bf16.h; "
                "none was found (install nvidia-cuda-runtime, or set CUDA_HOME to a CUDA toolkit)"
            )
        opts += [f"-I{d}" for d in dirs]
    key = hashlib.sha256(
        "\0".join([source, *opts, f"nvrtc{version}", target_arch]).encode()
    ).hexdigest()
    if key in _MEMORY:
        return _MEMORY[key]
    cached = _read_cache(key, target_arch, version)
    if cached is None:
        cached = _compile(source, opts, target_arch, version, name)
        _write_cache(key, cached)
    _MEMORY[key] = cached
    return cached


def _compile(source: str, opts: list[str], target_arch: str, version: tuple[int, int],
             name: str) -> CompiledBinary:
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in opts]
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        log = _output(nvrtc, prog, "ProgramLog").rstrip(b"\0 ").decode(errors="replace")
        if int(status) != 0:
            numbered = "\n".join(f"{n + 1:4d}  {line}" for n, line in
                                 enumerate(source.splitlines()))
            exc = CompileError(
                f"NVRTC {version[0]}.{version[1]} failed to compile {name} for {target_arch} "
                f"with {' '.join(opts)}:\n{log}\n--- source ---\n{numbered}"
            )
            exc.log = log  # type: ignore[attr-defined]
            exc.source = source  # type: ignore[attr-defined]
            raise exc
        if target_arch.startswith("sm_"):
            return CompiledBinary("cubin", _output(nvrtc, prog, "CUBIN"), target_arch, log,
                                  version)
        return CompiledBinary("ptx", _output(nvrtc, prog, "PTX"), target_arch, log, version)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _output(nvrtc, prog, what: str) -> bytes:  # noqa: ANN001
    """One of the program's outputs (``ProgramLog``, ``CUBIN``, ``PTX``), copied out of NVRTC.

    NVRTC writes into the buffer it is given, so the buffer must be a fresh mutable one: an
    immutable ``bytes`` such as ``b" " * 1`` is CPython's shared one-byte object, and
    overwriting it corrupts every later use of that literal in the process."""
    err, size = getattr(nvrtc, f"nvrtcGet{what}Size")(prog)
    _check(err, f"nvrtcGet{what}Size")
    buffer = bytearray(size)
    _check(getattr(nvrtc, f"nvrtcGet{what}")(prog, buffer), f"nvrtcGet{what}")
    return bytes(buffer)


def _read_cache(key: str, target_arch: str, version: tuple[int, int]) -> CompiledBinary | None:
    kind = "cubin" if target_arch.startswith("sm_") else "ptx"
    data = DiskCache("cuda").read(f"{key}.{kind}")
    return None if data is None else CompiledBinary(kind, data, target_arch, "", version)


def _write_cache(key: str, binary: CompiledBinary) -> None:
    DiskCache("cuda").write(f"{key}.{binary.kind}", binary.data)
