"""Run compiled kernels through pycuda: load the cubin, move arrays, launch, time with events.

Arguments may be numpy arrays (copied to the device and, when the function writes them, back),
pycuda ``DeviceAllocation`` / ``GPUArray``, or any object with ``__cuda_array_interface__``
(a torch or cupy tensor on the GPU), which are used in place.

A module whose kernels check something at run time (codegen.py: a status word parameter) is
given a status word, cleared before the launches of a call and read after them; a failure
raises ``KernelFailure`` (targets/status.py). Modules without checks read nothing.

Example::

    mod = aus.build(s, [A, B, C], target="cuda")
    mod(a, b, c)                         # numpy in, c written in place
    t = mod.time(a, b, c, repeat=50)     # Timing: .median, .mean, .min seconds per call
"""

from __future__ import annotations

import atexit
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from autosched.errors import RuntimeError_
from autosched.targets.backend import Timing, time_repeats
from autosched.targets.cuda.codegen import CudaSource, KernelInfo
from autosched.targets.cuda.dtypes import host_bits
from autosched.targets.cuda.launch import TENSOR_MAP, DriverFunction
from autosched.targets.cuda.nvrtc import CompiledBinary
from autosched.targets.cuda.tma import TensorMap, encode
from autosched.targets.status import KernelFailure
from autosched.targets.target import Target
from autosched.te import dtype as dt
from autosched.tir import ir
from autosched.tir.evaluate import eval_int
from autosched.tir.params import bind_params, check_array, mismatch

INSTALL_HINT = "pip install autosched[cuda]  (or: pip install pycuda)"


def driver():  # noqa: ANN201
    """pycuda's driver module (RuntimeError_ with an install hint when pycuda is missing)."""
    try:
        import pycuda.driver as drv
    except ImportError as exc:
        raise RuntimeError_(
            f"running a cuda module needs pycuda ({exc}); install it with: {INSTALL_HINT}"
        ) from None
    return drv


@functools.cache
def context() -> Any:
    """The current CUDA context, or device 0's primary context (shared with torch / cupy)."""
    drv = driver()
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


def device_bus_id() -> str:
    """The PCI bus id of the current context's GPU (``0000:19:00.0``)."""
    drv = driver()
    context()
    return str(drv.Context.get_device().pci_bus_id())


def _pop(ctx: Any) -> None:
    try:
        ctx.pop()
    except Exception:  # the interpreter is exiting; a dead context is nothing to report
        pass


class _Loaded:
    """A module loaded into the CUDA context, with its kernel functions prepared."""

    def __init__(self, source: CudaSource, binary: CompiledBinary) -> None:
        drv = driver()
        context()
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
        self.max_shared = max(dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK),
                              dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
        self.max_regs = dev.get_attribute(attr.MAX_REGISTERS_PER_BLOCK)
        self.max_grid = tuple(dev.get_attribute(a) for a in
                              (attr.MAX_GRID_DIM_X, attr.MAX_GRID_DIM_Y, attr.MAX_GRID_DIM_Z))
        self.functions = []
        for k in source.kernels:
            kinds = ("P",) * len(k.buffers) + tuple(
                "q" if v.dtype == "int64" else "i" for v in k.scalars) + ("P",) * k.checks
            fn: Any
            if k.tensor_maps:  # descriptors by value: the driver places the parameters
                fn = DriverFunction(binary.data, k.name, (TENSOR_MAP,) * len(k.tensor_maps)
                                    + kinds)
            else:
                fn = self.module.get_function(k.name)
                fn.prepare("".join(kinds))
            if k.dynamic_shared:  # more than the static 48 KB: the kernel opts in
                fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 k.dynamic_shared)
            self.functions.append(fn)


class StatusWords:
    """``n`` int32 status words on the device: cleared before the launches of a run, read after
    them (a kernel with checks ORs the STATUS_* bits of its failures into the word it is
    given)."""

    def __init__(self, n: int) -> None:
        context()
        self.n = n
        self.memory = driver().mem_alloc(4 * n)

    def address(self, k: int) -> int:
        """The device address of word ``k``, for a kernel's status parameter."""
        return int(self.memory) + 4 * k

    def clear(self) -> None:
        driver().memset_d32(self.memory, 0, self.n)

    def read(self) -> np.ndarray:
        """The words (after the launches: memcpy waits for them)."""
        words = np.empty(self.n, np.int32)
        driver().memcpy_dtoh(words, self.memory)
        return words


