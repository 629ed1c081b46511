"""The auto-scheduler: sketches give correct schedules, tuning records and resumes, a killed job
loses nothing, the task scheduler spreads trials, the CLI tunes a named operator."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import autosched as aus
from autosched.search.record import RecordLog
from autosched.search.space import SearchSpace
from autosched.search.task_scheduler import TaskScheduler
from autosched.search.workloads import make
from autosched.targets.ref import build_module as ref_module
from autosched.targets.target import parse
from tests.support import ROOT
from tests.support.backends import random_array, tolerance

WORKLOADS = [
    ("gemm", [12, 20, 9]),
    ("conv2d", [1, 3, 7, 7, 4, 3, 3, 1, 1]),
    ("depthwise_conv2d", [1, 4, 6, 6, 3, 1, 1]),
    ("batch_matmul", [2, 5, 6, 7]),
    ("softmax", [4, 24]),
]


def _task(name: str, shape: list[int], target: str) -> aus.Task:
    tensors = make(name, shape)
    return aus.Task(lambda: tensors, target=target, name=name)


def _reference(task: aus.Task, inputs: list[np.ndarray]) -> list[np.ndarray]:
    outs = [np.full(tuple(o.shape), np.nan, o.dtype) for o in task.outputs]
    aus.build(task.schedule(), task.args, "ref")(*inputs, *outs)
    return outs


@pytest.mark.parametrize("target", ["llvm", "cuda"])
@pytest.mark.parametrize("name,shape", WORKLOADS)
def test_random_sketch_candidates_are_correct(name, shape, target, rng):
    """Random annotations of every sketch compute what the default schedule computes (the GPU
    ones run in the reference evaluator with CUDA semantics)."""
    task = _task(name, shape, target)
    space = SearchSpace(task)
    inputs = [random_array(rng, tuple(t.shape), t.dtype) for t in task.args if t not in task.outputs]
    want = _reference(task, inputs)
    checked = 0
    for _ in range(12):
        low = space.lower(space.sample(rng))
        if low is None:
            continue
        outs = [np.full(tuple(o.shape), np.nan, o.dtype) for o in task.outputs]
        ref_module(low.func, parse("ref"))(*inputs, *outs)
        for got, exp in zip(outs, want):
            np.testing.assert_allclose(got, exp, **tolerance("float32"))
        checked += 1
        if checked == 4:
            break
    assert checked >= 2, f"too few valid candidates for {name} on {target}"


def test_tune_records_resume_and_build_best(tmp_path, rng):
    task = _task("gemm", [48, 40, 32], "llvm")
    log = tmp_path / "gemm.jsonl"
    opts = aus.TuneOptions(batch_size=8, seed=1, verbose=False, population=32, generations=1)
    best = aus.tune(task, trials=16, log=log, options=opts, repeat=2, min_repeat_ms=5)
    recs = RecordLog(log).load()
    assert len(recs) == 16
    assert all(r.workload_key == task.workload_key for r in recs)
    hashes = [r.ir_hash for r in recs]
    assert len(set(hashes)) == len(hashes), "a candidate was measured twice"
    ok = [r for r in recs if r.ok]
    assert ok and best[task.name] == min(r.cost for r in ok)
    # resume: 8 more trials measure only new candidates
    aus.tune(task, trials=8, log=log, options=opts, repeat=2, min_repeat_ms=5)
    recs2 = RecordLog(log).load()
    assert len(recs2) == 24 and [r.ir_hash for r in recs2[:16]] == hashes
    assert len({r.ir_hash for r in recs2}) == 24
    f = aus.build_best(task, log)
    a, b = (random_array(rng, tuple(t.shape)) for t in task.args[:2])
    c = np.full((48, 40), np.nan, "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, **tolerance("float32"))
    best_rec = min((r for r in recs2 if r.ok), key=lambda r: r.cost)  # the resumed job's too
    assert json.loads(aus.best_schedule(task, log).to_json())["steps"] == best_rec.steps
    assert any(r.extra.get("sketch") == "default" and r.steps == [] for r in recs2)  # measured once
    # the sketch's untuned default candidate is measured in the first round too
    from autosched.search.space import SearchSpace

    default = SearchSpace(task).default_candidate().as_dict()
    assert any(r.extra.get("candidate") == default for r in recs2[:8])
    tiled = next(r for r in ok if r.steps)
    text = task.schedule(tiled.schedule_steps()).to_python()
    assert "s.cache_write" in text or "compute_at" in text


def test_killed_job_loses_nothing_and_remeasures_nothing(tmp_path):
    """SIGKILL a tuning job mid-way; the rerun keeps every record and measures only new ones."""
    log = tmp_path / "kill.jsonl"
    script = textwrap.dedent(f"""
        import autosched as aus
        from autosched.search.workloads import make
        tensors = make("gemm", [64, 64, 64])
        task = aus.Task(lambda: tensors, target="llvm", name="gemm")
        opts = aus.TuneOptions(batch_size=4, seed=3, verbose=False, population=32, generations=1)
        aus.tune(task, total_trials=40, log={str(log)!r}, options=opts, repeat=2,
                 min_repeat_ms=5)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        if log.exists() and len(log.read_bytes().splitlines()) >= 8:
            break
        if proc.poll() is not None:
            pytest.fail(f"tuning job ended early with {proc.returncode}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the job and its measurement workers
    proc.wait()
    before = RecordLog(log).load()
    assert 8 <= len(before) < 40
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=600)
    after = RecordLog(log).load()
    assert len(after) == 40
    assert [r.ir_hash for r in after[: len(before)]] == [r.ir_hash for r in before]
    assert len({r.ir_hash for r in after}) == 40, "the resumed job re-measured a candidate"


