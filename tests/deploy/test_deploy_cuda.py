"""CUDA models deployed as one library (targets/cuda/library.py): built in CI (NVRTC and the
host C compiler, no GPU: the model is compiled with ``-emulate=ir``, the same kernels), checked
for what it exports and links; on a GPU (marker ``gpu``) run from C (host and device pointers)
and by ``autosched.load``, against onnxruntime."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import autosched as aus
from autosched.errors import ModelImportError, RuntimeError_
from autosched.graph.deploy import export, library_spec
from autosched.targets.cuda.library import build_library, c_string
from autosched.targets.host import detect_cuda_arch
from autosched.targets.model_api import API, DEVICE_API, Status
from autosched.testing.models import ort_run, resnet18, small_cnn
from importers.onnx import from_onnx
from tests.deploy.c_driver import DriverError
from tests.support.nvrtc import needs_nvrtc

pytestmark = needs_nvrtc
MODELS = {"small_cnn": lambda: small_cnn(image=20), "resnet18": lambda: resnet18(image=64)}


def _compile(proto: object, arch: str) -> object:
    """The model's kernels for ``arch`` (without running anything on a GPU)."""
    return aus.compile(from_onnx(proto), target=f"cuda -arch={arch} -emulate=ir")


def _deploy(proto: object, arch: str, out: Path, name: str) -> dict[str, np.ndarray]:
    export(_compile(proto, arch), out, name=name)
    rng = np.random.default_rng()
    return {v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype)
            for v in from_onnx(proto).inputs}


