"""``autosched.load``: a model library run from Python through ctypes, against the in-process
executor and onnxruntime; what a runtime-only import pulls in; a library for another machine
or CPU. (Threads and hostile build dirs: tests/system/test_deploy_trust.py.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autosched as aus
from autosched.errors import ModelImportError, RuntimeError_
from autosched.graph.deploy import export
from autosched.testing.models import ort_run, small_cnn
from importers.onnx import from_onnx
from tests.deploy.c_driver import CROSS


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, Path]:
    proto = small_cnn(image=13)
    model = aus.compile(from_onnx(proto), target="llvm")
    build = tmp_path_factory.mktemp("cnn")
    export(model, build, name="cnn")
    return proto, model, build


def _x(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input": rng.uniform(-1, 1, (1, 3, 13, 13)).astype(np.float32)}


def test_load_runs_as_the_executor_and_onnxruntime(cnn: tuple[object, object, Path]) -> None:
    proto, model, build = cnn
    deployed = aus.load(build)
    assert deployed.name == "cnn" and deployed.target == str(model.target)
    assert deployed.version == aus.__version__
    assert [(v.name, v.shape, v.dtype) for v in deployed.graph.inputs] == [
        ("input", (1, 3, 13, 13), "float32")]
    x = _x(1)
    (a,) = model.run(x)
    (b,) = deployed.run(x)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(ModelImportError, match="missing input"):
        deployed.run({})
    misaligned = np.empty(1 + x["input"].nbytes // 4, np.float32)[1:].reshape(1, 3, 13, 13)
    misaligned[...] = x["input"]
    np.testing.assert_array_equal(deployed.run({"input": misaligned})[0], b)
    assert deployed.time(x, repeat=3, min_s=0.0) > 0


def test_importing_load_needs_no_compiler() -> None:
    code = ("import sys, autosched; autosched.load; "
            "print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('llvmlite', 'xgboost', 'onnx', 'tqdm', 'importers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_a_library_for_another_machine_says_which(tmp_path: Path) -> None:
    if shutil.which(CROSS["aarch64"][0]) is None:
        pytest.skip(f"{CROSS['aarch64'][0]} is not installed (apt-get install -y "
                    "gcc-aarch64-linux-gnu libc6-dev-arm64-cross): it links the library")
    model = aus.compile(from_onnx(small_cnn(image=8)),
                        target="llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72")
    export(model, tmp_path, name="arm")
    with pytest.raises(ModelImportError) as info:
        aus.load(tmp_path)
    message = str(info.value)
    assert "\n" not in message and "aarch64" in message and "arm.so" in message


def test_a_library_for_a_cpu_with_more_features_fails_with_a_status(tmp_path: Path) -> None:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "avx512_fp16" in flags or " avx2" not in flags:
        pytest.skip("needs an x86 CPU without AVX512-FP16")
    model = aus.compile(from_onnx(small_cnn(image=8)), target="llvm -mattr=+avx2,+avx512fp16")
    export(model, tmp_path, name="fp16")
    with pytest.raises(ModelImportError, match="lacks an instruction set extension") as info:
        aus.load(tmp_path)
    assert "\n" not in str(info.value)


def test_a_failing_run_is_an_error_not_a_crash(cnn: tuple[object, object, Path]) -> None:
    deployed = aus.load(cnn[2])
    run = deployed._api["run"]
    assert run(None, None, None) == 4  # a NULL context: the ARGUMENT status
    assert "NULL" in deployed.message(4)
    with pytest.raises(RuntimeError_, match="NULL"):
        deployed._call([None, None])


def test_outputs_that_are_views_or_inputs_are_copied_out(tmp_path: Path,
                                                         rng: np.random.Generator) -> None:
    """Outputs no kernel writes in place: a reshape of another output, and a graph input."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([6, 5], np.int64), "shape")
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["flat"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("flat", "r", "x")]
    proto = helper.make_model(helper.make_graph(nodes, "views", [x], outs, [shape]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model = aus.compile(from_onnx(proto), target="llvm")
    export(model, tmp_path, name="views")
    feeds = {"x": rng.uniform(-1, 1, (2, 3, 5)).astype(np.float32)}
    want = ort_run(proto, feeds)
    for got in (aus.load(tmp_path).run(feeds), model.run(feeds)):
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
