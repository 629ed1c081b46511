"""Tasks that normalize rows (softmax, log-softmax, LayerNorm) in one GPU kernel
(search/sketch_gpu.py, gpu_rows_rule): a block's rows each over a warp or more, every
reduction of a row computed in the block into shared memory before the output reads it.
Untuned, this sketch leads; every form matches numpy on the host emulator (which also
reports any data race between the threads), on the GPU too."""

from __future__ import annotations

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.search.space import Candidate, SearchSpace
from autosched.targets.cuda.host_emulate import unavailable
from autosched.te.ops import norm
from tests.support.nvrtc import NVRTC_SKIP

HOST_SKIP = NVRTC_SKIP or unavailable()
TARGETS = [
    pytest.param("cuda -emulate=host", marks=pytest.mark.skipif(HOST_SKIP is not None,
                                                                reason=str(HOST_SKIP))),
    pytest.param("cuda", marks=pytest.mark.gpu)]


def _softmax(shape: tuple[int, ...], target: str, log: bool = False) -> aus.Task:
    """A half softmax as the fp16 graph builds it: cast up where read, rounded where stored."""
    x = te.placeholder(shape, "float16", name="x")
    up = te.compute(x.shape, lambda *i: te.cast("float32", x[i]), name="x_f32")
    y = (norm.log_softmax if log else norm.softmax)(up, axis=-1)
    out = te.compute(y.shape, lambda *i: te.cast("float16", y[i]), name="store")
    return aus.Task(out, args=[x, out], target=target, precision="fp16")


def _layer_norm(shape: tuple[int, ...], target: str) -> aus.Task:
    x = te.placeholder(shape, name="x")
    gamma = te.placeholder(shape[-1:], name="gamma")
    beta = te.placeholder(shape[-1:], name="beta")
    out = norm.layer_norm(x, gamma, beta, axis=-1)
    return aus.Task(out, args=[x, gamma, beta, out], target=target)


def _rows_rule(space: SearchSpace, c: Candidate):
    return next(r for r in space.sketches[c.sketch].rules if r.kind == "gpu_rows")


def _knob(c: Candidate, suffix: str) -> int:
    return next(v for k, v in c.params if k.endswith(suffix))


def test_softmax_runs_in_one_kernel_untuned() -> None:
    """BERT's attention softmax at batch 32 (49,152 rows of 128): one kernel of 8 rows a
    block, a warp a row (before: three kernels, each reading the input)."""
    task = _softmax((32, 12, 128, 128), "cuda -arch=sm_90")
    space = SearchSpace(task)
    c = space.default_candidate()
    assert _rows_rule(space, c) is not None
    assert (_knob(c, ".rows"), _knob(c, ".lanes")) == (8, 32)
    (kernel,) = task.build(space.default_schedule()).source.kernels
    assert [g.value for g in kernel.grid] == [49152 // 8, 1, 1]
    assert [b.value for b in kernel.block] == [32, 8, 1]


def test_long_rows_take_more_lanes_and_other_tasks_keep_their_sketches() -> None:
    space = SearchSpace(_layer_norm((6, 4096), "cuda -arch=sm_90"))
    c = space.default_candidate()
    assert (_knob(c, ".rows"), _knob(c, ".lanes")) == (1, 128)  # 32 elements a lane
    x = te.placeholder((64, 256), name="x")  # a sum alone: no output of the rows
    space = SearchSpace(aus.Task(te.ops.reduction.sum(x, axis=(1,)), target="cuda -arch=sm_90"))
    assert all(r.kind != "gpu_rows" for sk in space.sketches for r in sk.rules)
    y = te.placeholder((64, 16), name="y")  # rows shorter than a warp
    space = SearchSpace(aus.Task(norm.softmax(y, axis=-1), target="cuda -arch=sm_90"))
    assert all(r.kind != "gpu_rows" for sk in space.sketches for r in sk.rules)


CASES = {
    # (task, reference); rows of 130 (no lane count divides them), 24 x 40 rows
    "softmax": (lambda t: _softmax((2, 12, 40, 130), t),
                lambda x: np.exp(x - x.max(-1, keepdims=True))
                / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
    "log_softmax": (lambda t: _softmax((3, 16, 96), t, log=True),
                    lambda x: x - x.max(-1, keepdims=True) - np.log(
                        np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))),
    "layer_norm": (lambda t: _layer_norm((24, 768), t), None),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("rows,lanes", [(None, None), (8, 32), (2, 64), (1, 256)])
def test_rows_in_one_kernel_match_numpy(case, rows, lanes, target, rng) -> None:
    make, ref = CASES[case]
    task = make(target)
    space = SearchSpace(task)
    c = space.default_candidate()
    if rows is not None:
        rule = _rows_rule(space, c)
        options = {k.name.rsplit(".", 1)[1]: k.options for k in rule.knobs}
        if rows not in options["rows"] or lanes not in options["lanes"]:
            pytest.skip(f"{rows} rows of {lanes} lanes not offered for {case}")
        c = Candidate(c.sketch, tuple((k, rows if k.endswith(".rows") else
                                       lanes if k.endswith(".lanes") else v)
                                      for k, v in c.params))
    low = space.lower(c)
    assert low is not None
    mod = task.build(low.schedule)
    assert mod.get_source().count('extern "C"') == 1  # one kernel
    shapes = [tuple(int(d) for d in t.shape) for t in task.args]
    arrays = [rng.uniform(-3, 3, s).astype(t.dtype) for s, t in zip(shapes, task.args)]
    arrays[-1] = np.full(shapes[-1], np.nan, task.args[-1].dtype)
    mod(*arrays)
    x = arrays[0].astype(np.float64)
    if case == "layer_norm":
        mean = x.mean(-1, keepdims=True)
        want = (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * arrays[1] + arrays[2]
        np.testing.assert_allclose(arrays[-1], want, rtol=1e-4, atol=1e-4)
    else:
        np.testing.assert_allclose(arrays[-1].astype(np.float64), ref(x), rtol=2e-3, atol=2e-3)


def test_zero_measurement_pick_keeps_the_one_kernel_default() -> None:
    """The shipped cost model has seen no such kernel: its own first pick for BERT's softmax
    was three kernels of a thread per row. The untuned default leads the picks."""
    from autosched.search.tune import model_candidates

    task = _softmax((32, 12, 128, 128), "cuda -arch=sm_90")
    first = model_candidates(task)[0]
    at = [d for d in first if d["kind"] == "compute_at"]
    assert {d["stage"] for d in at} >= {"T_softmax_maxelem", "T_softmax_expsum"}
    assert all(d["target"] == "store" for d in at if d["stage"].startswith("T_softmax"))
