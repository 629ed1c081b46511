"""The on-disk caches (autosched/cache.py) use a file only when its folder is private, it is the
user's own, writable by no one else, and its bytes match the SHA-256 stored with it; anything
else is rebuilt, with one warning."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from autosched import cache
from autosched.cache import DiskCache, untrusted


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOSCHED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_WARNED", set())
    return tmp_path / "cache"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_stored_files_come_back_and_are_private(cache_root: Path) -> None:
    data = np.random.default_rng().bytes(257)
    c = DiskCache("cuda")
    c.write("k.cubin", data)
    assert c.read("k.cubin") == data and c.verified("k.cubin") == cache_root / "cuda/k.cubin"
    assert _mode(cache_root / "cuda") == 0o700 and _mode(cache_root / "cuda/k.cubin") == 0o600
    assert c.read("absent.cubin") is None


@pytest.mark.parametrize("plant", ["no hash", "other bytes", "world-writable", "group-writable"])
def test_planted_or_tampered_files_are_refused_with_one_warning(cache_root: Path,
                                                                plant: str) -> None:
    rng = np.random.default_rng()
    c = DiskCache("cuda")
    c.write("k.cubin", rng.bytes(64))
    path = cache_root / "cuda/k.cubin"
    if plant == "no hash":
        (cache_root / "cuda/k.cubin.sha256").unlink()
    elif plant == "other bytes":
        path.write_bytes(rng.bytes(64))
    else:
        os.chmod(path, 0o602 if plant == "world-writable" else 0o620)
    with pytest.warns(UserWarning, match="not using .*k.cubin: it"):
        assert c.read("k.cubin") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per folder: the second refusal is silent
        assert c.verified("k.cubin") is None
    fresh = rng.bytes(64)
    c.write("k.cubin", fresh)  # rebuilt over the refused file
    assert c.read("k.cubin") == fresh


def test_a_file_of_another_user_is_refused(cache_root: Path) -> None:
    st = os.stat_result((stat.S_IFREG | 0o600, 0, 0, 1, os.getuid() + 1, 0, 0, 0, 0, 0))
    assert "owned by uid" in untrusted(st)
    mine = os.stat_result((stat.S_IFREG | 0o644, 0, 0, 1, os.getuid(), 0, 0, 0, 0, 0))
    assert untrusted(mine) is None
    if os.getuid() != 0:
        pytest.skip("only root can give a file to another user")
    c = DiskCache("cuda")
    c.write("k.cubin", b"x")
    os.chown(cache_root / "cuda/k.cubin", 65534, 65534)
    with pytest.warns(UserWarning, match="owned by uid 65534"):
        assert c.read("k.cubin") is None


def test_an_open_folder_is_tightened_and_a_foreign_one_replaced(
        cache_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (cache_root / "cuda").mkdir(parents=True, mode=0o777)
    os.chmod(cache_root / "cuda", 0o777)
    assert DiskCache("cuda").folder == cache_root / "cuda"
    assert _mode(cache_root / "cuda") == 0o700
    monkeypatch.setattr(os, "getuid", lambda: os.stat(cache_root).st_uid + 1)
    with pytest.warns(UserWarning, match="not using .*cuda: it is owned by uid"):
        folder = DiskCache("cuda").folder
    assert folder != cache_root / "cuda" and _mode(folder) == 0o700


def test_nvrtc_ignores_a_planted_cubin(cache_root: Path) -> None:
    pytest.importorskip("cuda.bindings")
    from autosched.targets.cuda import nvrtc

    src = f'extern "C" __global__ void k(float* a) {{ a[0] = {np.random.rand()}f; }}'
    first = nvrtc.compile_cuda(src, "sm_90")
    (cubin,) = (cache_root / "cuda").glob("*.cubin")
    cubin.write_bytes(b"planted" + first.data[7:])
    nvrtc._MEMORY.clear()
    with pytest.warns(UserWarning, match="do not match the SHA-256"):
        again = nvrtc.compile_cuda(src, "sm_90")
    assert again.data == first.data and cubin.read_bytes() == first.data


_PLANT = textwrap.dedent("""\
    #include <stdio.h>
    __attribute__((constructor)) static void planted(void) {
        FILE *f = fopen(MARKER, "w"); if (f) fclose(f);
    }
""")

_RUN = textwrap.dedent("""\
    import numpy as np, sys
    import autosched as aus
    from autosched import te
    from autosched.targets.cuda.host_emulate import run_on_host
    A = te.placeholder((37,), name="A")
    B = te.compute((37,), lambda i: A[i] * 3.0 + 1.0, name="B")
    mod = aus.build(te.create_schedule(B.op), [A, B], target="cuda -arch=sm_90")
    a = np.array([float(x) for x in sys.argv[1:]], dtype="float32")
    b = np.full(37, np.nan, "float32")
    run_on_host(mod, a, b)
    print(" ".join(repr(float(v)) for v in b))
""")


def test_host_emulation_does_not_load_a_planted_library(cache_root: Path,
                                                        tmp_path: Path) -> None:
    """A library planted at the cache's predictable name is compiled again, never loaded (a
    fresh process each time: the dynamic loader keeps a loaded path for the process)."""
    pytest.importorskip("cuda.bindings")
    from autosched.targets.cuda.host_emulate import unavailable

    if unavailable():
        pytest.skip(unavailable())
    a = np.random.default_rng().uniform(-1, 1, 37).astype("float32")
    run = [sys.executable, "-c", _RUN, *map(repr, a.tolist())]

    def emulate() -> np.ndarray:
        proc = subprocess.run(run, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return np.array(proc.stdout.split(), dtype="float32")

    np.testing.assert_allclose(emulate(), a * 3 + 1, rtol=1e-6)
    (so,) = (cache_root / "cuda-host").glob("*.so")
    marker = tmp_path / "planted-code-ran"
    plant = tmp_path / "plant.c"
    plant.write_text(_PLANT)
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', str(plant), "-o",
                    str(so)], check=True)
    np.testing.assert_allclose(emulate(), a * 3 + 1, rtol=1e-6)
    assert not marker.exists()
