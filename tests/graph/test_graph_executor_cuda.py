"""The GPU executor's plumbing (device buffers from the memory plan, constants uploaded once,
inputs in and outputs out once per run) on a fake driver whose "device memory" is host memory
and whose kernels are the CPU builds of the same tasks; the real thing runs in
tests/models/test_models.py's gpu tests."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import autosched as aus
from autosched.targets.cuda.runtime import Launch, Launches
from autosched.targets.target import parse
from autosched.testing.models import Builder, ort_run
from importers.onnx import from_onnx


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


class _FakeFn:
    def __init__(self, drv: _FakeDriver, host_module: object, task: object) -> None:
        self.drv, self.mod, self.task = drv, host_module, task

    def prepared_call(self, grid: tuple, block: tuple, *ptrs: int) -> None:
        arrays = []
        for p, t in zip(ptrs, self.task.args):
            shape = [int(d) for d in t.shape]
            n = int(np.prod(shape)) * np.dtype(t.dtype).itemsize
            arrays.append(self.drv.memory[p][:n].view(t.dtype).reshape(shape))
        self.mod(*arrays)


class _FakeModule:
    def __init__(self, drv: _FakeDriver, host_module: object, task: object) -> None:
        self.fn = _FakeFn(drv, host_module, task)

    def launches(self, *args: object) -> Launches:
        return Launches([Launch(self.fn, (1, 1, 1), (1, 1, 1), [int(a) for a in args], "k")],
                        [], [])


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
    # one copy in per input and one copy out per output, whatever the number of kernels
    assert (drv.copies_in - uploads, drv.copies_out) == (1, 1)
    np.testing.assert_allclose(out, cpu.run(x)[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    assert model.time(x, repeat=3) == pytest.approx(1e-3)
    # the memory plan shares device buffers between values whose lifetimes do not overlap
    assert len(set(model.storage.values())) < len(model.storage)
    with pytest.raises(aus.ModelImportError, match="must be float32"):
        model.run({"x": x["x"].astype(np.float16)})
