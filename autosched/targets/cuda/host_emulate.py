"""Run the CUDA C of a CudaModule on the CPU: g++ compiles the generated text itself, so a machine
without a GPU checks the numbers of the code the GPU would run (not only of its loop IR).

The source is compiled as C++20 after a prelude of shims (host_prelude.py); the threads of a block
run as fibers on one OS thread, blocks one after another. The default, checked build wraps every
buffer: out-of-bounds accesses, misaligned vector accesses, races (between threads with no barrier
in between, or between blocks) and threads that disagree on ``__syncthreads`` are errors that
name the kernel, block, thread, buffer and element. Every argument is copied into a buffer with
guard zones (as runtime.py copies to the device), checked after each kernel; workspace, shared and
local memory start as NaN. Kernels with run-time checks get a status word, as on the GPU; a
failure it reports raises ``KernelFailure`` after the outputs are copied back.

What it cannot see: the threads of a block run one at a time between barriers (one legal
interleaving; races are found by the shadow records, not by interleaving), barriers are told
apart by source line, there are no warp primitives besides nvcuda::wmma (whose fragments hold
the whole tile in every lane: host_prelude.py), and NVRTC's own
compilation of the text is not exercised. x86-64 only (the fiber switch is assembly).

Shared libraries are cached by a hash of their text
(``$AUTOSCHED_CACHE_DIR/cuda-host`` or ``~/.cache/autosched/cuda-host``) and loaded only after
the checks of autosched/cache.py (owner, mode, SHA-256); a refused one is compiled again.

The target ``cuda -emulate=host`` builds EmulatedModules, which run this way (``-emulate=ir``:
the reference evaluator on the module's bound loop IR instead).

Example::

    mod = aus.build(s, [A, B, C], target="cuda -arch=sm_90")   # NVRTC, no GPU needed
    run = run_on_host(mod, a, b, c)       # c written in place; HostEmulationError on a bug
    run.warnings                          # e.g. reads of shared memory no thread wrote
    aus.build(s, [A, B, C], target="cuda -emulate=host")(a, b, c)   # the same, as a module
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autosched.cache import DiskCache
from autosched.errors import CompileError, RuntimeError_
from autosched.targets.backend import WallClockModule
from autosched.targets.cuda.cexpr import STATUS_PARAM
from autosched.targets.cuda.codegen import DYNAMIC_SHARED, CudaSource, KernelInfo
from autosched.targets.cuda.dtypes import C_TYPES
from autosched.targets.cuda.host_prelude import ERROR_NAMES, PRELUDE
from autosched.targets.cuda.runtime import CudaModule, _nbytes
from autosched.targets.cuda.tma import PARAM_TYPE
from autosched.targets.ref.evaluate import evaluate
from autosched.targets.status import KernelFailure
from autosched.tir import ir
from autosched.tir.evaluate import eval_int
from autosched.tir.params import mismatch

FLAGS = ("-O1", "-std=c++20", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden",
         # CUDA wraps signed overflow and has no strict-aliasing rule for float4 punning
         "-fwrapv", "-fno-strict-aliasing", "-ffp-contract=off", "-w")
GUARD = 1024  # bytes of sentinel on each side of every buffer
SENTINEL = 0xA5
ORDERS = {"forward": 0, "reverse": 1}  # or "shuffle:<seed>": a fresh order every interval


class HostEmulationError(RuntimeError_):
    """The CUDA C misbehaved on the host: the message names the kernel and what went wrong."""

    def __init__(self, msg: str, kind: str, kernel: str) -> None:
        super().__init__(msg)
        self.kind = kind
        self.kernel = kernel


@dataclass(frozen=True)
class HostRun:
    """What a run noticed that is not an error (counts and the first occurrence of each)."""

    warnings: tuple[str, ...]


def gxx() -> str | None:
    """The host C++ compiler (``$CXX`` or g++), or None when there is none."""
    return shutil.which(os.environ.get("CXX", "g++"))


def unavailable() -> str | None:
    """Why CUDA C cannot run on this host (None when it can): the fiber switch is x86-64
    assembly, and g++ must be there."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"host emulation of CUDA C needs an x86-64 CPU, this is {platform.machine()}"
    if gxx() is None:
        return "host emulation of CUDA C needs g++ (or $CXX) on PATH; none was found"
    return None


