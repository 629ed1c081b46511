"""Choosing schedules inside the model (graph/choose.py): the choice follows the times taken in
the model, not those measured alone; the log ranks it first; compile applies it; the search,
the trial counts, the cost model and the log tools treat it as what it is. Model times are
faked where the test is about the decision (real ones decide nothing reproducible), and the
compiled model is checked against onnxruntime."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched.graph import choose as choose_mod
from autosched.graph import executor as executor_mod
from autosched.graph.compiler import extract_tasks
from autosched.schedule.steps import step_from_dict
from autosched.search.record import MeasureRecord, RecordLog, ir_hash, ranked, target_fingerprint
from autosched.search.space import SearchSpace
from autosched.targets.target import parse
from autosched.testing.models import Builder, ort_run
from importers.onnx import from_onnx


def _model(seed: int) -> Any:
    b = Builder(seed)
    y = b.op("Relu", [b.conv("x", 3, 8, 3, bias=True)])
    y = b.op("Relu", [b.conv(y, 8, 8, 1, bias=True)])
    return b.model(("x", (1, 3, 10, 12)), y, "two_convs")


def _other_candidate(task: Any, rng: np.random.Generator) -> tuple[list[dict], str]:
    """Steps and IR hash of a legal candidate whose IR differs from the untuned default's."""
    space = SearchSpace(task)
    default = ir_hash(task.lower(space.default_schedule()))
    for _ in range(200):
        low = space.lower(space.sample(rng))
        if low is not None and low.schedule is not None and low.ir_hash != default:
            return [s.to_dict() for s in low.schedule.steps], low.ir_hash
    raise AssertionError(f"no candidate of {task.name} differs from its default")


def _record(task: Any, steps: list[dict], h: str, seconds: float, **extra: Any
            ) -> MeasureRecord:
    return MeasureRecord(workload_key=task.workload_key, task_name=task.name,
                         target=target_fingerprint(task.target), steps=steps, costs=[seconds],
                         timestamp=time.time(), ir_hash=h, extra=extra)


@pytest.fixture
def tuned(tmp_path: Path, rng: np.random.Generator) -> tuple[Any, Any, Path, list[Any]]:
    """A two-task model and a log holding, per task, one candidate measured alone that is
    "faster" than anything (1 ns)."""
    proto = _model(int(rng.integers(1 << 30)))
    graph = from_onnx(proto)
    tasks, _ = extract_tasks(graph, "llvm")
    assert len(tasks) == 2
    log = tmp_path / "log.jsonl"
    RecordLog(log).append(_record(t, *_other_candidate(t, rng), 1e-9) for t in tasks)
    return proto, graph, log, tasks


def _fake_model_times(monkeypatch: pytest.MonkeyPatch, seconds: dict[tuple[str, str], float]
                      ) -> None:
    """Each candidate (workload key, label) takes ``seconds`` in the model; the calls still run."""
    real = choose_mod._candidates

    class Timed:
        def __init__(self, module: Any, s: float) -> None:
            self.module, self.s = module, s

        def bind(self, *args: Any) -> Any:
            call = self.module.bind(*args)

            def timed() -> None:
                call()
            timed.seconds = self.s  # type: ignore[attr-defined]
            return timed

    def candidates(kernel: Any, *args: Any) -> list[Any]:
        out = real(kernel, *args)
        for c in out:
            c.module = Timed(c.module, seconds[kernel.task.workload_key, c.label])
        return out

    def call_times(calls: list[Any], repeat: int) -> np.ndarray:
        for call in calls:
            call()
        return np.array([getattr(c, "seconds", 1e-6) for c in calls])

    monkeypatch.setattr(choose_mod, "_candidates", candidates)
    monkeypatch.setattr(executor_mod, "call_times", call_times)


def test_the_choice_follows_model_times_not_times_alone(
        tuned: tuple[Any, Any, Path, list[Any]], monkeypatch: pytest.MonkeyPatch,
        rng: np.random.Generator) -> None:
    proto, graph, log, (a, b) = tuned
    # in the model: a's untuned default is faster than its record, b's record is faster
    _fake_model_times(monkeypatch, {(a.workload_key, "untuned"): 2e-6, (a.workload_key, "record 1"): 5e-6,
                                    (b.workload_key, "untuned"): 9e-6, (b.workload_key, "record 1"): 3e-6})
    choices = {c.workload_key: c for c in choose_mod.choose(graph, "llvm", log, rounds=3)}
    assert (choices[a.workload_key].chosen, choices[b.workload_key].chosen) == ("untuned", "record 1")
    assert choices[a.workload_key].seconds == pytest.approx(2e-6)
    assert choices[b.workload_key].untuned_seconds == pytest.approx(9e-6)
    monkeypatch.undo()

    records = RecordLog(log)
    (best_a,) = records.best(a.workload_key, a.target)
    (best_b,) = records.best(b.workload_key, b.target)
    assert best_a.in_model and best_a.extra["chosen"] == "untuned"
    assert best_a.ir_hash == ir_hash(a.lower(SearchSpace(a).default_schedule()))
    assert best_b.in_model and best_b.extra["chosen"] == "record 1"
    # a choice is not a trial: the search and the trial counts see the two records alone
    assert [r.in_model for r in records.records_for(a.workload_key, a.target)] == [False]
    x = {"x": rng.standard_normal((1, 3, 10, 12)).astype(np.float32)}
    (y,) = aus.compile(graph, "llvm", log=log).run(x)
    np.testing.assert_allclose(y, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)


