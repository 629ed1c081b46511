"""Models compiled to one library and run from C, on the host and on aarch64 under qemu,
against onnxruntime's outputs computed on the host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

import autosched as aus
from autosched.graph.deploy import export
from autosched.testing.models import ort_run, resnet18, small_cnn
from importers.onnx import from_onnx
from tests.deploy.c_driver import DriverError

AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
MODELS = {"small_cnn": lambda: small_cnn(image=20), "resnet18": lambda: resnet18(image=64)}


def _deploy(model_name: str, target: str, out: Path) -> tuple[object, dict[str, np.ndarray]]:
    proto = MODELS[model_name]()
    graph = from_onnx(proto)
    export(aus.compile(graph, target=target), out, name=model_name)
    rng = np.random.default_rng(7)
    feeds = {v.name: rng.uniform(-1, 1, v.shape).astype(v.dtype) for v in graph.inputs}
    return proto, feeds


def _check(proto: object, feeds: dict[str, np.ndarray], got: list[np.ndarray]) -> None:
    want = ort_run(proto, feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_host_library_from_c_matches_onnxruntime(model_name: str, tmp_path: Path,
                                                 c_runner) -> None:
    build = tmp_path / "build"
    proto, feeds = _deploy(model_name, "llvm", build)
    want = ort_run(proto, feeds)
    got = c_runner()(build, model_name, list(feeds.values()),
                     [(w.shape, str(w.dtype)) for w in want])
    _check(proto, feeds, got)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_aarch64_library_under_qemu_matches_onnxruntime(model_name: str, tmp_path: Path,
                                                        c_runner) -> None:
    run = c_runner("aarch64")
    build = tmp_path / "build"
    proto, feeds = _deploy(model_name, AARCH64, build)
    want = ort_run(proto, feeds)
    got = run(build, model_name, list(feeds.values()), [(w.shape, str(w.dtype)) for w in want])
    _check(proto, feeds, got)


def test_an_aarch64_library_on_a_cpu_without_its_extensions_fails_at_create(
        tmp_path: Path, c_runner) -> None:
    """Built with dot-product instructions: runs on qemu's default CPU, and on a Cortex-A72
    (no dotprod) returns the CPU status from create instead of dying of SIGILL."""
    run = c_runner("aarch64")  # skips first where the cross toolchain or qemu is missing
    build = tmp_path / "build"
    proto, feeds = _deploy("small_cnn", AARCH64 + " -mattr=+neon,+dotprod", build)
    want = ort_run(proto, feeds)
    outputs = [(w.shape, str(w.dtype)) for w in want]
    _check(proto, feeds, run(build, "small_cnn", list(feeds.values()), outputs))
    with pytest.raises(DriverError, match="create: this CPU lacks an instruction set"):
        c_runner("aarch64", cpu="cortex-a72")(build, "small_cnn", list(feeds.values()), outputs)


def test_only_the_api_is_exported_and_kernels_named_alike_do_not_clash(tmp_path: Path) -> None:
    """small_cnn has two winograd convolutions: kernels named alike, one library."""
    build = tmp_path / "build"
    _deploy("small_cnn", "llvm", build)
    lib = build / "small_cnn.so"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout.split()[2::3]
    assert sorted(symbols) == sorted(f"small_cnn_{f}" for f in (
        "create", "run", "destroy", "num_inputs", "num_outputs", "input", "output", "target",
        "version", "status_message"))
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    libs = {line.split("[")[1].split("]")[0] for line in needed.splitlines() if "NEEDED" in line}
    # parallel loops run on the thread pool linked into the library: no libgomp
    assert libs <= {"libc.so.6", "libm.so.6"}
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True,
                               text=True, check=True).stdout
    assert "GOMP_" not in undefined and "omp_" not in undefined
    assert {"README", "small_cnn.h", "small_cnn.so"} == {p.name for p in build.iterdir()}