def test_corrupt_line_is_skipped_when_resuming(tmp_path):
    task = _task("softmax", [8, 32], "llvm")
    log = tmp_path / "sm.jsonl"
    opts = aus.TuneOptions(batch_size=4, seed=2, verbose=False, population=16, generations=1)
    aus.tune(task, trials=4, log=log, options=opts, repeat=1, min_repeat_ms=1)
    with open(log, "a") as f:
        f.write('{"version": 1, "workload_key": "torn\n')
    with pytest.warns(UserWarning, match="line 6"):  # line 1: the target header
        aus.tune(task, trials=4, log=log, options=opts, repeat=1, min_repeat_ms=1)
    assert len(RecordLog(log).load()) == 8


class _FakeTuner:
    def __init__(self, flops: float, cost: float, family: str = "conv"):
        op = type("Op", (), {"name": family, "reduce_axis": ["k"]})()
        self.task = type("T", (), {"flop_count": flops, "dag": type("D", (), {"ops": [op]})()})()
        self.best_cost = cost
        self.history = [cost]
        self.trials = 0


def test_task_scheduler_prefers_the_task_with_most_to_gain():
    slow = _FakeTuner(1e9, 1.0)     # 1 GFLOPS: far from what the other task reaches
    fast = _FakeTuner(1e9, 0.01)    # 100 GFLOPS
    sched = TaskScheduler([fast, slow], weights=[1.0, 1.0])
    assert sched.next_task() is fast  # warm-up in order
    sched.update(fast)
    assert sched.next_task() is slow
    sched.update(slow)
    assert sched.next_task() is slow  # largest expected gain
    sched2 = TaskScheduler([fast, slow], weights=[1000.0, 1.0])
    sched2.update(fast)
    sched2.update(slow)
    fast.history = [0.02, 0.01]
    assert sched2.next_task() is fast  # weight (occurrences in a model) matters


def test_task_scheduler_compares_rates_within_a_family():
    # a task alone in its family has no faster sibling to promise a forward gain; a slow
    # conv beside a fast conv does (a Winograd transform's flop rate says nothing of a conv's)
    alone = _FakeTuner(1e9, 1.0, family="winograd_input")
    slow = _FakeTuner(1e9, 0.5)
    fast = _FakeTuner(1e9, 0.01)
    sched = TaskScheduler([alone, slow, fast])
    for t in (alone, slow, fast):
        sched.update(t)
    assert sched.next_task() is slow
    assert sched.gradient(0) < sched.gradient(1)


