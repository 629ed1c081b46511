"""The GPU executor's plumbing (device buffers from the memory plan, constants uploaded once,
inputs in and outputs out once per run, the status words of kernels with checks) on a fake
driver whose "device memory" is host memory and whose kernels are the CPU builds of the same
tasks, or their CUDA C run on the host; the real thing runs in tests/models/test_models.py's
and tests/graph/test_gather_checks.py's gpu tests."""

from __future__ import annotations

import itertools

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


class _FakeDriver:
    class Error(Exception):
        pass

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.ids = itertools.count(4096, 4096)
        self.copies_in = self.copies_out = 0
        drv = self

        class Context:
            @staticmethod
            def synchronize() -> None:
                pass

        class Event:
            def record(self) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def time_till(self, other: object) -> float:
                return 1.0

        self.Context, self.Event = Context, Event
        self._drv = drv

    def mem_alloc(self, n: int) -> int:
        ptr = next(self.ids)
        self.memory[ptr] = np.zeros(n, np.uint8)
        return ptr

    def memcpy_htod(self, dev: int, host: np.ndarray) -> None:
        self.copies_in += 1
        self.memory[int(dev)][: host.nbytes] = np.frombuffer(host.tobytes(), np.uint8)

    def memcpy_dtoh(self, host: np.ndarray, dev: int) -> None:
        self.copies_out += 1
        host.view(np.uint8).reshape(-1)[:] = self.memory[int(dev)][: host.nbytes]

    def memset_d32(self, dev: int, value: int, count: int) -> None:
        self.memory[int(dev)][: 4 * count].view(np.int32)[:] = value

    def word(self, address: int) -> np.ndarray:
        """The int32 at ``address`` (inside an allocation: they start 4096 bytes apart)."""
        offset = address % 4096
        return self.memory[address - offset][offset: offset + 4].view(np.int32)


class _FakeFn:
    """The whole module as one launch; a failure it reports is ORed into the status word
    passed after the arrays, as a kernel with checks does."""

    def __init__(self, drv: _FakeDriver, host_module: object, task: object) -> None:
        self.drv, self.mod, self.task = drv, host_module, task

    def prepared_call(self, grid: tuple, block: tuple, *ptrs: int) -> None:
        arrays = []
        for p, t in zip(ptrs, self.task.args):
            shape = [int(d) for d in t.shape]
            n = int(np.prod(shape)) * np.dtype(t.dtype).itemsize
            arrays.append(self.drv.memory[p][:n].view(t.dtype).reshape(shape))
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


def test_cuda_model_keeps_intermediates_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from autosched.graph.executor_cuda import CudaModel
    from autosched.targets.cuda import runtime as rt

    rng = np.random.default_rng()
    b = Builder(int(rng.integers(1 << 30)))
    y = b.conv_bn("x", 3, 8, 3)
    h = b.conv_bn(y, 8, 8, 3, act=None)
    y = b.op("Relu", [b.op("Add", [h, y])])
    y = b.op("GlobalAveragePool", [b.conv_bn(y, 8, 8, 3)])
    y = b.op("Flatten", [y], axis=1)  # the output is a view of the pool's buffer
    proto = b.model(("x", (1, 3, 10, 9)), y, "fake_gpu")
    graph = from_onnx(proto)
    cpu = aus.compile(graph, "llvm")

    drv = _FakeDriver()
    monkeypatch.setattr(rt, "driver", lambda: drv)
    monkeypatch.setattr(rt, "context", lambda: None)
    kernels = [type(k)(k.group, k.task, k.args, _FakeModule(drv, k.module, k.task))
               for k in cpu.kernels]
    assert cpu.aliases
    model = CudaModel(cpu.graph, kernels, parse("cuda"), cpu.constants, cpu.aliases)
    uploads = drv.copies_in
    assert uploads == sum(1 for c in cpu.constants if any(c in k.args for k in kernels))
    x = {"x": rng.standard_normal((1, 3, 10, 9)).astype(np.float32)}
    (out,) = model.run(x)
    # one copy in per input and one copy out per output, whatever the number of kernels (and
    # no status word to read: no kernel checks anything)
    assert (drv.copies_in - uploads, drv.copies_out) == (1, 1)
    np.testing.assert_allclose(out, cpu.run(x)[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    assert model.time(x, repeat=3) == pytest.approx(1e-3)
    # the memory plan shares device buffers between values whose lifetimes do not overlap
    assert len(set(model.storage.values())) < len(model.storage)
    with pytest.raises(aus.ModelImportError, match="must be float32"):
        model.run({"x": x["x"].astype(np.float16)})


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
