"""A compiled CPU model on disk, and the loader that runs it without the compiler.

``export(model, build_dir)`` writes one shared library per distinct kernel (the llvm module's
``export_library``), the constants the kernels read as ``constants.npz`` and ``manifest.json``
(inputs, outputs, value shapes, each library's SHA-256 and parameter sizes, and each kernel
call: its library, symbol and argument names). ``load(build_dir)`` checks all of it
(manifest.py), maps the libraries with ctypes and runs the calls over the same static memory
plan; it needs numpy only (no LLVM, no TE). ``run`` may be called from many threads at once:
each thread gets its own intermediate buffers.

A build dir holds native code: loading it runs that code, so load only build dirs you would
run as programs. The checks make sure that what runs is the kernels the exporter wrote there
(no library outside the dir, no symbol the library does not define, no buffer smaller than
its kernel expects), built for this machine (see docs/SECURITY.md).

Example::

    model = aus.compile(graph, target="llvm", log="tuning_logs/model.jsonl")
    export(model, "build/model")                  # or: autosched compile model.onnx -o build/model
    deployed = load("build/model")
    (y,) = deployed.run({"input": x})
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from autosched.cache import untrusted
from autosched.errors import ModelImportError, RuntimeError_
from autosched.graph.executor import check_inputs, memory_plan, nbytes, planned_arrays
from autosched.graph.graph import Graph
from autosched.graph.manifest import NAME as MANIFEST
from autosched.graph.manifest import VERSION, Library, Manifest, library_name, read_manifest
from autosched.targets.elf import ElfError, host_machine, read_shared_library
from autosched.targets.status import KernelFailure


def export(model: Any, build_dir: str | os.PathLike) -> Path:
    """Write ``model`` (a CompiledModel for an llvm target) to ``build_dir``; returns the
    manifest's path."""
    if not model.target.backend.exports:
        raise RuntimeError_(f"export writes models whose kernels export as libraries (target "
                            f"llvm); this one is for {model.target}")
    out = Path(build_dir)
    out.mkdir(parents=True, exist_ok=True)
    libs: dict[int, str] = {}
    libraries: dict[str, dict[str, Any]] = {}
    calls = []
    used: list[str] = []
    for k in model.kernels:
        mod = k.module
        if mod.signature.sym_vars:
            raise RuntimeError_(f"kernel {mod.entry_name} has symbolic sizes; graph kernels "
                                "have static shapes")
        if id(mod) not in libs:
            lib = libs[id(mod)] = library_name(len(libs), mod.entry_name)
            libraries[lib] = _export_library(mod, out / lib)
        calls.append({"task": k.task.name, "lib": libs[id(mod)], "symbol": mod.entry_name,
                      "args": list(k.args), "n_inputs": k.n_inputs,
                      "threads": bool(mod.uses_threads)})
        used += [a for a in k.args if a in model.constants and a not in used]
    keys = {name: f"c{i}" for i, name in enumerate(used)}
    np.savez(out / "constants.npz", **{keys[n]: model.constants[n] for n in used})
    g = model.graph
    manifest = {
        "version": VERSION, "name": g.name, "target": str(model.target),
        "machine": _machine(out, libraries), "cpu_features": _cpu_features(model.target),
        "inputs": [[v.name, list(v.shape), v.dtype] for v in g.inputs],
        "outputs": list(g.outputs),
        "values": {n: [list(v.shape), v.dtype] for n, v in g.values.items()
                   if any(n in c["args"] for c in calls) or n in g.outputs
                   or n in model.aliases},
        "constants": keys, "kernels": calls, "libraries": libraries,
        "aliases": dict(model.aliases),
    }
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=1))
    for p in [out, path, out / "constants.npz", *(out / lib for lib in libraries)]:
        _owner_writable_only(p)
    return path


def _owner_writable_only(path: Path) -> None:
    """Drop group and other write permission (a umask of 002 grants it), which the loader
    refuses: anyone who can write a build dir can change the code it runs."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        os.chmod(path, mode & ~0o022)


def _export_library(mod: Any, path: Path) -> dict[str, Any]:
    """Link ``mod``'s shared library at ``path``; its manifest entry (hash, parameters)."""
    portable = mod.portable() if hasattr(mod, "portable") else mod
    portable.export_library(path)
    params = [[[int(d.value) for d in b.shape], b.dtype] for b in mod.signature.params]
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "params": params}


# Vector and bit-manipulation features the kernels may use: LLVM's name -> /proc/cpuinfo's.
# A build that uses one on a CPU without it would die of SIGILL; the loader says which instead.
CPU_FLAGS = {
    "sse4.1": "sse4_1", "sse4.2": "sse4_2", "ssse3": "ssse3", "avx": "avx", "avx2": "avx2",
    "fma": "fma", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2", "avx512f": "avx512f",
    "avx512dq": "avx512dq", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16",
    "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512fp16": "avx512_fp16",
}