def run_on_host(mod: Any, *args: np.ndarray, checked: bool = True, order: str = "forward",
                time_limit: float = 60.0) -> HostRun:
    """Run every kernel of ``mod`` (a CudaModule) on the CPU with numpy ``args`` (one per
    parameter); the arrays it writes are updated in place, as ``mod(*args)`` would on a GPU."""
    env = mod.shape_env(args)
    for buf, a in zip(mod.func.params, args):
        if not isinstance(a, np.ndarray):
            raise mismatch(mod.func.name, buf, "a numpy array", f"a {type(a).__name__}")
    program = _program(mod.source, checked)
    lib = _library(program.text)
    mem: dict[ir.Buffer, _DeviceBuffer] = {}
    for buf, a in zip(mod.func.params, args):
        mem[buf] = _DeviceBuffer(buf.name, a.nbytes)
        mem[buf].array(a.shape, a.dtype)[...] = a
    for buf in mod.source.workspace:
        shape = tuple(eval_int(d, env) for d in buf.shape)
        mem[buf] = _DeviceBuffer(buf.name, _nbytes(buf, env))
        _fill_garbage(mem[buf].array(shape, np.dtype(buf.dtype)))
    code = _order_code(order)
    warnings: list[str] = []
    status = ctypes.c_int(0)
    with _LOCK:
        for info, kernel in zip(mod.source.kernels, program.kernels):
            grid = [eval_int(e, env) for e in info.grid]
            block = [eval_int(e, env) for e in info.block]
            if 0 in grid or 0 in block:
                continue
            _launch(lib, info, kernel, mem, env, grid + block, code, time_limit, status)
            for b in mem.values():
                b.check_guards(info.name)
            warnings += _warnings(lib, info.name)
    for buf, a in zip(mod.func.params, args):
        if buf in mod.source.written:
            a[...] = mem[buf].array(a.shape, a.dtype)
    if status.value:
        raise KernelFailure(mod.func.name, status.value)
    return HostRun(tuple(warnings))


class EmulatedModule(WallClockModule):
    """A CudaModule run on the CPU: its CUDA C through run_on_host (``mode`` "host") or its
    bound loop IR through the reference evaluator ("ir"), after the GPU module's own argument
    checks. Pickles as the CudaModule it wraps; ``time`` says nothing of the GPU's speed."""

    def __init__(self, module: CudaModule, mode: str) -> None:
        self.module = module
        self.mode = mode
        self.target = module.target

    def __call__(self, *arrays: np.ndarray) -> None:
        if self.mode == "ir":
            self.module.shape_env(arrays)
            evaluate(self.module.func, *arrays)
        else:
            run_on_host(self.module, *arrays)

    def get_source(self) -> str:
        return self.module.get_source()

    def __repr__(self) -> str:
        return f"EmulatedModule({self.module!r}, {self.mode})"


# -- rewriting the CUDA C --------------------------------------------------------------------

@dataclass(frozen=True)
class _Param:
    ctype: str
    name: str
    const: bool
    pointer: bool
    tensor_map: bool = False  # a TMA descriptor (tma.py), built by the launcher


@dataclass(frozen=True)
class _Kernel:
    name: str
    bounds: int  # __launch_bounds__, 0 when absent
    params: tuple[_Param, ...]
    status: bool  # takes the status word after its parameters


@dataclass(frozen=True)
class _Program:
    text: str
    kernels: tuple[_Kernel, ...]


_TYPE = "|".join(re.escape(t) for t in sorted(set(C_TYPES.values()), key=len, reverse=True))
_SIGNATURE = re.compile(
    r'^extern "C" __global__ void (?:__launch_bounds__\((\d+)(?:, \d+)?\) )?(\w+)\((.*)\) \{$')
