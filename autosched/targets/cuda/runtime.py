"""Run compiled kernels through pycuda: load the cubin, move arrays, launch, time with events.

Arguments may be numpy arrays (copied to the device and, when the function writes them, back),
pycuda ``DeviceAllocation`` / ``GPUArray``, or any object with ``__cuda_array_interface__``
(a torch or cupy tensor on the GPU), which are used in place.

Example::

    mod = aus.build(s, [A, B, C], target="cuda")
    mod(a, b, c)                         # numpy in, c written in place
    t = mod.time(a, b, c, repeat=50)     # Timing(median=..., ...) in seconds per call
"""

from __future__ import annotations

import atexit
import functools
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import RuntimeError_
from autosched.targets.cuda.codegen import CudaSource, KernelInfo
from autosched.targets.cuda.nvrtc import CompiledBinary
from autosched.targets.target import Target
from autosched.te.expr import Var
from autosched.te.visit import free_vars
from autosched.tir import ir
from autosched.tir.evaluate import eval_int

INSTALL_HINT = "pip install autosched[cuda]  (or: pip install pycuda)"


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, mean and min over ``samples``."""

    median: float
    mean: float
    min: float
    samples: tuple[float, ...]


def _driver():  # noqa: ANN202
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise RuntimeError_(
            f"running a cuda module needs pycuda ({exc}); install it with: {INSTALL_HINT}"
        ) from None
    return drv


@functools.cache
def _context() -> Any:
    """The current CUDA context, or device 0's primary context (shared with torch / cupy)."""
    drv = _driver()
    try:
        drv.init()
        if drv.Device.count() == 0:
            raise RuntimeError_("running a cuda module needs an NVIDIA GPU; none was found")
    except drv.Error as exc:
        raise RuntimeError_(f"running a cuda module needs a CUDA driver and GPU: {exc}") from None
    try:
        ctx = drv.Context.get_current()
    except drv.Error:
        ctx = None
    if ctx is None:
        ctx = drv.Device(0).retain_primary_context()
        ctx.push()
        atexit.register(_pop, ctx)
    return ctx


def _pop(ctx: Any) -> None:
    try:
        ctx.pop()
    except Exception:  # the interpreter is exiting; a dead context is nothing to report
        pass


class _Loaded:
    """A module loaded into the CUDA context, with its kernel functions prepared."""

    def __init__(self, source: CudaSource, binary: CompiledBinary) -> None:
        drv = _driver()
        _context()
        self.drv = drv
        try:
            self.module = drv.module_from_buffer(binary.data)
        except drv.Error as exc:
            major, minor = binary.nvrtc_version
            raise RuntimeError_(
                f"the CUDA driver (version {drv.get_driver_version()}) could not load the "
                f"{binary.kind} for {binary.arch} from NVRTC {major}.{minor}: {exc}; a PTX from "
                "an NVRTC newer than the driver is refused: install an nvidia-cuda-nvrtc that "
                "matches the driver, or compile for the GPU's sm_XX so a cubin is produced"
            ) from None
        dev = drv.Context.get_device()
        attr = drv.device_attribute
        self.max_threads = dev.get_attribute(attr.MAX_THREADS_PER_BLOCK)
        self.max_shared = dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK)
        self.max_regs = dev.get_attribute(attr.MAX_REGISTERS_PER_BLOCK)
        self.max_grid = tuple(dev.get_attribute(a) for a in
                              (attr.MAX_GRID_DIM_X, attr.MAX_GRID_DIM_Y, attr.MAX_GRID_DIM_Z))
        self.functions = []
        for k in source.kernels:
            fn = self.module.get_function(k.name)
            fmt = "P" * len(k.buffers) + "".join(
                "q" if v.dtype == "int64" else "i" for v in k.scalars)
            fn.prepare(fmt)
            self.functions.append(fn)