def _cpu_features(target: Any) -> list[str]:
    """The CPU_FLAGS features the target enables (none named: none checked)."""
    enabled = {f[1:] for f in target.features.split(",") if f.startswith("+")}
    return sorted(enabled & set(CPU_FLAGS))


def _machine(out: Path, libraries: dict[str, Any]) -> str:
    """The architecture the libraries were built for (the host's when there are none)."""
    for lib in libraries:
        return read_shared_library((out / lib).read_bytes()).machine
    return host_machine()


class DeployedModel:
    """Kernels from shared libraries, run in order on numpy arrays. ``run`` and ``time`` may be
    called from many threads at once: intermediates live in per-thread buffers."""

    def __init__(self, build_dir: str | os.PathLike):
        d = Path(build_dir)
        spec = read_manifest(d)
        _check_machine(d, spec.machine, f"target {spec.target}")
        _check_cpu_features(d, spec.cpu_features, spec.target)
        self.manifest = spec.raw
        self.graph = Graph(inputs=list(spec.inputs), outputs=list(spec.outputs), nodes=[],
                           values=dict(spec.values), name=spec.name)
        root = _trusted_dir(d)
        _build_file(root, MANIFEST)  # its fields size the buffers the kernels write
        self.constants = _constants(root, spec)
        symbols = {c.lib: c.symbol for c in spec.calls}
        libs = {f: _load_library(root, f, spec.libraries[f], sym) for f, sym in symbols.items()}
        self.kernels = []
        for c in spec.calls:
            fn = getattr(libs[c.lib], c.symbol)
            fn.argtypes = [ctypes.c_void_p] * len(c.args)
            fn.restype = ctypes.c_int32  # 0, or the STATUS_* bits of what failed
            self.kernels.append((c.task, fn, list(c.args), c.n_inputs))
        self._aliases = dict(spec.aliases)
        self._sizes: list[int] = []  # the raw buffers of the memory plan, allocated per thread
        steps = [(a[:n], a[n:]) for _, _, a, n in self.kernels]
        self._layout, self.peak_bytes = memory_plan(self.graph, steps, self._plan_buffer,
                                                    self._aliases)
        _check_memory(d, self.peak_bytes)
        self._local = threading.local()

    def _plan_buffer(self, n: int) -> int:
        self._sizes.append(n)
        return len(self._sizes) - 1

    def _storage(self) -> dict[str, np.ndarray]:
        """This thread's intermediate arrays, allocated on its first run (so that threads
        sharing one model never write each other's buffers)."""
        storage = getattr(self._local, "storage", None)
        if storage is None:
            raws = [_aligned(n) for n in self._sizes]
            storage = planned_arrays(self.graph, {v: raws[i] for v, i in self._layout.items()},
                                     self._aliases)
            self._local.storage = storage
        return storage

    def _calls(self, inputs: dict[str, Any]) -> tuple[list[tuple[str, Any, list[int]]],
                                                       dict[str, np.ndarray]]:
        vals: dict[str, np.ndarray] = dict(self.constants)
        for name, a in check_inputs(self.graph, inputs).items():
            vals[name] = a if a.ctypes.data % 64 == 0 else _aligned_copy(a)
        vals.update(self._storage())
        calls = [(task, fn, [vals[a].ctypes.data for a in args])
                 for task, fn, args, _ in self.kernels]
        return calls, vals

    def run(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        calls, vals = self._calls(inputs)
        _run(calls)
        return [np.array(vals[o]) for o in self.graph.outputs]

    def time(self, inputs: dict[str, Any], repeat: int = 10, min_s: float = 0.5) -> float:
        """Median seconds of one run, after a warm-up."""
        calls, _ = self._calls(inputs)
        _run(calls)
        times: list[float] = []
        deadline = time.perf_counter() + min_s
        while len(times) < repeat or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            _run(calls)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))


def _run(calls: list[tuple[str, Any, list[int]]]) -> None:
    """Each kernel in order; a kernel's failure (out of memory, an index out of range) stops
    the run with an error naming its task."""
    for task, fn, ptrs in calls:
        status = fn(*ptrs)
        if status:
            raise KernelFailure(task, status)


# -- checks before anything is loaded --------------------------------------------------------

MAX_LIBRARY_BYTES = 1 << 30
REBUILD = "write it again with autosched compile MODEL -o DIR"


def _check_machine(d: Path, machine: str, evidence: str) -> None:
    host = host_machine()
    if machine != host:
        raise ModelImportError(
            f"build dir {d} is for {machine} ({evidence}); this machine is {host}: run it "
            f"on a {machine} machine, or compile the model for this one (autosched compile "
            "MODEL --target llvm -o DIR)")


