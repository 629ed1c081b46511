"""Model libraries whose weights are a separate file (``export(..., weights_file=True)``,
``autosched compile --weights-file``): the CPU library maps NAME.weights at create and its
kernels read it in place, the CUDA library maps it and uploads it. Run from C (on the host and
under qemu-aarch64), by ``autosched.load`` and over the stand-in CUDA driver, against
onnxruntime; a missing, truncated, corrupted or foreign file is the WEIGHTS status with one
line naming the file."""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import autosched as aus
from autosched.cli import main as cli
from autosched.errors import ModelImportError
from autosched.graph.deploy import export, library_spec
from autosched.targets.cuda.host_emulate import unavailable
from autosched.targets.model_api import (
    API,
    DEVICE_API,
    WEIGHTS_HEADER_BYTES,
    WEIGHTS_MAGIC,
    Status,
    padded_weights,
    weights_checksum,
)
from autosched.testing.models import ort_run, resnet18, small_cnn
from importers.onnx import from_onnx
from tests.deploy.c_driver import DriverError
from tests.support.nvrtc import needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]
AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
IMAGE = 20


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """small_cnn for the host, exported three ways: ``file`` (with --weights-file, by the
    command line), ``embedded`` (the same kernels, weights inside), ``other`` (another
    model's library and weights file)."""
    root = tmp_path_factory.mktemp("weights")
    onnx.save(small_cnn(image=IMAGE), root / "cnn.onnx")
    assert cli(["compile", str(root / "cnn.onnx"), "-o", str(root / "file"), "--name", "cnn",
                "--weights-file"]) == 0
    kernels = aus.compile(from_onnx(small_cnn(image=IMAGE)), target="llvm", executor=False)
    export(kernels, root / "embedded", name="cnn")
    export(kernels, root / "other", name="other", weights_file=True)
    return {d: root / d for d in ("file", "embedded", "other")}


def _feeds() -> dict[str, np.ndarray]:
    x = np.random.default_rng().uniform(-1, 1, (1, 3, IMAGE, IMAGE)).astype(np.float32)
    return {"input": x}


def _outputs(want: list[np.ndarray]) -> list[tuple[tuple[int, ...], str]]:
    return [(w.shape, str(w.dtype)) for w in want]


def _check(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)


def _tool(*command: str | Path) -> str:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          check=True).stdout


def _exported(lib: Path) -> list[str]:
    """The symbols ``lib`` defines for others to link (nm -D), sorted."""
    return sorted(_tool("nm", "-D", "--defined-only", lib).split()[2::3])


def _copy(build: Path, to: Path) -> Path:
    shutil.copytree(build, to)
    return to


# -- the CPU library: runs ---------------------------------------------------------------------

def test_from_c_and_load_it_matches_onnxruntime(cnn: dict[str, Path], c_runner) -> None:
    assert {"README", "cnn.h", "cnn.so", "cnn.weights"} == {p.name for p in
                                                            cnn["file"].iterdir()}
    feeds = _feeds()
    want = ort_run(small_cnn(image=IMAGE), feeds)
    from_c = c_runner()(cnn["file"], "cnn", list(feeds.values()), _outputs(want))
    _check(from_c, want)
    _check(aus.load(cnn["file"]).run(feeds), want)
    # the same kernels on the same weights, embedded or mapped: the same bits
    np.testing.assert_array_equal(aus.load(cnn["embedded"]).run(feeds)[0], from_c[0])


def test_the_file_given_in_the_options_is_the_one_mapped(cnn: dict[str, Path], c_runner,
                                                         tmp_path: Path) -> None:
    """A library and its weights in different dirs: found by options.weights_path."""
    build = _copy(cnn["file"], tmp_path / "build")
    moved = tmp_path / "elsewhere.weights"
    (build / "cnn.weights").rename(moved)
    feeds = _feeds()
    want = ort_run(small_cnn(image=IMAGE), feeds)
    _check(c_runner()(build, "cnn", list(feeds.values()), _outputs(want), weights=moved), want)
    with pytest.raises(DriverError, match="cannot open it"):  # not next to it any more
        c_runner()(build, "cnn", list(feeds.values()), _outputs(want))


def test_aarch64_library_with_a_weights_file_under_qemu(tmp_path: Path, c_runner) -> None:
    run = c_runner("aarch64")
    proto = small_cnn(image=IMAGE)
    export(aus.compile(from_onnx(proto), target=AARCH64, executor=False), tmp_path, name="cnn",
           weights_file=True)
    feeds = _feeds()
    want = ort_run(proto, feeds)
    _check(run(tmp_path, "cnn", list(feeds.values()), _outputs(want)), want)
    (tmp_path / "cnn.weights").write_bytes((tmp_path / "cnn.weights").read_bytes()[:-64])
    with pytest.raises(DriverError, match=r"create: cnn: weights file .*cnn\.weights has "):
        run(tmp_path, "cnn", list(feeds.values()), _outputs(want))


# -- the CPU library: what it is -----------------------------------------------------------------

