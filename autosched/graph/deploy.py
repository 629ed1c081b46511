"""A compiled CPU model on disk, and the loader that runs it without the compiler.

``export(model, build_dir)`` writes one shared library per distinct kernel (the llvm module's
``export_library``), the constants the kernels read as ``constants.npz`` and ``manifest.json``
(inputs, outputs, value shapes, and each kernel call: its library, symbol and argument names).
``load(build_dir)`` maps the libraries with ctypes and runs the calls over the same static
memory plan; it needs numpy only (no LLVM, no TE).

Example::

    model = aus.compile(graph, target="llvm", log="tuning_logs/model.jsonl")
    export(model, "build/model")                  # or: autosched compile model.onnx -o build/model
    deployed = load("build/model")
    (y,) = deployed.run({"input": x})
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from autosched.errors import ModelImportError, RuntimeError_
from autosched.graph.executor import check_inputs, memory_plan, nbytes
from autosched.graph.graph import Graph, ValueInfo

MANIFEST = "manifest.json"
VERSION = 1


def export(model: Any, build_dir: str | os.PathLike) -> Path:
    """Write ``model`` (a CompiledModel for an llvm target) to ``build_dir``; returns the
    manifest's path."""
    if model.target.kind != "llvm":
        raise RuntimeError_(f"export writes CPU models (target llvm); this one is for "
                            f"{model.target}")
    out = Path(build_dir)
    out.mkdir(parents=True, exist_ok=True)
    libs: dict[int, str] = {}
    calls = []
    used: list[str] = []
    for k in model.kernels:
        mod = k.module
        if id(mod) not in libs:
            lib = f"kernel{len(libs)}_{mod.entry_name}.so"[:120]
            portable = mod.portable() if hasattr(mod, "portable") else mod
            portable.export_library(out / lib)
            libs[id(mod)] = lib
        if mod.signature.sym_vars:
            raise RuntimeError_(f"kernel {mod.entry_name} has symbolic sizes; graph kernels "
                                "have static shapes")
        calls.append({"task": k.task.name, "lib": libs[id(mod)], "symbol": mod.entry_name,
                      "args": list(k.args), "n_inputs": k.n_inputs,
                      "threads": bool(mod.uses_threads)})
        used += [a for a in k.args if a in model.constants and a not in used]
    keys = {name: f"c{i}" for i, name in enumerate(used)}
    np.savez(out / "constants.npz", **{keys[n]: model.constants[n] for n in used})
    g = model.graph
    manifest = {
        "version": VERSION, "name": g.name, "target": str(model.target),
        "inputs": [[v.name, list(v.shape), v.dtype] for v in g.inputs],
        "outputs": list(g.outputs),
        "values": {n: [list(v.shape), v.dtype] for n, v in g.values.items()
                   if any(n in c["args"] for c in calls) or n in g.outputs
                   or n in model.aliases},
        "constants": keys, "kernels": calls, "aliases": dict(model.aliases),
    }
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=1))
    return path


class DeployedModel:
    """Kernels from shared libraries, run in order on numpy arrays."""

    def __init__(self, build_dir: str | os.PathLike):
        d = Path(build_dir)
        path = d / MANIFEST
        if not path.exists():
            raise ModelImportError(f"{d} holds no {MANIFEST} (not an autosched compile output)")
        m = json.loads(path.read_text())
        if m.get("version") != VERSION:
            raise ModelImportError(f"{path}: manifest version {m.get('version')} is not "
                                   f"{VERSION}")
        self.manifest = m
        values = {n: ValueInfo(n, tuple(s), t) for n, (s, t) in m["values"].items()}
        inputs = [ValueInfo(n, tuple(s), t) for n, s, t in m["inputs"]]
        for v in inputs:
            values[v.name] = v
        self.graph = Graph(inputs=inputs, outputs=list(m["outputs"]), nodes=[], values=values,
                           name=m["name"])
        with np.load(d / "constants.npz") as z:
            self.constants = {n: np.ascontiguousarray(z[k]) for n, k in m["constants"].items()}
        self._libs: dict[str, Any] = {}
        self.kernels = []
        for c in m["kernels"]:
            lib = self._libs.get(c["lib"])
            if lib is None:
                lib = self._libs[c["lib"]] = ctypes.CDLL(os.fspath(d / c["lib"]))
            fn = getattr(lib, c["symbol"])
            fn.argtypes = [ctypes.c_void_p] * len(c["args"])
            fn.restype = None
            self.kernels.append((c["task"], fn, c["args"], c["n_inputs"]))
        steps = [(a[:n], a[n:]) for _, _, a, n in self.kernels]
        aliases = dict(m.get("aliases", {}))
        raw, self.peak_bytes = memory_plan(self.graph, steps, _aligned, aliases)
        self.storage = {v: r[: nbytes(values[v])].view(values[v].dtype).reshape(values[v].shape)
                        for v, r in raw.items()}
        for a, src in aliases.items():  # reshapes: views of a kernel's output
            self.storage[a] = self.storage[src].reshape(values[a].shape)

    def _calls(self, inputs: dict[str, Any]) -> list[tuple[Any, list[int]]]:
        vals: dict[str, np.ndarray] = dict(self.constants)
        for name, a in check_inputs(self.graph, inputs).items():
            vals[name] = a if a.ctypes.data % 64 == 0 else _aligned_copy(a)
        vals.update(self.storage)
        self._vals = vals
        return [(fn, [vals[a].ctypes.data for a in args]) for _, fn, args, _ in self.kernels]

    def run(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        for fn, ptrs in self._calls(inputs):
            fn(*ptrs)
        return [np.array(self._vals[o]) for o in self.graph.outputs]

    def time(self, inputs: dict[str, Any], repeat: int = 10, min_s: float = 0.5) -> float:
        """Median seconds of one run, after a warm-up."""
        calls = self._calls(inputs)
        for fn, ptrs in calls:
            fn(*ptrs)
        times: list[float] = []
        deadline = time.perf_counter() + min_s
        while len(times) < repeat or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            for fn, ptrs in calls:
                fn(*ptrs)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))


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
