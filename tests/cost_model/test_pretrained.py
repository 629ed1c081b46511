"""The pretrained cost model: the shipped file loads and scores, a model trains from a log,
a model of another feature version is refused with one line, tuning boosts on top of a model
instead of refitting it, the search measures where the model is unsure, and a model compiles
with no measurement at all (schedule="model")."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from autosched.cost_model import pretrain
from autosched.cost_model.features import FEATURE_VERSION
from autosched.cost_model.xgb_model import XGBModel
from autosched.search.error_codes import ErrorCode
from autosched.search.evolution import EvolutionarySearch
from autosched.search.measure import MeasureResult
from autosched.search.record import MeasureRecord, RecordLog, target_fingerprint
from autosched.search.space import SearchSpace
from autosched.search.task import Task
from autosched.search.training_data import OPERATORS, operator_tasks
from autosched.search.tune import _featurizer
from tests.support.nvrtc import needs_nvrtc


@pytest.fixture(scope="module")
def gemm() -> Task:
    (task,) = [t for t in operator_tasks() if t.name == OPERATORS[0][0]]
    return task


def matmul(n: int, target: str = "llvm") -> Task:
    from autosched import te

    A = te.placeholder((n, 24), name="A")
    B = te.placeholder((24, n), name="B")
    k = te.reduce_axis((0, 24), name="k")
    return Task(te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C"),
                target=target)


@pytest.fixture(scope="module")
def lowered(gemm: Task) -> list:
    """Distinct legal candidates of the gemm operator, lowered and featurised."""
    search = EvolutionarySearch(SearchSpace(gemm), _featurizer(gemm.target),
                                np.random.default_rng(0))
    return search._sample_valid(24)


def _costs(lowered: list, rng: np.random.Generator) -> list[float]:
    # a made-up timing that depends on the schedule (the vector length), plus noise
    from autosched.cost_model.features import FEATURE_NAMES

    vec = FEATURE_NAMES.index("vec_len")
    return [1e-3 / (1.0 + float(low.features[:, vec].max())) * rng.uniform(0.9, 1.1)
            for low in lowered]


@pytest.mark.parametrize("device", pretrain.DEVICES)
def test_the_shipped_models_load_and_score(lowered: list, device: str) -> None:
    model = pretrain.load_pretrained(device=device)
    assert model is not None and model.trained and model.num_trees > 0
    manifest = json.loads((pretrain.pretrained_dir(device) / pretrain.MANIFEST).read_text())
    assert manifest["feature_version"] == FEATURE_VERSION
    assert manifest["samples"] > 1000 and manifest["logs"]
    scores = model.predict([low.features for low in lowered])
    assert scores.shape == (len(lowered),) and np.isfinite(scores).all()
    assert np.ptp(scores) > 0  # it tells candidates apart
    size = sum(p.stat().st_size for p in pretrain.PRETRAINED_DIR.glob("*/*"))
    assert size < 8 << 20


def test_the_cpu_model_learnt_from_cpu_records_only() -> None:
    """GPU records in its training made the CPU picks worse (magika 9.25 ms against 3.97)."""
    manifest = json.loads((pretrain.pretrained_dir("cpu") / pretrain.MANIFEST).read_text())
    logs = [log["path"] for log in manifest["logs"]]
    assert logs and not [p for p in logs if "cuda" in p]
    with pytest.raises(ValueError, match="tpu"):
        pretrain.pretrained_dir("tpu")


def _log(tmp_path: Path, task: Task, lowered: list, rng: np.random.Generator) -> Path:
    search = EvolutionarySearch(SearchSpace(task), _featurizer(task.target), rng)
    fp = target_fingerprint(task.target)
    path = tmp_path / "tiny.jsonl"
    RecordLog(path).append(
        MeasureRecord(task.workload_key, task.name, fp,
                      [s.to_dict() for s in search.schedule_of(low).steps],
                      [c, c * 1.01], timestamp=time.time())
        for low, c in zip(lowered, _costs(lowered, rng)))
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_training_on_a_tiny_log(tmp_path: Path, gemm: Task, lowered: list,
                                capsys: pytest.CaptureFixture, gz: bool) -> None:
    import gzip

    from autosched.cli import main

    rng = np.random.default_rng()
    log = _log(tmp_path, gemm, lowered, rng)
    if gz:
        log = log.with_suffix(".jsonl.gz")
        log.write_bytes(gzip.compress(log.with_suffix("").read_bytes()))
    out = tmp_path / "model"
    assert main(["train-cost-model", str(log), "-o", str(out), "--rounds", "12"]) == 0
    assert "24 records, 24 used" in capsys.readouterr().out
    manifest = json.loads((out / pretrain.MANIFEST).read_text())
    assert manifest["samples"] == 24 and manifest["trees"] == 12
    assert manifest["logs"][0]["used"] == 24
    model = pretrain.load_pretrained(out)
    assert model is not None and model.num_trees == 12
    assert manifest["logs"][0]["tensor_cores"] == 0 and model.tensor_core_records == 0
    manifest["logs"] += [{"path": "half.jsonl", "tensor_cores": 7}, {"tensor_cores": "x"}]
    (out / pretrain.MANIFEST).write_text(json.dumps(manifest))
    assert pretrain.load_pretrained(out).tensor_core_records == 7  # type: ignore[union-attr]
    (out / pretrain.MANIFEST).write_text(json.dumps({**manifest, "logs": manifest["logs"][:1]}))
    # it learnt the made-up timing: the fastest candidates rank first
    feats = [low.features for low in lowered]
    costs = _costs(lowered, rng)
    tau = pretrain.kendall_tau(model.predict(feats), 1 / np.array(costs))
    assert tau > 0.3


def test_ranking_metrics() -> None:
    rng = np.random.default_rng()
    pred, true = rng.random(40), rng.random(40)
    pairs = [(i, j) for i in range(40) for j in range(i + 1, 40)]
    agree = sum(np.sign(pred[i] - pred[j]) * np.sign(true[i] - true[j]) for i, j in pairs)
    assert pretrain.kendall_tau(pred, true) == pytest.approx(agree / len(pairs))
    assert pretrain.kendall_tau(true, true) == 1.0
    order = np.argsort(-pred)
    assert pretrain.best_at(pred, true, 1) == pytest.approx(true[order[0]] / true.max())
    assert pretrain.best_at(pred, true, 5) == pytest.approx(true[order[:5]].max() / true.max())
    assert pretrain.best_at(true, true, 1) == 1.0


def test_a_model_of_another_feature_version_is_refused_with_one_line(tmp_path: Path) -> None:
    shutil.copytree(pretrain.pretrained_dir("cpu"), tmp_path / "m")
    path = tmp_path / "m" / pretrain.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["feature_version"] = FEATURE_VERSION - 1
    path.write_text(json.dumps(manifest))
    with pytest.warns(UserWarning) as caught:
        assert pretrain.load_pretrained(tmp_path / "m") is None
    (w,) = caught
    msg = str(w.message)
    assert "\n" not in msg and f"feature version {FEATURE_VERSION - 1}" in msg


def test_a_model_file_that_is_not_a_model_is_refused(tmp_path: Path) -> None:
    shutil.copytree(pretrain.pretrained_dir("cpu"), tmp_path / "m")
    (tmp_path / "m" / pretrain.MODEL_FILE).write_bytes(b"not a model")
    with pytest.warns(UserWarning, match="is not an XGBoost model"):
        assert pretrain.load_pretrained(tmp_path / "m") is None


def test_boosting_on_top_keeps_the_pretrained_trees(lowered: list, gemm: Task) -> None:
    model = pretrain.load_pretrained()
    assert model is not None
    before = model.num_trees
    feats = [low.features for low in lowered]
    p0 = model.predict(feats)
    costs = _costs(lowered, np.random.default_rng())
    model.fit(feats, [1 / c for c in costs], [gemm.workload_key] * len(feats))
    assert model.base.num_boosted_rounds() == before       # the base is untouched
    assert model.num_trees == before + model.finetune_rounds
    assert not np.allclose(model.predict(feats), p0)
    model.fit(feats[:12], [1 / c for c in costs[:12]], [gemm.workload_key] * 12)
    assert model.num_trees == before + model.finetune_rounds  # again from the base
    u = model.uncertainty(feats)
    assert u is not None and u.shape == (len(feats),) and (u >= 0).all() and (u <= 1).all()


class _FakeMeasurer:
    """Made-up timings, so the tuner's use of the model can be tested without timing."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng()

    def measure(self, task: Task, schedules: list) -> list[MeasureResult]:
        return [MeasureResult((float(self.rng.uniform(1e-4, 2e-4)),), ErrorCode.NO_ERROR)
                for _ in schedules]