def test_the_library_shrinks_by_the_weights_and_exports_only_the_api(
        cnn: dict[str, Path]) -> None:
    weights = (cnn["file"] / "cnn.weights").stat().st_size - WEIGHTS_HEADER_BYTES
    assert weights > 4 * (16 << 10)  # well above the tolerance below (97 KB of weights)
    shrunk = (cnn["embedded"] / "cnn.so").stat().st_size - (cnn["file"] / "cnn.so").stat().st_size
    assert abs(shrunk - weights) < 16 << 10, (shrunk, weights)  # the glue's code, page padding
    assert _exported(cnn["file"] / "cnn.so") == sorted(f"cnn_{f}" for f in API)
    dynamic = _tool("readelf", "-d", cnn["file"] / "cnn.so").splitlines()
    needed = {line.split("[")[1].split("]")[0] for line in dynamic if "NEEDED" in line}
    assert needed <= {"libc.so.6", "libm.so.6", "libgomp.so.1", "libdl.so.2"}
    assert "cnn.weights" in (cnn["file"] / "README").read_text()
    assert "const char *weights_path;" in (cnn["file"] / "cnn.h").read_text()


def test_the_file_holds_the_header_and_every_weight_64_byte_aligned(
        cnn: dict[str, Path]) -> None:
    data = (cnn["file"] / "cnn.weights").read_bytes()
    body = data[WEIGHTS_HEADER_BYTES:]
    assert data[:8] == WEIGHTS_MAGIC and int.from_bytes(data[8:12], "little") == 1
    assert int.from_bytes(data[12:16], "little") == WEIGHTS_HEADER_BYTES % 4096 == 128
    assert int.from_bytes(data[16:24], "little") == len(body) and len(body) % 64 == 0
    assert int.from_bytes(data[24:32], "little") == weights_checksum(body)
    assert data[32:96].rstrip(b"\0") == b"cnn" and data[96:128] == bytes(32)
    kernels = aus.compile(from_onnx(small_cnn(image=IMAGE)), target="llvm", executor=False)
    spec = library_spec(kernels, "cnn")
    assert padded_weights(spec.weights) == body
    offsets = [p.at for c in spec.calls for p in c.args if p.region == "weights"]
    assert offsets and all(at % 64 == 0 for at in offsets)


def test_the_checksum_sees_any_one_changed_word() -> None:
    rng = np.random.default_rng()
    data = padded_weights(rng.integers(0, 256, 3000, np.uint8).tobytes())
    base = weights_checksum(data)
    for at in rng.integers(0, len(data), 20):
        for bit in (0, 7):
            flipped = bytearray(data)
            flipped[at] ^= 1 << bit
            assert weights_checksum(bytes(flipped)) != base
    swapped = data[8:16] + data[:8] + data[16:]  # words in another order
    assert data[:8] != data[8:16] and weights_checksum(swapped) != base


# -- bad weights files: a status and one line naming the file -----------------------------------

