"""Exporting a model without an executor (``aus.compile(..., executor=False)``): a CUDA model
becomes a library on a machine with NVRTC and a C compiler only, no pycuda and no GPU."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

import autosched as aus
from autosched.graph.compiler import CompiledKernels
from autosched.graph.deploy import export
from autosched.targets.model_api import API, DEVICE_API
from autosched.testing.models import ort_run, small_cnn
from importers.onnx import from_onnx
from tests.support.nvrtc import needs_nvrtc

ROOT = Path(__file__).resolve().parents[2]


@needs_nvrtc
def test_the_cli_exports_a_cuda_model_without_pycuda(tmp_path: Path) -> None:
    onnx.save(small_cnn(image=9), tmp_path / "m.onnx")
    out = tmp_path / "build"
    blocked = ("import sys; sys.modules['pycuda'] = sys.modules['pycuda.driver'] = None; "
               "from autosched.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", blocked, "compile", str(tmp_path / "m.onnx"),
                           "--target", "cuda -arch=sm_90", "-o", str(out), "--name", "net"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert {"README", "net.h", "net.so"} == {p.name for p in out.iterdir()}
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(out / "net.so")],
                             capture_output=True, text=True, check=True).stdout.split()[2::3]
    assert sorted(symbols) == sorted(f"net_{f}" for f in (*API, *DEVICE_API))
    lib = ctypes.CDLL(str(out / "net.so"))
    lib.net_target.restype = ctypes.c_char_p
    assert lib.net_target() == b"cuda -arch=sm_90"


def test_a_cpu_model_compiled_without_an_executor_exports_the_same_library(
        tmp_path: Path) -> None:
    proto = small_cnn(image=10)
    kernels = aus.compile(from_onnx(proto), target="llvm", executor=False)
    assert isinstance(kernels, CompiledKernels) and not hasattr(kernels, "run")
    export(kernels, tmp_path, name="cnn")
    x = {"input": np.random.default_rng().uniform(-1, 1, (1, 3, 10, 10)).astype(np.float32)}
    (got,) = aus.load(tmp_path).run(x)
    np.testing.assert_allclose(got, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