def test_tune_keeps_a_trained_model_it_is_given(tmp_path: Path, gemm: Task,
                                                lowered: list) -> None:
    from autosched.search.tune import TuneOptions, tune

    feats = [low.features for low in lowered]
    costs = _costs(lowered, np.random.default_rng())
    model = XGBModel(objective="rank", num_rounds=10).fit(
        feats, [1 / c for c in costs], [gemm.workload_key] * len(feats))
    given = model.booster
    tune(gemm, trials=16, log=tmp_path / "t.jsonl", measurer=_FakeMeasurer(), model=model,
         options=TuneOptions(batch_size=8, population=16, generations=1, verbose=False, seed=0))
    assert model.base is given                 # its trees stay, as the base
    assert model.num_trees == 10 + model.finetune_rounds  # the job's records on top


def test_the_search_measures_where_the_model_is_least_sure(gemm: Task) -> None:
    from autosched.search.evolution import EvolutionConfig

    class Unsure:
        """Scores by the IR hash; most unsure of the lowest scored."""

        trained = True

        def predict(self, feats: list) -> np.ndarray:
            return np.array([float(x.sum()) for x in feats])

        def uncertainty(self, feats: list) -> np.ndarray:
            s = self.predict(feats)
            return (s.max() - s) / max(np.ptp(s), 1e-9)

    cfg = EvolutionConfig(population=24, generations=1, eps_greedy=0.0, eps_uncertain=0.25)
    search = EvolutionarySearch(SearchSpace(gemm), _featurizer(gemm.target),
                                np.random.default_rng(1), cfg)
    batch = search.next_batch(8, Unsure(), set())
    scores = [float(b.features.sum()) for b in batch]
    assert len(batch) == 8
    # six best predicted first, then the two it is least sure of: the lowest scored seen
    assert scores[:6] == sorted(scores[:6], reverse=True)
    assert max(scores[6:]) < min(scores[:6])

    class Sure(Unsure):
        def uncertainty(self, feats: list) -> None:  # type: ignore[override]
            return None

    # a model that cannot say where it is unsure: the whole batch is its best predicted
    search = EvolutionarySearch(SearchSpace(gemm), _featurizer(gemm.target),
                                np.random.default_rng(1), cfg)
    scores = [float(b.features.sum()) for b in search.next_batch(8, Sure(), set())]
    assert scores == sorted(scores, reverse=True)
    assert min(scores) > max(float(b.features.sum()) for b in batch[6:])


