"""CUDA models deployed as one library (targets/cuda/library.py): built in CI (NVRTC and the
host C compiler, no GPU: the model is compiled with ``-emulate=ir``, the same kernels), checked
for what it exports and links; on a GPU (marker ``gpu``) run from C (host and device pointers)
and by ``autosched.load``, against onnxruntime."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autosched as aus
from autosched.errors import CompileError, ModelImportError, RuntimeError_
from autosched.graph.deploy import export, library_spec
from autosched.targets.cuda.host_emulate import unavailable
from autosched.targets.cuda.library import build_library, c_string, deployed_target, library_archs
from autosched.targets.host import detect_cuda_arch
from autosched.targets.model_api import API, DEVICE_API, Status
from autosched.targets.model_api import header as api_header
from autosched.targets.target import parse
from autosched.testing.models import ort_run, resnet18, small_cnn
from importers.onnx import from_onnx
from tests.deploy.c_driver import DriverError
from tests.deploy.mock_cuda import gather_model
from tests.support.nvrtc import needs_nvrtc

pytestmark = needs_nvrtc
needs_host_emulation = pytest.mark.skipif(
    unavailable() is not None, reason=f"host emulation of CUDA C: {unavailable()}")
MODELS = {"small_cnn": lambda: small_cnn(image=20), "resnet18": lambda: resnet18(image=64)}


def _compile(proto: object, arch: str) -> object:
    """The model's kernels for ``arch`` (without running anything on a GPU)."""
    return aus.compile(from_onnx(proto), target=f"cuda -arch={arch} -emulate=ir")


def _deploy(proto: object, arch: str, out: Path, name: str) -> dict[str, np.ndarray]:
    export(_compile(proto, arch), out, name=name)
    rng = np.random.default_rng()
    return {v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype)
            for v in from_onnx(proto).inputs}


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
    model = _compile(gather_model(), "sm_90")
    spec = library_spec(model, "gather", static=False)
    for graphs in ("1", "0"):  # 0: each kernel launched on every run (benchmarks compare)
        built = build_library(spec, tmp_path / "gather.so",
                              flags=("-Werror", "-Wshadow", f"-DCUDA_GRAPHS={graphs}"))
    assert "#define GATHER_RUN_DEVICE_WAITS 1" in built.header  # its kernel checks indices
    assert built.target == "cuda -arch=sm_90"


def test_without_a_host_c_compiler_the_error_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from autosched.targets.cuda import library

    monkeypatch.setattr(library.shutil, "which", lambda name: None)
    with pytest.raises(CompileError, match=r"host C compiler \(cc or gcc\)"):
        library.host_compiler()


def test_the_target_a_library_reports() -> None:
    """Kernels build for the first listed arch; the library says every arch, never emulation."""
    target = parse("cuda -arch=sm_80,sm_90 -emulate=ir")
    assert target.arch == "sm_80" and library_archs(target) == ("sm_80", "sm_90")
    assert str(deployed_target(target)) == "cuda -arch=sm_80,sm_90"
    detected = parse("cuda -emulate=ir")
    assert str(deployed_target(detected)) == f"cuda -arch={detected.arch}"


def test_c_strings_survive_any_name(tmp_path: Path) -> None:
    name = 'in "put"\\ ??= ü\n'
    src = tmp_path / "s.c"
    src.write_text(f'#include <stdio.h>\nint main(void) {{ fputs({c_string(name)}, stdout); }}\n')
    subprocess.run(["cc", "-Wall", "-Werror", "-trigraphs", str(src), "-o", str(tmp_path / "s")],
                   check=True)
    assert subprocess.run([str(tmp_path / "s")], capture_output=True, check=True).stdout == \
        name.encode()


def test_the_cpu_header_keeps_its_layout_and_gains_no_device_entry() -> None:
    text = api_header("net", [("x", "float32", (2,))], [("y", "float32", (2,))], "llvm")
    assert "run_device" not in text and "RUN_DEVICE_WAITS" not in text
    fields = text[text.index("typedef struct {"):text.index("} net_options;")]
    assert fields.index("int32_t num_threads;") < fields.index("int32_t device;") < \
        fields.index("void *stream;")  # a CPU library reads the first field only


# -- in CI, over a stand-in driver that runs the kernels' CUDA C on the CPU ----------------------