_POINTER = re.compile(rf"^(const )?({_TYPE})\* __restrict__ (\w+)$")
_SCALAR = re.compile(rf"^({_TYPE}) (\w+)$")
_TENSOR_MAP = re.compile(rf"^const __grid_constant__ {PARAM_TYPE} (\w+)$")
_SHARED = re.compile(rf"^(\s*)__shared__ __align__\((\d+)\) ({_TYPE}) (\w+)\[(\d+)\];$")
_LOCAL = re.compile(rf"^(\s*)({_TYPE}) (\w+)\[(\d+)\];$")
# codegen's dynamic shared memory: the one allocation, and each buffer carved out of it
_DYNAMIC = re.compile(rf"^\s*extern __shared__ __align__\(\d+\) unsigned char {DYNAMIC_SHARED}\[\];$")
_CARVED = re.compile(rf"^(\s*)({_TYPE})\* (\w+) = reinterpret_cast<\2\*>\({DYNAMIC_SHARED} "
                     rf"\+ \d+\);  // shared (\d+)$")
_STATUS = f"int* __restrict__ {STATUS_PARAM}"


def _program(source: CudaSource, checked: bool) -> _Program:
    """The C++ translation unit: prelude, the kernels (checked: with wrapped buffers), and one
    ``as_launch_<kernel>`` entry point per kernel."""
    lines, kernels = [], []
    for line in source.code.splitlines():
        if line.startswith(("#include <cuda_fp16.h>", "#include <cuda_bf16.h>",
                            "#include <mma.h>")):
            line = "// " + line[10:-1] + ": the host prelude defines its types"
        m = _SIGNATURE.match(line)
        if m:
            kernel = _parse_signature(m)
            kernels.append(kernel)
            if checked:
                params = [f"as_emu::Global<{p.ctype}> {p.name}" if p.pointer
                          else f"{p.ctype} {p.name}" for p in kernel.params]
                params += [f"int* {STATUS_PARAM}"] * kernel.status
                line = f"static void {kernel.name}({', '.join(params)}) {{"
        elif _DYNAMIC.match(line):
            continue  # each carved buffer becomes a shared array of its own
        else:
            line = _static_shared(line)
            if checked:
                line = _checked_declaration(line)
        lines.append(line)
    if [k.name for k in kernels] != [k.name for k in source.kernels]:
        raise CompileError(
            f"host emulation found kernels {[k.name for k in kernels]} in the CUDA C, the "
            f"module has {[k.name for k in source.kernels]} (did codegen's signature format "
            "change? see _SIGNATURE in host_emulate.py)")
    for kernel, info in zip(kernels, source.kernels):
        pointers = sum(p.pointer for p in kernel.params)
        maps = sum(p.tensor_map for p in kernel.params)
        if pointers != len(info.buffers) or kernel.status != info.checks \
                or maps != len(info.tensor_maps):
            raise CompileError(f"host emulation: kernel {kernel.name} has "
                               f"{len(kernel.params)} parameters (status word: {kernel.status}), "
                               f"expected {len(info.buffers)} buffers and {len(info.scalars)} "
                               f"scalars (status word: {info.checks})")
    body = "\n".join(lines)
    if checked and "__shared__" in body:
        bad = next(ln for ln in lines if "__shared__" in ln)
        raise CompileError(f"host emulation cannot check the shared declaration {bad.strip()!r}")
    launchers = "\n".join(_launcher(k, info, checked) for k, info in zip(kernels, source.kernels))
    text = PRELUDE + '#line 1 "kernel.cu"\n' + body + "\n" + launchers + "\n"
    return _Program(text, tuple(kernels))


def _parse_signature(m: re.Match[str]) -> _Kernel:
    params = []
    texts = m.group(3).split(", ") if m.group(3) else []
    status = texts[-1:] == [_STATUS]
    for text in texts[:len(texts) - status]:
        p, s, tm = _POINTER.match(text), _SCALAR.match(text), _TENSOR_MAP.match(text)
        if tm:
            params.append(_Param(PARAM_TYPE, tm.group(1), True, False, True))
        elif p:
            params.append(_Param(p.group(2), p.group(3), bool(p.group(1)), True))
        elif s:
            params.append(_Param(s.group(1), s.group(2), False, False))
        else:
            raise CompileError(f"host emulation cannot parse parameter {text!r} of kernel "
                               f"{m.group(2)}")
    return _Kernel(m.group(2), int(m.group(1) or 0), tuple(params), status)


