"""Cross compilation: a scheduled kernel built for aarch64 (cortex-a72), linked into a shared
library with Debian's cross gcc, driven by a small C program under qemu-aarch64, compared with
numpy. Skips, saying what is missing, without the cross toolchain or qemu."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import RuntimeError_
from autosched.targets.llvm.c_types import c_type

AARCH64 = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"

# The driver and the test draw inputs from the same generator: xorshift64, values in [-1, 1).
DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
%(decl)s
static uint64_t state = %(seed)dULL;
static float next_value(void) {
    state ^= state << 13; state ^= state >> 7; state ^= state << 17;
    return (float)((state >> 40) / 16777216.0 * 2.0 - 1.0);
}
int main(void) {
%(alloc)s
%(call)s
%(dump)s
    return 0;
}
"""


def _xorshift(seed: int, count: int) -> np.ndarray:
    mask = (1 << 64) - 1
    s, out = seed, np.empty(count, "float32")
    for i in range(count):
        s ^= (s << 13) & mask
        s ^= s >> 7
        s ^= (s << 17) & mask
        out[i] = np.float32((s >> 40) / 16777216.0 * 2.0 - 1.0)
    return out, s


def _missing() -> str | None:
    for tool in (CROSS_CC, QEMU):
        if shutil.which(tool) is None:
            return (f"{tool} is not installed (apt-get install -y qemu-user gcc-aarch64-linux-gnu "
                    "libc6-dev-arm64-cross)")
    return None


def _matmul_tanh(M: int, N: int, K: int):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((M, N), lambda i, j: te.tanh(C[i, j]) + te.exp(C[i, j] * 0.1), name="D")
    s = te.create_schedule(D.op)
    i, j = s[C].op.axis
    (kk,) = s[C].op.reduce_axis
    jo, ji = s[C].split(j, factor=4)  # one NEON vector
    s[C].reorder(i, jo, kk, ji)
    s[C].vectorize(ji)
    s[C].parallel(i)
    di, dj = s[D].op.axis
    djo, dji = s[D].split(dj, factor=8)
    s[D].vectorize(dji)
    return s, [A, B, D]


def test_aarch64_shared_library_under_qemu(tmp_path):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    M, N, K, seed = 13, 22, 9, 12345
    s, args = _matmul_tanh(M, N, K)
    mod = aus.build(s, args, target=AARCH64, name="mm_tanh")
    asm = mod.get_assembly()
    assert "fmla" in asm or "fmul" in asm  # AArch64 NEON / scalar FP code
    with pytest.raises(RuntimeError_, match="aarch64"):
        mod(np.zeros((M, K), "float32"))
    lib = mod.export_library(tmp_path / "libmm.so")
    sizes = [M * K, K * N, M * N]
    names = ["A", "B", "D"]
    alloc = "\n".join(
        f"    {c_type('float32')} *{n} = aligned_alloc(64, {4 * ((sz + 15) // 16 * 16)});"
        for n, sz in zip(names, sizes))
    alloc += "\n" + "\n".join(
        f"    for (int i = 0; i < {sz}; i++) {n}[i] = next_value();"
        for n, sz in zip(names[:2], sizes[:2]))
    driver = DRIVER % {
        "decl": mod.c_declaration(), "seed": seed, "alloc": alloc,
        "call": "    mm_tanh(A, B, D);",
        "dump": f'    for (int i = 0; i < {sizes[2]}; i++) printf("%.9g\\n", D[i]);',
    }
    (tmp_path / "driver.c").write_text(driver)
    exe = tmp_path / "driver"
    subprocess.run([CROSS_CC, "-O1", "-o", str(exe), str(tmp_path / "driver.c"), str(lib),
                    f"-Wl,-rpath,{tmp_path}"], check=True, capture_output=True, text=True)
    run = subprocess.run([QEMU, "-L", SYSROOT, str(exe)], capture_output=True, text=True,
                         timeout=120, env={"OMP_NUM_THREADS": "2", "LD_LIBRARY_PATH": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    got = np.array([float(x) for x in run.stdout.split()], "float32").reshape(M, N)
    vals, _ = _xorshift(seed, M * K + K * N)
    a = vals[: M * K].reshape(M, K)
    b = vals[M * K:].reshape(K, N)
    c = a.astype("float64") @ b.astype("float64")
    want = np.tanh(c) + np.exp(c * 0.1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cross_object_file_without_a_linker(tmp_path):
    """save_object needs no toolchain: an AArch64 ELF relocatable comes out."""
    s, args = _matmul_tanh(4, 8, 3)
    mod = aus.build(s, args, target=AARCH64, name="mm_tanh")
    data = open(mod.save_object(tmp_path / "k.o"), "rb").read()
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 183  # EM_AARCH64