def test_task_scheduler_revisits_the_task_holding_most_latency_per_trial():
    # the best-rate task of a family has no forward gain and a flat history, so the gradient
    # alone never returns to it however long it runs; every REVISIT-th pick does
    from autosched.search.task_scheduler import REVISIT

    stem = _FakeTuner(1e9, 0.01)              # the family's best rate, flat: gradient 0
    stem.trials = 64
    rest = [_FakeTuner(1e9, 0.1) for _ in range(3)]  # 10x slower: the gradient's choice
    for r in rest:
        r.trials = 500
        r.history = [0.2, 0.15, 0.1]
    sched = TaskScheduler([stem, *rest], weights=[4.0, 1.0, 1.0, 1.0])
    for t in (stem, *rest):
        sched.update(t)
    picks = [sched.next_task() for _ in range(2 * REVISIT)]
    assert picks.count(stem) == 2
    assert picks[REVISIT - 1] is stem and picks[2 * REVISIT - 1] is stem
    assert all(p is not stem for i, p in enumerate(picks) if (i + 1) % REVISIT)


def test_warm_up_goes_to_the_largest_tasks_first():
    """A budget below one warm-up round of every task is spent where the model's time is:
    tasks warm up by weight x estimated size, not in model order."""
    small, big, mid = (_task("gemm", [n, n, n], "llvm") for n in (8, 96, 40))
    tuners = [type("Tuner", (), {"task": t})() for t in (small, big, mid)]
    sched = TaskScheduler(tuners)
    order = []
    for _ in tuners:
        order.append(sched.next_task())
        sched.update(order[-1])
    assert [t.task for t in order] == [big, mid, small]
    heavy = TaskScheduler(tuners, weights=[1e6, 1.0, 1.0])  # the small one occurs 10^6 times
    assert heavy.next_task().task is small


def test_warm_up_rounds_are_sized_by_the_task_s_share():
    """A task far below the average estimated size warms up with WARM_MIN candidates, one far
    above it with the whole batch, so a budget of a round per task is not all warm-up; after
    the warm-up every round is the batch."""
    from autosched.search.task_scheduler import WARM_MIN

    tasks = [_task("gemm", [n, n, n], "llvm") for n in (8, 16, 128, 128)]
    tuners = [type("Tuner", (), {"task": t})() for t in tasks]
    sched = TaskScheduler(tuners)
    sizes = [sched.round_size(t, 16) for t in tuners]
    assert sizes[0] == sizes[1] == WARM_MIN and sizes[2] == sizes[3] == 16, sizes
    sched.update(tuners[0])
    assert sched.round_size(tuners[0], 16) == 16
    assert sched.round_size(tuners[1], 3) == 3  # never more than the batch


def test_resumed_job_warms_up_the_tasks_not_tuned_yet(tmp_path):
    # a model tuned in several calls (a resumed job) must not give every call's first trials
    # to the first tasks again: tasks with records have had their warm-up
    tasks = [_task("softmax", [4, 8 * (i + 1)], "llvm") for i in range(3)]
    log = tmp_path / "three.jsonl"
    opts = aus.TuneOptions(batch_size=4, seed=0, verbose=False, population=8, generations=1)
    for _ in range(3):
        aus.tune(tasks, trials=4, log=log, options=opts, repeat=1, min_repeat_ms=1)
    counts = [len(RecordLog(log).records_for(t.workload_key, t.target)) for t in tasks]
    assert counts == [4, 4, 4]
    resumed, new = _FakeTuner(1e9, 1.0), _FakeTuner(1e9, 1.0)
    resumed.records = ["a record"]
    assert TaskScheduler([resumed, new]).next_task() is new


def test_cli_tune_op(tmp_path):
    log = tmp_path / "cli.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "autosched", "tune-op", "softmax", "8", "64",
         "--trials", "4", "--batch-size", "4", "--log", str(log)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "GFLOPS" in out.stdout
    assert "s[" in out.stdout or "the default schedule (no steps) was fastest" in out.stdout
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 5 and "target_header" in lines[0]  # the target's header, 4 records


def test_register_tile_default_follows_reuse_and_strides() -> None:
    from autosched.search.sketch import register_tile
    from autosched.search.workloads import make

    def tile(name: str, shape: list[int]) -> list[int]:
        return register_tile(make(name, shape)[-1].op, lanes=16)

    assert tile("gemm", [256, 256, 256]) == [4, 64]            # rows x a 64-wide panel
    assert tile("conv2d", [1, 64, 56, 56, 64, 3, 3, 1, 1]) == [1, 4, 1, 56]
    # 7 columns would be vectors of 4, 2 and 1 lanes: one masked vector of 16 instead
    assert tile("conv2d", [1, 32, 7, 7, 32, 3, 3, 1, 1]) == [1, 2, 7, 16]
    # a stride-2 read along the vector is a gather: the tile leans on the channels instead
    strided = tile("conv2d", [1, 16, 28, 28, 32, 3, 3, 2, 1])
    assert strided[1] >= 8


