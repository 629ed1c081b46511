"""The deployed-model loader (autosched/graph/deploy.py) against hostile and broken build dirs,
and from many threads at once."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autosched.errors import ModelImportError
from autosched.graph.deploy import export, load
from autosched.targets.elf import host_machine

LIBC = "/lib/x86_64-linux-gnu/libc.so.6" if host_machine() == "x86_64" else "libc.so.6"


def _model_proto(rng: np.random.Generator) -> Any:
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
    return helper.make_model(helper.make_graph(nodes, "small", [x], [y], [w, m, shape]))


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


def _edit(build: Path, change: Callable[[dict[str, Any]], None]) -> None:
    m = json.loads((build / "manifest.json").read_text())
    change(m)
    (build / "manifest.json").write_text(json.dumps(m))


def _x(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((1, 3, 7, 9)).astype(np.float32)


def test_the_build_runs_and_has_a_view(built: tuple[Path, Any], rng: np.random.Generator) -> None:
    path, proto = built
    m = load(path)
    assert m.manifest["aliases"] and m.manifest["machine"] == host_machine()
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


def test_a_manifest_cannot_call_a_system_library(build: Path, tmp_path: Path) -> None:
    """The attack: libc's ``system`` on a constant that holds a shell command."""
    marker = tmp_path / "pwned"
    np.savez(build / "constants.npz", c0=np.frombuffer(f"touch {marker}\0".encode(), np.uint8))

    def attack(lib: str, symbol: str = "system") -> Callable[[dict[str, Any]], None]:
        def change(m: dict[str, Any]) -> None:
            m["values"]["cmd"] = [[len(f"touch {marker}") + 1], "uint8"]
            m["constants"] = {"cmd": "c0"}
            m["kernels"] = [{"task": "t", "lib": lib, "symbol": symbol, "args": ["cmd", "y"],
                             "n_inputs": 1, "threads": False}]
            m["aliases"] = {}
            m["libraries"][lib] = {"sha256": "0" * 64, "params": [[[1], "uint8"]] * 2}
        return change

    for lib in (LIBC, "../../lib/libc.so.6", "libc.so.6", "kernel0_system.so"):
        _edit(build, attack(lib))
        with pytest.raises(ModelImportError, match="manifest.json (kernels|libraries)"):
            load(build)
    assert not marker.exists()


def test_a_symbol_the_library_does_not_define_is_refused(build: Path) -> None:
    """A copy of a real kernel library named for ``system``: dlsym would find libc's."""
    import hashlib

    m = json.loads((build / "manifest.json").read_text())
    lib = m["kernels"][0]["lib"]
    shutil.copy(build / lib, build / "kernel0_system.so")
    sha = hashlib.sha256((build / lib).read_bytes()).hexdigest()

    def change(m: dict[str, Any]) -> None:
        for k in m["kernels"]:
            if k["lib"] == lib:
                k["lib"], k["symbol"] = "kernel0_system.so", "system"
        m["libraries"]["kernel0_system.so"] = {**m["libraries"].pop(lib), "sha256": sha}

    _edit(build, change)
    with pytest.raises(ModelImportError, match="does not define the kernel function 'system'"):
        load(build)


def test_a_library_link_leaving_the_dir_is_refused(build: Path) -> None:
    lib = json.loads((build / "manifest.json").read_text())["kernels"][0]["lib"]
    os.unlink(build / lib)
    os.symlink(os.path.realpath(LIBC), build / lib)
    with pytest.raises(ModelImportError, match="is not a file in the build dir"):
        load(build)


def test_constants_must_be_a_file_in_the_dir(build: Path, tmp_path: Path) -> None:
    os.replace(build / "constants.npz", tmp_path / "elsewhere.npz")
    os.symlink(tmp_path / "elsewhere.npz", build / "constants.npz")
    with pytest.raises(ModelImportError, match="constants.npz is not a file in the build dir"):
        load(build)
    os.unlink(build / "constants.npz")
    os.mkfifo(build / "constants.npz")  # reading it would block forever
    with pytest.raises(ModelImportError, match="constants.npz is not a file in the build dir"):
        load(build)


