"""Cost model: features of lowered loop IR (width, finiteness, what each group reacts to) and
the XGBoost model (learns a ranking of schedules, save / load, update, warm start)."""

from __future__ import annotations

import json
import math
import random
import time
from types import SimpleNamespace

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.cost_model.features import (
    FEATURE_NAMES,
    N_FEATURES,
    extract_features,
    extract_features_batch,
)
from autosched.cost_model.random_model import RandomModel
from autosched.cost_model.xgb_model import XGBModel, aggregate, warm_start_from_records
from autosched.schedule.steps import step_from_dict
from autosched.search.record import MeasureRecord
from autosched.search.task import Task
from autosched.targets.target import parse
from tests.support.cost_model import matmul, pairwise_accuracy, random_matmul_schedule

CPU = parse("llvm -mcpu=skylake -mattr=+avx2,+fma -num-cores=4")
GPU = parse("cuda -arch=sm_90")
F = {n: i for i, n in enumerate(FEATURE_NAMES)}


def feats_of(s, args, target=CPU) -> np.ndarray:
    return extract_features(aus.lower(s, args), target)


def value(x: np.ndarray, name: str, row: int = -1) -> float:
    return float(x[row, F[name]])


def unlog(v: float) -> float:
    return 2.0**v - 1.0


def buffer_slot(x: np.ndarray, row: int, want: str) -> int:
    """The buffer slot of ``row`` whose access type is ``want`` (read / write / readwrite)."""
    for b in range(5):
        if x[row, F[f"buf{b}_present"]] and x[row, F[f"buf{b}_{want}"]]:
            return b
    raise AssertionError(f"no {want} buffer in row {row}")


# -- features ---------------------------------------------------------------------------------


def test_feature_names_are_unique_and_match_the_width():
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) == N_FEATURES
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    x = feats_of(s, [A, B, C])
    assert x.dtype == np.float32 and x.shape == (2, N_FEATURES)  # init store, update store
    assert np.isfinite(x).all()


def test_arithmetic_counts_are_totals_over_the_nest():
    A, B, C = matmul(19, 13, 11)
    s = te.create_schedule(C.op)
    x = feats_of(s, [A, B, C])
    update = x[-1]
    assert unlog(update[F["float_mul"]]) == pytest.approx(19 * 13 * 11, rel=1e-5)
    assert unlog(update[F["float_fma"]]) == pytest.approx(19 * 13 * 11, rel=1e-5)
    assert unlog(update[F["flops"]]) == pytest.approx(2 * 19 * 13 * 11, rel=1e-5)
    assert unlog(update[F["outer_prod"]]) == pytest.approx(19 * 13 * 11, rel=1e-5)
    assert value(x, "value_is_const", 0) == 1.0 and value(x, "value_is_const", 1) == 0.0


def test_math_calls_and_selects_are_counted():
    A = te.placeholder((8, 16), name="A")
    C = te.compute((8, 16), lambda i, j: te.if_then_else(A[i, j] > 0.0, te.exp(A[i, j]), 0.0),
                   name="C")
    s = te.create_schedule(C.op)
    x = feats_of(s, [A, C])
    assert unlog(value(x, "float_math")) == pytest.approx(128)
    assert unlog(value(x, "select")) == pytest.approx(128)
    assert unlog(value(x, "float_cmp")) == pytest.approx(128)


def test_vectorize_sets_the_vector_length():
    A, B, C = matmul()
    base = te.create_schedule(C.op)
    vec = te.create_schedule(C.op)
    for s, do_vec in ((base, False), (vec, True)):
        i, j = s[C].op.axis
        jo, ji = s[C].split(j, factor=8)
        (k,) = s[C].op.reduce_axis
        s[C].reorder(i, jo, k, ji)
        if do_vec:
            s[C].vectorize(ji)
    xb, xv = feats_of(base, [A, B, C]), feats_of(vec, [A, B, C])
    assert value(xb, "vec_len") == 0.0
    assert unlog(value(xv, "vec_len")) == pytest.approx(8)
    assert value(xv, "vec_innermost") == 1.0 and value(xv, "loop0_vectorized") == 1.0
    assert value(xv, "vec_lanes_ratio") == pytest.approx(1.0)  # 8 float32 lanes in AVX2
    assert value(xb, "loop0_serial") == 1.0