class CudaModule:
    """A compiled CUDA function. ``get_source()`` and ``cubin`` work without a GPU; calling
    it needs one (and pycuda)."""

    def __init__(self, func: ir.PrimFunc, target: Target, source: CudaSource,
                 binary: CompiledBinary) -> None:
        self.func = func
        self.target = target
        self.source = source
        self.binary = binary
        self._loaded: _Loaded | None = None
        self._workspace: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # a module travels between processes (build worker -> run worker) as source + cubin;
        # the loaded CUDA module and device buffers belong to one context and stay behind
        state = dict(self.__dict__)
        state["_loaded"] = None
        state["_workspace"] = {}
        return state

    def get_source(self) -> str:
        return self.source.code

    @property
    def cubin(self) -> bytes | None:
        return self.binary.data if self.binary.kind == "cubin" else None

    @property
    def ptx(self) -> str | None:
        return self.binary.data.decode() if self.binary.kind == "ptx" else None

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.source.kernels)

    def __repr__(self) -> str:
        return (f"CudaModule({self.func.name}, {self.target}, kernels={list(self.kernel_names)},"
                f" {self.binary.kind} for {self.binary.arch})")

    def _load(self) -> _Loaded:
        if self._loaded is None:
            self._loaded = _Loaded(self.source, self.binary)
        return self._loaded

    def __call__(self, *args: Any) -> None:
        """Run on ``args`` (one per parameter, in order); numpy outputs are written in place."""
        env = self._bind_shapes(args)  # argument errors need no GPU
        loaded = self._load()
        calls, copy_back, _keep = self._prepare(loaded, args, env)
        drv = loaded.drv
        for fn, grid, block, values, name in calls:
            try:  # synchronize per kernel so that a fault names its kernel
                fn.prepared_call(grid, block, *values)
                drv.Context.synchronize()
            except drv.Error as exc:
                raise RuntimeError_(
                    f"{self.func.name}: kernel {name} (grid {grid}, block {block}) failed: {exc}"
                ) from exc
        for host, dev in copy_back:
            drv.memcpy_dtoh(host, dev)

    def time(self, *args: Any, warmup: int = 3, repeat: int = 20, number: int = 1) -> Timing:
        """Time all kernels of one call with CUDA events (data stays on the device)."""
        env = self._bind_shapes(args)
        loaded = self._load()
        calls, _copy, _keep = self._prepare(loaded, args, env)
        drv = loaded.drv

        def launch() -> None:
            for fn, grid, block, values, _name in calls:
                fn.prepared_call(grid, block, *values)

        samples = []
        try:
            for _ in range(warmup):
                launch()
            drv.Context.synchronize()
            start, end = drv.Event(), drv.Event()
            for _ in range(repeat):
                start.record()
                for _ in range(number):
                    launch()
                end.record()
                end.synchronize()
                samples.append(start.time_till(end) / 1e3 / number)
        except drv.Error as exc:
            raise RuntimeError_(
                f"{self.func.name}: running kernels {list(self.kernel_names)} failed: {exc}"
            ) from exc
        return Timing(statistics.median(samples), statistics.fmean(samples), min(samples),
                      tuple(samples))

    # -- arguments and launches --------------------------------------------------------------

    def _prepare(self, loaded: _Loaded, args: tuple[Any, ...],
                 env: dict[int, int]) -> tuple[list, list, list]:
        params = self.func.params
        drv = loaded.drv
        ptrs: dict[ir.Buffer, int] = {}
        copy_back: list[tuple[np.ndarray, Any]] = []
        keep: list[Any] = []
        for buf, arg in zip(params, args):
            if isinstance(arg, np.ndarray):
                dev = drv.mem_alloc(max(arg.nbytes, 1))
                drv.memcpy_htod(dev, arg)
                keep.append(dev)
                ptrs[buf] = int(dev)
                if buf in self.source.written:
                    copy_back.append((arg, dev))
            else:
                ptrs[buf] = _device_pointer(arg, buf)
        for buf in self.source.workspace:
            nbytes = _nbytes(buf, env)
            if buf.uid not in self._workspace or self._workspace[buf.uid][0] < nbytes:
                self._workspace[buf.uid] = (nbytes, drv.mem_alloc(max(nbytes, 1)))
            ptrs[buf] = int(self._workspace[buf.uid][1])
        calls = []
        for info, fn in zip(self.source.kernels, loaded.functions):
            grid = tuple(eval_int(e, env) for e in info.grid)
            block = tuple(eval_int(e, env) for e in info.block)
            if 0 in grid or 0 in block:
                continue
            self._check_limits(loaded, info, fn, grid, block)
            values = [ptrs[b] for b in info.buffers] + [env[v.uid] for v in info.scalars]
            calls.append((fn, grid, block, values, info.name))
        return calls, copy_back, keep

    def _bind_shapes(self, args: tuple[Any, ...]) -> dict[int, int]:
        params = self.func.params
        if len(args) != len(params):
            raise RuntimeError_(
                f"{self.func.name} takes {len(params)} arguments "
                f"({', '.join(b.name for b in params)}), got {len(args)}"
            )
        env: dict[int, int] = {}
        for buf, arg in zip(self.func.params, args):
            shape, dtype = _shape_dtype(arg)
            if dtype is not None and np.dtype(dtype) != np.dtype(buf.dtype):
                raise RuntimeError_(
                    f"{self.func.name}: argument {buf.name} must be {buf.dtype}, got {dtype}"
                )
            if isinstance(arg, np.ndarray) and not arg.flags.c_contiguous:
                raise RuntimeError_(
                    f"{self.func.name}: argument {buf.name} must be C-contiguous "
                    "(use np.ascontiguousarray)"
                )
            if shape is None:
                continue
            if len(shape) != len(buf.shape):
                raise RuntimeError_(
                    f"{self.func.name}: argument {buf.name} must have {len(buf.shape)} dims "
                    f"{tuple(str(d) for d in buf.shape)}, got shape {tuple(shape)}"
                )
            for want, got in zip(buf.shape, shape):
                if isinstance(want, Var) and want.uid not in env:
                    env[want.uid] = int(got)
            for d, (want, got) in enumerate(zip(buf.shape, shape)):
                if any(v.uid not in env for v in free_vars(want)):
                    continue
                expected = eval_int(want, env)
                if expected != int(got):
                    raise RuntimeError_(
                        f"{self.func.name}: argument {buf.name} dim {d} must be {want} = "
                        f"{expected}, got {got} (shape {tuple(shape)})"
                    )
        missing = [v.name for v in self.source.shape_vars if v.uid not in env]
        if missing:
            raise RuntimeError_(
                f"{self.func.name}: cannot bind shape variables {missing} from the arguments "
                "(pass numpy arrays or GPUArrays, which carry shapes)"
            )
        return env

    def _check_limits(self, loaded: _Loaded, info: KernelInfo, fn: Any,
                      grid: tuple[int, ...], block: tuple[int, ...]) -> None:
        drv = loaded.drv
        threads = block[0] * block[1] * block[2]
        limit = min(self.target.max_threads_per_block, loaded.max_threads)
        if threads > limit:
            raise RuntimeError_(
                f"kernel {info.name}: block {block} has {threads} threads; the limit is {limit}"
            )
        regs = fn.get_attribute(drv.function_attribute.NUM_REGS)
        fn_max = fn.get_attribute(drv.function_attribute.MAX_THREADS_PER_BLOCK)
        if threads > fn_max:
            raise RuntimeError_(
                f"kernel {info.name} uses {regs} registers per thread, so at most {fn_max} "
                f"threads per block can run it (register file {loaded.max_regs}); block "
                f"{block} has {threads}"
            )
        shared = fn.get_attribute(drv.function_attribute.SHARED_SIZE_BYTES)
        if shared > min(loaded.max_shared, self.target.max_shared_memory_per_block):
            raise RuntimeError_(
                f"kernel {info.name} needs {shared} bytes of shared memory per block; the limit "
                f"is {min(loaded.max_shared, self.target.max_shared_memory_per_block)}"
            )
        for axis, (g, m) in enumerate(zip(grid, loaded.max_grid)):
            if g > m:
                raise RuntimeError_(
                    f"kernel {info.name}: grid {grid} exceeds the device's limit {m} on "
                    f"axis {'xyz'[axis]}"
                )


