"""The model-library loader (autosched/graph/loader.py) against hostile and broken build
dirs, and from many threads at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched.errors import ModelImportError, RuntimeError_
from autosched.graph.deploy import export
from autosched.graph.loader import load
from autosched.targets.elf import host_machine


def _model_proto(rng: np.random.Generator, name: str = "small") -> Any:
    """Conv -> Relu -> Reshape (a view) -> MatMul: intermediates, a constant and an alias."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    m = numpy_helper.from_array(rng.standard_normal((4 * 7 * 9, 5)).astype(np.float32), "m")
    shape = numpy_helper.from_array(np.array([1, 4 * 7 * 9], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])
    return helper.make_model(helper.make_graph(nodes, name, [x], [y], [w, m, shape]))


def _reference(proto: Any, x: np.ndarray) -> np.ndarray:
    from onnx import numpy_helper

    init = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    conv = np.einsum("nchwij,ocij->nohw", win, init["w"].astype(np.float64))
    return np.maximum(conv, 0).reshape(1, -1) @ init["m"]


@pytest.fixture(scope="module")
def compiled() -> tuple[Any, Any]:
    import autosched as aus
    from importers.onnx import from_onnx

    proto = _model_proto(np.random.default_rng())
    return aus.compile(from_onnx(proto), target="llvm"), proto


@pytest.fixture(scope="module")
def built(compiled: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, Any]:
    model, proto = compiled
    out = tmp_path_factory.mktemp("build") / "model"
    export(model, out)
    return out, proto


@pytest.fixture
def build(built: tuple[Path, Any], tmp_path: Path) -> Path:
    """A fresh copy of the build dir to spoil."""
    return Path(shutil.copytree(built[0], tmp_path / "build"))


def _x(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((1, 3, 7, 9)).astype(np.float32)


def test_the_build_runs_and_has_a_view(built: tuple[Path, Any], compiled: tuple[Any, Any],
                                       rng: np.random.Generator) -> None:
    path, proto = built
    assert compiled[0].aliases  # the Reshape is a view of the Relu's buffer
    m = load(path)
    x = _x(rng)
    np.testing.assert_allclose(m.run({"x": x})[0], _reference(proto, x), rtol=1e-4, atol=1e-4)


def test_an_export_under_a_group_umask_loads(compiled: tuple[Any, Any], tmp_path: Path,
                                             rng: np.random.Generator) -> None:
    """With umask 002 (user private groups) files come out group-writable; export makes its
    build dir writable by its owner only, so that the loader trusts it."""
    model, proto = compiled
    old = os.umask(0o002)
    try:
        export(model, tmp_path / "build")
    finally:
        os.umask(old)
    x = _x(rng)
    np.testing.assert_allclose(load(tmp_path / "build").run({"x": x})[0], _reference(proto, x),
                               rtol=1e-4, atol=1e-4)


def test_a_library_link_leaving_the_dir_is_refused(build: Path) -> None:
    (build / "small.so").unlink()
    libc = "/lib/x86_64-linux-gnu/libc.so.6" if host_machine() == "x86_64" else "/bin/sh"
    (build / "small.so").symlink_to(libc)
    with pytest.raises(ModelImportError, match="not a file in the build dir"):
        load(build)


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_library_or_dir_others_can_change_is_refused(build: Path, mode: int) -> None:
    for path in (build / "small.so", build):
        os.chmod(path, mode)
        with pytest.raises(ModelImportError, match="writable by its group or by everyone"):
            load(build)
        os.chmod(path, 0o755)


def test_one_library_per_build_dir(build: Path) -> None:
    shutil.copy(build / "small.so", build / "other.so")
    with pytest.raises(ModelImportError, match="must hold one model library"):
        load(build)
    (build / "other.so").unlink()
    (build / "small.so").rename(build / "bad-name.so")
    with pytest.raises(ModelImportError, match="must hold one model library"):
        load(build)


def test_a_file_that_is_not_a_library_is_refused(build: Path, rng: np.random.Generator
                                                 ) -> None:
    (build / "small.so").write_bytes(rng.bytes(4096))
    with pytest.raises(ModelImportError, match="is not a shared library"):
        load(build)


def test_a_library_without_the_api_is_refused(build: Path, tmp_path: Path) -> None:
    src = tmp_path / "f.c"
    src.write_text("int small_create(void) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(build / "small.so")],
                   check=True)
    with pytest.raises(ModelImportError, match="does not define small_run"):
        load(build)


# A library with the API whose introspection says what each case puts there.
FAKE = r"""
#include <stdint.h>
#include <stddef.h>
typedef struct { const char *name; const char *dtype; int32_t ndim; const int64_t *shape; } info;
static const int64_t shape[4] = {SHAPE};
static const info one = {NAME, DTYPE, NDIM, shape};
int32_t fake_create(const void *o, void **c) { *c = (void *)&one; return 0; }
int32_t fake_run(void *c, const void *const *i, void *const *o) { return 0; }
void fake_destroy(void *c) {}
int32_t fake_num_inputs(void) { return COUNT; }
int32_t fake_num_outputs(void) { return 1; }
const info *fake_input(int32_t i) { return INPUT; }
const info *fake_output(int32_t i) { return &one; }
const char *fake_target(void) { return "llvm"; }
const char *fake_version(void) { return "0"; }
const char *fake_status_message(int32_t s) { return "?"; }
"""
GOOD = {"SHAPE": "1, 2, 3, 4", "NAME": '"x"', "DTYPE": '"float32"', "NDIM": "4", "COUNT": "1",
        "INPUT": "i == 0 ? &one : NULL"}
HOSTILE = {
    "negative dim": ("SHAPE", "1, -2, 3, 4", "shape"),
    "huge tensor": ("SHAPE", "1 << 30, 1 << 30, 1 << 30, 4", "shape"),
    "many dims": ("NDIM", "100000", "dims"),
    "negative ndim": ("NDIM", "-1", "dims"),
    "unknown dtype": ("DTYPE", '"complex128"', "unknown dtype"),
    "no name": ("NAME", "NULL", "no string"),
    "many inputs": ("COUNT", "1 << 30", "inputs"),
    "no input": ("INPUT", "NULL", "is NULL"),
}


@pytest.mark.parametrize("case", ["good", *HOSTILE])
def test_hostile_introspection_is_named(tmp_path: Path, case: str) -> None:
    fields = dict(GOOD)
    if case != "good":
        key, value, _ = HOSTILE[case]
        fields[key] = value
    src = FAKE
    for key, value in fields.items():
        src = src.replace(key, value)
    build = tmp_path / "build"
    build.mkdir(mode=0o755)
    (tmp_path / "fake.c").write_text(src)
    subprocess.run(["cc", "-shared", "-fPIC", str(tmp_path / "fake.c"), "-o",
                    str(build / "fake.so")], check=True)
    if case == "good":
        assert load(build).graph.inputs[0].shape == (1, 2, 3, 4)
        return
    with pytest.raises(ModelImportError, match=HOSTILE[case][2]) as info:
        load(build)
    assert "fake.so" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or host_machine() != "x86_64",
                    reason="needs the aarch64 cross compiler on an x86-64 host")
