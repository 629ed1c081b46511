"""Tuning curves from the command line: ``autosched logs plot`` and a tune's ``--plot`` write a
PNG that decodes to the documented size and an HTML page whose embedded PNG and table agree with
the log, read here independently of the plotting code; bad input is one line and exit 2."""

from __future__ import annotations

import base64
import io
import json
import math
import statistics
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from autosched.cli import main
from autosched.search.record import MeasureRecord, RecordLog, target_fingerprint
from autosched.targets.target import parse
from tests.support.cli import one_line_error

TABLE_HEAD = ["task", "weight", "trials", "best latency", "time to best"]


class _Page(HTMLParser):
    """The images' sources and the table cells of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.images: list[str] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of PNG bytes, decoded by matplotlib."""
    from matplotlib import image

    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    pixels = image.imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and np.ptp(pixels) > 0  # not a blank canvas
    return pixels.shape[1], pixels.shape[0]


def _expected_size(rows: int) -> tuple[int, int]:
    from autosched.report.plot import DPI, ROW_HEIGHT_IN, WIDTH_IN

    return round(WIDTH_IN * DPI), round(rows * ROW_HEIGHT_IN * DPI)


def _from_log(path: Path) -> dict[str, dict[str, float]]:
    """Per workload, read straight from the JSON lines: the task name, the records and the
    best median cost in seconds (inf without a successful record). A record of a worker killed
    from outside measured nothing, and a schedule chosen in the model is a time taken there:
    neither is a trial."""
    out: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if ("target_header" in d or d["error_code"] == "WORKER_KILLED"
                or d.get("extra", {}).get("in_model")):  # not a trial
            continue
        task = out.setdefault(d["workload_key"], {"name": d["task_name"], "trials": 0,
                                                   "best": math.inf})
        task["trials"] += 1
        if d["error_code"] == "NO_ERROR" and d["costs"]:
            task["best"] = min(task["best"], statistics.median(d["costs"]))
    return out


def _seconds(cell: str, unit: str = "ms") -> float:
    value, got = cell.split()
    assert got == unit, cell
    return float(value) / 1e3


def _check_page(path: Path, log: Path, weights: dict[str, int], rows: int) -> None:
    """The page embeds a PNG of ``rows`` rows of panels and tables every task of the log: its
    weight, trials and best latency; and the weighted sum of the bests."""
    page = _Page(path.read_text())
    (src,) = page.images
    head, _, data = src.partition(",")
    assert head == "data:image/png;base64"
    assert _png_size(base64.b64decode(data, validate=True)) == _expected_size(rows)
    assert page.rows[0] == TABLE_HEAD
    expected = _from_log(log)
    assert len(page.rows) - 1 == len(expected)
    for row, (key, task) in zip(page.rows[1:], expected.items()):
        name, weight, trials, best, _ = row
        assert name.startswith(str(task["name"])), (row, task)
        assert float(weight) == weights.get(key, 1)
        assert int(trials) == task["trials"]
        assert _seconds(best) == pytest.approx(task["best"], rel=1e-3)
    total = sum(weights.get(k, 1) * t["best"] for k, t in expected.items())
    estimate = path.read_text().split("estimated end-to-end latency ")[1].split("<")[0]
    assert _seconds(estimate) == pytest.approx(total, rel=1e-3)


def _synthetic_log(path: Path, rng: np.random.Generator) -> Path:
    """Three workloads (two share a task name), failures and killed workers among them, written
    through the record writer with increasing timestamps."""
    fp = target_fingerprint(parse("llvm"))
    records, t = [], 1.7e9
    for n in range(40):
        key, name = [("a" * 24, "conv"), ("b" * 24, "conv"), ("c" * 24, "dense")][n % 3]
        error = rng.choice(["NO_ERROR"] * 8 + ["RUNTIME_ERROR", "WORKER_KILLED"])
        t += float(rng.uniform(0.1, 2.0))
        costs = [float(c) for c in rng.uniform(1e-4, 5e-3, size=3)] if error == "NO_ERROR" else []
        records.append(MeasureRecord(workload_key=key, task_name=name, target=fp, steps=[],
                                     costs=costs, error_code=str(error), timestamp=t))
    RecordLog(path).append(records)
    return path