def _shape_dtype(arg: Any) -> tuple[tuple[int, ...] | None, Any]:
    if isinstance(arg, np.ndarray):
        return arg.shape, arg.dtype
    cai = getattr(arg, "__cuda_array_interface__", None)
    if cai is not None:
        return tuple(cai["shape"]), np.dtype(cai["typestr"])
    return None, None


def _device_pointer(arg: Any, buf: ir.Buffer) -> int:
    cai = getattr(arg, "__cuda_array_interface__", None)
    if cai is not None:
        strides = cai.get("strides")
        if strides is not None:
            itemsize = np.dtype(cai["typestr"]).itemsize
            expect, acc = [], itemsize
            for n in reversed(cai["shape"]):
                expect.append(acc)
                acc *= n
            if tuple(strides) != tuple(reversed(expect)):
                raise RuntimeError_(f"argument {buf.name} must be a contiguous device array")
        return int(cai["data"][0])
    if hasattr(arg, "gpudata"):
        return int(arg.gpudata)
    try:
        return int(arg)  # a pycuda DeviceAllocation or a raw device pointer
    except TypeError:
        raise RuntimeError_(
            f"argument {buf.name}: expected a numpy array, a pycuda DeviceAllocation/GPUArray or "
            f"an object with __cuda_array_interface__, got {type(arg).__name__}"
        ) from None


def _nbytes(buf: ir.Buffer, env: dict[int, int]) -> int:
    n = 1
    for d in buf.shape:
        n *= eval_int(d, env)
    return n * buf.itemsize