def _check_cpu_features(d: Path, required: tuple[str, ...], target: str) -> None:
    flags = _cpuinfo_flags()
    missing = [f for f in required if f in CPU_FLAGS and flags is not None
               and CPU_FLAGS[f] not in flags]
    if missing:
        raise ModelImportError(
            f"build dir {d} uses CPU features this CPU lacks: {', '.join(missing)} (target "
            f"{target}); compile the model on this machine, or for a CPU without them "
            "(autosched compile MODEL --target 'llvm -mcpu=NAME' -o DIR)")


def _cpuinfo_flags() -> set[str] | None:
    """The first CPU's flags from /proc/cpuinfo (x86 Linux); None when there are none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return None


def _trusted_dir(d: Path) -> Path:
    """The build dir, resolved, after checking no one but its owner (this user or root) can
    change the code in it."""
    root = d.resolve()
    problem = untrusted(os.stat(root), owners=(os.getuid(), 0))
    if problem:
        raise ModelImportError(f"build dir {d}: not loading code from it: {problem} (make it "
                               "yours and chmod go-w it)")
    return root


def _load_library(root: Path, name: str, lib: Library, symbol: str) -> Any:
    """The kernel library ``name`` of the build dir ``root``, loaded only when it is a file
    inside the dir, writable by its owner only, unchanged since export, built for this machine,
    and defines ``symbol`` itself."""
    path = _build_file(root, name)
    where = f"build dir {root}: {name}"
    if path.stat().st_size > MAX_LIBRARY_BYTES:
        raise ModelImportError(f"{where}: not loading it: it has {path.stat().st_size} bytes, "
                               "more than a kernel library can")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != lib.sha256:
        raise ModelImportError(f"{where} changed since export (its SHA-256 is not the "
                               f"manifest's); {REBUILD}")
    try:
        elf = read_shared_library(data)
    except ElfError as exc:
        raise ModelImportError(f"{where} is not a shared library ({exc}); {REBUILD}") from None
    _check_machine(root, elf.machine, f"{name} is {elf.machine} code")
    if symbol not in elf.functions:
        raise ModelImportError(f"{where} does not define the kernel function {symbol!r}; "
                               f"{REBUILD}")
    return ctypes.CDLL(os.fspath(path))


def _build_file(root: Path, name: str) -> Path:
    """``root / name`` with links resolved, when that is a regular file directly in ``root``
    (not a link out of it, a FIFO or a device) that no one but its owner (this user or root)
    can change."""
    path = (root / name).resolve()
    if path.parent != root or not path.is_file():
        raise ModelImportError(f"build dir {root}: {name} is not a file in the build dir (it "
                               f"resolves to {path}); {REBUILD}")
    problem = untrusted(os.stat(path), owners=(os.getuid(), 0))
    if problem:
        raise ModelImportError(f"build dir {root}: not using {name}: {problem} (make it yours "
                               "and chmod go-w it)")
    return path


def _constants(d: Path, spec: Manifest) -> dict[str, np.ndarray]:
    """The constants from constants.npz, each checked against its declared shape and dtype
    (and its stored size before it is read)."""
    out: dict[str, np.ndarray] = {}
    path = _build_file(d, "constants.npz")  # d: the resolved build dir
    try:
        with np.load(path, allow_pickle=False) as z:
            for name, key in spec.constants.items():
                v = spec.values[name]
                stored = z.zip.getinfo(f"{key}.npy").file_size
                if stored > nbytes(v) + 4096:
                    raise ValueError(f"{key} ({name}) stores {stored} bytes for {v}")
                a = z[key]
                if a.shape != v.shape or str(a.dtype) != v.dtype:
                    raise ValueError(f"{key} ({name}) is {a.dtype}{list(a.shape)}, not {v}")
                out[name] = np.ascontiguousarray(a)
    except (OSError, ValueError, KeyError, EOFError, AttributeError) as exc:
        raise ModelImportError(f"build dir {d}: constants.npz: {type(exc).__name__}: "
                               f"{str(exc)[:200]}; {REBUILD}") from None
    return out


def _check_memory(d: Path, peak: int) -> None:
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if peak > memory:
        raise ModelImportError(f"build dir {d}: its intermediate buffers need {peak} bytes, "
                               f"more than this machine's memory ({memory} bytes)")


def _aligned(n: int) -> np.ndarray:
    """``n`` bytes starting on a 64-byte boundary (the kernels need 16)."""
    raw = np.empty(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off: off + n]


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    out = _aligned(max(a.nbytes, 1))[: a.nbytes].view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    return out


def load(build_dir: str | os.PathLike) -> DeployedModel:
    """The model that ``export`` (or ``autosched compile -o``) wrote to ``build_dir``."""
    return DeployedModel(build_dir)
