"""The GPU executor's plumbing (device buffers from the memory plan, constants uploaded once,
inputs in and outputs out once per run, the status words of kernels with checks, the launches
recorded as a CUDA graph and replayed) on a fake driver whose "device memory" is host memory
and whose kernels are the CPU builds of the same tasks, or their CUDA C run on the host; the
real thing runs in tests/models/test_models.py's and tests/graph/test_gather_checks.py's gpu
tests, and in this file's."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

import autosched as aus
from autosched.errors import RuntimeError_
from autosched.targets.cuda.runtime import Launch, Launches
from autosched.targets.status import KernelFailure
from autosched.targets.target import parse
from autosched.testing.models import Builder, ort_run
from importers.onnx import from_onnx
from tests.graph.test_gather_checks import HOST_SKIP, LOOKUP_FAILED, N, _model


class _FakeGraphs:
    """The driver's graph functions (targets/cuda/graphs.py's GraphDriver): a stream that
    records keeps its launches (arguments as they were queued), a graph launch makes them."""

    def __init__(self, clock: Callable[[], float], works: bool = True) -> None:
        self.works, self.clock = works, clock
        self.stamps: dict[int, float] = {}  # event: the clock when last recorded
        self.recording: dict[int, list] = {}
        self.graphs: dict[int, list] = {}
        self.ids = itertools.count(1)
        self.recorded = self.launches = self.created_events = 0

    def begin_capture(self, stream: int) -> None:
        if not self.works:
            raise RuntimeError_("cuStreamBeginCapture_v2 failed: CUDA_ERROR_NOT_SUPPORTED")
        self.recording[stream] = []

    def end_capture(self, stream: int) -> int:
        graph = next(self.ids)
        self.graphs[graph] = self.recording.pop(stream)
        self.recorded += 1
        return graph

    def instantiate(self, graph: int) -> int:
        exec_ = next(self.ids)
        self.graphs[exec_] = list(self.graphs[graph])
        return exec_

    def launch(self, exec_: int, stream: int) -> None:
        assert stream not in self.recording
        self.launches += 1
        for fn, grid, block, values in self.graphs[exec_]:
            if block is None:  # an event recorded with the launches
                self.stamps[fn] = self.clock()
            else:
                fn.run(grid, block, *values)

    def destroy_exec(self, exec_: int) -> None:
        del self.graphs[exec_]

    def create_event(self) -> int:
        event = next(self.ids)
        self.stamps[event] = 0.0
        self.created_events += 1
        return event

    def record_event(self, event: int, stream: int) -> None:
        if stream in self.recording:
            self.recording[stream].append((event, None, None, None))
        else:
            self.stamps[event] = self.clock()

    def synchronize_event(self, event: int) -> None:
        assert event in self.stamps

    def elapsed(self, start: int, end: int) -> float:
        return self.stamps[end] - self.stamps[start]

    def destroy_event(self, event: int) -> None:
        del self.stamps[event]

    def destroy_graph(self, graph: int) -> None:
        del self.graphs[graph]


class _FakeDriver:
    class Error(Exception):
        pass

    def __init__(self, graphs: bool = True) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.ids = itertools.count(1 << 32, 1 << 32)  # allocations never reach the next one
        self.copies_in = self.copies_out = 0
        self.graphs = _FakeGraphs(lambda: self.clock, graphs)
        self.direct_launches = 0
        self.clock = 0.0  # seconds of fake kernel runs
        drv = self

        class Stream:
            def __init__(self, flags: int = 0) -> None:
                assert flags == 1  # non-blocking: the legacy stream cannot record
                self.handle = next(drv.ids)

        class Context:
            @staticmethod
            def synchronize() -> None:
                pass

        class Event:
            """Stamped with the driver's clock, which each kernel run advances."""

            t = 0.0

            def record(self, stream: object = None) -> None:
                assert stream is None  # on the legacy stream, never inside a recording
                self.t = drv.clock

            def synchronize(self) -> None:
                pass

            def time_till(self, other: Event) -> float:
                return (other.t - self.t) * 1e3

        self.Context, self.Event, self.Stream = Context, Event, Stream
        self._drv = drv

    def mem_alloc(self, n: int) -> int:
        ptr = next(self.ids)
        self.memory[ptr] = np.zeros(n, np.uint8)
        return ptr

    def at(self, address: int, n: int) -> np.ndarray:
        """The ``n`` bytes at ``address``, inside one allocation (an address into one, as
        values of a workspace have, is as good as its start)."""
        offset = int(address) % (1 << 32)
        mem = self.memory[int(address) - offset]
        assert offset + n <= len(mem), f"{n} bytes at {offset} overrun a {len(mem)}-byte buffer"
        return mem[offset: offset + n]

    def memcpy_htod(self, dev: int, host: np.ndarray) -> None:
        self.copies_in += 1
        self.at(dev, host.nbytes)[:] = np.frombuffer(host.tobytes(), np.uint8)

    def memcpy_dtoh(self, host: np.ndarray, dev: int) -> None:
        self.copies_out += 1
        host.view(np.uint8).reshape(-1)[:] = self.at(dev, host.nbytes)

    def memset_d32(self, dev: int, value: int, count: int) -> None:
        self.at(dev, 4 * count).view(np.int32)[:] = value

    def word(self, address: int) -> np.ndarray:
        """The int32 at ``address``."""
        return self.at(address, 4).view(np.int32)