def test_logs_plot_png_and_html(tmp_path: Path, rng: np.random.Generator,
                                capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    log = _synthetic_log(tmp_path / "three.jsonl", rng)
    assert main(["logs", "plot", str(log), "-o", str(tmp_path / "c.png")]) == 0
    assert _png_size((tmp_path / "c.png").read_bytes()) == _expected_size(2)
    assert main(["logs", "plot", str(log), "-o", str(tmp_path / "c.html")]) == 0
    assert "tuning curves: " in capsys.readouterr().out
    _check_page(tmp_path / "c.html", log, {}, rows=2)
    assert "each task weighs 1" in (tmp_path / "c.html").read_text()


def test_curves_are_running_minima(tmp_path: Path, rng: np.random.Generator) -> None:
    """Each task's curve steps down exactly where its running minimum does (counting trials
    over every record of the log but killed workers); the model's curve starts once every
    task has run and ends at the sum of the bests."""
    from autosched.report.curves import tuning_runs

    log = _synthetic_log(tmp_path / "three.jsonl", rng)
    lines = [d for d in map(json.loads, log.read_text().splitlines())
             if "target_header" not in d and d["error_code"] != "WORKER_KILLED"]
    (run,) = tuning_runs(log)
    assert run.trials == len(lines)
    first_time = lines[0]["timestamp"]
    for task in run.tasks:
        expected, best = [], math.inf
        for trial, d in enumerate(lines, start=1):
            cost = statistics.median(d["costs"]) if d["costs"] else math.inf
            if d["workload_key"] == task.workload_key and cost < best:
                best = cost
                expected.append((trial, d["timestamp"] - first_time, cost))
        assert [s.trial for s in task.steps] == [e[0] for e in expected]
        assert [s.seconds for s in task.steps] == pytest.approx([e[1] for e in expected])
        assert [s.best for s in task.steps] == pytest.approx([e[2] for e in expected])
    all_ran = max(task.steps[0].trial for task in run.tasks)
    assert run.model[0].trial == all_ran
    assert run.model[-1].best == pytest.approx(sum(task.best for task in run.tasks))


def test_tune_op_writes_its_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    log, png = tmp_path / "gemm.jsonl", tmp_path / "gemm.png"
    argv = ["tune-op", "gemm", "24", "20", "12", "--trials", "6", "--batch-size", "3",
            "--seed", "0", "--log", str(log), "--plot", str(png)]
    assert main(argv) == 0
    assert _png_size(png.read_bytes()) == _expected_size(1)  # one task: no model row


def _two_task_model(path: Path) -> Path:
    """x @ W1 -> relu -> @ W2 -> relu -> @ W3: the first two layers are one task (weight 2)."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), f"w{i}")
               for i, s in enumerate([(16, 16), (16, 16), (16, 8)])]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"]),
             helper.make_node("Relu", ["h0"], ["r0"]),
             helper.make_node("MatMul", ["r0", "w1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", 1, [8, 16])],
                              [helper.make_tensor_value_info("y", 1, [8, 8])], weights)
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_model_tune_plot_weighs_tasks_by_the_model(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from autosched.graph.compiler import extract_tasks
    from importers.onnx import from_onnx

    model = _two_task_model(tmp_path / "mlp.onnx")
    log, page = tmp_path / "mlp.jsonl", tmp_path / "mlp.html"
    argv = ["tune", str(model), "--trials", "8", "--batch-size", "4", "--seed", "0",
            "--log", str(log), "--plot", str(page)]
    assert main(argv) == 0
    tasks, counts = extract_tasks(from_onnx(str(model)), "llvm")
    weights = {t.workload_key: c for t, c in zip(tasks, counts)}
    assert sorted(weights.values()) == [1, 2]
    _check_page(page, log, weights, rows=2)
    assert "how often each task occurs in" in page.read_text()
    # the same page from the log, with the weights taken from the model
    again = tmp_path / "again.html"
    assert main(["logs", "plot", str(log), "--model", str(model), "-o", str(again)]) == 0
    _check_page(again, log, weights, rows=2)


def test_bad_logs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = str(tmp_path / "c.png")
    missing = tmp_path / "missing.jsonl"
    one_line_error(capsys, ["logs", "plot", str(missing), "-o", out], str(missing))
    failed = tmp_path / "failed.jsonl"
    RecordLog(failed).append([MeasureRecord(
        workload_key="k" * 24, task_name="gemm", target=target_fingerprint(parse("llvm")), steps=[],
        costs=[], error_code="COMPILE_ERROR", timestamp=1.7e9)])
    one_line_error(capsys, ["logs", "plot", str(failed), "-o", out], str(failed), "none successful")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_line_error(capsys, ["logs", "plot", str(empty), "-o", out], str(empty), "no valid record")
    one_line_error(capsys, ["logs", "plot", str(failed), "-o", str(tmp_path / "c.svg")],
                    "c.svg", ".png or .html")
    assert not (tmp_path / "c.png").exists()


def test_without_matplotlib_one_line_names_the_extra(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    log = tmp_path / "gemm.jsonl"
    one_line_error(capsys, ["tune-op", "gemm", "8", "8", "8", "--trials", "2", "--log",
                             str(log), "--plot", str(tmp_path / "c.png")], "autosched[plot]")
    assert not log.exists()  # refused before measuring anything


def test_import_autosched_does_not_import_matplotlib() -> None:
    code = ("import sys, autosched, autosched.cli, autosched.report.plot; "
            "assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