def _truncate(path: Path, other: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _flip_a_bit(path: Path, other: Path) -> None:
    data = bytearray(path.read_bytes())
    data[WEIGHTS_HEADER_BYTES + len(data) // 2 % (len(data) - WEIGHTS_HEADER_BYTES)] ^= 0x10
    path.write_bytes(bytes(data))


def _other_model(path: Path, other: Path) -> None:
    shutil.copyfile(other, path)


def _not_weights(path: Path, other: Path) -> None:
    path.write_bytes(b"\x7fELF" + bytes(4000))


def _another_build(path: Path, other: Path) -> None:
    data = bytearray(path.read_bytes())
    data[24] ^= 1  # the header's checksum: weights of another export of this model
    path.write_bytes(bytes(data))


BAD: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "missing": (lambda path, other: path.unlink(), r"cannot open it \(No such file"),
    "truncated": (_truncate, r"has \d+ bytes, the weights need \d+: truncated"),
    "bit-flipped": (_flip_a_bit, "is corrupted: its contents do not match its checksum"),
    "other model": (_other_model, "holds another model's weights"),
    "not weights": (_not_weights, "is not an autosched weights file"),
    "another build": (_another_build, "holds the weights of another build of this model"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_weights_file_is_a_status_and_one_line_naming_it(
        case: str, cnn: dict[str, Path], tmp_path: Path, c_runner) -> None:
    damage, why = BAD[case]
    build = _copy(cnn["file"], tmp_path / "build")
    weights = build / "cnn.weights"
    damage(weights, cnn["other"] / "other.weights")
    with pytest.raises(ModelImportError, match=why) as info:
        aus.load(build)
    assert "\n" not in str(info.value) and str(weights) in str(info.value)
    lib = ctypes.CDLL(str(build / "cnn.so"))  # options NULL: the file next to the library
    lib.cnn_status_message.restype = ctypes.c_char_p
    ctx = ctypes.c_void_p()
    assert lib.cnn_create(None, ctypes.byref(ctx)) == Status.WEIGHTS and not ctx.value
    message = lib.cnn_status_message(int(Status.WEIGHTS)).decode()
    assert message.startswith(f"cnn: weights file {weights}") and re.search(why, message)
    feeds = _feeds()
    with pytest.raises(DriverError, match=f"create: cnn: weights file {weights}"):
        c_runner()(build, "cnn", list(feeds.values()), [((1, 10), "float32")])


# -- the CUDA library ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_cnn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cuda_weights")
    kernels = aus.compile(from_onnx(small_cnn(image=IMAGE)), target="cuda -arch=sm_90",
                          executor=False)
    export(kernels, root / "file", name="cnn", weights_file=True)
    export(kernels, root / "embedded", name="cnn")
    return {d: root / d for d in ("file", "embedded")}


@needs_nvrtc
def test_the_cuda_library_shrinks_by_the_weights(cuda_cnn: dict[str, Path]) -> None:
    weights = (cuda_cnn["file"] / "cnn.weights").stat().st_size - WEIGHTS_HEADER_BYTES
    shrunk = ((cuda_cnn["embedded"] / "cnn.so").stat().st_size
              - (cuda_cnn["file"] / "cnn.so").stat().st_size)
    assert abs(shrunk - weights) < 16 << 10, (shrunk, weights)
    assert _exported(cuda_cnn["file"] / "cnn.so") == sorted(f"cnn_{f}"
                                                            for f in (*API, *DEVICE_API))


@needs_nvrtc
@pytest.mark.parametrize("case", sorted(BAD))
def test_the_cuda_library_checks_the_file_before_the_driver(
        case: str, cuda_cnn: dict[str, Path], cnn: dict[str, Path], tmp_path: Path) -> None:
    """The WEIGHTS status and its line, with or without a GPU (the driver is not loaded)."""
    damage, why = BAD[case]
    build = _copy(cuda_cnn["file"], tmp_path / "build")
    damage(build / "cnn.weights", cnn["other"] / "other.weights")
    lib = ctypes.CDLL(str(build / "cnn.so"))
    lib.cnn_status_message.restype = ctypes.c_char_p
    ctx = ctypes.c_void_p()
    assert lib.cnn_create(None, ctypes.byref(ctx)) == Status.WEIGHTS and not ctx.value
    message = lib.cnn_status_message(int(Status.WEIGHTS)).decode()
    assert message.startswith(f"cnn: weights file {build / 'cnn.weights'}")
    assert re.search(why, message) and "\n" not in message, message


@needs_nvrtc
@pytest.mark.skipif(unavailable() is not None, reason=f"host emulation of CUDA C: {unavailable()}")
def test_the_cuda_library_over_a_stand_in_driver_matches_onnxruntime(tmp_path: Path) -> None:
    """Weights from the file, uploaded at create: host and device pointers, two archs."""
    proc = subprocess.run([sys.executable, "-m", "tests.deploy.mock_cuda", "small_cnn",
                           "sm_90,sm_80", str(tmp_path), "90:-1", "86:-1", "--weights-file"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.splitlines()[-1])
    assert (tmp_path / "build" / "small_cnn.weights").exists()
    for report, arch in zip(reports, ("sm_90", "sm_80")):
        assert report["errors"] == [] and report["create"] == "" and report["live"] == 0
        assert report["host"] < 1e-4 and report["device"] < 1e-4 and report["archs"] == [arch]


@pytest.mark.gpu
@pytest.mark.parametrize("model_name", ["small_cnn", "resnet18"])
def test_on_the_gpu_from_c_and_load_it_matches_onnxruntime(model_name: str, tmp_path: Path,
                                                           c_runner) -> None:
    """Weights mapped, uploaded at create (45 MB for ResNet-18), unmapped; both pointer kinds."""
    from autosched.targets.host import detect_cuda_arch

    proto = small_cnn(image=IMAGE) if model_name == "small_cnn" else resnet18(image=64)
    kernels = aus.compile(from_onnx(proto), target=f"cuda -arch={detect_cuda_arch()}",
                          executor=False)
    export(kernels, tmp_path, name=model_name, weights_file=True)
    rng = np.random.default_rng()
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype) for v in kernels.graph.inputs}
    want = ort_run(proto, feeds)
    for flags in ([], ["-DDEVICE_POINTERS", "-ldl"]):
        _check(c_runner(flags=flags)(tmp_path, model_name, list(feeds.values()), _outputs(want)),
               want)
    _check(aus.load(tmp_path).run(feeds), want)
    _flip_a_bit(tmp_path / f"{model_name}.weights", tmp_path)
    with pytest.raises(ModelImportError, match="is corrupted"):
        aus.load(tmp_path)


def test_load_refuses_a_weights_file_others_can_change(cnn: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """As it refuses such a library: only the owner may change what the model computes."""
    build = _copy(cnn["file"], tmp_path / "build")
    (build / "cnn.weights").chmod(0o664)
    with pytest.raises(ModelImportError, match="cnn.weights: not loading weights from it"):
        aus.load(build)
    (build / "cnn.weights").unlink()
    (build / "cnn.weights").symlink_to(cnn["file"] / "cnn.weights")
    with pytest.raises(ModelImportError, match="cnn.weights is not a file in the build dir"):
        aus.load(build)
