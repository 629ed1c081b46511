"""targets/cuda/graphs.py without a GPU: the driver's graph functions called through ctypes
(here on a stand-in library), their errors, and a recording that always ends; the GPU executor's
use of them is tested in tests/graph/test_graph_executor_cuda.py."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from autosched.errors import RuntimeError_
from autosched.targets.cuda import graphs


class _Lib:
    """libcuda.so.1's graph functions as Python callables, each returning ``codes[name]``."""

    def __init__(self, codes: dict[str, int]) -> None:
        self.calls: list[str] = []
        for name in graphs.SIGNATURES:
            setattr(self, name, self._function(name, codes.get(name, 0)))

    def _function(self, name: str, code: int) -> Any:
        def call(*args: Any) -> int:
            self.calls.append(name)
            if name == "cuGetErrorName":
                args[1]._obj.value = b"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
            elif name in ("cuStreamEndCapture", "cuGraphInstantiateWithFlags"):
                handle = args[1] if name == "cuStreamEndCapture" else args[0]
                handle._obj.value = 77
            return code

        return call


class _Stream:
    handle = 5

    def __init__(self, flags: int) -> None:
        assert flags == graphs.STREAM_NON_BLOCKING


class _Drv:
    Stream = _Stream


def test_a_recording_becomes_an_executable_graph_and_the_recorded_one_goes() -> None:
    lib = _Lib({})
    api = graphs.GraphDriver(lib)
    queued = []
    graph = graphs.record(_Drv, queued.append, api)
    assert [type(s) for s in queued] == [_Stream] and graph.exec == 77
    graph.launch()
    graph.close()
    graph.close()  # once only
    assert lib.calls == ["cuStreamBeginCapture_v2", "cuStreamEndCapture",
                         "cuGraphInstantiateWithFlags", "cuGraphDestroy", "cuGraphLaunch",
                         "cuGraphExecDestroy"]


def test_a_failing_call_names_itself_and_the_driver_error() -> None:
    api = graphs.GraphDriver(_Lib({"cuStreamEndCapture": 901}))
    with pytest.raises(RuntimeError_, match="^cuStreamEndCapture failed: "
                                            "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED$"):
        graphs.record(_Drv, lambda stream: None, api)


def test_an_error_while_queueing_ends_the_recording_and_is_the_one_raised() -> None:
    lib = _Lib({"cuGraphDestroy": 400})
    def fail(stream: object) -> None:
        raise ValueError("bad launch")

    with pytest.raises(ValueError, match="bad launch"):
        graphs.record(_Drv, fail, graphs.GraphDriver(lib))
    assert lib.calls[:3] == ["cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphDestroy"]


def test_a_driver_without_graph_functions_is_one_line() -> None:
    lib = _Lib({})
    del lib.cuGraphInstantiateWithFlags
    with pytest.raises(AttributeError):
        graphs.GraphDriver(lib)
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        graphs.graph_driver.cache_clear()
        with pytest.raises(RuntimeError_, match="CUDA graphs need libcuda.so.1 from CUDA 11.4"):
            graphs.graph_driver()