class _FakeFn:
    """The whole module as one launch; a failure it reports is ORed into the status word
    passed after the arrays, as a kernel with checks does."""

    def __init__(self, drv: _FakeDriver, host_module: object, task: object) -> None:
        self.drv, self.mod, self.task = drv, host_module, task
        self.seconds = 1e-6  # what a run adds to the driver's clock

    def prepared_async_call(self, grid: tuple, block: tuple, stream: object, *ptrs: int,
                            shared_size: int = 0) -> None:
        recording = self.drv.graphs.recording.get(getattr(stream, "handle", None))
        if recording is None:
            self.prepared_call(grid, block, *ptrs, shared_size=shared_size)
        else:  # the values now: a graph keeps them
            recording.append((self, grid, block, list(ptrs)))

    def prepared_call(self, grid: tuple, block: tuple, *ptrs: int, shared_size: int = 0
                      ) -> None:
        assert shared_size == 0, "these kernels declare their shared memory statically"
        self.drv.direct_launches += 1
        self.run(grid, block, *ptrs)

    def run(self, grid: tuple, block: tuple, *ptrs: int) -> None:
        arrays = []
        for p, t in zip(ptrs, self.task.args):
            shape = [int(d) for d in t.shape]
            n = int(np.prod(shape)) * np.dtype(t.dtype).itemsize
            arrays.append(self.drv.at(p, n).view(t.dtype).reshape(shape))
        self.drv.clock += self.seconds
        try:
            self.mod(*arrays)
        except KernelFailure as exc:
            (status,) = ptrs[len(self.task.args):]
            self.drv.word(status)[0] |= exc.status


class _FakeModule:
    def __init__(self, drv: _FakeDriver, host_module: object, task: object,
                 checks: bool = False) -> None:
        self.fn = _FakeFn(drv, host_module, task)
        self.checks = checks

    def launches(self, *args: object, status: int | None = None) -> Launches:
        values = [int(a) for a in args] + ([status] if self.checks else [])
        return Launches([Launch(self.fn, (1, 1, 1), (1, 1, 1), values, "k")], [], [])


def _fake_gpu_model(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator,
                    graphs: bool = True) -> tuple[object, object, object, _FakeDriver]:
    """A small CNN's CudaModel on the fake driver (``graphs``: whether it can record), with
    its ONNX model and CPU build."""
    from autosched.graph.executor_cuda import CudaModel
    from autosched.targets.cuda import runtime as rt

    b = Builder(int(rng.integers(1 << 30)))
    y = b.conv_bn("x", 3, 8, 3)
    h = b.conv_bn(y, 8, 8, 3, act=None)
    y = b.op("Relu", [b.op("Add", [h, y])])
    y = b.op("GlobalAveragePool", [b.conv_bn(y, 8, 8, 3)])
    y = b.op("Flatten", [y], axis=1)  # the output is a view of the pool's buffer
    proto = b.model(("x", (1, 3, 10, 9)), y, "fake_gpu")
    graph = from_onnx(proto)
    cpu = aus.compile(graph, "llvm")
    drv = _FakeDriver(graphs)
    monkeypatch.setattr(rt, "driver", lambda: drv)
    monkeypatch.setattr(rt, "context", lambda: None)
    kernels = [type(k)(k.group, k.task, k.args, _FakeModule(drv, k.module, k.task))
               for k in cpu.kernels]
    assert cpu.aliases
    return CudaModel(cpu.graph, kernels, parse("cuda"), cpu.constants, cpu.aliases), proto, \
        cpu, drv