def test_a_changed_or_open_library_is_refused(build: Path) -> None:
    lib = json.loads((build / "manifest.json").read_text())["kernels"][0]["lib"]
    for name in (lib, "manifest.json", "constants.npz"):
        mode = os.stat(build / name).st_mode
        os.chmod(build / name, mode | 0o020)
        with pytest.raises(ModelImportError, match=f"{name}: .*writable by its group"):
            load(build)
        os.chmod(build / name, mode)
    with open(build / lib, "ab") as f:
        f.write(b"\0")
    with pytest.raises(ModelImportError, match="changed since export"):
        load(build)
    os.chmod(build, 0o777)
    with pytest.raises(ModelImportError, match="not loading code from it"):
        load(build)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(m: dict[str, Any]) -> None:
        node = m
        for key in path[:-1]:
            node = node[key] if not callable(key) else key(m)
        node[path[-1]] = value
    return change


def _written(m: dict[str, Any]) -> str:
    k = m["kernels"][-1]  # the output: no view of it checks its size first
    return k["args"][k["n_inputs"]]


def _first_lib(m: dict[str, Any]) -> dict[str, Any]:
    return m["libraries"][m["kernels"][0]["lib"]]


HOSTILE = {  # field -> (change, what the error names)
    "a value smaller than its kernel writes": (
        lambda m: m["values"][_written(m)].__setitem__(0, [1]), "takes .* elements"),
    "a negative dim": (lambda m: m["values"]["x"].__setitem__(0, [1, -3, 7, 9]), r"x.*-3"),
    "a boolean dim": (lambda m: m["values"]["x"].__setitem__(0, [True, 3, 7, 9]), "True"),
    "a string dim": (lambda m: m["values"]["x"].__setitem__(0, ["1", 3, 7, 9]), "expected a int"),
    "a huge tensor": (lambda m: m["values"]["x"].__setitem__(0, [2**31 - 1] * 4), "bytes"),
    "an unknown dtype": (lambda m: m["values"]["x"].__setitem__(1, "object"), "'object'"),
    "an input that differs from its value": (
        lambda m: m["inputs"][0].__setitem__(2, "float64"), "differs from the input"),
    "n_inputs past the args": (_set(("kernels", 0, "n_inputs"), 99), "n_inputs"),
    "an unknown argument": (lambda m: m["kernels"][0]["args"].__setitem__(0, "nope"), "'nope'"),
    "a kernel writing an input": (
        lambda m: m["kernels"][0].__setitem__("n_inputs", 0), "is written here"),
    "a read before the write": (lambda m: m["kernels"].reverse(), "read before"),
    "a symbol not its library's": (_set(("kernels", 0, "symbol"), "other"), "symbol"),
    "a library path": (_set(("kernels", 0, "lib"), "/tmp/kernel0_x.so"), "lib"),
    "a bad hash": (lambda m: _first_lib(m).__setitem__("sha256", "x" * 64), "sha256"),
    "missing params": (lambda m: _first_lib(m)["params"].pop(), "arguments"),
    "a view of another size": (
        lambda m: m["values"][next(iter(m["aliases"]))][0].append(2), "cannot view"),
    "an unknown output": (_set(("outputs", 0), "nope"), "outputs"),
    "a constant key": (
        lambda m: m["constants"].__setitem__(next(iter(m["constants"])), "../x"), "constants"),
    "the version": (_set(("version",), 1), "version: 1 is not 2"),
    "another machine": (_set(("machine",), "aarch64"), "is for aarch64"),
    "a list": (lambda m: m.clear(), "version"),
    "a feature name": (_set(("cpu_features",), ["avx; rm -rf"]), "cpu_features"),
    "threads not a flag": (_set(("kernels", 0, "threads"), "yes"), "threads"),
    "two inputs of one name": (lambda m: m["inputs"].append(m["inputs"][0]), "one name"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifest_fields_are_named(build: Path, case: str) -> None:
    change, needle = HOSTILE[case]
    _edit(build, change)
    with pytest.raises(ModelImportError, match=needle) as info:
        load(build)
    assert str(build) in str(info.value)


@pytest.mark.parametrize("text", ["not json {", "[1, 2]", "[" * 100_000 + "]" * 100_000])
def test_a_manifest_that_is_not_an_object(build: Path, text: str) -> None:
    (build / "manifest.json").write_text(text)
    with pytest.raises(ModelImportError, match="manifest.json file"):
        load(build)


def test_constants_are_checked(build: Path, rng: np.random.Generator) -> None:
    key = next(iter(json.loads((build / "manifest.json").read_text())["constants"].values()))
    np.savez(build / "constants.npz", **{key: rng.standard_normal(3).astype(np.float32)})
    with pytest.raises(ModelImportError, match="constants.npz: .*stores|constants.npz: .*not"):
        load(build)
    (build / "constants.npz").write_bytes(rng.bytes(100))
    with pytest.raises(ModelImportError, match="constants.npz"):
        load(build)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None or host_machine() != "x86_64",
                    reason="needs the aarch64 cross compiler on an x86-64 host")
def test_a_build_for_another_cpu_says_which(tmp_path: Path) -> None:
    import autosched as aus
    from importers.onnx import from_onnx

    graph = from_onnx(_model_proto(np.random.default_rng()))
    out = tmp_path / "build_arm"
    export(aus.compile(graph, target="llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"), out)
    with pytest.raises(ModelImportError, match="is for aarch64 .*this machine is x86_64"):
        load(out)
    _edit(out, _set(("machine",), "x86_64"))  # the libraries still say what they are
    with pytest.raises(ModelImportError, match="kernel.*is aarch64 code"):
        load(out)


def test_a_build_using_cpu_features_this_cpu_lacks_says_which(build: Path) -> None:
    from autosched.graph.deploy import CPU_FLAGS, _cpuinfo_flags

    flags = _cpuinfo_flags()
    lacking = sorted(f for f, flag in CPU_FLAGS.items() if flags and flag not in flags)
    if not lacking:
        pytest.skip("this CPU has every feature the loader checks (or no /proc/cpuinfo flags)")
    _edit(build, lambda m: m["cpu_features"].append(lacking[0]))
    with pytest.raises(ModelImportError, match=f"CPU features this CPU lacks: {lacking[0]}"):
        load(build)


def test_eight_threads_share_one_model(built: tuple[Path, Any],
                                       rng: np.random.Generator) -> None:
    """10,000 runs from 8 threads at once, every output checked (about 2 s)."""
    path, proto = built
    m = load(path)
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
    from autosched.errors import RuntimeError_
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
    lib = next(path.glob("kernel*.so")).read_bytes()
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


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*path, k))] + [path]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*path, i))] + [path]
    return [path]


