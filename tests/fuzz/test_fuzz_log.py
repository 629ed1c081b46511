"""Fuzzing tier: random tuning-log lines.

A log holds one good record and lines made from another good record by replacing one value
(anywhere: a top-level field, a step's field, a knob of extra.candidate) with random JSON, by
dropping a key, or by random bytes. Loading, resuming and applying the best record must never
raise; a loaded record that counts as a success has a finite positive cost; the chosen best
replays, lowers and builds. ``--fuzz-cases`` sets the count (a third of it), the seed
``--fuzz-seed``.
"""

from __future__ import annotations

import copy
import json
import math
import warnings

import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.search.record import (  # noqa: E402
    RECORD_VERSION,
    ApplyHistoryBest,
    RecordLog,
    target_fingerprint,
)
from tests.support.options import FUZZ  # noqa: E402

CASES = max(1, FUZZ.cases // 3)
SEED = FUZZ.seed


def _task() -> aus.Task:
    A = te.placeholder((16, 12), name="A")
    B = te.placeholder((12, 10), name="B")
    k = te.reduce_axis((0, 12), name="k")
    C = te.compute((16, 10), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return aus.Task(C, target="llvm")


TASK = _task()


def _record(cost: float, factor: int) -> dict:
    sch = TASK.schedule()
    st_c = sch.stage("C")
    i, j = st_c.op.axis
    _, ji = st_c.split(j, factor=factor)
    st_c.vectorize(ji)
    return {"version": RECORD_VERSION, "workload_key": TASK.workload_key, "task_name": "C",
            "target": target_fingerprint(TASK.target), "steps": [s.to_dict() for s in sch.steps],
            "costs": [cost, cost], "error_code": "NO_ERROR", "error_msg": "", "timestamp": 1.0,
            "build_time": 0.1, "autosched_version": "0", "ir_hash": f"h{factor}",
            "extra": {"candidate": {"sketch": 0, "params": {"C.tile": [factor]}}}}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6)


def _paths(d: object, prefix: tuple = ()) -> list[tuple]:
    """Every key path in a decoded record (dict keys and list indices)."""
    out = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


@st.composite
def bad_lines(draw) -> bytes:  # noqa: ANN001
    kind = draw(st.sampled_from(["replace", "replace", "drop", "bytes", "deep", "huge"]))
    rec = _record(1e-6, 2)
    if kind == "bytes":
        return draw(st.binary(max_size=60)).replace(b"\n", b" ")
    if kind == "deep":  # nesting deeper than the JSON reader's recursion
        n = draw(st.integers(1000, 100_000))
        return b"[" * n + b"]" * n
    if kind == "huge":  # numbers past float range, as text
        return json.dumps(rec).replace('"costs": [1e-06, 1e-06]',
                                       '"costs": [1e400, -1e400]').encode()
    path = draw(st.sampled_from(_paths(rec)))
    target = rec
    for k in path[:-1]:
        target = target[k]
    if kind == "drop" and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = draw(json_values)
    return json.dumps(rec).encode()  # NaN / Infinity written as JSON's common extension


@seed(SEED)
@settings(max_examples=CASES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck), print_blob=True)
@given(st.lists(bad_lines(), min_size=1, max_size=4), st.integers(0, 4))
def test_random_log_lines_never_crash_or_win(tmp_path_factory, lines, at) -> None:  # noqa: ANN001
    path = tmp_path_factory.mktemp("log") / "fuzz.jsonl"
    good = json.dumps(_record(1e-3, 5)).encode()
    body = list(lines)
    body.insert(min(at, len(body)), good)
    path.write_bytes(b"\n".join(body) + b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        log = RecordLog(path)
        records = log.load()
        for r in records:
            if r.ok:
                assert math.isfinite(r.cost) and r.cost > 0, r
        log.measured_ir_hashes(TASK.workload_key, TASK.target)
        best = ApplyHistoryBest(TASK, log)
        sch = best.schedule_for(TASK)
    mod = TASK.build(sch)
    assert mod is not None
    rec = best.record_for(TASK)
    assert rec is not None  # the good line is always there to fall back on
    assert rec.cost <= 1e-3 + 1e-12
    if rec.cost < 1e-3:  # a fuzzed line won: then it must be a sound record
        assert rec.ok and math.isfinite(rec.cost) and rec.cost > 0
        assert copy.deepcopy(rec.steps) == rec.steps
