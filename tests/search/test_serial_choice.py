"""The serial choice of the CPU sketches' parallel knobs: 0 runs a stage on the calling thread
with no parallel loop (no fork-join). Serial candidates build and match numpy, the untuned
default is serial for a small stage and parallel for a large one, the choice survives JSON,
the cost model's features see it, and records written before it existed replay unchanged."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.cost_model.features import FEATURE_NAMES, extract_features
from autosched.schedule.steps import step_from_dict
from autosched.search.knobs import ChoiceKnob
from autosched.search.record import ir_hash
from autosched.search.space import Candidate, SearchSpace
from autosched.search.task import Task
from autosched.te import ops
from autosched.tir import ir as lir
from autosched.tir.visit import walk

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "tuning_logs" / "resnet18_llvm_znver4_3000.jsonl.gz"
TARGET = "llvm -num-cores=2"
P = te.placeholder


def _matmul_relu(m: int, n: int, k: int) -> tuple[list[te.Tensor], te.Tensor]:
    a, b = P((m, k), name="a"), P((k, n), name="b")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    return [a, b], ops.relu(c)


def _max_pool(x: np.ndarray) -> np.ndarray:
    """3x3 windows, stride 2, padding 1 (with -inf)."""
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    return win[:, :, ::2, ::2].max(axis=(-2, -1))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _graphs() -> dict:
    """(inputs, output, numpy reference) for each CPU rule with a parallel knob: tile, window,
    reduce and injective (the last two in a softmax), at shapes tiles do not divide."""
    def matmul_relu() -> tuple:
        return (*_matmul_relu(19, 23, 17), lambda a, b: np.maximum(a @ b, 0))

    def pool() -> tuple:
        x = P((1, 5, 13, 11), name="x")
        return [x], ops.max_pool2d(x, 3, 2, 1), _max_pool

    def softmax() -> tuple:
        x = P((7, 33), name="x")
        return [x], ops.softmax(x, axis=1), _softmax

    return {"matmul_relu": matmul_relu, "pool": pool, "softmax": softmax}


GRAPHS = _graphs()


def _parallel_knobs(space: SearchSpace) -> list[ChoiceKnob]:
    return [k for k in space.sketches[0].knobs
            if isinstance(k, ChoiceKnob) and k.name.endswith(".parallel")]


def _with(space: SearchSpace, c: Candidate, value: int) -> Candidate:
    """``c`` with every parallel knob at ``value`` (the largest it offers, if less)."""
    knobs = {k.name: k for k in _parallel_knobs(space)}
    return Candidate(c.sketch, tuple(
        (n, min(value, max(knobs[n].options)) if n in knobs else v) for n, v in c.params))


def _parallel_loops(func: lir.PrimFunc) -> int:
    return sum(isinstance(s, lir.For) and s.kind == "parallel" for s in walk(func.body))


def _run(space: SearchSpace, c: Candidate, inputs: list[te.Tensor], out: te.Tensor,
         values: list[np.ndarray]) -> tuple[np.ndarray, Any]:
    mod = aus.build(space.schedule(c), [*inputs, out], target=TARGET)
    got = np.full(tuple(int(d) for d in out.shape), np.nan, out.dtype)
    mod(*values, got)
    return got, mod


@pytest.mark.parametrize("name", list(GRAPHS))
def test_every_parallel_knob_offers_serial_and_it_matches_numpy(
        name: str, rng: np.random.Generator) -> None:
    inputs, out, reference = GRAPHS[name]()
    task = Task(out, target=TARGET)
    space = SearchSpace(task)
    knobs = _parallel_knobs(space)
    assert knobs and all(0 in k.options for k in knobs), knobs
    values = [rng.uniform(-2, 2, tuple(int(d) for d in t.shape)).astype(t.dtype)
              for t in inputs]
    for depth in (0, 1):
        c = _with(space, space.default_candidate(), depth)
        low = space.lower(c)
        assert low is not None and low.func is not None
        assert (_parallel_loops(low.func) == 0) == (depth == 0)
        got, mod = _run(space, c, inputs, out, values)
        assert mod.uses_threads == (depth > 0)
        np.testing.assert_allclose(got, reference(*values), rtol=1e-5, atol=1e-5)


def test_untuned_default_is_serial_for_a_small_stage_and_parallel_for_a_large_one() -> None:
    for (m, n, k), want_serial in (((8, 16, 8), True), ((256, 256, 256), False)):
        task = Task(_matmul_relu(m, n, k)[1], target=TARGET)
        space = SearchSpace(task)
        (knob,) = _parallel_knobs(space)
        low = space.lower(space.default_candidate())
        assert low is not None
        assert (knob.default() == 0) == want_serial, (m, n, k, knob)
        assert (_parallel_loops(low.func) == 0) == want_serial
    # an elementwise stage: a few hundred elements serial, a few million parallel
    for size, want_serial in ((300, True), (4_000_000, False)):
        x = P((size // 100, 100), name="x")
        space = SearchSpace(Task(ops.relu(x), target=TARGET))
        (knob,) = _parallel_knobs(space)
        assert (knob.default() == 0) == want_serial, (size, knob)
    # a small pad beside a large convolution: the kernel forks anyway, the pad joins in
    x, w = P((1, 16, 56, 56), name="x"), P((32, 16, 3, 3), name="w")
    space = SearchSpace(Task(ops.conv2d_nchw(x, w, 1, 1), target=TARGET))
    knobs = {k.name: k for k in _parallel_knobs(space)}
    assert "pad_temp.parallel" in knobs and all(k.default() > 0 for k in knobs.values()), knobs
    # a symbolic extent may be large at run time: parallel
    x = P((te.var("n"), 100), name="x")
    (knob,) = _parallel_knobs(SearchSpace(Task(ops.relu(x), target=TARGET)))
    assert knob.default() > 0, knob


def test_a_serial_candidate_round_trips_through_json(rng: np.random.Generator) -> None:
    inputs, out, _ = GRAPHS["matmul_relu"]()
    task = Task(out, target=TARGET)
    space = SearchSpace(task)
    c = _with(space, space.sample(rng), 0)
    back = Candidate.from_dict(json.loads(json.dumps(c.as_dict())))
    assert back == c and space.knows(back)
    low = space.lower(c)
    assert low is not None and low.schedule is not None
    steps = json.loads(json.dumps([s.to_dict() for s in low.schedule.steps]))
    replayed = task.lower(task.schedule([step_from_dict(d) for d in steps]))
    assert ir_hash(replayed) == low.ir_hash and _parallel_loops(replayed) == 0


def test_mutation_reaches_the_serial_choice(rng: np.random.Generator) -> None:
    inputs, out, _ = GRAPHS["matmul_relu"]()
    space = SearchSpace(Task(out, target=TARGET))
    (knob,) = _parallel_knobs(space)
    start = _with(space, space.default_candidate(), 1)
    seen = {dict(space.mutate(start, rng).params)[knob.name] for _ in range(300)}
    assert 0 in seen and len(seen) == len(knob.options)


def test_features_tell_a_serial_candidate_from_a_parallel_one() -> None:
    inputs, out, _ = GRAPHS["matmul_relu"]()
    task = Task(out, target=TARGET)
    space = SearchSpace(task)
    col = {n: FEATURE_NAMES.index(n) for n in ("parallel_num", "parallel_prod")}
    rows = {}
    for value in (0, 1):
        low = space.lower(_with(space, space.default_candidate(), value))
        assert low is not None and low.func is not None
        rows[value] = extract_features(low.func, task.target)
    for name, j in col.items():
        assert (rows[0][:, j] == 0).all(), name
        assert (rows[1][:, j] > 0).any(), name


@pytest.fixture(scope="module")
def resnet18_tasks() -> dict[str, Task]:
    from autosched.graph.compiler import extract_tasks
    from autosched.testing.models import resnet18
    from importers.onnx import from_onnx

    with gzip.open(BUNDLED, "rt") as f:
        fp = json.loads(f.readline())["target"]
    target = f"llvm -mcpu={fp['cpu']} -num-cores={fp['num_cores']}"
    tasks, _ = extract_tasks(from_onnx(resnet18()), target)
    return {t.workload_key: t for t in tasks}


def test_bundled_records_from_before_the_serial_choice_replay_unchanged(
        resnet18_tasks: dict[str, Task]) -> None:
    """Each task's fastest record in the bundled ResNet-18 log: its candidate (parallel depths
    1..n, no 0) still fits the space and builds the very loop nest its steps replay to."""
    best: dict[str, dict] = {}
    with gzip.open(BUNDLED, "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["error_code"] != "NO_ERROR" or "candidate" not in r.get("extra", {}):
                continue
            key = r["workload_key"]
            if key not in best or min(r["costs"]) < min(best[key]["costs"]):
                best[key] = r
    # the classifier's Gemm changed its workload (constant weights as column panels): its
    # records apply to nothing now; every other task's do
    stale = {k: r["task_name"] for k, r in best.items() if k not in resnet18_tasks}
    assert set(stale.values()) <= {"gemm"} and len(best) - len(stale) >= 10
    best = {k: r for k, r in best.items() if k not in stale}
    fitted = 0
    for key, r in best.items():
        task = resnet18_tasks[key]
        replayed = ir_hash(task.lower(task.schedule([step_from_dict(d) for d in r["steps"]])))
        space = SearchSpace(task)
        c = Candidate.from_dict(r["extra"]["candidate"])
        if not space.knows(c):  # a rule that gained a knob since: its record has fewer
            names = [k.name for k in space.sketches[c.sketch].knobs]
            have = dict(c.params)
            gained = [n for n in names if n not in have]
            assert gained and set(have) <= set(names), r["task_name"]
            if not all(n.endswith(".host") for n in gained):  # reduce: replayed from its steps
                assert any(rule.kind == "reduce" for rule in space.sketches[0].rules), r["task_name"]
                continue
            # a Winograd transform's rows, hosted or not: as before the knob, not
            c = Candidate(c.sketch, tuple((n, have.get(n, 0)) for n in names))
        assert 0 not in [v for n, v in c.params if n.endswith(".parallel")]
        low = space.lower(c)
        assert low is not None and low.ir_hash == replayed, r["task_name"]
        fitted += 1
    assert fitted >= len(best) - 1