def _over_a_stand_in_driver(model: str, archs: str, folder: Path, *gpus: str) -> list[dict]:
    """tests/deploy/mock_cuda.py's reports, from a child process (the stand-in replaces
    libcuda.so.1 for the process that loads it)."""
    proc = subprocess.run([sys.executable, "-m", "tests.deploy.mock_cuda", model, archs,
                           str(folder), *gpus], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@needs_host_emulation
def test_over_a_stand_in_driver_each_gpu_runs_the_code_of_its_arch(tmp_path: Path) -> None:
    """sm_90 and sm_86 GPUs (the sm_86 one runs the sm_80 cubins), both pointer kinds against
    onnxruntime; an sm_75 GPU gets one line naming its arch; a GPU without the memory gets
    the ALLOC status; every context leaves nothing behind."""
    sm90, sm86, sm75, full = _over_a_stand_in_driver(
        "small_cnn", "sm_90,sm_80", tmp_path, "90:-1", "86:-1", "75:-1", "90:100000")
    for report, arch in ((sm90, "sm_90"), (sm86, "sm_80")):
        assert report["errors"] == [] and report["create"] == ""
        assert report["host"] < 1e-4 and report["device"] < 1e-4
        assert report["archs"] == [arch] and report["launches"] > 0
        assert report["direct_launches"] == 0 and report["graph_launches"] == 7
    assert "GPU 0 is sm_75; this library holds code for sm_90, sm_80 only" in sm75["create"]
    assert "CUDA_ERROR_OUT_OF_MEMORY" in full["create"] and sm75["launches"] == 0
    for report in (sm75, full):
        assert "\n" not in report["create"]
    assert [r["live"] for r in (sm90, sm86, sm75, full)] == [0, 0, 0, 0]


@needs_host_emulation
def test_over_a_stand_in_driver_tma_kernels_get_the_descriptors_of_their_buffers(
        tmp_path: Path) -> None:
    """A wgmma main loop copying by TMA: the library encodes a descriptor of each operand
    (its shape, strides and box as the kernel's map says, over the buffer of that launch)
    and passes it before the buffers, in graphs and without them, for both pointer kinds."""
    reports = _over_a_stand_in_driver("matmul_fp16", "sm_90", tmp_path, "90:-1", "90:-1:0")
    for report in reports:
        assert report["errors"] == [] and report["create"] == ""
        assert report["host"] < 0.05 and report["device"] < 0.05  # fp16 operands, K = 64
        assert report["launches"] > 0 and report["live"] == 0
    graphs, plain = reports
    # A and B each time a run's launches are recorded (7 runs, 5 of them on new pointers), or
    # at each launch of the matmul (one of a run's 3 kernels) when they are launched one by one
    assert graphs["tensor_maps"] == 2 * graphs["recorded"] == 10
    assert plain["tensor_maps"] == 2 * plain["direct_launches"] // 3 == 14


@needs_host_emulation
def test_over_a_stand_in_driver_kernels_get_their_dynamic_shared_memory(tmp_path: Path) -> None:
    """Kernels whose shared buffers are carved out of dynamic shared memory (forced here for
    every buffer; codegen does it above 48 KB): the library opts each in and launches it with
    its bytes (the stand-in refuses a launch with more than the function was given)."""
    reports = []
    for m in ("small_cnn", "small_cnn_dynamic"):
        (tmp_path / m).mkdir()
        reports += _over_a_stand_in_driver(m, "sm_90", tmp_path / m, "90:-1")
    plain, dynamic = reports
    for report in (plain, dynamic):
        assert report["errors"] == [] and report["create"] == "" and report["live"] == 0
        assert report["host"] < 1e-4 and report["device"] < 1e-4
    assert plain["opted_in"] == 0 and dynamic["opted_in"] > 0
    assert dynamic["launches"] == plain["launches"]


@needs_host_emulation
def test_over_a_stand_in_driver_runs_replay_one_graph_each(tmp_path: Path) -> None:
    """The host path records its graph at the first run and replays it; the device path
    records again only for other pointers (mock_cuda.DEVICE_RUNS: other inputs, other
    outputs, both: four recordings, the executable graph instantiated once and updated three
    times), and each replay reads the arrays it is bound to. A driver that cannot record gets
    the same launches one by one, with the same outputs."""
    graphs, plain = _over_a_stand_in_driver("small_cnn", "sm_90", tmp_path, "90:-1", "90:-1:0")
    for report in (graphs, plain):
        assert report["errors"] == [] and report["create"] == "" and report["live"] == 0
        assert report["host"] < 1e-4 and report["device"] < 1e-4
    kernels = graphs["launches"] // 7  # two host runs, five device runs
    assert graphs["launches"] == plain["launches"] == 7 * kernels and kernels > 1
    assert (graphs["recorded"], graphs["instantiated"], graphs["updated"]) == (5, 2, 3)
    assert (graphs["graph_launches"], graphs["direct_launches"]) == (7, 0)
    assert (plain["recorded"], plain["graph_launches"], plain["direct_launches"]) == \
        (0, 0, 7 * kernels)


@needs_host_emulation
def test_over_a_stand_in_driver_a_kernel_check_is_the_status_of_the_run(tmp_path: Path) -> None:
    """The status word is cleared inside the graph: the run after a failing one is clean."""
    (report,) = _over_a_stand_in_driver("gather", "sm_90", tmp_path, "90:-1")
    assert report["errors"] == [] and report["host"] == 0 and report["device"] == 0
    assert "out of range" in report["bad_index"] and report["live"] == 0
    assert report["after_bad_index"] == 0 and report["direct_launches"] == 0


@pytest.mark.slow
@needs_host_emulation
def test_over_a_stand_in_driver_resnet18_matches_onnxruntime(tmp_path: Path) -> None:
    """Kernel modules that several calls share, 48 launches, 45 MB of weights (15 s)."""
    (report,) = _over_a_stand_in_driver("resnet18", "sm_90", tmp_path, "90:-1")
    assert report["errors"] == [] and report["live"] == 0
    assert report["host"] < 2e-3 and report["device"] < 2e-3


@needs_host_emulation
def test_over_a_stand_in_driver_outputs_no_kernel_writes_are_copied(tmp_path: Path) -> None:
    """A reshape of another output and the input itself, on both paths."""
    (report,) = _over_a_stand_in_driver("views", "sm_90", tmp_path, "90:-1")
    assert report["errors"] == [] and report["host"] == 0 and report["device"] == 0


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
    run = c_runner(flags=["-DDEVICE_POINTERS", "-ldl"] if pointers == "device" else [])
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
def test_on_the_gpu_each_replay_reads_the_arrays_of_its_run(tmp_path: Path) -> None:
    """The library replays a recorded graph: two host runs on different inputs, and device
    runs on two sets of pointers and the first again (recorded anew each time the pointers
    change), each against onnxruntime; a library built without graphs gives the same."""
    import pycuda.gpuarray as gpuarray

    from autosched.targets.cuda.library import build_library

    proto = small_cnn(image=20)
    model = _compile(proto, detect_cuda_arch())
    export(model, tmp_path / "graphs", name="cnn")
    export(model, tmp_path / "plain", name="cnn")
    build_library(library_spec(model, "cnn", static=False), tmp_path / "plain" / "cnn.so",
                  flags=("-DCUDA_GRAPHS=0",))
    (tmp_path / "plain" / "cnn.so").chmod(0o755)  # as export leaves it: only its owner writes
    rng = np.random.default_rng()
    feeds = [{"input": rng.uniform(-1, 1, (1, 3, 20, 20)).astype(np.float32)} for _ in range(2)]
    want = [ort_run(proto, f) for f in feeds]
    assert not np.allclose(want[0][0], want[1][0])
    for build in ("graphs", "plain"):
        deployed = aus.load(tmp_path / build)
        for f, w in zip(feeds, want):
            _check(deployed.run(f), w)
        sets = [({"input": gpuarray.to_gpu(f["input"])},
                 [gpuarray.empty(w[0].shape, np.float32)]) for f, w in zip(feeds, want)]
        for n in (0, 1, 0, 0):
            sets[n][1][0].fill(np.nan)
            deployed.run_device(*sets[n])
            _check([sets[n][1][0].get()], want[n])  # get() waits: the default stream


@pytest.mark.gpu
def test_a_failing_kernel_check_is_the_status_of_the_run(tmp_path: Path,
                                                         rng: np.random.Generator) -> None:
    export(_compile(gather_model(), detect_cuda_arch()), tmp_path, name="gather")
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
