"""A compiled model as one shared library with a C API: ``export(model, out)``.

The build dir gets ``NAME.so`` (every kernel, the weights, the static memory plan and the call
order, behind ``NAME_create / NAME_run / NAME_destroy``; targets/llvm/library.py for CPUs,
targets/cuda/library.py for NVIDIA GPUs over the CUDA driver API), ``NAME.h``
(the API, with the inputs and outputs listed) and a README with a C program that runs it.
With ``weights_file=True`` (``autosched compile --weights-file``) the weights go to
``NAME.weights`` instead, which the library maps at create: the .so shrinks by the weights'
size. The file's header (targets/model_api.py) names the model and holds the checksum of
this very build, so create refuses a file written with another library.
Nothing on the target needs Python; ``autosched.load(out)`` runs the same
library from Python through ctypes (graph/loader.py).

Example::

    model = aus.compile(graph, target="llvm -mtriple=aarch64-linux-gnu")
    export(model, "build/net")                # or: autosched compile model.onnx -o build/net
    # build/net/net.so, build/net/net.h, build/net/README
    export(model, "build/net", weights_file=True)   # ... and build/net/net.weights
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autosched.errors import RuntimeError_
from autosched.graph.memory import memory_layout, nbytes
from autosched.version import __version__

ALIGN = 64  # every weight and workspace buffer starts on a cache line
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def library_name(name: str) -> str:
    """``name`` as a C identifier prefix: other characters become ``_`` ("model" if empty)."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name)[:64] or "model"
    return ident if IDENTIFIER.fullmatch(ident) else "m_" + ident[:62]


def export(model: Any, build_dir: str | os.PathLike, name: str | None = None,
           weights_file: bool = False) -> Path:
    """Write ``model`` to ``build_dir`` as NAME.so, NAME.h and README; returns the library's
    path. ``name`` (default: the graph's) prefixes every C symbol; ``weights_file``: the
    weights go to NAME.weights, which the library maps at create. A model for an llvm target
    (host or cross) becomes LLVM code; one for a cuda target (static shapes), C over the CUDA
    driver API with a cubin per listed arch (``cuda -arch=sm_80,sm_90``) that the host C
    compiler builds: a machine without a GPU (or pycuda) builds it from
    ``aus.compile(graph, "cuda -arch=sm_XX", executor=False)``, the kernels without an
    executor."""
    from autosched.targets.llvm.library import build_library
    from autosched.targets.model_api import header, readme

    out = Path(build_dir)
    device_library = getattr(model.target.backend, "model_library", None)
    if device_library is None and not model.target.backend.exports:
        raise RuntimeError_(f"export writes models whose kernels export as libraries (target "
                            f"llvm or cuda); this one is for {model.target}")
    spec = replace(library_spec(model, library_name(name or model.graph.name),
                                static=device_library is None), weights_file=weights_file)
    out.mkdir(parents=True, exist_ok=True)
    if device_library is not None:  # kernels for a device, glue over its driver
        built = device_library(spec, out / f"{spec.name}.so")
        text, target, gpu = built.header, built.target, True
    else:
        build_library(spec, out / f"{spec.name}.so")
        inputs, outputs = ([(t.name, t.dtype, t.shape) for t in ts]
                           for ts in (spec.inputs, spec.outputs))
        target, gpu = str(spec.target), False
        text = header(spec.name, inputs, outputs, target)
    return _write(out, spec, text, readme(spec.name, target, gpu, weights_file))


def _write(out: Path, spec: Any, header: str, readme: str) -> Path:
    """NAME.h, README and (``spec.weights_file``) NAME.weights next to the library NAME.so,
    only their owner allowed to change them; returns the library's path. A weights file left
    by an earlier export goes: the library no longer reads it."""
    from autosched.targets.model_api import weights_file

    lib = out / f"{spec.name}.so"
    weights = out / f"{spec.name}.weights"
    (out / f"{spec.name}.h").write_text(header)
    (out / "README").write_text(readme)
    written = [out, lib, out / f"{spec.name}.h", out / "README"]
    if spec.weights_file:
        weights.write_bytes(weights_file(spec.name, spec.weights))
        written.append(weights)
    else:
        weights.unlink(missing_ok=True)
    for p in written:
        _owner_writable_only(p)
    return lib


def library_spec(model: Any, name: str, embed: bool = True, static: bool = True) -> Any:
    """The LibrarySpec of ``model``: the weights packed (or, with ``embed`` false, read where
    ``model.constants`` holds them, for a library run in this process), the memory plan laid
    out in one workspace, each kernel argument's place. ``static``: check here that the
    kernels (llvm modules) have no symbolic sizes; a device backend checks its own."""
    from autosched.targets.llvm.library import Call, Copy, LibrarySpec, Place, Tensor

    g = model.graph
    for k in model.kernels if static else ():
        if k.module.signature.sym_vars:
            raise RuntimeError_(f"kernel {k.module.entry_name} has symbolic sizes; graph "
                                "kernels have static shapes")
    aliases = dict(model.aliases)
    written = {a for k in model.kernels for a in k.args[k.n_inputs:]}
    places: dict[str, Any] = {v.name: Place("input", j) for j, v in enumerate(g.inputs)}
    direct: dict[str, int] = {}
    for j, o in enumerate(g.outputs):
        if o in written and o not in places and o not in direct:
            direct[o] = j
            places[o] = Place("output", j)
    used = [c for c in dict.fromkeys([a for k in model.kernels for a in k.args]
                                     + [aliases.get(o, o) for o in g.outputs])
            if c in model.constants]
    if embed:
        weights, offsets = _pack(model.constants, used)
    else:
        weights, offsets = b"", {c: model.constants[c].ctypes.data for c in used}
    region = "weights" if embed else "address"
    places.update({c: Place(region, at) for c, at in offsets.items() if c not in places})
    steps = [(k.args[: k.n_inputs], k.args[k.n_inputs:]) for k in model.kernels]
    layout, workspace = memory_layout(g, steps, aliases)
    places.update({v: Place("workspace", at) for v, at in layout.items() if v not in places})

    def place(v: str) -> Any:
        while v not in places and v in aliases:
            v = aliases[v]
        return places[v]

    calls = tuple(Call(k.module, tuple(place(a) for a in k.args)) for k in model.kernels)
    copies = tuple(Copy(place(o), j, nbytes(g.values[o])) for j, o in enumerate(g.outputs)
                   if direct.get(o) != j)
    return LibrarySpec(
        name=name, target=model.target, version=__version__,
        inputs=tuple(Tensor(v.name, v.dtype, tuple(map(int, v.shape))) for v in g.inputs),
        outputs=tuple(Tensor(o, g.values[o].dtype, tuple(map(int, g.values[o].shape)))
                      for o in g.outputs),
        weights=weights, workspace=workspace, calls=calls, copies=copies)


def _pack(constants: dict[str, np.ndarray], used: list[str]) -> tuple[bytes, dict[str, int]]:
    """The constants ``used`` in one blob, each at a 64-byte aligned offset."""
    blob = bytearray()
    offsets: dict[str, int] = {}
    for name in used:
        blob += bytes(-len(blob) % ALIGN)
        offsets[name] = len(blob)
        blob += np.asarray(constants[name], order="C").tobytes()
    return bytes(blob), offsets


def _owner_writable_only(path: Path) -> None:
    """Drop group and other write permission (a umask of 002 grants it), which the loader
    refuses: anyone who can write a build dir can change the code it runs."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        os.chmod(path, mode & ~0o022)