def test_a_build_for_another_cpu_says_which(tmp_path: Path) -> None:
    import autosched as aus
    from importers.onnx import from_onnx

    graph = from_onnx(_model_proto(np.random.default_rng()))
    out = tmp_path / "build_arm"
    export(aus.compile(graph, target="llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"), out)
    with pytest.raises(ModelImportError, match="built for aarch64, this machine is x86_64"):
        load(out)


def test_eight_threads_share_one_model(built: tuple[Path, Any],
                                       rng: np.random.Generator) -> None:
    """10,000 runs from 8 threads at once (a context each), every output checked."""
    path, proto = built
    m = load(path, threads=1)
    xs = [_x(rng) for _ in range(8)]
    expected = [m.run({"x": x})[0] for x in xs]
    np.testing.assert_allclose(expected[0], _reference(proto, xs[0]), rtol=1e-4, atol=1e-4)
    wrong: list[int] = []
    barrier = threading.Barrier(8)

    def work(t: int) -> None:
        barrier.wait()
        for _ in range(1250):
            (y,) = m.run({"x": xs[t]})
            if not np.array_equal(y, expected[t]):
                wrong.append(t)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} of 10,000 runs returned another thread's result"


def test_a_kernel_failure_stops_the_run(tmp_path: Path, rng: np.random.Generator) -> None:
    """A kernel's status (an index out of range) is checked after each call, not dropped."""
    from onnx import TensorProto, helper

    import autosched as aus
    from importers.onnx import from_onnx

    d = helper.make_tensor_value_info("d", TensorProto.FLOAT, [5, 3])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])
    node = helper.make_node("Gather", ["d", "i"], ["y"])
    proto = helper.make_model(helper.make_graph([node], "gather", [d, i], [y]))
    export(aus.compile(from_onnx(proto), target="llvm"), tmp_path / "gather")
    m = load(tmp_path / "gather")
    data = rng.standard_normal((5, 3)).astype(np.float32)
    index = rng.integers(-5, 5, 4)
    np.testing.assert_array_equal(m.run({"d": data, "i": index})[0], data[index])
    index[rng.integers(4)] = 5 + rng.integers(100)
    with pytest.raises(RuntimeError_, match="out of range"):
        m.run({"d": data, "i": index})


def test_elf_reader_survives_corrupt_libraries(built: tuple[Path, Any],
                                               rng: np.random.Generator) -> None:
    """Random byte changes and truncations: the reader answers or raises ElfError, nothing
    else (it reads untrusted files before they are loaded)."""
    from autosched.targets.elf import ElfError, read_shared_library

    path, _ = built
    lib = (path / "small.so").read_bytes()
    assert read_shared_library(lib).machine == host_machine()
    for _ in range(300):
        data = bytearray(lib[: int(rng.integers(1, len(lib) + 1))])
        for at in rng.integers(0, len(data), int(rng.integers(1, 20))):
            data[at] = int(rng.integers(256))
        try:
            read_shared_library(bytes(data))
        except ElfError:
            pass
    with pytest.raises(ElfError, match="not an ELF file"):
        read_shared_library(rng.bytes(200))


def test_an_unnamed_graph_loads(tmp_path: Path, rng: np.random.Generator) -> None:
    import autosched as aus
    from importers.onnx import from_onnx

    proto = _model_proto(rng, name="")
    export(aus.compile(from_onnx(proto), target="llvm"), tmp_path / "b")
    m = load(tmp_path / "b")
    x = _x(rng)
    assert m.name == "model"
    np.testing.assert_allclose(m.run({"x": x})[0], _reference(proto, x), rtol=1e-4, atol=1e-4)