def test_parallel_feature_reflects_the_parallel_loop():
    A, B, C = matmul(64, 48, 32)
    s = te.create_schedule(C.op)
    i, _ = s[C].op.axis
    io, _ = s[C].split(i, factor=10)   # 7 chunks on 4 cores
    s[C].parallel(io)
    x = feats_of(s, [A, B, C])
    assert unlog(value(x, "parallel_prod")) == pytest.approx(7)
    assert value(x, "parallel_num") == pytest.approx(1.0)   # log2(1 + 1)
    assert value(x, "parallel_balance") == pytest.approx(7 / 8)
    plain = feats_of(te.create_schedule(C.op), [A, B, C])
    assert value(plain, "parallel_prod") == 0.0


def test_unroll_and_pragmas():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    jo, ji = s[C].split(j, factor=4)
    s[C].unroll(ji)
    s[C].pragma(i, "auto_unroll_max_step", 64)
    s[C].pragma(i, "unroll_explicit", True)
    x = feats_of(s, [A, B, C])
    assert unlog(value(x, "unroll_len")) == pytest.approx(4)
    assert unlog(value(x, "auto_unroll_max_step")) == pytest.approx(64)
    assert value(x, "unroll_explicit") == 1.0


def transpose_copy(column: bool):
    A = te.placeholder((1024, 1024), name="A")
    C = te.compute((1024, 1024), (lambda i, j: A[j, i]) if column else (lambda i, j: A[i, j]),
                   name="C")
    return A, C


def test_strided_access_touches_more_cache_lines():
    lines = {}
    for column in (False, True):
        A, C = transpose_copy(column)
        x = feats_of(te.create_schedule(C.op), [A, C])
        b = buffer_slot(x, 0, "read")
        lines[column] = (value(x, f"buf{b}_lines_inner", 0), value(x, f"buf{b}_stride_inner", 0),
                         value(x, f"buf{b}_lane_contiguous", 0), value(x, f"buf{b}_traffic_l1", 0))
    (row_lines, row_stride, row_contig, row_l1) = lines[False]
    (col_lines, col_stride, col_contig, col_l1) = lines[True]
    assert unlog(row_lines) == pytest.approx(1024 * 4 / 64)  # 64 lines for a 4 KB row
    assert unlog(col_lines) == pytest.approx(1024)           # one line per element
    assert unlog(row_stride) == pytest.approx(1) and unlog(col_stride) == pytest.approx(1024)
    assert (row_contig, col_contig) == (1.0, 0.0)
    # A column of lines (64 KB) does not stay in a 32 KB L1 until the next column reuses it.
    assert unlog(row_l1) == pytest.approx(1024 * 1024 / 16, rel=1e-3)
    assert unlog(col_l1) == pytest.approx(1024 * 1024, rel=1e-3)


def test_fused_loop_strides_through_floordiv_and_floormod():
    A = te.placeholder((30, 20), name="A")
    C = te.compute((30, 20), lambda i, j: A[i, j] * 2.0, name="C")
    s = te.create_schedule(C.op)
    fo, fi = s[C].split(s[C].fuse(*s[C].op.axis), factor=16)
    x = feats_of(s, [A, C])      # indices (fo * 16 + fi) // 20 and (fo * 16 + fi) % 20
    b = buffer_slot(x, 0, "read")
    assert unlog(value(x, f"buf{b}_stride_inner", 0)) == pytest.approx(1.0)
    assert value(x, f"buf{b}_lane_contiguous", 0) == 1.0
    assert unlog(value(x, f"buf{b}_unique_bytes", 0)) == pytest.approx(600 * 4, rel=1e-3)
    assert 0.95 <= value(x, "guard_fraction", 0) <= 1.0   # 600 of 608 iterations pass