def _static_shared(line: str) -> str:
    """A buffer carved out of dynamic shared memory as the static declaration it stands for
    (the host has no 48 KB limit)."""
    m = _CARVED.match(line)
    if m is None:
        return line
    indent, ctype, name, n = m.groups()
    return f"{indent}__shared__ __align__(32) {ctype} {name}[{n}];"


def _checked_declaration(line: str) -> str:
    m = _SHARED.match(line)
    if m:
        indent, align, ctype, name, n = m.groups()
        if int(align) > 32:
            raise CompileError(f"host emulation: shared {name} asks for {align}-byte alignment")
        return f'{indent}static as_emu::Shared<{ctype}, {n}> {name}{{"{name}"}};'
    m = _LOCAL.match(line)
    if m:
        indent, ctype, name, n = m.groups()
        return f'{indent}as_emu::Local<{ctype}, {n}> {name}("{name}");'
    return line


def _tensor_map(info: KernelInfo, n: int) -> str:
    """The launcher's value of the kernel's tensor map ``n``: what its descriptor says, over
    the buffer the launch passes."""
    buf, tm = info.tensor_maps[n]
    at = info.buffers.index(buf)
    dims = ", ".join(str(d) for d in reversed(tm.shape))
    box = ", ".join(str(b) for b in reversed(tm.box))
    return (f"as_tensor_map{{(const unsigned char*)p[{at}], n[{at}] * {tm.itemsize}, "
            f"{len(tm.shape)}, {tm.itemsize}, {{{dims}}}, {{{box}}}}}")


def _launcher(k: _Kernel, info: KernelInfo, checked: bool) -> str:
    out = [f"AS_API int as_launch_{k.name}(void* const* p, const long long* n, "
           "const long long* s, const long long* launch, int order, double limit, "
           "int* status) {"]
    values, nb, ns, nm = [], 0, 0, 0
    for prm in k.params:
        if prm.tensor_map:
            values.append(_tensor_map(info, nm))
            nm += 1
            continue
        if not prm.pointer:
            values.append(f"({prm.ctype})s[{ns}]")
            ns += 1
            continue
        if not checked:
            const = "const " if prm.const else ""
            values.append(f"({const}{prm.ctype}*)p[{nb}]")
        else:
            shadow = "nullptr"
            if not prm.const:  # written: record who writes and reads each element
                out.append(f"  as_emu::ShadowBuf sh{nb}(n[{nb}]);")
                shadow = f"sh{nb}.p"
            values.append(f'as_emu::Global<{prm.ctype}>{{{{"{prm.name}", p[{nb}], n[{nb}], '
                          f"{shadow}, as_emu::GLOBAL}}}}")
        nb += 1
    values += ["status"] * k.status
    out.append(f"  auto body = [&]() {{ {k.name}({', '.join(values)}); }};")
    out.append(f'  return as_emu::launch("{k.name}", {k.bounds}, launch, order, limit, body);')
    out.append("}")
    return "\n".join(out)


# -- compiling and loading -------------------------------------------------------------------

_LOCK = threading.Lock()  # a library's fiber scheduler and shared arrays are process globals
_LOADED: dict[str, ctypes.CDLL] = {}


@functools.cache
def _compiler() -> tuple[str, str]:
    reason = unavailable()
    if reason is not None:
        raise CompileError(reason)
    cxx = gxx()
    assert cxx is not None
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    return cxx, version.splitlines()[0] if version else "unknown"


def _library(text: str) -> ctypes.CDLL:
    cxx, version = _compiler()
    key = hashlib.sha256("\0".join([text, version, *FLAGS]).encode()).hexdigest()[:32]
    if key in _LOADED:
        return _LOADED[key]
    cache = DiskCache("cuda-host")
    so = cache.verified(f"{key}.so") or _compile_library(cache, key, text, cxx)
    lib = ctypes.CDLL(str(so))
    lib.as_error.restype = ctypes.c_char_p
    lib.as_warning.restype = ctypes.c_char_p
    lib.as_warning.argtypes = [ctypes.c_int]
    lib.as_warning_count.restype = ctypes.c_longlong
    lib.as_warning_count.argtypes = [ctypes.c_int]
    _LOADED[key] = lib
    return lib


