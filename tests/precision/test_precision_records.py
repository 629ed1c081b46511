"""Records carry the precision: a task's key ends in it (but for fp32), so a record tuned in
one precision never applies to another, and logs written before precisions existed (the
bundled ones) load as fp32. Also the option's edges: unknown names, the tolerance table,
the command line."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import autosched as aus
from autosched.cli import main
from autosched.errors import TEError
from autosched.graph.compiler import extract_tasks
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import MeasureResult
from autosched.search.measure_worker import compare
from autosched.search.record import RecordLog, records_from
from autosched.search.space import SearchSpace
from autosched.search.task import Task
from autosched.te.dtype import PRECISIONS, precision
from autosched.testing import models
from importers.onnx import from_onnx

BUNDLED = Path(__file__).resolve().parents[2] / "tuning_logs" / "resnet18_cuda_h200.jsonl.gz"


def _matmul_model(rng: np.random.Generator) -> onnx.ModelProto:
    """relu(x @ w1) @ w2: the middle value is stored in half under fp16 / bf16."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 24])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    ws = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
          for n, s in (("w1", (24, 16)), ("w2", (16, 8)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [x], [y], ws)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_keys_carry_the_precision(rng: np.random.Generator) -> None:
    graph = from_onnx(_matmul_model(rng))
    keys = {p: [t.workload_key for t in extract_tasks(graph, "llvm", p)[0]] for p in PRECISIONS}
    assert all("-" not in k for k in keys["fp32"])
    assert keys["tf32"] == [f"{k}-tf32" for k in keys["fp32"]]  # the same computation
    for p in ("fp16", "bf16"):  # half tensors: another computation, and the suffix
        assert all(k.endswith(f"-{p}") for k in keys[p])
        assert not {k.split("-")[0] for k in keys[p]} & set(keys["fp32"])


def test_bundled_logs_load_as_fp32() -> None:
    """The ResNet-18 H200 log (written before precisions) covers every fp32 task and applies
    to no task of another precision."""
    graph = from_onnx(models.resnet18())
    log = RecordLog(BUNDLED)
    found, counts = {}, {}
    for p in ("fp32", "tf32", "fp16"):
        tasks, _ = extract_tasks(graph, "cuda -arch=sm_90", p)
        found[p] = sum(bool(log.best(t.workload_key, t.target)) for t in tasks)
        counts[p] = len(tasks)
        assert len(tasks) > 10
    assert found == {"fp32": counts["fp32"], "tf32": 0, "fp16": 0}


def test_records_round_trip_with_precision(tmp_path: Path, rng: np.random.Generator) -> None:
    graph = from_onnx(_matmul_model(rng))
    task = extract_tasks(graph, "llvm", "fp16")[0][0]
    sch = SearchSpace(task).default_schedule()
    log = RecordLog(tmp_path / "half.jsonl")
    log.append(records_from(task, [sch], [MeasureResult((1e-5,), ErrorCode.NO_ERROR)]))
    (back,) = RecordLog(tmp_path / "half.jsonl").load()
    assert back.workload_key == task.workload_key and back.workload_key.endswith("-fp16")
    assert task.schedule(back.schedule_steps()).steps == sch.steps
    assert RecordLog(log.path).best(task.workload_key, task.target)
    for other in ("fp32", "tf32", "bf16"):
        assert not RecordLog(log.path).best(task.with_precision(other).workload_key, task.target)


@pytest.mark.parametrize("target", ["llvm", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_tuned_fp16_records_apply_to_fp16_only(target: str, tmp_path: Path,
                                               rng: np.random.Generator) -> None:
    graph = from_onnx(_matmul_model(rng))
    log = str(tmp_path / "mlp.jsonl")
    aus.tune_graph(graph, target, trials=8, log=log, precision="fp16",
                   options=aus.TuneOptions(batch_size=4, verbose=False))
    recs = RecordLog(log).load()
    tasks, _ = extract_tasks(graph, target, "fp16")
    assert {r.workload_key for r in recs} == {t.workload_key for t in tasks}
    # candidates checked against the default schedule with fp16's tolerance, all right
    assert all(r.ok for r in recs), [r.error_msg for r in recs if not r.ok]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a task without a record would warn
        half = aus.compile(graph, target, log=log, precision="fp16")
    with pytest.warns(UserWarning, match="no tuning record"):
        aus.compile(graph, target, log=log, executor=False)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    (got,) = half.run({"x": x})
    w1, w2 = graph.constants["w1"], graph.constants["w2"]
    assert compare("y", got, np.maximum(x @ w1, 0) @ w2, "fp16") is None


def test_unknown_precision_is_refused(rng: np.random.Generator) -> None:
    graph = from_onnx(_matmul_model(rng))
    with pytest.raises(TEError, match="unknown precision 'fp8'; expected one of fp32, tf32"):
        aus.compile(graph, "llvm", precision="fp8")
    with pytest.raises(TEError, match="'int4'"):
        Task(extract_tasks(graph, "llvm")[0][0].outputs, precision="int4")


def test_tolerance_table() -> None:
    """A 1.5% error passes the half precisions, not fp32 or tf32; the table is ordered."""
    want = np.linspace(1.0, 2.0, 50, dtype=np.float32)
    got = want * np.float32(1.015)
    assert compare("y", got, want, "fp16") is None and compare("y", got, want, "bf16") is None
    for strict in ("fp32", "tf32"):
        assert "differ beyond" in str(compare("y", got, want, strict))
    order = [precision(p) for p in ("fp32", "tf32", "fp16", "bf16")]
    assert all(a.rtol <= b.rtol and a.atol <= b.atol for a, b in zip(order, order[1:]))
    assert [p.storage for p in order] == ["float32", "float32", "float16", "bfloat16"]


def test_command_line_precision(tmp_path: Path, rng: np.random.Generator,
                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mlp.onnx"
    onnx.save(_matmul_model(rng), str(path))
    assert main(["bench", str(path), "--precision", "bf16", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "outputs match" in out, out
    with pytest.raises(SystemExit):
        main(["run", str(path), "--precision", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
