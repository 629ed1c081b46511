"""Tests of deployed model libraries (autosched/graph/deploy.py, graph/loader.py): models
compiled to one .so, run by a C program (c_driver.py: on the host, and cross-compiled for
aarch64 under qemu-aarch64: no Python inside) and by ``autosched.load``, compared with
onnxruntime on the host.

Fixtures: ``c_runner``, which builds the C driver for a build dir and runs it on input arrays.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from tests.deploy.c_driver import DRIVER, DriverError, Runner, tools


@pytest.fixture
def c_runner(tmp_path: Path) -> Callable[..., Runner]:
    """``c_runner(arch)(build_dir, name, inputs, outputs)``: the driver built with the host's
    cc (arch None) or the cross compiler, run (under qemu for a cross arch, emulating ``cpu``
    when given; ``flags``: more compiler flags, such as -DDEVICE_POINTERS -ldl) on ``inputs``,
    with the weights file ``weights`` when given (else the library's own);
    returns the outputs, given as (shape, dtype). A driver that
    fails raises DriverError with its exit status and stderr."""

    def make(arch: str | None = None, threads: int = 2, cpu: str | None = None,
             flags: Sequence[str] = ()) -> Runner:
        compiler, prefix = tools(arch, cpu)

        def run(build: Path, name: str, inputs: Sequence[np.ndarray],
                outputs: Sequence[tuple[tuple[int, ...], str]],
                weights: Path | None = None) -> list[np.ndarray]:
            src = tmp_path / "driver.c"
            src.write_text(DRIVER.replace("NAME", name))
            exe = tmp_path / "driver"
            subprocess.run([compiler, "-O1", "-std=c11", f"-I{build}", str(src), "-o", str(exe),
                            str(build / f"{name}.so"), f"-Wl,-rpath,{build}", *flags], check=True)
            (tmp_path / "in.bin").write_bytes(b"".join(np.ascontiguousarray(a).tobytes()
                                                       for a in inputs))
            proc = subprocess.run([*prefix, str(exe), str(tmp_path / "in.bin"),
                                   str(tmp_path / "out.bin"), str(threads),
                                   *([str(weights)] if weights else [])],
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode:
                raise DriverError(f"driver exited {proc.returncode}: {proc.stderr.strip()}")
            data = (tmp_path / "out.bin").read_bytes()
            arrays, at = [], 0
            for shape, dtype in outputs:
                n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                arrays.append(np.frombuffer(data[at: at + n], dtype).reshape(shape))
                at += n
            assert at == len(data)
            return arrays

        return run

    return make