def test_random_manifest_values_load_or_are_named(build: Path,
                                                  rng: np.random.Generator) -> None:
    """Any field replaced by any JSON value: a ModelImportError naming the build dir, or a
    model that runs (the replacement was harmless: a name, or another output), never another
    exception."""
    good = json.loads((build / "manifest.json").read_text())
    paths = [p for p in _leaves(good) if p]
    x = _x(rng)
    expected = load(build).run({"x": x})[0]
    junk = [-1, 0, 2**31, 2**70, 1.5, True, None, "", "x", "../kernel0_x.so", [], [1], {},
            {"a": 1}, "float64", [[1], "uint8"]]
    for _ in range(400):
        m = json.loads(json.dumps(good))
        path = paths[int(rng.integers(len(paths)))]
        node = m
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = junk[int(rng.integers(len(junk)))]
        (build / "manifest.json").write_text(json.dumps(m))
        try:
            model = load(build)
        except ModelImportError as exc:
            assert str(build) in str(exc)
            continue
        outs = model.run({"x": x})
        assert [o.shape for o in outs] == [model.graph.values[o].shape for o in m["outputs"]]
        if m["outputs"] == good["outputs"] and m["aliases"] == good["aliases"]:
            np.testing.assert_array_equal(outs[0], expected)


def test_an_unnamed_graph_and_task_load(build: Path, rng: np.random.Generator) -> None:
    def change(m: dict[str, Any]) -> None:
        m["name"] = ""
        for k in m["kernels"]:
            k["task"] = ""

    _edit(build, change)
    assert load(build).run({"x": _x(rng)})[0].shape == (1, 5)
