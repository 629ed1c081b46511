"""Every error a user can cause prints one line on stderr and exits 2; ``--debug`` adds the
traceback. Bugs (any other exception) keep their traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autosched import errors
from autosched.cli import main
from tests.support.cli import one_line_error


def _model(path: Path, op: str, dtypes: tuple[int, ...] = (1,)) -> Path:
    """A one-node ONNX model: ``op`` on inputs x0, x1, ... (ONNX dtype codes) into y."""
    import onnx
    from onnx import helper

    ins = [helper.make_tensor_value_info(f"x{i}", t, [2, 3]) for i, t in enumerate(dtypes)]
    y = helper.make_tensor_value_info("y", dtypes[0], [2, 3])
    node = helper.make_node(op, [v.name for v in ins], ["y"])
    onnx.save(helper.make_model(helper.make_graph([node], "m", ins, [y])), str(path))
    return path


@pytest.mark.parametrize("command", [["run"], ["compile", "-o", "build"], ["tune", "--trials", "1"],
                                     ["bench"], ["inspect"]])
def test_model_import_error_is_one_line(tmp_path: Path, command: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _model(tmp_path / "mixed.onnx", "Add", (1, 7))  # float32 + int64: not importable
    argv = [command[0], str(path), *command[1:]]
    one_line_error(capsys, argv, f"autosched {command[0]}: ModelImportError", "Add")


def test_missing_and_corrupt_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.onnx")
    one_line_error(capsys, ["run", missing], "missing.onnx", "does not exist")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(np.random.default_rng().bytes(64))
    one_line_error(capsys, ["compile", str(corrupt), "-o", str(tmp_path / "b")], "corrupt.onnx")
    one_line_error(capsys, ["run", str(tmp_path)], str(tmp_path), "NAME.so")


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_model(tmp_path / "relu.onnx", "Relu"))
    one_line_error(capsys, ["run", path, "--shape", "x0=2,a"], "--shape 'x0=2,a'", "NAME=D0")
    one_line_error(capsys, ["inspect", path, "--shape", "2,3"], "--shape '2,3'")
    one_line_error(capsys, ["run", path, "--input", "nope=x.npy"], "--input", "['x0']")
    one_line_error(capsys, ["run", path, "--input", f"x0={tmp_path / 'absent.npy'}"],
                    "absent.npy", "check the path")
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    one_line_error(capsys, ["run", path, "--input", f"x0={pickled}"], "objects.npy",
                    "numpy.save")
    os.mkfifo(tmp_path / "fifo.npy")  # reading a FIFO blocks forever
    one_line_error(capsys, ["run", path, "--input", f"x0={tmp_path / 'fifo.npy'}"],
                    "fifo.npy is not a regular file")
    one_line_error(capsys, ["run", str(tmp_path / "fifo.npy")], "fifo.npy is not a regular "
                    "file or a build dir")
    one_line_error(capsys, ["inspect", str(tmp_path / "fifo.npy")], "model: ")
    one_line_error(capsys, ["run", path, "--log", str(tmp_path / "fifo.npy")], "--log: ")
    one_line_error(capsys, ["compile", str(tmp_path), "-o", "b"], "is not a regular file")
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.random.default_rng().standard_normal((3, 2)).astype(np.float32))
    one_line_error(capsys, ["run", path, "--input", f"x0={wrong}"], "x0", "[2, 3]")
    one_line_error(capsys, ["tune-op", "nosuchop", "4"], "TEError", "gemm")


@pytest.mark.parametrize("kind", [errors.TEError, errors.ScheduleError, errors.LowerError,
                                  errors.CompileError, errors.RuntimeError_,
                                  errors.MeasureError, errors.ModelImportError])
def test_every_error_type_is_one_line(kind: type[Exception], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import importers.inspect as inspect

    def fail(*args: object, **kwargs: object) -> str:
        raise kind("stage C: split factor 0 for axis i\nsecond line of detail")

    monkeypatch.setattr(inspect, "inspect_model", fail)
    path = str(_model(tmp_path / "relu.onnx", "Relu"))
    where = f"{path}: " if kind is errors.ModelImportError else ""  # the model is at fault
    err = one_line_error(capsys, ["inspect", path], f"{kind.__name__}: {where}stage C",
                          "1 more lines with --debug")
    assert "second line" not in err
    assert main(["inspect", path, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "second line of detail" in err


def test_a_bug_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importers.inspect as inspect

    def bug(*args: object, **kwargs: object) -> str:
        raise KeyError("internal")

    monkeypatch.setattr(inspect, "inspect_model", bug)
    with pytest.raises(KeyError):
        main(["inspect", str(_model(tmp_path / "relu.onnx", "Relu"))])


def test_ctrl_c_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    import importers.inspect as inspect

    def interrupted(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(inspect, "inspect_model", interrupted)
    assert main(["inspect", str(_model(tmp_path / "relu.onnx", "Relu"))]) == 130
    assert capsys.readouterr().err == "autosched inspect: interrupted\n"


def test_command_line_smoke(tmp_path: Path) -> None:
    """The installed entry point as a user runs it: one line, status 2, and --debug."""
    path = str(_model(tmp_path / "mixed.onnx", "Add", (1, 7)))
    script = Path(sys.executable).parent / "autosched"  # the installed entry point
    cmd = [str(script)] if script.exists() else [
        sys.executable, "-c", "import sys; from autosched.cli import main; sys.exit(main())"]
    proc = subprocess.run([*cmd, "run", path], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("autosched run: ModelImportError")
    proc = subprocess.run([*cmd, "--debug", "run", path], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" in proc.stderr, proc.stderr


@pytest.mark.parametrize("argv,bad", [(["tune", "M", "--batch-size", "0"], "--batch-size: '0'"),
                                      (["tune", "M", "--trials", "-5"], "--trials: '-5'"),
                                      (["run", "M", "--repeat", "x"], "--repeat: 'x'"),
                                      (["tune-op", "gemm", "8", "0", "8"], "sizes: '0'")])
def test_numbers_out_of_range_are_argument_errors(argv: list[str], bad: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own error (status 2), before anything runs: a batch size of 0 divided by
    zero, a zero-size operator failed deep in the search."""
    path = str(_model(tmp_path / "relu.onnx", "Relu"))
    with pytest.raises(SystemExit) as info:
        main([path if a == "M" else a for a in argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert f"argument {bad} is not an integer >=" in err


def test_bench_when_onnxruntime_cannot_run_the_model(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    ort = pytest.importorskip("onnxruntime")

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : no kernel")

    monkeypatch.setattr(ort, "InferenceSession", refuse)
    path = str(_model(tmp_path / "relu.onnx", "Relu"))
    assert main(["bench", path, "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime could not run the model (RuntimeError: [ONNXRuntimeError]" in out


def test_unbound_dim_names_the_shape_option(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The importer's advice is spelt as the option that binds the dim."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "m", [x], [y])
    path = tmp_path / "batch.onnx"
    onnx.save(helper.make_model(graph), str(path))
    err = one_line_error(capsys, ["run", str(path)], "symbolic dim 0 'batch'",
                          "bind it with --shape x=D0,D1,...")
    assert "shapes=" not in err
    assert main(["run", str(path), "--shape", "x=2,3"]) == 0


def test_a_reader_that_goes_away_is_no_error() -> None:
    """`autosched logs summary LOG | head -1`: the pipe's reader has gone before the table is
    written; the command ends quietly instead of printing BrokenPipeError tracebacks."""
    root = Path(__file__).resolve().parents[2]
    log = root / "tuning_logs" / "cost_model_conv2d_llvm_4t.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "autosched", "logs", "summary", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "BrokenPipeError" not in err and "Traceback" not in err, err