class Launch(NamedTuple):
    """One kernel launch with its arguments bound."""

    function: Any
    grid: tuple[int, ...]
    block: tuple[int, ...]
    values: list[Any]
    name: str
    shared: int = 0  # bytes of dynamic shared memory

    def __call__(self) -> None:
        self.function.prepared_call(self.grid, self.block, *self.values,
                                    shared_size=self.shared)

    def enqueue(self, stream: Any) -> None:
        """Queue the launch on ``stream`` (a pycuda Stream), not waiting for it."""
        self.function.prepared_async_call(self.grid, self.block, stream, *self.values,
                                          shared_size=self.shared)


class Launches(NamedTuple):
    """The launches of one call on given arguments, the (host array, device buffer) pairs to
    copy back after them, and the device buffers they use (kept alive with them)."""

    calls: list[Launch]
    copy_back: list[tuple[np.ndarray, Any]]
    keep: list[Any]


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
        self._status: StatusWords | None = None  # its own word, for calls and timing
        self._descriptors: dict[tuple[TensorMap, int], bytes] = {}  # TMA's, by address

    def __getstate__(self) -> dict[str, Any]:
        # a module travels between processes (build worker -> run worker) as source + cubin;
        # the loaded CUDA module and device buffers belong to one context and stay behind
        state = dict(self.__dict__)
        state["_loaded"] = None
        state["_workspace"] = {}
        state["_status"] = None
        state["_descriptors"] = {}
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

    @property
    def checks(self) -> bool:
        """Whether its kernels report failures to a status word (``launches(status=...)``)."""
        return self.source.checks

    def __repr__(self) -> str:
        return (f"CudaModule({self.func.name}, {self.target}, kernels={list(self.kernel_names)},"
                f" {self.binary.kind} for {self.binary.arch})")

    def _load(self) -> _Loaded:
        if self._loaded is None:
            self._loaded = _Loaded(self.source, self.binary)
        return self._loaded

    def __call__(self, *args: Any) -> None:
        """Run on ``args`` (one per parameter, in order); numpy outputs are written in place."""
        env = self.shape_env(args)  # argument errors need no GPU
        launches = self._launches(args, env, self._own_status())
        drv = driver()
        for launch in launches.calls:
            try:  # synchronize per kernel so that a fault names its kernel
                launch()
                drv.Context.synchronize()
            except drv.Error as exc:
                raise RuntimeError_(
                    f"{self.func.name}: kernel {launch.name} (grid {launch.grid}, block "
                    f"{launch.block}) failed: {exc}"
                ) from exc
        for host, dev in launches.copy_back:
            drv.memcpy_dtoh(host_bits(host), dev)
        self._check_status()

    def bind(self, *args: Any) -> Callable[[], None]:
        return lambda: self(*args)

    def time(self, *args: Any, number: int = 1, repeat: int = 3, warmup: int = 1,
             min_repeat_ms: float = 0.0) -> Timing:
        """Time all kernels of one call with CUDA events (data stays on the device)."""
        launches = self._launches(args, self.shape_env(args), self._own_status())
        drv = driver()
        start, end = drv.Event(), drv.Event()

        def run(n: int) -> float:
            start.record()
            for _ in range(n):
                for launch in launches.calls:
                    launch()
            end.record()
            end.synchronize()
            return start.time_till(end) / 1e3

        try:
            timing = time_repeats(run, number=number, repeat=repeat, warmup=warmup,
                                  min_repeat_ms=min_repeat_ms)
        except drv.Error as exc:
            raise RuntimeError_(
                f"{self.func.name}: running kernels {list(self.kernel_names)} failed: {exc}"
            ) from exc
        self._check_status()
        return timing

    def launches(self, *args: Any, status: int | None = None) -> Launches:
        """The kernels of one call bound to ``args`` (device arrays, used in place, or numpy
        arrays, copied to fresh device buffers), for callers that launch them many times. A
        module that ``checks`` needs ``status``: the device address of an int32 its kernels OR
        their failures into, which the caller clears and reads."""
        if self.checks and status is None:
            raise RuntimeError_(f"{self.func.name}: its kernels report failures to a status "
                                "word; launches() needs its address (status=)")
        return self._launches(args, self.shape_env(args), status)

    # -- status ------------------------------------------------------------------------------

    def _own_status(self) -> int | None:
        """The module's status word, cleared, for a call (None when no kernel checks)."""
        if not self.checks:
            return None
        if self._status is None:
            self._status = StatusWords(1)
        self._status.clear()
        return self._status.address(0)

    def _check_status(self) -> None:
        if self._status is not None:
            word = int(self._status.read()[0])
            if word:
                raise KernelFailure(self.func.name, word)

    # -- arguments and launches --------------------------------------------------------------

    def _launches(self, args: tuple[Any, ...], env: dict[int, int], status: int | None
                  ) -> Launches:
        loaded = self._load()
        params = self.func.params
        drv = loaded.drv
        ptrs: dict[ir.Buffer, int] = {}
        copy_back: list[tuple[np.ndarray, Any]] = []
        keep: list[Any] = []
        for buf, arg in zip(params, args):
            if isinstance(arg, np.ndarray):
                dev = drv.mem_alloc(max(arg.nbytes, 1))
                drv.memcpy_htod(dev, host_bits(arg))
                keep.append(dev)
                ptrs[buf] = int(dev)
                if buf in self.source.written:
                    copy_back.append((arg, dev))
            else:
                ptrs[buf] = _device_pointer(self.func.name, arg, buf)
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
            values: list[Any] = [self._descriptor(tm, ptrs[b]) for b, tm in info.tensor_maps]
            values += [ptrs[b] for b in info.buffers]
            values += [env[v.uid] for v in info.scalars] + [status] * info.checks
            calls.append(Launch(fn, grid, block, values, info.name, info.dynamic_shared))
        return Launches(calls, copy_back, keep)

    def _descriptor(self, tm: TensorMap, address: int) -> bytes:
        """``tm`` over the buffer at ``address``, encoded once per address."""
        key = (tm, address)
        if key not in self._descriptors:
            if len(self._descriptors) > 256:
                self._descriptors.clear()
            self._descriptors[key] = encode(tm, address)
        return self._descriptors[key]

    def shape_env(self, args: tuple[Any, ...]) -> dict[int, int]:
        """Check ``args`` against the parameters (tir/params.py; no GPU needed) and bind the
        shape variables: {variable uid: size}."""
        params = self.func.params
        env = bind_params(self.func.name, params, [_shape_dtype(arg) for arg in args])
        for buf, arg in zip(params, args):
            if isinstance(arg, np.ndarray):
                check_array(self.func.name, buf, arg, buf in self.source.written)
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
        shared = fn.get_attribute(drv.function_attribute.SHARED_SIZE_BYTES) + info.dynamic_shared
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