def test_reuse_of_a_buffer_invariant_to_the_inner_loop():
    A, B, C = matmul()
    s = te.create_schedule(C.op)   # loops i, j, k
    x = feats_of(s, [A, B, C])
    levels = {}
    for b in range(3):
        kind = ("read" if x[1, F[f"buf{b}_read"]] else "readwrite")
        levels.setdefault(kind, []).append(value(x, f"buf{b}_reuse_level", 1))
    assert levels["readwrite"] == [1.0]          # C: k is innermost and absent from C[i, j]
    assert sorted(levels["read"]) == [2.0, 3.0]  # A[i, k] is reused across j, B[k, j] across i


def test_guards_from_non_dividing_splits():
    A, B, C = matmul(64, 48, 32)
    even, odd = te.create_schedule(C.op), te.create_schedule(C.op)
    even[C].split(even[C].op.axis[0], factor=16)
    odd[C].split(odd[C].op.axis[0], factor=10)
    xe, xo = feats_of(even, [A, B, C]), feats_of(odd, [A, B, C])
    assert value(xe, "guard_num") == 0.0 and value(xe, "guard_fraction") == 1.0
    assert value(xo, "guard_num") > 0.0
    assert value(xo, "guard_fraction") == pytest.approx(64 / 70, rel=1e-3)


def test_cache_read_and_cache_write_show_local_and_shared_allocations():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    AA = s.cache_read(A, "shared", [CC])
    i, j = s[C].op.axis
    io, ii = s[C].split(i, factor=16)
    jo, ji = s[C].split(j, factor=16)
    s[C].reorder(io, jo, ji, ii)
    s[C].bind(io, te.thread_axis("blockIdx.x"))
    s[C].bind(jo, te.thread_axis("blockIdx.y"))
    s[C].bind(ji, te.thread_axis("threadIdx.x"))
    s[CC].compute_at(s[C], ii)
    s[AA].compute_at(s[C], jo)
    x = feats_of(s, [A, B, C], GPU)
    assert x.shape[0] == 4  # shared fill, local init, local update, write back
    assert (x[:, F["is_gpu"]] == 1.0).all()
    assert unlog(value(x, "func_shared_bytes", 0)) == pytest.approx(16 * 32 * 4)
    assert unlog(value(x, "func_local_bytes", 0)) == pytest.approx(4)
    update = int(np.argmax(x[:, F["flops"]]))
    assert unlog(value(x, "alloc_local_bytes", update)) == pytest.approx(4)
    assert unlog(value(x, "alloc_shared_bytes", update)) == pytest.approx(16 * 32 * 4)
    assert unlog(value(x, "threadIdx_x", update)) == pytest.approx(16)
    assert unlog(value(x, "blockIdx_x", update)) == pytest.approx(4)
    assert unlog(value(x, "num_blocks", update)) == pytest.approx(12)
    scopes = {s: sum(value(x, f"buf{b}_scope_{s}", update) for b in range(5))
              for s in ("global", "shared", "local")}
    assert scopes == {"global": 1.0, "shared": 1.0, "local": 1.0}
    # B[k, j.outer * 16 + threadIdx.x]: neighbouring threads read neighbouring floats.
    b = next(b for b in range(5) if value(x, f"buf{b}_scope_global", update))
    assert value(x, f"buf{b}_lane_contiguous", update) == 1.0
    no_cache = feats_of(te.create_schedule(C.op), [A, B, C], GPU)
    assert (no_cache[:, F["func_shared_bytes"]] == 0).all()


