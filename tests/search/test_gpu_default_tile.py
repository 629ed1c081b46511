"""The untuned GPU tile (search/sketch_gpu.py, default_tiles): enough threads per block and
enough blocks whatever the extents, prime ones included, and right when its tiles overhang."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.search.sketch_gpu import MIN_BLOCKS, default_tiles
from autosched.search.space import SearchSpace
from autosched.te.ops.conv import conv2d_nchw
from tests.support.nvrtc import needs_nvrtc

TARGET = "cuda -arch=sm_90"


def _blocks(extents: list[int], thr: list[int], reg: list[int]) -> int:
    return math.prod(-(-e // (t * r)) for e, t, r in zip(extents, thr, reg))


@pytest.mark.parametrize("extents", [
    [1, 16, 127, 127],   # prime spatial extents: a divisors-only tile ran 1 thread per block
    [1, 64, 56, 56], [1, 512, 7, 7], [1, 24, 40, 40], [1, 96, 20, 20],
    [4096, 4096], [1000, 1], [97, 89], [1, 3, 131, 257],
])
def test_default_tile_keeps_the_gpu_busy(extents):
    thr, reg = default_tiles(extents, 1024)
    threads = math.prod(thr)
    total = math.prod(extents)
    assert 1 <= threads <= 1024 and all(1 <= r <= 4 for r in reg)
    # a block of at least a warp whenever there is work for MIN_BLOCKS of them
    if total >= 32 * MIN_BLOCKS:
        assert threads >= 32, (thr, reg)
        assert _blocks(extents, thr, reg) >= MIN_BLOCKS // 2, (thr, reg)


def test_default_candidate_of_a_prime_conv_uses_full_warps():
    x = te.placeholder((1, 16, 127, 127), name="x")
    w = te.placeholder((16, 16, 3, 3), name="w")
    task = aus.Task(conv2d_nchw(x, w, stride=1, padding=1), target=TARGET)
    params = dict(SearchSpace(task).default_candidate().params)
    threads = math.prod(v[0] for k, v in params.items() if ".tile." in k)
    assert threads >= 64, params


@needs_nvrtc
@pytest.mark.parametrize("shape", [(2, 10, 7, 7), (1, 8, 127, 67)])  # threads, registers overhang
def test_overhanging_default_tile_is_right_on_the_host(shape, rng):
    from autosched.targets.cuda.host_emulate import run_on_host, unavailable

    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    n, c, h, wd = shape
    k = 9
    x = te.placeholder(shape, name="x")
    w = te.placeholder((k, c, 3, 3), name="w")
    task = aus.Task(conv2d_nchw(x, w, stride=1, padding=1), target=TARGET)
    space = SearchSpace(task)
    low = space.lower(space.default_candidate())
    assert low is not None
    a = rng.uniform(-1, 1, shape).astype("float32")
    b = rng.uniform(-1, 1, (k, c, 3, 3)).astype("float32")
    out = np.full((n, k, h, wd), np.nan, "float32")
    run_on_host(task.build(low.schedule), a, b, out)
    xp = np.pad(a.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    np.testing.assert_allclose(out, np.einsum("nchwij,ocij->nohw", win, b), rtol=1e-4, atol=1e-4)


def test_untuned_default_stays_within_the_shared_memory_of_a_plain_launch():
    # ResNet-18's stem: its preferred tile stages 105 KB of input, legal on sm_90 (227 KB
    # opted in) but one block per SM; untuned, ResNet-18 took 8.5 ms on an H100 with it
    # against 3.8 with a tile under 48 KB
    from autosched.targets.cuda import shared_bytes

    x = te.placeholder((1, 3, 224, 224), name="x")
    w = te.placeholder((64, 3, 7, 7), name="w")
    task = aus.Task(conv2d_nchw(x, w, stride=2, padding=3), target=TARGET)
    assert task.target.max_shared_memory_per_block > 48 * 1024
    func = task.lower(SearchSpace(task).default_schedule())
    assert shared_bytes(func) <= 48 * 1024