def test_register_tile_overhangs_where_columns_leave_odd_vectors() -> None:
    """169 columns (13 x 13 Winograd tiles) divide only into 13s, three vectors of 8, 4 and
    1 lanes each: the default takes whole vectors that overhang the last tile instead; 196
    columns in 49s (3 vectors and one lane) stay as they are."""
    from autosched import te
    from autosched.search.knobs import TileKnob
    from autosched.search.sketch import register_tile, vector_pieces
    from autosched.te import ops

    def bmm(k: int, n: int) -> list[int]:
        u = te.placeholder((36, k, k), name="u")
        v = te.placeholder((36, k, n), name="v")
        return register_tile(ops.batch_matmul(u, v).op, lanes=16)

    assert [vector_pieces(n, 16) for n in (1, 7, 13, 16, 40, 48, 49)] == [1, 3, 3, 1, 3, 3, 4]
    last = bmm(96, 169)[-1]
    assert last % 16 == 0 and 169 % last != 0
    assert bmm(64, 196)[-1] == 49
    knob = TileKnob("t", 169, 3, prefer=(4, 1, 64), exact_inner=True)
    assert knob.default() == (3, 1, 64)       # 169 in 3 tiles of 64, the last one overhanging
    assert TileKnob("t", 169, 3, prefer=(4, 1, 64)).default() == (1, 1, 13)