def test_end_to_end_check_overrules_a_mix_that_is_slower(
        tuned: tuple[Any, Any, Path, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each task alone prefers its record, but together (neighbours' data, sleeping pool
    threads) the records are slower than both untuned: the end-to-end check keeps untuned."""
    _, graph, log, (a, b) = tuned
    real = choose_mod._end_to_end

    def end_to_end(seconds_whole: Any, keys: list[str], cands: Any, mix: dict[str, int],
                   rounds: int) -> dict[str, int]:
        assert all(v == 1 for v in mix.values())  # per task, the records won
        totals = {0: 1.0, 1: 2.0}  # all untuned 1 s, the mix (all records) 2 s

        def fake(pick: dict[str, int]) -> float:
            return totals[max(pick.values())]
        return real(fake, keys, cands, mix, rounds)

    _fake_model_times(monkeypatch, {(a.workload_key, "untuned"): 9e-6, (a.workload_key, "record 1"): 5e-6,
                                    (b.workload_key, "untuned"): 9e-6, (b.workload_key, "record 1"): 3e-6})
    monkeypatch.setattr(choose_mod, "_end_to_end", end_to_end)
    choices = choose_mod.choose(graph, "llvm", log, rounds=3)
    assert sorted(c.chosen for c in choices) == ["untuned", "untuned"]


def test_end_to_end_times_whole_runs(tuned: tuple[Any, Any, Path, list[Any]],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The end-to-end check times each option as a whole run (``run_seconds``), not as the
    sum of its kernels' times between events: on a GPU the events between kernels add their
    own time and keep the kernels from going back to back. Per kernel both records win;
    whole, the model runs faster untuned: untuned stays."""
    _, graph, log, (a, b) = tuned
    _fake_model_times(monkeypatch, {(a.workload_key, "untuned"): 9e-6, (a.workload_key, "record 1"): 5e-6,
                                    (b.workload_key, "untuned"): 9e-6, (b.workload_key, "record 1"): 3e-6})
    untuned = {}

    def run_seconds(self: Any, inputs: Any, repeat: int = 20, modules: Any = None) -> float:
        mods = modules or [k.module for k in self.kernels]
        return 1e-6 if all(m is untuned.get(k.task.workload_key)
                           for k, m in zip(self.kernels, mods)) else 2e-6

    real = choose_mod._candidates

    def candidates(kernel: Any, *args: Any) -> list[Any]:
        out = real(kernel, *args)
        untuned[kernel.task.workload_key] = out[0].module
        return out

    monkeypatch.setattr(choose_mod, "_candidates", candidates)
    monkeypatch.setattr(executor_mod.CompiledModel, "run_seconds", run_seconds)
    choices = choose_mod.choose(graph, "llvm", log, rounds=3)
    assert sorted(c.chosen for c in choices) == ["untuned", "untuned"]


@pytest.mark.parametrize("pick_wins", [False, True])
def test_a_task_without_a_record_chooses_between_default_and_pick(
        tuned: tuple[Any, Any, Path, list[Any]], monkeypatch: pytest.MonkeyPatch,
        rng: np.random.Generator, pick_wins: bool) -> None:
    """Compiled with a log and schedule "model" (a GPU's default), a task the log has no
    record of gets the cost model's pick, where the untuned model has its default: the
    choice times both in the model and records the faster, which compile then applies (a
    300-trial log left 41 of ppocr_cls's 60 GPU tasks without a trial; compiled with that
    log, the model ran 10% slower than untuned on an H100)."""
    import autosched.search.tune as tune_mod

    proto, graph, log, (a, b) = tuned
    lines = [r for r in RecordLog(log).load() if r.workload_key == a.workload_key]
    log.unlink()
    RecordLog(log).append(lines)   # b: no record
    pick_steps, pick_hash = _other_candidate(b, rng)
    monkeypatch.setattr(tune_mod, "model_schedules", lambda tasks, **kw: [
        t.schedule([step_from_dict(d) for d in pick_steps]) if t.workload_key == b.workload_key
        else SearchSpace(t).default_schedule() for t in tasks])
    _fake_model_times(monkeypatch, {(a.workload_key, "untuned"): 2e-6, (a.workload_key, "record 1"): 5e-6,
                                    (b.workload_key, "untuned"): 4e-6,
                                    (b.workload_key, "model pick"): 2e-6 if pick_wins else 8e-6})
    choices = {c.workload_key: c for c in choose_mod.choose(graph, "llvm", log, rounds=3,
                                                            schedule="model")}
    want = "model pick" if pick_wins else "untuned"
    assert choices[b.workload_key].chosen == want
    (best_b,) = RecordLog(log).best(b.workload_key, b.target)
    assert best_b.in_model and best_b.extra["chosen"] == want
    assert best_b.ir_hash == (pick_hash if pick_wins else
                              ir_hash(b.lower(SearchSpace(b).default_schedule())))
    x = {"x": rng.standard_normal((1, 3, 10, 12)).astype(np.float32)}
    (y,) = aus.compile(graph, "llvm", log=log, schedule="model").run(x)
    np.testing.assert_allclose(y, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)


def test_a_busy_spell_over_half_the_rounds_does_not_pick_a_slower_candidate() -> None:
    """Nine alternating rounds; a busy spell (2x) from the default's turn in round 5 on, so
    the default has five slow rounds and the candidate, 4% slower in every round, four: the
    medians (2.0 against 1.04) would keep the candidate; the per-round ratios do not."""
    default = [1.0] * 4 + [2.0] * 5
    candidate = [1.04] * 5 + [2.08] * 4
    assert np.median(candidate) < np.median(default)
    assert choose_mod.fastest([default, candidate]) == 0
    faster = [0.9] * 4 + [1.0] + [1.8] * 4  # 10% faster in each round but the spell's first
    assert choose_mod.fastest([default, candidate, faster]) == 2


def test_a_tie_within_the_margin_keeps_the_untuned_default() -> None:
    rounds = np.linspace(1.0, 1.2, 9)  # drifting
    assert choose_mod.fastest([rounds, rounds * (1 - choose_mod.KEEP_MARGIN / 2)]) == 0
    assert choose_mod.fastest([rounds, rounds * (1 - 2 * choose_mod.KEEP_MARGIN)]) == 1


def test_the_latest_choice_wins_and_log_tools_keep_it(
        tuned: tuple[Any, Any, Path, list[Any]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    _, graph, log, (a, b) = tuned
    times = {(a.workload_key, "untuned"): 2e-6, (a.workload_key, "record 1"): 5e-6,
             (b.workload_key, "untuned"): 2e-6, (b.workload_key, "record 1"): 5e-6}
    _fake_model_times(monkeypatch, times)
    choose_mod.choose(graph, "llvm", log, rounds=3)
    # later, the machine (or the model around it) favours the records: a second choice wins
    times.update({(a.workload_key, "record 1"): 1e-6, (a.workload_key, "record 2"): 1e-6,
                  (b.workload_key, "record 1"): 1e-6, (b.workload_key, "record 2"): 1e-6})
    choose_mod.choose(graph, "llvm", log, rounds=3)
    monkeypatch.undo()
    recs = RecordLog(log).load()
    chosen = [r for r in recs if r.in_model and r.workload_key == a.workload_key]
    assert len(chosen) == 2
    (first,) = RecordLog(log).best(a.workload_key, a.target)
    assert first == chosen[-1] and first.ir_hash != chosen[0].ir_hash
    assert ranked(r for r in recs if r.workload_key == a.workload_key)[0] == chosen[-1]

    from autosched.cli import main

    merged, distilled = tmp_path / "merged.jsonl", tmp_path / "distilled.jsonl"
    assert main(["logs", "merge", str(log), "-o", str(merged)]) == 0
    assert len(RecordLog(merged).load()) == len(recs)  # a choice is not a duplicate
    assert main(["logs", "distill", str(log), "-k", "1", "-o", str(distilled)]) == 0
    kept = {r.workload_key: r for r in RecordLog(distilled).load()}
    assert kept[a.workload_key].in_model and kept[a.workload_key].ir_hash == first.ir_hash


def test_a_choice_against_another_default_is_made_again(
        tuned: tuple[Any, Any, Path, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A choice records the IR of the untuned default it was timed against; once compiling
    gives another default (the compiler's defaults changed) or where a log does not say,
    the model's next tuning run chooses again instead of keeping it."""
    _, graph, log, (a, b) = tuned
    _fake_model_times(monkeypatch, {(a.workload_key, "untuned"): 2e-6, (a.workload_key, "record 1"): 5e-6,
                                    (b.workload_key, "untuned"): 9e-6, (b.workload_key, "record 1"): 3e-6})
    choose_mod.choose(graph, "llvm", log, rounds=3)
    tasks = extract_tasks(graph, "llvm")[0]
    chosen = [r for r in RecordLog(log).load() if r.in_model]
    assert {r.extra[choose_mod.UNTUNED_IR] for r in chosen} == {
        choose_mod.default_ir_hash(t) for t in tasks if t.workload_key in (a.workload_key,
                                                                           b.workload_key)}
    assert choose_mod.chosen_since_last_trial(tasks, log)
    real = choose_mod.default_ir_hash
    monkeypatch.setattr(choose_mod, "default_ir_hash",
                        lambda t: "another" if t.workload_key == a.workload_key else real(t))
    assert not choose_mod.chosen_since_last_trial(tasks, log)
    monkeypatch.setattr(choose_mod, "default_ir_hash", real)
    lines = [json.loads(line) for line in Path(log).read_text().splitlines()]
    for d in lines:
        d.get("extra", {}).pop(choose_mod.UNTUNED_IR, None)  # a log from before the key
    Path(log).write_text("".join(json.dumps(d) + "\n" for d in lines))
    assert not choose_mod.chosen_since_last_trial(tasks, log)


def test_cost_model_data_leaves_choices_out(tuned: tuple[Any, Any, Path, list[Any]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from autosched.search.training_data import samples_from_records

    _, graph, log, (a, b) = tuned
    _fake_model_times(monkeypatch, {(a.workload_key, "untuned"): 2e-6, (a.workload_key, "record 1"): 5e-6,
                                    (b.workload_key, "untuned"): 9e-6, (b.workload_key, "record 1"): 3e-6})
    choose_mod.choose(graph, "llvm", log, rounds=3)
    recs = RecordLog(log).load()
    assert sum(r.in_model for r in recs) == 2
    samples, stats = samples_from_records(recs, {a.workload_key: a, b.workload_key: b}, "log")
    assert stats.used == 2


@pytest.mark.filterwarnings("ignore:no tuning record")  # 6 trials may not reach both tasks
def test_tune_graph_chooses_in_the_model(tmp_path: Path, rng: np.random.Generator) -> None:
    proto = _model(int(rng.integers(1 << 30)))
    graph = from_onnx(proto)
    log = tmp_path / "tuned.jsonl"
    aus.tune_graph(graph, "llvm", trials=6, log=log, min_repeat_ms=2.0, repeat=2)
    recs = RecordLog(log).load()
    chosen = [r for r in recs if r.in_model]
    assert chosen and all(json.loads(r.to_json_line())["extra"]["in_model"] for r in chosen)
    assert sum(not r.in_model for r in recs) >= 6
    x = {"x": rng.standard_normal((1, 3, 10, 12)).astype(np.float32)}
    (y,) = aus.compile(graph, "llvm", log=log).run(x)
    np.testing.assert_allclose(y, ort_run(proto, x)[0], rtol=1e-4, atol=1e-4)
    # the budget spent, a rerun measures nothing and chooses nothing again
    assert choose_mod.chosen_since_last_trial(extract_tasks(graph, "llvm")[0], log)
    aus.tune_graph(graph, "llvm", total_trials=len(recs) - len(chosen), log=log,
                   min_repeat_ms=2.0, repeat=2)
    assert len(RecordLog(log).load()) == len(recs)
    # one more trial (a resumed job with a larger budget): chosen again
    aus.tune_graph(graph, "llvm", total_trials=len(recs) - len(chosen) + 1, log=log,
                   min_repeat_ms=2.0, repeat=2)
    again = RecordLog(log).load()
    assert len([r for r in again if r.in_model]) > len(chosen)


def test_choosing_refuses_a_model_that_cannot_run_here(tuned: tuple[Any, Any, Path, list[Any]]
                                                       ) -> None:
    _, graph, log, _ = tuned
    with pytest.raises(ValueError, match="not this machine"):
        choose_mod.choose(graph, "llvm -mtriple=aarch64-linux-gnu", log)


def test_only_targets_of_this_machine_choose_in_the_model() -> None:
    assert choose_mod.runs_here(parse("llvm"))
    assert not choose_mod.runs_here(parse("llvm -mtriple=aarch64-linux-gnu"))
    assert not choose_mod.runs_here(parse("cuda -emulate=host"))  # CUDA C on the CPU
    try:
        from autosched.targets.cuda import runtime

        runtime.context()
        gpu = True
    except Exception:  # noqa: BLE001  no pycuda, driver or GPU here
        gpu = False
    assert choose_mod.runs_here(parse("cuda")) == gpu
