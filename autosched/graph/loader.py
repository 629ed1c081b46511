"""Running a model library from Python: ``load(build_dir)`` (``autosched.load``).

The build dir is what ``autosched compile -o`` (graph/deploy.py) writes: ``NAME.so`` with its
C API. The loader runs it through ctypes on numpy arrays and needs numpy only (importing it
pulls in neither LLVM, the ONNX importer, the search nor the cost model), so a runtime-only
install is enough on the target. ``run`` may be called from many threads at once: each
thread gets its own context (its own workspace).

A build dir holds native code: loading it runs that code, so load only build dirs you would
run as programs. What the loader reads is still checked before it acts on it (see
docs/SECURITY.md): the dir and the library are files that only their owner can change, the
library is an ELF shared library for this machine that defines the API, and what its
introspection functions report (counts, names, dtypes, shapes) is bounded before any buffer is
sized from it. A library built for another CPU says so in one line.

A CUDA library (targets/cuda/library.py) loads the same way: ``run`` takes numpy arrays (the
library copies them to the GPU and back), and ``run_device`` takes arrays already on the GPU
(``__cuda_array_interface__``: CuPy, PyTorch, Numba, pycuda's GPUArray), queued on the stream
given to ``load`` without waiting for it. A machine without the driver, the GPU or the arch
the library was built for fails at load with one line saying which.

Example::

    model = autosched.load("build/net")
    (y,) = model.run({"input": x})
    print(model.target, model.time({"input": x}) * 1e3, "ms")
    gpu = autosched.load("build/net_cuda", device=0)
    gpu.run_device({"input": x_gpu}, [y_gpu])          # e.g. cupy arrays; then sync the stream
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autosched.cache import untrusted
from autosched.errors import ModelImportError, RuntimeError_
from autosched.graph.executor import native_arguments, time_calls
from autosched.graph.graph import Graph, ValueInfo
from autosched.targets.elf import ElfError, host_machine, read_shared_library
from autosched.targets.model_api import API, DEVICE_API, Status
from autosched.te import dtype as dt

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_LIBRARY_BYTES = 4 << 30
MAX_TENSORS = 1024
MAX_NDIM = 32
MAX_TENSOR_BYTES = 1 << 48
MAX_STRING = 4096
REBUILD = "write it again with autosched compile MODEL -o DIR"


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("ndim", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64))]


class _Options(ctypes.Structure):
    """NAME_options (model_api.py): a CPU library reads the thread count, a CUDA one the device
    and stream; one built with a weights file, its path."""

    _fields_ = [("num_threads", ctypes.c_int32), ("device", ctypes.c_int32),
                ("stream", ctypes.c_void_p), ("weights_path", ctypes.c_char_p)]


class ModelLibrary:
    """A model library loaded for this process. ``run({name: array}) -> [arrays]``;
    ``inputs`` / ``outputs`` describe them; ``threads`` is each context's thread count (0:
    OMP_NUM_THREADS or all cores); a CUDA library runs on GPU ``device``, on ``stream`` (a
    CUstream as an int; 0: the default stream)."""

    def __init__(self, build_dir: str | os.PathLike, threads: int = 0, device: int = 0,
                 stream: int = 0) -> None:
        self.path = _library_file(Path(build_dir))
        self.name = self.path.stem
        # read only by a library built with a weights file, which checks what it holds
        self.weights_path = _weights_file(self.path)
        self._lib = ctypes.CDLL(os.fspath(self.path))
        self._api = {f: getattr(self._lib, f"{self.name}_{f}") for f in API}
        # a CUDA library: also a run on device pointers
        self.gpu = hasattr(self._lib, f"{self.name}_{DEVICE_API[0]}")
        if self.gpu:
            self._api.update({f: getattr(self._lib, f"{self.name}_{f}") for f in DEVICE_API})
        _declare(self._api)
        self.device = device
        self.stream = stream
        self.target = self._string("target")
        self.version = self._string("version")
        inputs = self._tensors("input")
        outputs = self._tensors("output")
        self.graph = Graph(inputs=inputs, outputs=[o.name for o in outputs], nodes=[],
                           values={v.name: v for v in [*inputs, *outputs]}, name=self.name)
        self._outputs = outputs
        self.threads = threads
        self._local = threading.local()
        self._context()  # a CPU without the library's features fails here, not at run

    def _string(self, function: str) -> str:
        return _text(self._api[function](), f"{self.path}: {function}()")

    def _tensors(self, which: str) -> list[ValueInfo]:
        where = f"{self.path}: {self.name}_{which}"
        n = self._api[f"num_{which}s"]()
        if not 0 <= n <= MAX_TENSORS:
            raise ModelImportError(f"{where}s: {n} {which}s; {REBUILD}")
        out = []
        for i in range(n):
            info = self._api[which](i)
            if not info:
                raise ModelImportError(f"{where}({i}) is NULL; {REBUILD}")
            out.append(_tensor(info.contents, f"{where}({i})"))
        return out

    def _context(self) -> Any:
        """This thread's context, created on its first run."""
        ctx = getattr(self._local, "context", None)
        if ctx is None:
            ctx = self._local.context = _Context(self)
        return ctx.pointer

    def message(self, status: int) -> str:
        return self._api["status_message"](status).decode(errors="replace")[:MAX_STRING]

    def run(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        _, outs, args = native_arguments(self.graph, inputs, self._outputs)
        self._call(args)
        return outs

    def _call(self, pointers: Any, entry: str = "run") -> None:
        status = self._api[entry](self._context(), *pointers)
        if status:
            raise RuntimeError_(f"{self.name}: {self.message(status)}")

    def run_device(self, inputs: dict[str, Any], outputs: list[Any]) -> None:
        """A CUDA library's run on arrays on the GPU (``__cuda_array_interface__``, C-contiguous,
        of the shapes and dtypes of ``graph``): queued on the stream, not waited for."""
        self.device_call(inputs, outputs)()

    def device_call(self, inputs: dict[str, Any], outputs: list[Any]) -> Callable[[], None]:
        """``run_device`` on these arrays as a call without arguments: the arrays are checked
        and their device pointers bound once, so that each call is the one C call (what a C
        program's ``run_device`` costs). The call holds the arrays."""
        if not self.gpu:
            raise RuntimeError_(f"{self.name}: run_device runs CUDA libraries; this one is for "
                                f"{self.target} (use run)")
        names = [v.name for v in self.graph.inputs]
        if sorted(inputs) != sorted(names):
            raise ModelImportError(f"{self.name}: run_device takes the inputs {names}, got "
                                   f"{sorted(inputs)}")
        if len(outputs) != len(self._outputs):
            raise ModelImportError(f"{self.name}: {len(outputs)} outputs given, the model has "
                                   f"{len(self._outputs)}")
        pointers = [(ctypes.c_void_p * max(len(xs), 1))(*xs) for xs in (
            [_device_pointer(inputs[n], v) for n, v in zip(names, self.graph.inputs)],
            [_device_pointer(a, v) for a, v in zip(outputs, self._outputs)])]
        held = (inputs, outputs)

        def call() -> None:
            self._call(pointers, "run_device")

        call.held = held  # type: ignore[attr-defined]  # the arrays live as long as the call
        return call

    def time(self, inputs: dict[str, Any], repeat: int = 10, min_s: float = 0.5) -> float:
        """Median seconds of one run (one C call), after a warm-up, inputs bound once."""
        _, _, pointers = bound = native_arguments(self.graph, inputs, self._outputs)
        t = time_calls([lambda: self._call(pointers)], repeat, min_s)
        del bound  # the arrays the pointers point to lived until here
        return t


class _Context:
    """One context of the library (a workspace), destroyed with this object."""

    def __init__(self, model: ModelLibrary) -> None:
        self.pointer = ctypes.c_void_p()
        self._destroy = model._api["destroy"]
        options = _Options(model.threads, model.device, model.stream or None,
                           os.fsencode(model.weights_path))
        status = model._api["create"](ctypes.byref(options), ctypes.byref(self.pointer))
        if status and (model.gpu or status & Status.WEIGHTS):  # the message says what to do
            raise ModelImportError(f"{model.path}: {model.message(status)} (built for "
                                   f"{model.target})")
        if status:
            raise ModelImportError(f"{model.path}: {model.message(status)} (built for "
                                   f"{model.target}); compile the model for this machine "
                                   "(autosched compile MODEL --target llvm -o DIR)")

    def __del__(self) -> None:
        if self.pointer:
            self._destroy(self.pointer)


def _declare(api: dict[str, Any]) -> None:
    info = ctypes.POINTER(_TensorInfo)
    protos = {"create": (ctypes.c_int32, [ctypes.c_void_p, ctypes.c_void_p]),
              "run": (ctypes.c_int32, [ctypes.c_void_p] * 3),
              "run_device": (ctypes.c_int32, [ctypes.c_void_p] * 3),
              "destroy": (None, [ctypes.c_void_p]),
              "num_inputs": (ctypes.c_int32, []), "num_outputs": (ctypes.c_int32, []),
              "input": (info, [ctypes.c_int32]), "output": (info, [ctypes.c_int32]),
              "target": (ctypes.c_char_p, []), "version": (ctypes.c_char_p, []),
              "status_message": (ctypes.c_char_p, [ctypes.c_int32])}
    for name, (restype, argtypes) in protos.items():
        if name not in api:
            continue
        api[name].restype = restype
        api[name].argtypes = argtypes


def _device_pointer(array: Any, info: ValueInfo) -> int:
    """The device address of ``array``, after checking it is a C-contiguous ``info``."""
    cai = getattr(array, "__cuda_array_interface__", None)
    if not isinstance(cai, dict):
        raise ModelImportError(f"{info.name}: run_device takes arrays on the GPU (with "
                               f"__cuda_array_interface__), got a {type(array).__name__}")
    shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
    if shape != tuple(info.shape) or str(dtype) != info.dtype:
        raise ModelImportError(f"{info.name} must be {info.dtype}{list(info.shape)}, got "
                               f"{dtype}{list(shape)}")
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != np.empty(shape, dtype).strides:
        raise ModelImportError(f"{info.name} must be C-contiguous; its strides are "
                               f"{tuple(strides)}")
    return int(cai["data"][0])


def _text(raw: bytes | None, where: str) -> str:
    if raw is None or len(raw) > MAX_STRING:
        raise ModelImportError(f"{where} returned no string or a longer one than "
                               f"{MAX_STRING} bytes; {REBUILD}")
    return raw.decode(errors="replace")


def _tensor(info: _TensorInfo, where: str) -> ValueInfo:
    """An input or output as the library describes it, checked by value."""
    name = _text(info.name, f"{where}.name")
    dtype = _text(info.dtype, f"{where}.dtype")
    if dtype not in dt.ALL_TYPES:
        raise ModelImportError(f"{where}: unknown dtype {dtype[:40]!r}; {REBUILD}")
    if not 0 <= info.ndim <= MAX_NDIM:
        raise ModelImportError(f"{where}: {info.ndim} dims; {REBUILD}")
    shape = tuple(int(info.shape[d]) for d in range(info.ndim))
    size = dt.nbytes(dtype)
    for d in shape:
        size *= max(d, 1)
        if d < 0 or size > MAX_TENSOR_BYTES:
            raise ModelImportError(f"{where}: shape {list(shape)} of {dtype}; {REBUILD}")
    return ValueInfo(name, shape, dtype)


def _library_file(d: Path) -> Path:
    """The one NAME.so of the build dir, after checking that only its owner can change it, that
    it is an ELF shared library for this machine and that it defines the API."""
    root = d.resolve()
    if not root.is_dir():
        raise ModelImportError(f"build dir {d} does not exist; {REBUILD}")
    _owned(root, f"build dir {d}")
    found = sorted(p.name for p in root.iterdir() if p.suffix == ".so")
    if len(found) != 1 or not NAME.fullmatch(found[0][:-3]):
        raise ModelImportError(f"build dir {d} must hold one model library NAME.so (NAME a C "
                               f"identifier), it holds {found[:5] or 'none'}; {REBUILD}")
    path = (root / found[0]).resolve()
    if path.parent != root or not path.is_file():
        raise ModelImportError(f"build dir {d}: {found[0]} is not a file in the build dir (it "
                               f"resolves to {path}); {REBUILD}")
    _owned(path, f"build dir {d}: {found[0]}")
    if path.stat().st_size > MAX_LIBRARY_BYTES:
        raise ModelImportError(f"build dir {d}: {found[0]} has {path.stat().st_size} bytes, "
                               "more than a model library can")
    try:
        elf = read_shared_library(path.read_bytes())
    except ElfError as exc:
        raise ModelImportError(f"build dir {d}: {found[0]} is not a shared library ({exc}); "
                               f"{REBUILD}") from None
    host = host_machine()
    if elf.machine != host:
        raise ModelImportError(
            f"build dir {d}: {found[0]} is built for {elf.machine}, this machine is {host}: "
            f"run it on an {elf.machine} machine, or compile the model for this one "
            "(autosched compile MODEL --target llvm -o DIR)")
    name = found[0][:-3]
    missing = [f"{name}_{f}" for f in API if f"{name}_{f}" not in elf.functions]
    if missing:
        raise ModelImportError(f"build dir {d}: {found[0]} does not define {missing[0]}"
                               f"{' and more' if len(missing) > 1 else ''}; {REBUILD}")
    return path


def _weights_file(library: Path) -> Path:
    """NAME.weights next to the library NAME.so, which a library built with a weights file
    maps (and checks); when it is there, only its owner may be able to change it, like the
    library, and it must be a file in the build dir."""
    path = library.with_suffix(".weights")
    if not os.path.lexists(path):
        return path  # a library that needs it says so at create, naming it
    where = f"build dir {library.parent}: {path.name}"
    if path.resolve() != path or not path.is_file():
        raise ModelImportError(f"{where} is not a file in the build dir (it resolves to "
                               f"{path.resolve()}); {REBUILD}")
    _owned(path, where, "weights")
    return path


def _owned(path: Path, what: str, reading: str = "code") -> None:
    problem = untrusted(os.stat(path), owners=(os.getuid(), 0))
    if problem:
        raise ModelImportError(f"{what}: not loading {reading} from it: {problem} (make it "
                               "yours and chmod go-w it)")


def load(build_dir: str | os.PathLike, threads: int = 0, device: int = 0,
         stream: int = 0) -> ModelLibrary:
    """The model that ``autosched compile -o`` (graph/deploy.py's ``export``) wrote to
    ``build_dir``, ready to run from Python (``device`` and ``stream``: a CUDA library's)."""
    return ModelLibrary(build_dir, threads, device, stream)