def test_register_tile_keeps_a_vector_in_the_row_its_read_cuts(rng) -> None:
    """A Winograd input transform reads ``rows[..., p % 140 // 14, p % 14 * 4 + rj]`` over
    its flattened tile index p, 14 tiles a row: the untuned vector divides the row, so its
    lanes stay in one row and load strided instead of lane by lane, and the kernel matches
    numpy. Its output transform's ``x // 4`` over 14 columns makes rows of 2 lanes, shorter
    than MIN_ROW: those columns are chosen as before."""
    from autosched import te
    from autosched.search.sketch import MIN_ROW, register_tile, row_length
    from autosched.te import ops

    at, _, bt = ops.winograd_matrices(4)
    x, b = te.placeholder((1, 8, 40, 56), name="x"), te.placeholder(bt.shape, name="bt")
    v = ops.winograd_input(x, b, 4, padding=1)
    assert row_length(v.op, v.op.axis[-1].var) == 14
    assert 14 % register_tile(v.op, lanes=16)[-1] == 0
    task = aus.Task(v, target="llvm")
    mod = task.build(SearchSpace(task).default_schedule())
    lane_by_lane = r"insertelement <\d+ x float> .*, i32 [1-9]\d*$"
    assert not re.search(lane_by_lane, mod.get_llvm_ir(optimized=False), re.M)
    xs = random_array(rng, (1, 8, 40, 56), "float32")
    got = np.empty((36, 8, 140), "float32")
    args = {"x": xs, "bt": bt.astype(np.float32), "winograd_input": got}
    mod(*(args[t.name] for t in task.args))
    xp = np.pad(xs.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    tiles = np.lib.stride_tricks.sliding_window_view(xp, (6, 6), axis=(2, 3))[0, :, ::4, ::4]
    want = np.einsum("ei,cyxij,nj->encyx", bt, tiles, bt).reshape(36, 8, 140)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    prod, a = te.placeholder((36, 8, 40), name="prod"), te.placeholder(at.shape, name="at")
    y = ops.winograd_output(prod, a, 4, (1, 8, 40, 14))
    assert math.gcd(14, row_length(y.op, y.op.axis[-1].var) or 0) < MIN_ROW


@pytest.mark.parametrize("height,hosted", [(400, True), (40, False)])
def test_transform_rows_are_computed_in_the_tiles_that_read_them(height, hosted, rng) -> None:
    """A Winograd transform's rows stage (6 taps) whose output would leave the caches
    (HOSTED_MIN_BYTES: 6.4 MB over 400 x 161 with 16 channels) is computed inside its reader's
    parallel tiles by default, the input transform's tiles holding all 36 points of B^T so
    each input element loads once (64 channels over 900 x 161: 34 -> 14 ms; the output
    transform 39 -> 10); small ones keep computing it first. Both match numpy."""
    from autosched import te
    from autosched.te import ops

    at, _, bt = ops.winograd_matrices(4)
    c, w = 16, 161
    th, tw = height // 4, -(-w // 4)
    x, b = te.placeholder((1, c, height, w), name="x"), te.placeholder(bt.shape, name="bt")
    v = ops.winograd_input(x, b, 4, padding=1)
    task = aus.Task(v, target="llvm")
    params = dict(SearchSpace(task).default_candidate().params)
    assert params["winograd_rows.host"] == int(hosted)
    if hosted:
        assert math.prod(params["winograd_input.tile.t"]) == 36
    mod = task.build(SearchSpace(task).default_schedule())
    xs = random_array(rng, (1, c, height, w), "float32")
    got = np.empty((36, c, th * tw), "float32")
    feed = {"x": xs, "bt": bt.astype(np.float32), "winograd_input": got}
    mod(*(feed[t.name] for t in task.args))
    xp = np.pad(xs.astype(np.float64), ((0, 0), (0, 0), (1, 3), (1, tw * 4 + 2 - w - 1)))
    tiles = np.lib.stride_tricks.sliding_window_view(xp, (6, 6), axis=(2, 3))[0, :, ::4, ::4]
    want = np.einsum("ei,cyxij,nj->encyx", bt, tiles, bt).reshape(36, c, th * tw)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    prod, a = te.placeholder((36, c, th * tw), name="prod"), te.placeholder(at.shape, name="at")
    y = ops.winograd_output(prod, a, 4, (1, c, height, w))
    task = aus.Task(y, target="llvm")
    params = dict(SearchSpace(task).default_candidate().params)
    assert params["winograd_out_rows.host"] == int(hosted)
    mod = task.build(SearchSpace(task).default_schedule())
    ps = random_array(rng, (36, c, th * tw), "float32")
    out = np.empty((1, c, height, w), "float32")
    feed = {"prod": ps, "at": at.astype(np.float32), "winograd_output": out}
    mod(*(feed[t.name] for t in task.args))
    m6 = ps.astype(np.float64).reshape(6, 6, c, th, tw)
    full = np.einsum("ae,encyx,bn->cyaxb", at, m6, at).reshape(c, th * 4, tw * 4)
    np.testing.assert_allclose(out[0], full[:, :height, :w], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups,kernel,stride,inlined", [
    (16, 3, 2, True),     # depthwise 3 x 3, stride 2: each padded element read about twice
    (16, 5, 1, False),    # depthwise 5 x 5, stride 1: 25 times (1.5-1.75x faster computed first)
    (1, 3, 2, False),     # dense: once per output channel and tap
])
def test_padding_default_follows_its_readers_reuse(groups: int, kernel: int, stride: int,
                                                   inlined: bool, rng) -> None:
    """The untuned default inlines a padding its readers read each element of fewer than
    PAD_REUSE times (a few taps of one channel) and computes one they read more often first.
    Either default matches numpy."""
    from autosched import te
    from autosched.te import ops

    x = te.placeholder((1, 16, 28, 27), name="x")
    w = te.placeholder((16, 16 // groups, kernel, kernel), name="w")
    y = ops.conv2d_nchw(x, w, stride=stride, padding=kernel // 2, groups=groups)
    task = aus.Task(lambda: [x, w, y], target="llvm")
    space = SearchSpace(task)
    assert dict(space.default_candidate().params)["pad_temp.inline"] == int(inlined)
    inputs = [random_array(rng, (1, 16, 28, 27), "float32"),
              random_array(rng, (16, 16 // groups, kernel, kernel), "float32")]
    out = np.empty([int(d) for d in y.shape], "float32")
    task.build(space.default_schedule())(*inputs, out)
    np.testing.assert_allclose(out, _reference(task, inputs)[0], **tolerance("float32"))


def test_register_tile_overhangs_where_divisors_leave_vectors_under_half_full() -> None:
    """166 columns divide into 2s and 83s: vectors of 2 lanes fill an eighth of AVX-512's
    (a convolution over them ran 4-7x slower than in overhanging 16s); the default takes
    whole vectors that overhang the last tile. 56 columns keep their 56."""
    from autosched.search.sketch import register_tile

    def last(width: int) -> int:
        return register_tile(make("conv2d", [1, 16, 8, width, 16, 3, 3, 1, 1])[-1].op, 16)[-1]

    assert last(166) % 16 == 0
    assert last(56) == 56


class _ScoreByCost:
    """A trained model that prefers fewer loop iterations; counts the candidates it scored."""

    trained = True

    def __init__(self):
        self.scored = 0

    def predict(self, feats):  # noqa: ANN001, ANN201
        self.scored += len(feats)
        return np.array([-float(f[:, 0].sum()) for f in feats])


def test_cold_round_samples_and_a_trained_round_evolves():
    from autosched.cost_model.features import extract_features
    from autosched.cost_model.random_model import RandomModel
    from autosched.search.evolution import EvolutionarySearch, EvolutionConfig

    task = _task("gemm", [32, 48, 40], "llvm")
    space = SearchSpace(task)
    cfg = EvolutionConfig(population=24, generations=2, elite=4)
    search = EvolutionarySearch(space, lambda f: extract_features(f, task.target),
                                np.random.default_rng(0), cfg)
    cold = search.next_batch(6, RandomModel(0), set())
    hashes = [c.ir_hash for c in cold]
    assert len(cold) == 6 and len(set(hashes)) == 6
    # a cold round lowers its starts and at most 2n samples per draw, not population x
    # generations (4 draws at most when samples collide)
    assert len(search._cache) <= 1 + 4 * 2 * 6
    again = search.next_batch(6, RandomModel(1), set(hashes))
    assert not set(hashes) & {c.ir_hash for c in again}  # measured candidates never return
    model = _ScoreByCost()
    warm = search.next_batch(6, model, set(hashes))
    assert len(warm) == 6 and not set(hashes) & {c.ir_hash for c in warm}
    assert model.scored >= cfg.population * (cfg.generations + 1)  # it evolved under the model


def test_a_round_starts_from_the_last_rounds_best_predicted():
    """Every trained round drew a whole population of fresh random samples and lowered them;
    now three quarters of it are the last round's best predicted candidates not taken
    (already lowered, rescored), never one measured since, and only the rest is drawn."""
    from autosched.cost_model.features import extract_features
    from autosched.search.evolution import EvolutionarySearch, EvolutionConfig
    from autosched.search.space import Candidate

    task = _task("gemm", [32, 48, 40], "llvm")
    space = SearchSpace(task)
    cfg = EvolutionConfig(population=24, generations=2, elite=4)
    search = EvolutionarySearch(space, lambda f: extract_features(f, task.target),
                                np.random.default_rng(0), cfg)
    drawn: list[int] = []
    sample = space.sample

    def counted(rng: np.random.Generator) -> Candidate:
        drawn[-1] += 1
        return sample(rng)

    space.sample = counted  # type: ignore[method-assign]
    measured: set[str] = set()
    for _ in range(3):
        drawn.append(0)
        batch = search.next_batch(6, _ScoreByCost(), measured)
        assert len(batch) == 6 and not measured & {c.ir_hash for c in batch}
        carried = search._carried
        assert len(carried) == int(cfg.population * cfg.carry)
        assert not {c.ir_hash for c in batch} & {c.ir_hash for c in carried}
        measured |= {c.ir_hash for c in batch}
        measured.add(carried[0].ir_hash)  # measured elsewhere since: not carried in
    # the first round drew the population and the eps-greedy picks; the later ones a quarter
    eps = int(round(6 * cfg.eps_greedy)) * 3 + 3
    assert drawn[0] >= cfg.population
    assert all(cfg.population // 4 <= d <= cfg.population // 4 + 1 + eps for d in drawn[1:]), \
        drawn


def test_every_sketch_gets_a_share_of_each_batch():
    """A half matmul on the GPU has a SIMT and a tensor-core sketch: the first round measures
    each sketch's default, and a model that scores one sketch far below the other still leaves
    it a share of every batch."""
    from autosched import te
    from autosched.cost_model.features import extract_features
    from autosched.cost_model.random_model import RandomModel
    from autosched.search.evolution import EvolutionarySearch, EvolutionConfig
    from autosched.te import ops

    a = te.placeholder((64, 48), "float16", name="A")
    b = te.placeholder((48, 80), "float16", name="B")
    # sm_80: no third (warpgroup) sketch
    task = aus.Task(lambda: [a, b, ops.matmul(a, b, out_dtype="float32")],
                    target="cuda -arch=sm_80", precision="fp16")
    space = SearchSpace(task)
    assert len(space.sketches) == 2
    search = EvolutionarySearch(space, lambda f: extract_features(f, task.target),
                                np.random.default_rng(0),
                                EvolutionConfig(population=24, generations=1, elite=4,
                                                eps_greedy=0.0, eps_uncertain=0.0))
    cold = search.next_batch(8, RandomModel(0), set())
    assert set(space.sketch_defaults()) <= {c.candidate for c in cold}

    class Blind:
        """Scores every candidate of ``low`` far below those of the other sketch."""

        trained = True

        def __init__(self, low: int) -> None:
            self.low = low

        def predict(self, feats):  # noqa: ANN001, ANN201
            sketch = {id(c.features): c.candidate.sketch for c in search._cache.values() if c}
            return np.array([-1e9 if sketch[id(f)] == self.low else 0.0 for f in feats])

    measured = {c.ir_hash for c in cold}
    for low in (0, 1):
        batch = search.next_batch(8, Blind(low), measured)
        assert len(batch) == 8 and {c.candidate.sketch for c in batch} == {0, 1}
        assert sum(c.candidate.sketch == low for c in batch) == 1  # n / (4 x sketches)


def test_register_tiles_fit_the_register_file():
    from autosched.search.sketch import accumulator_registers
    from autosched.search.space import Candidate

    assert parse("llvm -mcpu=haswell -mattr=+avx2,+fma").vector_registers == 16
    assert parse("llvm -mcpu=skylake-avx512 -mattr=+avx512f,+avx2,+fma").vector_registers == 32
    assert parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72").vector_registers == 32
    tensors = make("conv2d", [1, 32, 14, 14, 64, 3, 3, 1, 1])
    task = aus.Task(lambda: tensors, target="llvm -mcpu=haswell -mattr=+avx2,+fma")
    space = SearchSpace(task)
    tiles = [k.name for k in space.sketches[0].knobs if ".tile." in k.name]
    rng = np.random.default_rng(0)

    def acc(c: Candidate) -> int:
        p = dict(c.params)
        return accumulator_registers([p[t][2] for t in tiles], lanes=8)

    samples = [space.sample(rng) for _ in range(40)]
    assert all(acc(c) <= 16 for c in samples)
    assert all(acc(space.mutate(c, rng)) <= 16 for c in samples)
    assert acc(space.default_candidate()) <= 12  # operands keep a few registers
    # a tile of 4 channels x 14 columns (2 vectors each) x 2 rows needs 16 registers: legal;
    # with 4 rows it needs 32 and is refused with the reason
    p = dict(space.default_candidate().params)
    f, y, x = tiles[1:]
    ok = Candidate(0, tuple({**p, f: (16, 1, 4), y: (7, 1, 2), x: (1, 1, 14)}.items()))
    big = Candidate(0, tuple({**p, f: (16, 1, 4), y: (7, 1, 4), x: (1, 1, 14)}.items()))
    assert acc(ok) == 16 and space.lower(ok) is not None
    assert acc(big) == 32 and space.lower(big) is None
    with pytest.raises(aus.errors.ScheduleError, match="32 accumulator registers"):
        space.schedule(big)


def test_progress_note_weighs_tasks_and_counts_the_unmeasured():
    """The note summed the best latencies of the tasks measured so far, unweighted: it grew as
    each task got its first measurement, which read as tuning making the model slower."""
    from types import SimpleNamespace

    from autosched.search.tune import _status

    a, b, c = (SimpleNamespace(best_cost=x) for x in (2e-3, 1e-3, float("inf")))
    assert _status([a, b, c], [3, 1, 1], 1.0) == (
        "2 of 3 tasks measured, their weighted best 7.000 ms")
    c.best_cost = 5e-4
    assert _status([a, b, c], [3, 1, 2], 1.0) == "estimated model latency 8.000 ms"