class CudaMemory:
    """Device arrays for measurement (targets/backend.py's DeviceMemory), through pycuda."""

    def __init__(self) -> None:
        self._flush: Any = None

    def to_device(self, arr: np.ndarray) -> Any:
        context()  # RuntimeError_ with an install hint when pycuda or the GPU is missing
        import pycuda.gpuarray as gpuarray

        bits = host_bits(arr)
        d = gpuarray.to_gpu(bits)
        # bfloat16 travels as its bits (pycuda's view() fails on a 0-d array: none needed)
        return d if bits.dtype == arr.dtype else d.view(arr.dtype)

    def to_host(self, arg: Any) -> np.ndarray:
        if isinstance(arg, np.ndarray):
            return arg
        if arg.dtype.name in dt.STORAGE_TYPES:  # copied as its bits (dtypes.host_bits)
            return arg.view(np.uint16).get().view(arg.dtype)
        return arg.get()

    def flush_caches(self, nbytes: int) -> None:
        drv = driver()
        if self._flush is None:
            self._flush = drv.mem_alloc(nbytes)
        drv.memset_d32(self._flush, 0x3F800000, nbytes // 4)
        drv.Context.synchronize()

    def is_device_error(self, exc: Exception) -> bool:
        try:
            import pycuda.driver as drv
        except ImportError:
            return False
        return isinstance(exc, drv.Error)


def _shape_dtype(arg: Any) -> tuple[tuple[int, ...] | None, Any]:
    if isinstance(arg, np.ndarray):
        return arg.shape, arg.dtype
    if hasattr(arg, "gpudata") and hasattr(arg, "dtype"):  # pycuda's: bfloat16's typestr is V2
        return tuple(arg.shape), np.dtype(arg.dtype)
    cai = getattr(arg, "__cuda_array_interface__", None)
    if cai is not None:
        return tuple(cai["shape"]), np.dtype(cai["typestr"])
    return None, None


def _device_pointer(func_name: str, arg: Any, buf: ir.Buffer) -> int:
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
                raise mismatch(func_name, buf, "a C-contiguous array", f"strides {tuple(strides)}")
        return int(cai["data"][0])
    if hasattr(arg, "gpudata"):
        return int(arg.gpudata)
    try:
        return int(arg)  # a pycuda DeviceAllocation or a raw device pointer
    except TypeError:
        raise mismatch(func_name, buf, "a numpy array, a pycuda DeviceAllocation or GPUArray, or an "
                       "object with __cuda_array_interface__", f"a {type(arg).__name__}") from None


def _nbytes(buf: ir.Buffer, env: dict[int, int]) -> int:
    n = 1
    for d in buf.shape:
        n *= eval_int(d, env)
    return n * buf.itemsize
