"""The in-process executor runs the model through the same glue as a deployed library: one
native call per run, no Python between kernels; threads and failures as before."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import autosched as aus
from autosched.errors import RuntimeError_
from autosched.targets.llvm.runtime import HostModule
from autosched.testing.models import ort_run, small_cnn
from importers.onnx import from_onnx


def test_a_run_calls_no_kernel_from_python(monkeypatch: pytest.MonkeyPatch,
                                           rng: np.random.Generator) -> None:
    proto = small_cnn(image=11)
    model = aus.compile(from_onnx(proto), target="llvm -num-cores=2")
    x = {"input": rng.uniform(-1, 1, (1, 3, 11, 11)).astype(np.float32)}

    def python_call(*_: object) -> None:
        raise AssertionError("a kernel was called from Python")

    monkeypatch.setattr(HostModule, "__call__", python_call)
    monkeypatch.setattr(HostModule, "bind", python_call)
    (y,) = model.run(x)
    np.testing.assert_allclose(y, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    assert model.time(x, repeat=2, min_s=0.0) > 0


def test_set_threads_reaches_the_kernels(rng: np.random.Generator) -> None:
    # large enough that the untuned defaults run some stages in parallel (small ones serially)
    model = aus.compile(from_onnx(small_cnn(image=64)), target="llvm -num-cores=2")
    x = {"input": rng.uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)}
    threaded = [k.module for k in model.kernels if k.module.uses_threads]
    if not threaded:
        pytest.skip("no kernel of this model has a parallel loop")
    # threads_ran counts the threads that ran part of a parallel loop: the caller, and the
    # workers that joined in time (on a busy machine maybe none in one run)
    model.set_threads(1)
    before = [m.threads_ran for m in threaded]
    model.run(x)
    regions = [m.threads_ran - b for m, b in zip(threaded, before)]
    assert all(r > 0 for r in regions), regions
    model.set_threads(3)
    deadline = time.monotonic() + 20
    joined = False
    while not joined and time.monotonic() < deadline:
        before = [m.threads_ran for m in threaded]
        model.run(x)
        ran = [m.threads_ran - b for m, b in zip(threaded, before)]
        assert all(k <= r <= 3 * k for r, k in zip(ran, regions)), (ran, regions)
        joined = any(r > k for r, k in zip(ran, regions))
    assert joined, "no worker thread ever joined a parallel loop at 3 threads"


def test_a_failing_kernel_names_its_node(rng: np.random.Generator) -> None:
    d = helper.make_tensor_value_info("d", TensorProto.FLOAT, [5, 3])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])
    node = helper.make_node("Gather", ["d", "i"], ["y"], name="pick")
    model = aus.compile(from_onnx(helper.make_model(helper.make_graph([node], "g", [d, i], [y]))),
                        target="llvm")
    data = rng.standard_normal((5, 3)).astype(np.float32)
    with pytest.raises(RuntimeError_, match="pick.*out of range"):
        model.run({"d": data, "i": np.array([0, 1, 9, 2])})
    np.testing.assert_array_equal(model.run({"d": data, "i": np.array([0, 4, 1, 2])})[0],
                                  data[[0, 4, 1, 2]])