def _compile_library(cache: DiskCache, key: str, text: str, cxx: str) -> Path:
    """Compile ``text`` with g++ into the cache as ``<key>.so`` (its hash recorded)."""
    src = cache.folder / f"{key}.cpp"
    src.write_text(text)
    fd, tmp = tempfile.mkstemp(dir=cache.folder, suffix=".so.tmp")
    os.close(fd)
    proc = subprocess.run([cxx, *FLAGS, str(src), "-o", tmp], capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise CompileError(f"{cxx} could not compile the host emulation of the CUDA C "
                           f"(source kept at {src}):\n{proc.stderr[:4000]}")
    return cache.adopt(Path(tmp), f"{key}.so")


# -- memory and launches ---------------------------------------------------------------------

class _DeviceBuffer:
    """Host memory standing for a device allocation: 256-byte aligned (as cudaMalloc), with
    sentinel guard zones on both sides."""

    def __init__(self, name: str, nbytes: int) -> None:
        self.name = name
        self.nbytes = nbytes
        self.raw = np.full(nbytes + 2 * GUARD + 256, SENTINEL, dtype=np.uint8)
        self.start = GUARD + (-(self.raw.ctypes.data + GUARD)) % 256

    @property
    def ptr(self) -> int:
        return self.raw.ctypes.data + self.start

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return self.raw[self.start:self.start + self.nbytes].view(dtype).reshape(shape)

    def check_guards(self, kernel: str) -> None:
        before = np.flatnonzero(self.raw[:self.start] != SENTINEL)
        after = np.flatnonzero(self.raw[self.start + self.nbytes:] != SENTINEL)
        if before.size or after.size:
            where = (f"{int(before[0]) - self.start} bytes before its start" if before.size
                     else f"byte {self.nbytes + int(after[0])} of {self.nbytes}")
            raise HostEmulationError(
                f"kernel {kernel} wrote outside buffer {self.name}: {where} changed "
                "(an out-of-bounds store)", ERROR_NAMES[1], kernel)


def _fill_garbage(a: np.ndarray) -> None:
    if a.dtype.kind == "f":
        a[...] = np.nan
    elif a.dtype.kind == "b":
        a[...] = True
    else:
        a.view(np.uint8)[...] = 0xFF


def _order_code(order: str) -> int:
    if order in ORDERS:
        return ORDERS[order]
    if order.startswith("shuffle:"):
        return 2 + int(order.split(":", 1)[1])
    raise ValueError(f"order must be forward, reverse or shuffle:<seed>, got {order!r}")


def _launch(lib: ctypes.CDLL, info: KernelInfo, kernel: _Kernel,
            mem: dict[ir.Buffer, _DeviceBuffer], env: dict[int, int], launch: list[int],
            order: int, limit: float, status: ctypes.c_int) -> None:
    ptrs = (ctypes.c_void_p * max(len(info.buffers), 1))(*[mem[b].ptr for b in info.buffers])
    sizes = (ctypes.c_longlong * max(len(info.buffers), 1))(
        *[mem[b].nbytes // b.itemsize for b in info.buffers])
    scalars = (ctypes.c_longlong * max(len(info.scalars), 1))(*[env[v.uid] for v in info.scalars])
    dims = (ctypes.c_longlong * 6)(*launch)
    fn = getattr(lib, f"as_launch_{kernel.name}")
    fn.restype = ctypes.c_int
    code = fn(ptrs, sizes, scalars, dims, ctypes.c_int(order), ctypes.c_double(limit),
              ctypes.byref(status))
    if code:
        msg = lib.as_error().decode(errors="replace")
        raise HostEmulationError(
            f"{ERROR_NAMES.get(code, f'error {code}')} (grid {tuple(launch[:3])}, block "
            f"{tuple(launch[3:])}): {msg}", ERROR_NAMES.get(code, str(code)), info.name)


def _warnings(lib: ctypes.CDLL, kernel: str) -> list[str]:
    out = []
    for kind in (0, 1):
        n = lib.as_warning_count(kind)
        if n:
            first = lib.as_warning(kind).decode(errors="replace")
            out.append(f"{n} time(s), first: {first}")
    return out