@pytest.mark.parametrize("target", ["llvm", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_schedule_model_compiles_without_measuring(monkeypatch: pytest.MonkeyPatch,
                                                   target: str) -> None:
    import autosched as aus
    from autosched.search import measure, tune
    from autosched.search.evolution import EvolutionConfig
    from autosched.testing.models import ort_run, small_cnn

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("schedule='model' started a Measurer")

    picked: list[tuple[Task, object]] = []
    real = tune.model_schedule

    def model_schedule(task: Task, *args: object, **kwargs: object) -> object:
        picked.append((task, real(task, *args, **kwargs)))
        return picked[-1][1]

    monkeypatch.setattr(measure.Measurer, "__init__", never)
    monkeypatch.setattr(tune, "model_schedule", model_schedule)
    monkeypatch.setattr(tune, "MODEL_SEARCH", EvolutionConfig(
        population=8, generations=1, eps_greedy=0.0, eps_uncertain=0.0))  # fewer lowerings
    monkeypatch.setattr(tune, "MODEL_SEARCH_WORKERS", 1)  # searched here, where the patch is
    proto = small_cnn(image=20)
    graph = aus.from_onnx(proto)
    x = np.random.default_rng().uniform(-1, 1, (1, 3, 20, 20)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shipped model loads, no task falls back silently
        model = aus.compile(graph, target=target, schedule="model")
    (got,) = model.run({"input": x})
    (want,) = ort_run(proto, {"input": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    # every task was scheduled by the model, and not all of them got the default schedule
    assert len(picked) == len({k.task.workload_key for k in model.kernels})
    assert any(sch.steps != SearchSpace(task).default_schedule().steps for task, sch in picked)


def test_cli_compile_passes_the_schedule_option(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    from autosched.cli import main
    from autosched.errors import AutoschedError
    from autosched.graph import compiler
    from autosched.testing.models import small_cnn

    seen: dict[str, object] = {}

    def compile_(graph: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise AutoschedError("stop here")

    monkeypatch.setattr(compiler, "compile", compile_)
    path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(image=16), str(path))
    assert main(["compile", str(path), "--schedule", "model", "-o", str(tmp_path / "b")]) == 2
    assert seen["schedule"] == "model"
    seen.clear()
    assert main(["run", str(path)]) == 2
    assert seen["schedule"] is None  # compile resolves it: AUTOSCHED_SCHEDULE, else auto


def test_train_cost_model_errors_are_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    from autosched.cli import main

    assert main(["train-cost-model", str(tmp_path / "none.jsonl"), "-o", str(tmp_path)]) == 2
    assert "no such log" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"  # a record of a workload nothing here rebuilds
    other.write_text(json.dumps({"version": 1, "workload_key": "0" * 24, "target": {"kind": "llvm"},
                                 "steps": [], "costs": [1e-3], "error_code": "NO_ERROR"}) + "\n")
    assert main(["train-cost-model", str(other), "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "0 usable records" in err
    assert not (tmp_path / "m").exists()


def test_the_model_pick_is_checked_against_the_default_schedule() -> None:
    from autosched.search.tune import _Reference
    from autosched.search.workloads import gemm as gemm_op

    task = Task(gemm_op, args=(37, 29, 23), name="gemm")
    space = SearchSpace(task)
    rng = np.random.default_rng()
    picks = [space.schedule(space.sample(rng)) for _ in range(3)]
    ref = _Reference(task, space.default_schedule(), seed=int(rng.integers(1 << 30)))
    assert ref.outputs is not None and np.isfinite(ref.outputs[0]).all()
    assert all(ref.agrees(sch) for sch in picks)
    ref.outputs[0][5, 7] += 1.0  # a pick that differs in one element is refused
    assert not any(ref.agrees(sch) for sch in picks)


def test_finetune_table_compares_the_three_models(lowered: list, gemm: Task) -> None:
    rng = np.random.default_rng()
    samples = pretrain.Samples()
    for low, c in zip(lowered, _costs(lowered, rng)):
        samples.add(low.features, c, f"{gemm.workload_key}@cpu", "gemm")
    base = pretrain.load_pretrained()
    assert base is not None
    table = pretrain.finetune_table(base, samples, ks=(8, 32), reps=1).splitlines()
    assert len(table) == 2 and table[1].split()[:2] == ["8", "1"]  # 32 + 16 > 24 candidates
    assert len(table[1].split()) == 2 + 9
    assert "no group" in pretrain.finetune_table(base, samples, ks=(32,))


def test_model_schedules_search_in_worker_processes_as_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zero-measurement picks of several tasks, searched in spawned worker processes, are
    the picks searched in this one (same seed), best predicted first, and legal."""
    from autosched.schedule.steps import step_from_dict
    from autosched.search.tune import model_candidates, model_schedules

    tasks = [matmul(40), matmul(24)]
    monkeypatch.setenv("AUTOSCHED_CACHE_DIR", str(tmp_path / "here"))  # no cached picks
    here = model_schedules(tasks, workers=1, seed=3, check=False)
    monkeypatch.setenv("AUTOSCHED_CACHE_DIR", str(tmp_path / "there"))
    there = model_schedules(tasks, workers=2, seed=3, check=False)
    assert [s.steps for s in here] == [s.steps for s in there]
    for t, sch in zip(tasks, there):
        best = model_candidates(t, seed=3)[0]
        assert sch.steps == t.schedule([step_from_dict(d) for d in best]).steps
        t.build(sch)


def test_schedule_model_with_a_workload_that_occurs_twice(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """Two convs of one workload share the pick made for the first (a pick made on the other
    one's task named operations the built task does not have)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import autosched as aus
    from autosched.search import tune
    from autosched.search.evolution import EvolutionConfig
    from autosched.testing.models import ort_run

    monkeypatch.setattr(tune, "MODEL_SEARCH", EvolutionConfig(
        population=8, generations=1, eps_greedy=0.0, eps_uncertain=0.0))
    monkeypatch.setattr(tune, "MODEL_SEARCH_WORKERS", 1)
    rng = np.random.default_rng()
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32), n)
             for n in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y2"], ["out"])]
    graph = helper.make_graph(
        nodes, "twice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8, 12, 12))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, (1, 8, 12, 12))], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    model = aus.compile(aus.from_onnx(proto), target="llvm", schedule="model")
    assert len(model.kernels) == 2
    assert model.kernels[0].task.workload_key == model.kernels[1].task.workload_key
    x = rng.uniform(-1, 1, (1, 8, 12, 12)).astype(np.float32)
    np.testing.assert_allclose(model.run({"x": x})[0], ort_run(proto, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


def test_model_schedules_from_a_script_without_a_main_guard(tmp_path: Path) -> None:
    """The search workers never import the caller's __main__: a plain script (no
    ``if __name__ == "__main__"``) that compiles with schedule="model" runs once, not once per
    worker (multiprocessing's spawn re-ran it and broke the pool)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "plain.py"
    script.write_text(
        "from autosched import te\n"
        "from autosched.search.task import Task\n"
        "from autosched.search.tune import model_schedules\n"
        "def mm(n):\n"
        "    A = te.placeholder((n, 16), name='A'); B = te.placeholder((16, n), name='B')\n"
        "    k = te.reduce_axis((0, 16), name='k')\n"
        "    return Task(te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k),"
        " name='C'), target='llvm')\n"
        "print('RAN')\n"
        "print(len(model_schedules([mm(24), mm(40)], workers=2, check=False)))\n")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-W", "error", str(script)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["RAN", "2"]


def test_model_picks_are_cached_by_task_and_target(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A second zero-measurement compile of a task takes the cached picks instead of searching;
    another target searches; a cache file that holds no step lists is a miss, and steps that
    do not apply are skipped (the default schedule, no error)."""
    from autosched.cache import DiskCache
    from autosched.search import tune
    from autosched.search.evolution import EvolutionConfig

    monkeypatch.setenv("AUTOSCHED_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tune, "MODEL_SEARCH", EvolutionConfig(
        population=8, generations=1, eps_greedy=0.0, eps_uncertain=0.0))
    searched: list[str] = []
    real = tune.model_candidates

    def counted(task: Task, *args: object, **kwargs: object) -> object:
        searched.append(str(task.target))
        return real(task, *args, **kwargs)

    monkeypatch.setattr(tune, "model_candidates", counted)
    task = matmul(40)
    (first,) = tune.model_schedules([task], workers=1, check=False)
    (again,) = tune.model_schedules([matmul(40)], workers=1, check=False)
    assert again.steps == first.steps and len(searched) == 1
    monkeypatch.setenv("AUTOSCHED_PICK_CACHE", "0")
    tune.model_schedules([matmul(40)], workers=1, check=False)
    assert len(searched) == 2
    monkeypatch.delenv("AUTOSCHED_PICK_CACHE")
    tune.model_schedules([matmul(40, "llvm -mcpu=znver3")], workers=1, check=False)
    assert len(searched) == 3

    name = tune._PickCache(0)._name(task)
    DiskCache("picks").write(name, b'{"not": "a list"}')
    (third,) = tune.model_schedules([task], workers=1, check=False)
    assert len(searched) == 4 and third.steps == first.steps
    DiskCache("picks").write(name, json.dumps([[{"kind": "no_such_step"}]]).encode())
    (fourth,) = tune.model_schedules([task], workers=1, check=False)
    assert len(searched) == 4
    assert fourth.steps == SearchSpace(task).default_schedule().steps


def test_auto_schedule_is_the_model_on_gpus_and_the_default_on_cpus(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from autosched.graph.compiler import resolve_schedule
    from autosched.targets.target import parse

    monkeypatch.delenv("AUTOSCHED_SCHEDULE")
    assert resolve_schedule(None, parse("cuda -arch=sm_90")) == "model"
    assert resolve_schedule(None, parse("llvm")) == "default"
    assert resolve_schedule("default", parse("cuda -arch=sm_90")) == "default"
    monkeypatch.setenv("AUTOSCHED_SCHEDULE", "model")
    assert resolve_schedule(None, parse("llvm")) == "model"
    monkeypatch.setenv("AUTOSCHED_SCHEDULE", "fastest")
    with pytest.raises(ValueError, match="fastest"):
        resolve_schedule(None, parse("llvm"))


@needs_nvrtc
def test_a_gpu_compile_without_a_schedule_takes_the_model_picks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import autosched as aus
    from autosched.search import tune
    from autosched.testing.models import small_cnn

    monkeypatch.delenv("AUTOSCHED_SCHEDULE")
    asked: list[int] = []

    def model_schedules(tasks: list[Task], **kwargs: object) -> list[object]:
        asked.append(len(tasks))
        return [SearchSpace(t).default_schedule() for t in tasks]

    monkeypatch.setattr(tune, "model_schedules", model_schedules)
    graph = aus.from_onnx(small_cnn(image=12))
    kernels = aus.compile(graph, target="cuda -arch=sm_90 -emulate=host", executor=False)
    assert asked == [len({k.task.workload_key for k in kernels.kernels})]
    aus.compile(graph, target="llvm", executor=False)
    assert len(asked) == 1