def test_cuda_model_keeps_intermediates_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng()
    model, proto, cpu, drv = _fake_gpu_model(monkeypatch, rng)
    kernels = model.kernels
    uploads = drv.copies_in
    assert uploads == sum(1 for c in cpu.constants if any(c in k.args for k in kernels))
    x = {"x": rng.standard_normal((1, 3, 10, 9)).astype(np.float32)}
    (out,) = model.run(x)
    # one copy in per input and one copy out per output, whatever the number of kernels (and
    # no status word to read: no kernel checks anything)
    assert (drv.copies_in - uploads, drv.copies_out) == (1, 1)
    np.testing.assert_allclose(out, cpu.run(x)[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    assert model.time(x, repeat=3) == pytest.approx(sum(k.module.fn.seconds for k in kernels))
    # the memory plan shares device buffers between values whose lifetimes do not overlap
    assert len(set(model.storage.values())) < len(model.storage)
    with pytest.raises(aus.ModelImportError, match="must be float32"):
        model.run({"x": x["x"].astype(np.float16)})


def test_cuda_model_replays_its_launches_as_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded at the first run, replayed after it: each replay reads the inputs copied in
    for it (the graph is bound to the buffers, not to a copy of their contents); time() can
    launch each kernel instead."""
    rng = np.random.default_rng()
    model, proto, cpu, drv = _fake_gpu_model(monkeypatch, rng)
    assert "recorded as one CUDA graph at the first run" in model.summary()
    xs = [{"x": rng.standard_normal((1, 3, 10, 9)).astype(np.float32)} for _ in range(3)]
    outs = [model.run(x)[0] for x in xs]
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out, cpu.run(x)[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    assert (drv.graphs.recorded, drv.graphs.launches, drv.direct_launches) == (1, 3, 0)
    assert "replayed as one CUDA graph" in model.summary() and model.graph_failure is None
    model.time(xs[0], repeat=4, warmup=1)
    assert (drv.graphs.launches, drv.direct_launches) == (8, 0)
    model.time(xs[0], repeat=4, warmup=1, graphs=False)
    assert (drv.graphs.launches, drv.direct_launches) == (8, 5 * len(model.kernels))
    np.testing.assert_allclose(model.run(xs[1])[0], outs[1], rtol=0, atol=0)


def test_cuda_model_without_graphs_launches_each_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that cannot record: runs launch each kernel, with the same outputs, and the
    summary says why."""
    rng = np.random.default_rng()
    model, proto, cpu, drv = _fake_gpu_model(monkeypatch, rng, graphs=False)
    for _ in range(2):
        x = {"x": rng.standard_normal((1, 3, 10, 9)).astype(np.float32)}
        np.testing.assert_allclose(model.run(x)[0], ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    assert (drv.graphs.recorded, drv.direct_launches) == (0, 2 * len(model.kernels))
    assert "launched one by one (cuStreamBeginCapture_v2 failed" in model.summary()


@pytest.mark.parametrize("graphs", [True, False])
def test_kernel_seconds_times_each_kernel_in_place(monkeypatch: pytest.MonkeyPatch,
                                                   graphs: bool) -> None:
    """Each kernel's time between the events around it, over a replayed recording of the run
    (or, where the driver cannot record, launched one by one); other modules of the same tasks
    run in their place, and the model's own launches are untouched."""
    rng = np.random.default_rng()
    model, proto, cpu, drv = _fake_gpu_model(monkeypatch, rng, graphs=graphs)
    n = len(model.kernels)
    want = rng.uniform(1e-6, 1e-4, n)
    for k, s in zip(model.kernels, want):
        k.module.fn.seconds = s
    x = {"x": rng.standard_normal((1, 3, 10, 9)).astype(np.float32)}
    np.testing.assert_allclose(model.kernel_seconds(x, repeat=3), want, rtol=1e-9)
    others = [_FakeModule(drv, k.module.fn.mod, k.task) for k in model.kernels]
    for m in others:
        m.fn.seconds = 7e-6
    np.testing.assert_allclose(model.kernel_seconds(x, repeat=3, modules=others), 7e-6,
                               rtol=1e-9)
    with pytest.raises(ValueError, match="modules for"):
        model.kernel_seconds(x, modules=others[1:])
    # the whole run between two events, kernels back to back
    events = drv.graphs.created_events
    assert model.run_seconds(x, repeat=3) == pytest.approx(want.sum(), rel=1e-9)
    assert model.run_seconds(x, repeat=3, modules=others) == pytest.approx(7e-6 * n, rel=1e-9)
    assert drv.graphs.created_events - events == 2 * 2  # two a run_seconds call
    assert drv.graphs.recorded == (4 if graphs else 0)
    assert drv.direct_launches == (0 if graphs else 4 * 4 * n)
    np.testing.assert_allclose(model.run(x)[0], ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(HOST_SKIP is not None, reason=str(HOST_SKIP))
def test_cuda_model_names_the_node_whose_index_check_failed(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The CUDA C of a Gather model run on the host behind the fake driver: its task gets a
    status word, cleared before each run and read after it; an index out of range raises one
    line naming the task and the node, and the next run is clean."""
    from autosched.graph.executor_cuda import CudaModel
    from autosched.targets.cuda import runtime as rt

    rng = np.random.default_rng()
    proto = _model("Gather", rng.uniform(-1, 1, (N, 5)).astype("float32"), (4, 6), 0, True)
    host = aus.compile(from_onnx(proto), "cuda -emulate=host")
    drv = _FakeDriver()
    monkeypatch.setattr(rt, "driver", lambda: drv)
    monkeypatch.setattr(rt, "context", lambda: None)
    kernels = [type(k)(k.group, k.task, k.args,
                       _FakeModule(drv, k.module, k.task, k.module.module.checks))
               for k in host.kernels]
    assert [k.module.checks for k in kernels] == [True]
    model = CudaModel(host.graph, kernels, parse("cuda"), host.constants, host.aliases)
    ids = rng.integers(-N - 1, N - 1, (4, 6)).astype(np.int64)  # the model adds 1
    (out,) = model.run({"ids": ids})
    np.testing.assert_array_equal(out, ort_run(proto, {"ids": ids})[0])
    bad = ids.copy()
    bad[2, 3] = N - 1
    for _ in range(2):  # a failure does not stick to the status word
        with pytest.raises(RuntimeError_, match=LOOKUP_FAILED):
            model.run({"ids": bad})
        np.testing.assert_array_equal(model.run({"ids": ids})[0], out)
    with pytest.raises(RuntimeError_, match=LOOKUP_FAILED):
        model.time({"ids": bad}, repeat=1, warmup=0)


@pytest.mark.gpu
def test_on_the_gpu_the_replayed_graph_matches_onnxruntime_run_after_run() -> None:
    """The real driver records the launches queued through pycuda and replays them: two runs
    on different inputs give different outputs, each onnxruntime's; the same with the launches
    one by one, and timing both ways works."""
    from autosched.testing.models import small_cnn

    rng = np.random.default_rng()
    proto = small_cnn(image=20)
    graph = from_onnx(proto)
    model = aus.compile(graph, target="cuda")
    xs = [{v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype) for v in graph.inputs}
          for _ in range(2)]
    outs = [model.run(x)[0] for x in xs]
    assert model.graph_failure is None, model.graph_failure
    assert "replayed as one CUDA graph" in model.summary()
    assert not np.allclose(outs[0], outs[1])
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    replayed, launched = model.time(xs[0], repeat=5), model.time(xs[0], repeat=5, graphs=False)
    assert replayed > 0 and launched > 0
    np.testing.assert_allclose(model.run(xs[1])[0], outs[1], rtol=0, atol=0)
