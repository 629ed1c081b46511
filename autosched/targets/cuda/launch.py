"""Kernels launched through the driver's array of parameter pointers (``cuLaunchKernel``'s
``kernelParams``), by ctypes on ``libcuda.so.1``: the kernels that take TMA descriptors
(tma.py) by value.

pycuda passes a kernel's parameters as one packed buffer (``CU_LAUNCH_PARAM_BUFFER_POINTER``),
laid out from offset 0 by their natural alignment. A descriptor is a 64-byte aligned parameter,
and the compiler aligns it in the constant bank itself (on sm_90, 48 bytes past the start of
the parameters), so only the driver knows where it and the parameters after it go: given a
pointer per parameter, it places each one. ``DriverFunction`` does that and otherwise looks
like the pycuda ``Function`` runtime.py prepares (``prepared_call``, ``prepared_async_call``,
``get_attribute``, ``set_attribute``), in the current context (pycuda's).

Example::

    fn = DriverFunction(cubin, "matmul_kernel0", ("tensor_map", "P", "P", "P"))
    fn.prepared_call((32, 32, 1), (256, 1, 1), descriptor, a_ptr, b_ptr, c_ptr,
                     shared_size=200_000)
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from autosched.errors import RuntimeError_
from autosched.targets.cuda.tma import DESCRIPTOR_BYTES

TENSOR_MAP = "tensor_map"  # a parameter kind: a descriptor's bytes
_CTYPES = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "q": ctypes.c_int64}
_SIGNATURES = {
    "cuModuleLoadData": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p),
    "cuModuleUnload": (ctypes.c_void_p,),
    "cuModuleGetFunction": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p),
    "cuFuncGetAttribute": (ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p),
    "cuFuncSetAttribute": (ctypes.c_void_p, ctypes.c_int, ctypes.c_int),
    "cuLaunchKernel": (ctypes.c_void_p, *(ctypes.c_uint,) * 7, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
}


def driver_functions(signatures: dict[str, tuple[Any, ...]], need: str) -> dict[str, Any]:
    """The functions of ``libcuda.so.1`` named in ``signatures`` (their argument types; each
    returns a CUresult); RuntimeError_ starting with ``need`` when the library or one of them
    is missing."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        out = {}
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            out[name] = fn
    except (OSError, AttributeError) as exc:
        raise RuntimeError_(f"{need}: {exc}") from None
    return out


@functools.cache
def _driver() -> dict[str, Any]:
    return driver_functions(_SIGNATURES, "launching a kernel that takes TMA descriptors needs "
                                         "libcuda.so.1")


def _check(call: str, code: int, what: str) -> None:
    if code:
        name = ctypes.c_char_p()
        _driver()["cuGetErrorName"](code, ctypes.byref(name))
        raise RuntimeError_(f"{what}: {call} failed: "
                            f"{(name.value or b'CUDA error %d' % code).decode()}")


class DriverFunction:
    """Kernel ``name`` of the cubin ``image``, loaded into the current context; ``kinds`` says
    what each parameter is: TENSOR_MAP (128 bytes), "P" (a pointer), "i" / "q" (int32 /
    int64)."""

    def __init__(self, image: bytes, name: str, kinds: tuple[str, ...]) -> None:
        cu = _driver()
        self.name, self.kinds = name, kinds
        self._image = ctypes.create_string_buffer(image)  # the driver reads it while loading
        self._module = ctypes.c_void_p()
        _check("cuModuleLoadData", cu["cuModuleLoadData"](ctypes.byref(self._module),
                                                          self._image), f"kernel {name}")
        self._fn = ctypes.c_void_p()
        _check("cuModuleGetFunction", cu["cuModuleGetFunction"](
            ctypes.byref(self._fn), self._module, name.encode()), f"kernel {name}")

    def __del__(self) -> None:
        module = getattr(self, "_module", None)
        if module is not None and module.value:
            try:
                _driver()["cuModuleUnload"](module)
            except Exception:  # the interpreter is exiting; a dead context is nothing to report
                pass

    def get_attribute(self, attribute: Any) -> int:
        value = ctypes.c_int()
        _check("cuFuncGetAttribute", _driver()["cuFuncGetAttribute"](
            ctypes.byref(value), int(attribute), self._fn), f"kernel {self.name}")
        return value.value

    def set_attribute(self, attribute: Any, value: int) -> None:
        _check("cuFuncSetAttribute", _driver()["cuFuncSetAttribute"](
            self._fn, int(attribute), int(value)), f"kernel {self.name}")

    def prepared_call(self, grid: tuple[int, ...], block: tuple[int, ...], *values: Any,
                      shared_size: int = 0) -> None:
        self._launch(grid, block, shared_size, None, values)

    def prepared_async_call(self, grid: tuple[int, ...], block: tuple[int, ...], stream: Any,
                            *values: Any, shared_size: int = 0) -> None:
        self._launch(grid, block, shared_size, stream.handle if stream is not None else None,
                     values)

    def _launch(self, grid: tuple[int, ...], block: tuple[int, ...], shared: int,
                stream: int | None, values: tuple[Any, ...]) -> None:
        if len(values) != len(self.kinds):
            raise RuntimeError_(f"kernel {self.name} takes {len(self.kinds)} parameters; "
                                f"{len(values)} were given")
        held: list[Any] = []  # what the pointers point to, alive until the launch returns
        pointers = (ctypes.c_void_p * max(len(values), 1))()
        for j, (kind, value) in enumerate(zip(self.kinds, values)):
            if kind == TENSOR_MAP:
                raw = ctypes.create_string_buffer(DESCRIPTOR_BYTES + 64)
                at = ctypes.addressof(raw) + (-ctypes.addressof(raw) % 64)
                ctypes.memmove(at, bytes(value), DESCRIPTOR_BYTES)
                held.append(raw)
                pointers[j] = at
            else:
                cell = _CTYPES[kind](int(value))
                held.append(cell)
                pointers[j] = ctypes.addressof(cell)
        g = (tuple(grid) + (1, 1))[:3]
        b = (tuple(block) + (1, 1))[:3]
        _check("cuLaunchKernel", _driver()["cuLaunchKernel"](
            self._fn, *g, *b, shared, stream, pointers, None), f"kernel {self.name}")