def _gather_model() -> object:
    """A Gather: its kernel checks each index and reports through the status word."""
    d = helper.make_tensor_value_info("d", TensorProto.FLOAT, [5, 3])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])
    node = helper.make_node("Gather", ["d", "i"], ["y"], name="pick")
    return helper.make_model(helper.make_graph([node], "g", [d, i], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


def _no_gpu() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


# -- in CI: built, exported symbols, linked libraries --------------------------------------------

@pytest.fixture(scope="module")
def cnn_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("cuda_cnn")
    _deploy(small_cnn(image=20), "sm_90,sm_80", build, "cnn")
    return build


def test_the_library_exports_only_the_api_and_links_no_cuda_library(cnn_library: Path) -> None:
    lib = cnn_library / "cnn.so"
    assert {"README", "cnn.h", "cnn.so"} == {p.name for p in cnn_library.iterdir()}
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout.split()[2::3]
    assert sorted(symbols) == sorted(f"cnn_{f}" for f in (*API, *DEVICE_API))
    dynamic = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    needed = {line.split("[")[1].split("]")[0] for line in dynamic.splitlines()
              if "NEEDED" in line}
    assert needed and needed <= {"libc.so.6", "libdl.so.2", "libpthread.so.0"}, needed
    header = (cnn_library / "cnn.h").read_text()
    assert "int32_t cnn_run_device(" in header and "#define CNN_RUN_DEVICE_WAITS 0" in header
    assert "void *stream;" in header and "int32_t device;" in header
    assert "libcuda.so.1" in (cnn_library / "README").read_text()


def test_introspection_needs_no_gpu(cnn_library: Path) -> None:
    lib = ctypes.CDLL(str(cnn_library / "cnn.so"))
    lib.cnn_target.restype = lib.cnn_version.restype = ctypes.c_char_p
    lib.cnn_status_message.restype = ctypes.c_char_p
    assert lib.cnn_target() == b"cuda -arch=sm_90,sm_80"  # no -emulate: it runs on the GPU
    assert lib.cnn_version() == aus.__version__.encode()
    assert (lib.cnn_num_inputs(), lib.cnn_num_outputs()) == (1, 1)
    assert b"arch" in lib.cnn_status_message(int(Status.DEVICE))
    assert lib.cnn_run(None, None, None) == Status.ARGUMENT
    assert lib.cnn_run_device(None, None, None) == Status.ARGUMENT


@pytest.mark.skipif(not _no_gpu(), reason="this machine has a CUDA driver")
def test_without_a_cuda_driver_load_fails_in_one_line(cnn_library: Path) -> None:
    with pytest.raises(ModelImportError, match="no CUDA driver") as info:
        aus.load(cnn_library)
    assert "\n" not in str(info.value) and "cuda -arch=" in str(info.value)


def test_the_generated_c_compiles_without_warnings(tmp_path: Path) -> None:
    model = _compile(_gather_model(), "sm_90")
    spec = library_spec(model, "gather", static=False)
    built = build_library(spec, tmp_path / "gather.so", flags=("-Werror", "-Wshadow"))
    assert "#define GATHER_RUN_DEVICE_WAITS 1" in built.header  # its kernel checks indices
    assert built.target == "cuda -arch=sm_90"


def test_c_strings_survive_any_name(tmp_path: Path) -> None:
    name = 'in "put"\\ ??= ü\n'
    src = tmp_path / "s.c"
    src.write_text(f'#include <stdio.h>\nint main(void) {{ fputs({c_string(name)}, stdout); }}\n')
    subprocess.run(["cc", "-Wall", "-Werror", "-trigraphs", str(src), "-o", str(tmp_path / "s")],
                   check=True)
    assert subprocess.run([str(tmp_path / "s")], capture_output=True, check=True).stdout == \
        name.encode()


def test_a_model_for_an_llvm_target_still_exports_as_before(tmp_path: Path) -> None:
    export(aus.compile(from_onnx(small_cnn(image=8)), target="llvm"), tmp_path, name="cpu")
    assert "run_device" not in (tmp_path / "cpu.h").read_text()


# -- on a GPU ------------------------------------------------------------------------------------

def _check(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("pointers", ["host", "device"])
def test_from_c_on_the_gpu_matches_onnxruntime(model_name: str, pointers: str, tmp_path: Path,
                                               c_runner) -> None:
    proto = MODELS[model_name]()
    build = tmp_path / "build"
    feeds = _deploy(proto, detect_cuda_arch(), build, model_name)
    want = ort_run(proto, feeds)
    run = c_runner(flags=["-DDEVICE_POINTERS"] if pointers == "device" else [])
    _check(run(build, model_name, list(feeds.values()), [(w.shape, str(w.dtype)) for w in want]),
           want)


@pytest.mark.gpu
def test_load_runs_a_cuda_library_as_the_executor_and_onnxruntime(tmp_path: Path) -> None:
    import pycuda.gpuarray as gpuarray

    proto = small_cnn(image=20)
    build = tmp_path / "build"
    feeds = _deploy(proto, detect_cuda_arch(), build, "cnn")
    deployed = aus.load(build)
    assert deployed.gpu and deployed.target == f"cuda -arch={detect_cuda_arch()}"
    want = ort_run(proto, feeds)
    (got,) = deployed.run(feeds)
    _check([got], want)
    in_process = aus.compile(from_onnx(proto), target="cuda")
    np.testing.assert_allclose(got, in_process.run(feeds)[0], rtol=1e-4, atol=1e-4)
    x = gpuarray.to_gpu(feeds["input"])
    y = gpuarray.empty(want[0].shape, np.float32)
    deployed.run_device({"input": x}, [y])
    _check([y.get()], want)  # get() copies on the default stream, after the run
    with pytest.raises(ModelImportError, match="must be float32"):
        deployed.run_device({"input": x.astype(np.float64)}, [y])
    assert deployed.time(feeds, repeat=3, min_s=0.0) > 0


@pytest.mark.gpu
def test_a_failing_kernel_check_is_the_status_of_the_run(tmp_path: Path,
                                                         rng: np.random.Generator) -> None:
    export(_compile(_gather_model(), detect_cuda_arch()), tmp_path, name="gather")
    deployed = aus.load(tmp_path)
    data = rng.standard_normal((5, 3)).astype(np.float32)
    with pytest.raises(RuntimeError_, match="out of range"):
        deployed.run({"d": data, "i": np.array([0, 1, 9, 2])})
    np.testing.assert_array_equal(deployed.run({"d": data, "i": np.array([0, 4, 1, 2])})[0],
                                  data[[0, 4, 1, 2]])


@pytest.mark.gpu
def test_a_library_without_code_for_the_gpu_says_which_arch(tmp_path: Path, c_runner) -> None:
    gpu = detect_cuda_arch()
    other = "sm_75" if not gpu.startswith("sm_7") else "sm_90"
    proto = small_cnn(image=8)
    feeds = _deploy(proto, other, tmp_path, "cnn")
    with pytest.raises(ModelImportError, match=f"is {gpu}; this library holds code for "
                                               f"{other} only") as info:
        aus.load(tmp_path)
    assert "\n" not in str(info.value)
    with pytest.raises(DriverError, match=f"create: cnn: GPU 0 is {gpu}"):
        c_runner()(tmp_path, "cnn", list(feeds.values()), [((1, 10), "float32")])
