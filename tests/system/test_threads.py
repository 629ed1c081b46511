"""One compiled model shared by threads: every call gets its own intermediate buffers, and its
outputs are fresh arrays. Each output is checked against a single-threaded run on the same
input (bit for bit: a kernel computes the same way on every call).

The soak version (10,000 calls from 8 threads) runs with ``--slow``."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import autosched as aus
from autosched.testing.models import ort_run, small_cnn
from importers.onnx import from_onnx


@pytest.fixture(scope="module")
def cnn() -> tuple[object, object]:
    onnx_model = small_cnn(image=12, seed=3)
    return onnx_model, aus.compile(from_onnx(onnx_model), target="llvm")


def _hammer(model: object, inputs: list[dict[str, np.ndarray]], want: list[list[np.ndarray]],
            threads: int, calls: int, seed: int) -> list[str]:
    """``calls`` runs spread over ``threads`` threads, each on a random one of ``inputs``;
    the descriptions of the outputs that differ from ``want``."""
    errors: list[str] = []
    start = threading.Barrier(threads)

    def worker(t: int) -> None:
        rng = np.random.default_rng([seed, t])
        start.wait()
        for c in range(calls // threads + (t < calls % threads)):
            k = int(rng.integers(len(inputs)))
            try:
                got = model.run(inputs[k])
            except Exception as exc:  # noqa: BLE001  reported with the call that raised
                errors.append(f"thread {t} call {c}: {type(exc).__name__}: {exc}")
                continue
            if len(got) != len(want[k]) or not all(
                    np.array_equal(g, w) for g, w in zip(got, want[k])):
                errors.append(f"thread {t} call {c}: input {k} gave another output")
            for g in got:  # the caller owns its outputs: scribbling on them harms no one
                g.fill(np.nan)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return errors


def _check(cnn: tuple[object, object], rng: np.random.Generator, threads: int,
           calls: int, tol: float = 1e-5) -> None:
    onnx_model, model = cnn
    name = model.graph.inputs[0].name
    shape = model.graph.inputs[0].shape
    inputs = [{name: rng.uniform(-1, 1, shape).astype("float32")} for _ in range(12)]
    want = [model.run(x) for x in inputs]
    np.testing.assert_allclose(want[0][0], ort_run(onnx_model, inputs[0])[0], rtol=10 * tol,
                               atol=tol)
    assert len({w[0].tobytes() for w in want}) == len(inputs)  # the inputs are told apart
    errors = _hammer(model, inputs, want, threads, calls, int(rng.integers(2**32)))
    assert not errors, f"{len(errors)} of {calls} calls went wrong, e.g. {errors[:3]}"


def test_eight_threads_share_one_model(cnn, rng):
    _check(cnn, rng, threads=8, calls=800)


@pytest.mark.slow
def test_soak_ten_thousand_calls_from_eight_threads(cnn, rng):
    _check(cnn, rng, threads=8, calls=10_000)


@pytest.mark.gpu
def test_cuda_model_shared_by_threads(rng):
    """On the GPU: the threads take turns on the device buffers, each pushing the context."""
    onnx_model = small_cnn(image=12, seed=3)
    model = aus.compile(from_onnx(onnx_model), target="cuda")
    _check((onnx_model, model), rng, threads=8, calls=400, tol=1e-4)


def test_cuda_model_serialises_threads(monkeypatch: pytest.MonkeyPatch, rng):
    """The GPU executor on the stand-in driver of test_graph_executor_cuda (host memory as
    device memory, the CPU kernels as CUDA kernels): one set of device buffers, so calls must
    take turns, each with the model's context current on its thread."""
    from autosched.graph.executor_cuda import CudaModel
    from autosched.targets.cuda import runtime as rt
    from autosched.targets.target import parse
    from tests.graph.test_graph_executor_cuda import _FakeDriver, _FakeModule

    class Context:
        current: dict[int, list[object]] = {}

        def push(self) -> None:
            Context.current.setdefault(threading.get_ident(), []).append(self)

        @staticmethod
        def pop() -> None:
            Context.current[threading.get_ident()].pop()

    drv = _FakeDriver()
    ctx = Context()
    drv.Context.pop = Context.pop
    monkeypatch.setattr(rt, "driver", lambda: drv)
    monkeypatch.setattr(rt, "context", lambda: ctx)
    onnx_model = small_cnn(image=10, seed=5)
    cpu = aus.compile(from_onnx(onnx_model), target="llvm")
    kernels = [type(k)(k.group, k.task, k.args, _FakeModule(drv, k.module, k.task))
               for k in cpu.kernels]
    model = CudaModel(cpu.graph, kernels, parse("cuda"), cpu.constants, cpu.aliases)
    name, shape = cpu.graph.inputs[0].name, cpu.graph.inputs[0].shape
    inputs = [{name: rng.uniform(-1, 1, shape).astype("float32")} for _ in range(8)]
    want = [cpu.run(x) for x in inputs]
    errors = _hammer(model, inputs, want, threads=8, calls=200, seed=int(rng.integers(2**32)))
    assert not errors, f"{len(errors)} of 200 calls went wrong, e.g. {errors[:3]}"
    assert all(not stack for stack in Context.current.values())  # every push was popped