@pytest.mark.parametrize("registers", [0, 1])
def test_a_block_tiles_epilogue_counts_as_its_threads_share(registers):
    """The nest of a wgmma tile's output: read from the staging tile by every thread, or
    computed from the accumulators each thread holds (one serial nest marked with the block's
    thread count): its store is seen as 256 threads writing 64 elements each either way."""
    from autosched.search.space import SearchSpace
    from autosched.te import ops as te_ops
    from tests.targets.cuda.test_wgmma import _candidate

    a = te.placeholder((512, 256), "float16", name="A")
    b = te.placeholder((256, 512), "float16", name="B")
    c = te_ops.matmul(a, b, out_dtype="float32")
    task = Task([c], args=[a, b, c], target=GPU, precision="fp16")
    space = SearchSpace(task)
    x = extract_features(space.lower(_candidate(space, epilogue=registers)).func, GPU)
    out = int(np.argmax(x[:, F["threadIdx_x"]]))  # the row of the output's store
    assert unlog(value(x, "threadIdx_x", out)) == pytest.approx(256)
    assert unlog(value(x, "outer_prod", out)) == pytest.approx(512 * 512, rel=1e-3)


def test_extraction_is_fast_and_batched():
    A, B, C = matmul(512, 512, 512)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    (k,) = s[C].op.reduce_axis
    io, ii = s[C].split(i, factor=8)
    jo, ji = s[C].split(j, factor=16)
    ko, ki = s[C].split(k, factor=4)
    s[C].reorder(io, jo, ko, ki, ii, ji)
    s[C].vectorize(ji)
    s[C].parallel(io)
    f = aus.lower(s, [A, B, C])
    extract_features(f, CPU)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        extract_features(f, CPU)
        times.append(time.perf_counter() - t0)
    assert sorted(times)[len(times) // 2] < 0.01   # target 5 ms; slack for a busy machine
    batch = extract_features_batch([f, f], CPU)
    assert len(batch) == 2 and np.array_equal(batch[0], batch[1])


# -- the model -------------------------------------------------------------------------------

def synthetic_throughput(ch: dict, M: int, N: int, K: int, rng: random.Random) -> float:
    """A made-up machine defined on the schedule's choices (not on the features): vector speed
    from the vectorized axis, parallel speed from the parallel loop's chunks over 4 cores,
    a stride penalty for the innermost axis, a register-tile bonus, 5% noise."""
    f, order = ch["f"], ch["order"]
    extent = {"io": math.ceil(M / f["i"]), "jo": math.ceil(N / f["j"]), "ko": math.ceil(K / f["k"]),
              "ii": f["i"], "ji": f["j"], "ki": f["k"]}
    inner = order[-1]
    speed = 1.0
    if ch["vec"]:
        speed *= min(extent[inner], 8) if inner == "ji" else 1.5
    if ch["par"]:
        chunks = extent[order[0]]
        speed *= chunks / math.ceil(chunks / 4)
    speed /= {"ji": 1.0, "ii": 3.0, "ki": 2.0}.get(inner, 4.0)
    if ch["unroll"] and extent[order[-2]] <= 16:
        speed *= 1.3
    if 8 <= f["i"] * f["j"] <= 256 and order.index("ko") < order.index("ii"):
        speed *= 1.5   # an output tile that stays in registers across the k loop
    return speed * math.exp(rng.gauss(0.0, 0.05))


@pytest.fixture(scope="module")
def dataset():
    M, N, K = 64, 64, 32
    A, B, C = matmul(M, N, K)
    rng = random.Random(1234)
    feats, truth, seen = [], [], set()
    while len(feats) < 90:
        s, ch = random_matmul_schedule(rng, A, B, C)
        f = aus.lower(s, [A, B, C])
        key = str(f)
        if key in seen:
            continue
        seen.add(key)
        feats.append(extract_features(f, CPU))
        truth.append(synthetic_throughput(ch, M, N, K, rng))
    return feats, np.array(truth)


@pytest.mark.parametrize("objective", ["auto", "rank", "regression", "log_regression"])
def test_model_ranks_held_out_schedules(dataset, objective):
    feats, truth = dataset
    model = XGBModel(objective=objective)
    t0 = time.perf_counter()
    model.fit(feats[:60], list(truth[:60]))
    assert time.perf_counter() - t0 < 5.0
    pred = model.predict(feats[60:])
    assert pred.shape == (30,)
    acc = pairwise_accuracy(pred, truth[60:])
    assert acc > 0.7, f"{objective}: pairwise accuracy {acc:.3f} on held-out schedules"
    # Random scores sit near 0.5: the bar above is well clear of chance.
    assert pairwise_accuracy(RandomModel(0).predict(feats[60:]), truth[60:]) < 0.65


def test_untrained_model_scores_at_random(dataset):
    feats, _ = dataset
    model = XGBModel()
    assert not model.trained
    p = model.predict(feats[:10])
    assert p.shape == (10,) and len(set(p.tolist())) == 10
    model.fit(feats[:3], [1.0, 1.0, 1.0])   # nothing to rank yet
    assert not model.trained


def test_save_load_round_trip(dataset, tmp_path):
    feats, truth = dataset
    model = XGBModel().fit(feats[:40], list(truth[:40]))
    path = tmp_path / "model.json"
    model.save(str(path))
    again = XGBModel.load(str(path))
    assert again.trained and again.objective == model.objective
    np.testing.assert_array_equal(again.predict(feats[40:]), model.predict(feats[40:]))


def test_update_keeps_earlier_data_and_groups_normalise_per_task(dataset):
    feats, truth = dataset
    model = XGBModel(objective="regression")
    model.fit(feats[:20], list(truth[:20]), groups=["a"] * 20)
    model.update(feats[20:40], list(truth[20:40] * 1000.0), groups=["b"] * 20)
    assert model.num_samples == 40
    # Throughputs of task b are 1000x larger, yet normalised per task both lie in [0, 1].
    pred = model.predict(feats[:40])
    assert pred.max() < 1.5
    with pytest.raises(ValueError, match="throughputs"):
        model.update(feats[:1], [float("nan")])
    with pytest.raises(ValueError, match="shape"):
        model.update([np.zeros((2, 3), np.float32)], [1.0])


def test_aggregate_handles_candidates_without_stores():
    x = aggregate([np.zeros((0, N_FEATURES), np.float32), np.ones((3, N_FEATURES), np.float32)])
    assert x.shape[0] == 2 and (x[0] == 0).all() and x[1, -1] == pytest.approx(2.0)


def test_warm_start_from_records():
    M, N, K = 32, 32, 16
    A, B, C = matmul(M, N, K)
    task = Task(C, target=CPU)
    rng = random.Random(7)
    records, truth = [], []
    for _ in range(30):
        s, ch = random_matmul_schedule(rng, A, B, C)
        # The record stores steps of a schedule on the task's own tensors.
        steps = [st.to_dict() for st in s.steps]
        cost = 1.0 / synthetic_throughput(ch, M, N, K, rng)
        # Tuning-log records (round-tripped through their JSON line) or any look-alike object.
        rec = MeasureRecord(task.workload_key, task.name, {"kind": "llvm"}, steps,
                            [cost, cost * 1.01])
        records.append(MeasureRecord.from_json(json.loads(rec.to_json_line())) if len(records) % 2
                       else SimpleNamespace(workload_key=rec.workload_key, steps=rec.steps,
                                            costs=rec.costs, error_code="NO_ERROR"))
        truth.append(1.0 / cost)
    records.append(SimpleNamespace(workload_key=task.workload_key, steps=records[0].steps,
                                   costs=[], error_code="RUNTIME_ERROR"))
    records.append(SimpleNamespace(workload_key="unknown", steps=[], costs=[1.0],
                                   error_code="NO_ERROR"))
    model = warm_start_from_records(records, {task.workload_key: task})
    assert model.trained and model.num_samples == 30
    feats = [extract_features(task.lower(task.schedule([step_from_dict(d) for d in r.steps])),
                              CPU) for r in records[:30]]
    assert pairwise_accuracy(model.predict(feats), np.array(truth)) > 0.8
