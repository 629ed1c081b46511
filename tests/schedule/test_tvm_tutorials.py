"""Schedules in the style of TVM's classic tutorials, written as a TVM user would write them:
blocked GEMM on the CPU (blocking, vectorization, loop permutation, array packing, a write cache,
parallel loops) and shared-memory GEMM and convolution on CUDA (cache_read into shared and
local memory, cache_write, virtual threads, cooperative fetching). Only the import differs from
TVM; each must match numpy, on llvm and (NVRTC-compiled, run on the host) on cuda."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.targets.cuda.host_emulate import run_on_host, unavailable
from tests.schedule.test_schedule import check_replay
from tests.support.nvrtc import needs_nvrtc

# sizes that the tiles (32, 64, 4, 8) do not divide, except N for the packed layout
M, N, K = 70, 64, 50
BN = 32


def _gemm() -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    C = te.compute((M, N), lambda m, n: te.sum(A[m, k] * B[k, n], axis=k), name="C")
    return A, B, C


def _packed_gemm() -> tuple[te.Tensor, te.Tensor, te.Tensor, te.Tensor]:
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    packedB = te.compute((N // BN, K, BN), lambda bigN, k, littleN: B[k, bigN * BN + littleN],
                         name="packedB")
    C = te.compute((M, N), lambda m, n: te.sum(A[m, k] * packedB[n // BN, k, n % BN], axis=k),
                   name="C")
    return A, B, packedB, C


def _block(s: te.Schedule, C: te.Tensor, permute: bool, vectorize: bool) -> None:
    """The tutorial's steps one to three: 32x32 blocks, k split by 4, then the loop order
    (ki inside mi once permuted) and the vectorized innermost column loop."""
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    (kaxis,) = s[C].op.reduce_axis
    ko, ki = s[C].split(kaxis, factor=4)
    if permute:
        s[C].reorder(mo, no, ko, mi, ki, ni)
    else:
        s[C].reorder(mo, no, ko, ki, mi, ni)
    if vectorize:
        s[C].vectorize(ni)


def _pack(s: te.Schedule, packedB: te.Tensor) -> None:
    bigN, _, littleN = s[packedB].op.axis
    s[packedB].vectorize(littleN)
    s[packedB].parallel(bigN)


def blocking() -> tuple[te.Schedule, list]:
    A, B, C = _gemm()
    s = te.create_schedule(C.op)
    _block(s, C, permute=False, vectorize=False)
    return s, [A, B, C]


def vectorization() -> tuple[te.Schedule, list]:
    A, B, C = _gemm()
    s = te.create_schedule(C.op)
    _block(s, C, permute=False, vectorize=True)
    return s, [A, B, C]


def loop_permutation() -> tuple[te.Schedule, list]:
    A, B, C = _gemm()
    s = te.create_schedule(C.op)
    _block(s, C, permute=True, vectorize=True)
    return s, [A, B, C]


def array_packing() -> tuple[te.Schedule, list]:
    A, B, packedB, C = _packed_gemm()
    s = te.create_schedule(C.op)
    _block(s, C, permute=True, vectorize=True)
    _pack(s, packedB)
    return s, [A, B, C]


def _write_cache(scope: str, parallel: bool) -> tuple[te.Schedule, list]:
    A, B, packedB, C = _packed_gemm()
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, scope)
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    s[CC].compute_at(s[C], no)
    mc, nc = s[CC].op.axis
    (kaxis,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(kaxis, factor=4)
    s[CC].reorder(ko, mc, ki, nc)
    s[CC].unroll(ki)
    s[CC].vectorize(nc)
    if parallel:
        s[C].parallel(mo)
    _pack(s, packedB)
    return s, [A, B, C]


def write_cache() -> tuple[te.Schedule, list]:
    return _write_cache("global", parallel=False)


def write_cache_local() -> tuple[te.Schedule, list]:
    return _write_cache("local", parallel=False)


def parallel() -> tuple[te.Schedule, list]:
    return _write_cache("global", parallel=True)


CPU_SCHEDULES = [blocking, vectorization, loop_permutation, array_packing, write_cache,
                 write_cache_local, parallel]


@pytest.mark.parametrize("make", CPU_SCHEDULES, ids=lambda f: f.__name__)
def test_cpu_gemm_tutorial_schedule_matches_numpy(make: Callable, rng: np.random.Generator) -> None:
    s, args = make()
    func = aus.build(s, args, target="llvm", name="mmult")
    a = rng.uniform(-1, 1, (M, K)).astype("float32")
    b = rng.uniform(-1, 1, (K, N)).astype("float32")
    c = np.full((M, N), np.nan, "float32")
    func(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    check_replay(s, [args[-1]], args)  # the steps, as JSON and as printed Python


def test_rfactor_keeps_the_tensor_axes(rng: np.random.Generator) -> None:
    # the reduction tutorial's factoring, on the CPU: after rfactor, B.op.axis still schedules B
    n, m = 45, 70
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    ko, ki = s[B].split(B.op.reduce_axis[0], factor=16)
    BF = s.rfactor(B, ki)
    xo, xi = s[B].split(B.op.axis[0], factor=8)
    s[B].parallel(xo)
    s[BF].compute_at(s[B], xi)
    s[BF].vectorize(s[BF].op.axis[0])
    a = rng.uniform(-1, 1, (n, m)).astype("float32")
    b = np.full(n, np.nan, "float32")
    aus.build(s, [A, B], target="llvm")(a, b)
    np.testing.assert_allclose(b, a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


# -- CUDA ------------------------------------------------------------------------------------

def shared_memory_gemm(n: int = 100) -> tuple[te.Schedule, list]:
    """C = A^T B with 64x64 blocks of 8x8 threads, each doing a 2x2 grid of virtual threads."""
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda ii, jj: te.sum(A[k, ii] * B[k, jj], axis=k), name="C")
    s = te.create_schedule(C.op)
    AA = s.cache_read(A, "shared", [C])
    BB = s.cache_read(B, "shared", [C])
    AL = s.cache_read(AA, "local", [C])
    BL = s.cache_read(BB, "local", [C])
    CC = s.cache_write(C, "local")

    scale, num_thread = 8, 8
    block_factor = scale * num_thread
    block_x, block_y = te.thread_axis("blockIdx.x"), te.thread_axis("blockIdx.y")
    thread_x, thread_y = te.thread_axis("threadIdx.x"), te.thread_axis("threadIdx.y")
    thread_xz = te.thread_axis((0, 2), "vthread.x")
    thread_yz = te.thread_axis((0, 2), "vthread.y")

    by, yi = s[C].split(C.op.axis[0], factor=block_factor)
    bx, xi = s[C].split(C.op.axis[1], factor=block_factor)
    s[C].bind(by, block_y)
    s[C].bind(bx, block_x)
    s[C].reorder(by, bx, yi, xi)
    tyz, yi = s[C].split(yi, nparts=2)
    ty, yi = s[C].split(yi, nparts=num_thread)
    txz, xi = s[C].split(xi, nparts=2)
    tx, xi = s[C].split(xi, nparts=num_thread)
    s[C].bind(tyz, thread_yz)
    s[C].bind(txz, thread_xz)
    s[C].bind(ty, thread_y)
    s[C].bind(tx, thread_x)
    s[C].reorder(tyz, txz, ty, tx, yi, xi)
    s[CC].compute_at(s[C], tx)

    yo, xo = CC.op.axis
    ko, ki = s[CC].split(k, factor=8)
    kt, ki = s[CC].split(ki, factor=1)
    s[CC].reorder(ko, kt, ki, yo, xo)
    s[AA].compute_at(s[CC], ko)
    s[BB].compute_at(s[CC], ko)
    s[CC].unroll(kt)
    s[AL].compute_at(s[CC], kt)
    s[BL].compute_at(s[CC], kt)
    for cached in (AA, BB):  # cooperative fetching: every thread of the block copies a part
        ty, xi = s[cached].split(s[cached].op.axis[0], nparts=num_thread)
        _, xi = s[cached].split(s[cached].op.axis[1], factor=num_thread * 4)
        tx, xi = s[cached].split(xi, nparts=num_thread)
        s[cached].bind(ty, thread_y)
        s[cached].bind(tx, thread_x)
        s[cached].vectorize(xi)
    return s, [A, B, C]


def shared_memory_conv(batch: int = 8, in_channel: int = 16, out_channel: int = 32,
                       in_size: int = 7, kernel: int = 3, pad: int = 1) -> tuple[te.Schedule, list]:
    """A padded 3x3 convolution in HWCN layout: 64 filters x 64 images per block of 8x8
    threads with 2x2 virtual threads, input and weights staged in shared and local memory."""
    out_size = in_size + 2 * pad - kernel + 1
    A = te.placeholder((in_size, in_size, in_channel, batch), name="A")
    W = te.placeholder((kernel, kernel, in_channel, out_channel), name="W")
    Apad = te.compute(
        (in_size + 2 * pad, in_size + 2 * pad, in_channel, batch),
        lambda yy, xx, cc, nn: te.if_then_else(
            te.all(yy >= pad, yy - pad < in_size, xx >= pad, xx - pad < in_size),
            A[yy - pad, xx - pad, cc, nn], te.const(0.0, "float32")),
        name="Apad")
    rc = te.reduce_axis((0, in_channel), name="rc")
    ry = te.reduce_axis((0, kernel), name="ry")
    rx = te.reduce_axis((0, kernel), name="rx")
    B = te.compute(
        (out_size, out_size, out_channel, batch),
        lambda yy, xx, ff, nn: te.sum(Apad[yy + ry, xx + rx, rc, nn] * W[ry, rx, rc, ff],
                                      axis=[ry, rx, rc]),
        name="B")
    s = te.create_schedule(B.op)
    s[Apad].compute_inline()
    AA = s.cache_read(Apad, "shared", [B])
    WW = s.cache_read(W, "shared", [B])
    AL = s.cache_read(AA, "local", [B])
    WL = s.cache_read(WW, "local", [B])
    BL = s.cache_write(B, "local")

    tile, num_thread, step, vthread = 8, 8, 8, 2
    block_factor = tile * num_thread
    block_x, block_y = te.thread_axis("blockIdx.x"), te.thread_axis("blockIdx.y")
    block_z = te.thread_axis("blockIdx.z")
    thread_x = te.thread_axis((0, num_thread), "threadIdx.x")
    thread_y = te.thread_axis((0, num_thread), "threadIdx.y")
    thread_xz = te.thread_axis((0, vthread), "vthread", name="vx")
    thread_yz = te.thread_axis((0, vthread), "vthread", name="vy")

    hi, wi, fi, ni = s[B].op.axis
    bz = s[B].fuse(hi, wi)
    by, fi = s[B].split(fi, factor=block_factor)
    bx, ni = s[B].split(ni, factor=block_factor)
    tyz, fi = s[B].split(fi, nparts=vthread)
    txz, ni = s[B].split(ni, nparts=vthread)
    ty, fi = s[B].split(fi, nparts=num_thread)
    tx, ni = s[B].split(ni, nparts=num_thread)
    s[B].reorder(bz, by, bx, tyz, txz, ty, tx, fi, ni)
    s[B].bind(bz, block_z)
    s[B].bind(by, block_y)
    s[B].bind(bx, block_x)
    s[B].bind(tyz, thread_yz)
    s[B].bind(txz, thread_xz)
    s[B].bind(ty, thread_y)
    s[B].bind(tx, thread_x)

    s[BL].compute_at(s[B], tx)
    yi, xi, fi, ni = s[BL].op.axis
    ry, rx, rc = s[BL].op.reduce_axis
    rco, rci = s[BL].split(rc, factor=step)
    s[BL].reorder(rco, ry, rx, rci, fi, ni)
    s[AA].compute_at(s[BL], rx)
    s[WW].compute_at(s[BL], rx)
    s[AL].compute_at(s[BL], rci)
    s[WL].compute_at(s[BL], rci)
    for cached in (AA, WW):  # cooperative fetching, 4 contiguous elements per thread
        yi, xi, ci, ni = s[cached].op.axis
        ty, ci = s[cached].split(ci, nparts=num_thread)
        tx, ni = s[cached].split(ni, nparts=num_thread)
        _, ni = s[cached].split(ni, factor=4)
        s[cached].reorder(ty, tx, yi, xi, ci, ni)
        s[cached].bind(ty, thread_y)
        s[cached].bind(tx, thread_x)
        s[cached].vectorize(ni)
    return s, [A, W, B]


def _conv_hwcn(a: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    ap = np.pad(a.astype(np.float64), ((pad, pad), (pad, pad), (0, 0), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(ap, w.shape[:2], axis=(0, 1))
    return np.einsum("yxcnij,ijcf->yxfn", win, w.astype(np.float64))


@needs_nvrtc
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_cuda_shared_memory_gemm_tutorial_matches_numpy(rng: np.random.Generator) -> None:
    s, args = shared_memory_gemm(100)
    mod = aus.build(s, args, target="cuda -arch=sm_90")
    a = rng.uniform(-1, 1, (100, 100)).astype("float32")
    b = rng.uniform(-1, 1, (100, 100)).astype("float32")
    c = np.full((100, 100), np.nan, "float32")
    run = run_on_host(mod, a, b, c)
    np.testing.assert_allclose(c, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert run.warnings == ()
    check_replay(s, [args[-1]], args)


@needs_nvrtc
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_cuda_shared_memory_conv_tutorial_matches_numpy(rng: np.random.Generator) -> None:
    s, args = shared_memory_conv()
    mod = aus.build(s, args, target="cuda -arch=sm_90")
    a = rng.uniform(-1, 1, (7, 7, 16, 8)).astype("float32")
    w = rng.uniform(-1, 1, (3, 3, 16, 32)).astype("float32")
    out = np.full((7, 7, 32, 8), np.nan, "float32")
    run = run_on_host(mod, a, w, out)
    np.testing.assert_allclose(out, _conv_hwcn(a, w, 1), rtol=1e-4, atol=1e-4)
    assert run.warnings == ()
    check_replay(s, [args[-1]], args)
