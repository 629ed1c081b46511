"""CUDA graphs for launches queued through pycuda, which has no graph API: the driver's
stream capture, instantiation and graph launch called through ctypes on ``libcuda.so.1`` (the
library pycuda itself runs on, so the handles are the same).

``record(drv, enqueue)`` creates a non-blocking stream, records on it whatever ``enqueue(stream)``
queues there (pycuda's ``prepared_async_call`` on that stream), and returns a ``Graph`` whose
``launch(stream)`` replays it with one driver call. Recording only records: nothing runs until
the first launch, and the kernels' arguments are the values they had when queued. The legacy
default stream cannot record; a non-blocking one is used so that work other threads queue on
the legacy stream meanwhile does not break the recording, and the graph is launched on any
stream, the legacy one included (handle 0).

Example::

    graph = record(drv, lambda stream: [launch.enqueue(stream) for launch in launches])
    graph.launch()                 # on the legacy default stream, ordered with pycuda's copies
    drv.Context.synchronize()
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable
from typing import Any

from autosched.errors import RuntimeError_

STREAM_NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
CAPTURE_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: other threads' calls are free
SIGNATURES = {  # symbol in libcuda.so.1: its argument types (CUDA 11.4)
    "cuStreamBeginCapture_v2": (ctypes.c_void_p, ctypes.c_int),
    "cuStreamEndCapture": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)),
    "cuGraphInstantiateWithFlags": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                    ctypes.c_ulonglong),
    "cuGraphLaunch": (ctypes.c_void_p, ctypes.c_void_p),
    "cuGraphExecDestroy": (ctypes.c_void_p,),
    "cuGraphDestroy": (ctypes.c_void_p,),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuEventCreate": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint),
    "cuEventRecordWithFlags": (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint),
    "cuEventSynchronize": (ctypes.c_void_p,),
    "cuEventElapsedTime": (ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p),
    "cuEventDestroy_v2": (ctypes.c_void_p,),
}
EVENT_RECORD_EXTERNAL = 1  # CU_EVENT_RECORD_EXTERNAL: recorded into a graph as an event node


class GraphDriver:
    """The driver's graph functions; each call raises RuntimeError_ naming the call and the
    driver's error."""

    def __init__(self, lib: Any) -> None:
        self._functions = {}
        for name, argtypes in SIGNATURES.items():
            fn = getattr(lib, name)  # AttributeError: a driver before CUDA 11.4
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            self._functions[name] = fn

    def _call(self, name: str, *args: Any) -> None:
        code = self._functions[name](*args)
        if code:
            text = ctypes.c_char_p()
            self._functions["cuGetErrorName"](code, ctypes.byref(text))
            raise RuntimeError_(f"{name} failed: "
                                f"{(text.value or b'CUDA error %d' % code).decode()}")

    def begin_capture(self, stream: int) -> None:
        self._call("cuStreamBeginCapture_v2", stream, CAPTURE_THREAD_LOCAL)

    def end_capture(self, stream: int) -> int:
        graph = ctypes.c_void_p()
        self._call("cuStreamEndCapture", stream, ctypes.byref(graph))
        return graph.value or 0

    def instantiate(self, graph: int) -> int:
        exec_ = ctypes.c_void_p()
        self._call("cuGraphInstantiateWithFlags", ctypes.byref(exec_), graph, 0)
        return exec_.value or 0

    def launch(self, exec_: int, stream: int) -> None:
        self._call("cuGraphLaunch", exec_, stream)

    def destroy_exec(self, exec_: int) -> None:
        self._call("cuGraphExecDestroy", exec_)

    def destroy_graph(self, graph: int) -> None:
        self._call("cuGraphDestroy", graph)

    # events that a recording keeps (pycuda's are recorded without flags: inside a recording
    # they only order streams, and waiting on them afterwards is an error)

    def create_event(self) -> int:
        event = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(event), 0)
        return event.value or 0

    def record_event(self, event: int, stream: int) -> None:
        """Record ``event`` on ``stream``; while the stream records, as a node of the graph
        whose every replay records it."""
        self._call("cuEventRecordWithFlags", event, stream, EVENT_RECORD_EXTERNAL)

    def synchronize_event(self, event: int) -> None:
        self._call("cuEventSynchronize", event)

    def elapsed(self, start: int, end: int) -> float:
        """Seconds between two recorded events."""
        ms = ctypes.c_float()
        self._call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value / 1e3

    def destroy_event(self, event: int) -> None:
        self._call("cuEventDestroy_v2", event)


@functools.cache
def graph_driver() -> GraphDriver:
    """The driver's graph functions (RuntimeError_ when libcuda.so.1 is missing or too old)."""
    try:
        return GraphDriver(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError) as exc:
        raise RuntimeError_(f"CUDA graphs need libcuda.so.1 from CUDA 11.4 or newer: {exc}"
                            ) from None


class Graph:
    """An executable graph: ``launch(stream)`` replays what was recorded; ``close`` frees it
    (with its context current)."""

    def __init__(self, api: Any, exec_: int) -> None:
        self.api = api
        self.exec = exec_

    def launch(self, stream: int = 0) -> None:
        self.api.launch(self.exec, stream)

    def close(self) -> None:
        if self.exec:
            exec_, self.exec = self.exec, 0
            self.api.destroy_exec(exec_)


def record(drv: Any, enqueue: Callable[[Any], None], api: Any = None) -> Graph:
    """What ``enqueue(stream)`` queues on a fresh non-blocking pycuda stream, as a Graph
    (``api``: the graph functions, graph_driver's by default). The recording is ended whatever
    ``enqueue`` raises, so the stream is never left recording."""
    api = api or graph_driver()
    stream = drv.Stream(flags=STREAM_NON_BLOCKING)
    api.begin_capture(stream.handle)
    try:
        enqueue(stream)
    except BaseException:
        with contextlib.suppress(RuntimeError_):  # the first error says what went wrong
            api.destroy_graph(api.end_capture(stream.handle))
        raise
    recorded = api.end_capture(stream.handle)
    try:
        return Graph(api, api.instantiate(recorded))
    finally:
        api.destroy_graph(recorded)
