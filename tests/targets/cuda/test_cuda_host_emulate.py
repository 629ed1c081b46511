"""The generated CUDA C run on the CPU (autosched/targets/cuda/host_emulate.py): GPU sketch
candidates against numpy, and hand-written kernels that must be caught (divergent barriers,
out-of-bounds accesses, races, misaligned vector accesses)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.search.space import SearchSpace
from autosched.search.workloads import make
from autosched.targets.cuda.host_emulate import HostEmulationError, run_on_host, unavailable
from autosched.targets.cuda.runtime import CudaModule
from autosched.te import expr as E
from tests.support.nvrtc import needs_nvrtc
from tests.support.sgemm_candidates import FAILING, lowered

pytestmark = [needs_nvrtc,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

TARGET = "cuda -arch=sm_90"


def _uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, shape).astype("float32")


def _conv_numpy(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))
    return np.einsum("nchwij,ocij->nohw", win, w.astype(np.float64))


# -- GPU sketch candidates -------------------------------------------------------------------

@pytest.mark.parametrize("n", [64, 128, 256])
@pytest.mark.parametrize("params", FAILING)
def test_pinned_h200_candidate_cuda_c_is_right(params, n, rng):
    task, low = lowered(params, n)
    mod = task.build(low.schedule)
    a, b = _uniform(rng, (n, n)), _uniform(rng, (n, n))
    c = np.full((n, n), np.nan, "float32")
    run = run_on_host(mod, a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert run.warnings == ()


def test_thread_order_does_not_change_the_result(rng):
    task, low = lowered(FAILING[1], 64)
    mod = task.build(low.schedule)
    a, b = _uniform(rng, (64, 64)), _uniform(rng, (64, 64))
    outs = []
    for order in ("forward", "reverse", f"shuffle:{int(rng.integers(1 << 30))}"):
        c = np.full((64, 64), np.nan, "float32")
        run_on_host(mod, a, b, c, order=order)
        outs.append(c)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def _sampled(task: aus.Task, rng: np.random.Generator, count: int) -> list:
    space = SearchSpace(task)
    out, seen = [], set()
    for _ in range(count * 20):
        low = space.lower(space.sample(rng))
        if low is not None and low.ir_hash not in seen:
            seen.add(low.ir_hash)
            out.append(low)
        if len(out) == count:
            break
    assert len(out) == count, f"only {len(out)} legal candidates in {count * 20} samples"
    return out


@pytest.mark.parametrize("n", [64, 100])  # 100: tiles that do not divide the matrix
def test_sampled_gemm_candidates_cuda_c_is_right(n, rng):
    task = aus.Task(lambda: make("gemm", [n, n, n]), target=TARGET, name="sgemm")
    a, b = _uniform(rng, (n, n)), _uniform(rng, (n, n))
    want = a.astype(np.float64) @ b
    for low in _sampled(task, rng, 4):
        c = np.full((n, n), np.nan, "float32")
        run_on_host(task.build(low.schedule), a, b, c)
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4,
                                   err_msg=str(low.candidate.as_dict()))


def test_sampled_conv2d_candidates_cuda_c_is_right(rng):
    shape = [1, 16, 14, 14, 16, 3, 3, 1, 1]  # N C H W O KH KW stride pad
    task = aus.Task(lambda: make("conv2d", shape), target=TARGET, name="conv")
    x, w = _uniform(rng, (1, 16, 14, 14)), _uniform(rng, (16, 16, 3, 3))
    want = _conv_numpy(x, w, pad=1)
    for low in _sampled(task, rng, 4):
        out = np.full(want.shape, np.nan, "float32")
        run_on_host(task.build(low.schedule), x, w, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4,
                                   err_msg=str(low.candidate.as_dict()))


def _pipelined(task: aus.Task, **knobs: int):
    """The task's default SIMT candidate with the shared tiles double-buffered (stages=2) and
    ``knobs`` (by suffix) changed."""
    space = SearchSpace(task)
    default = space.default_candidate()
    params = {k: knobs.get(k.rsplit(".", 1)[1], v) for k, v in default.params}
    params.update({k: 2 for k in params if k.endswith(".stages")})
    low = space.lower(replace(default, params=tuple(params.items())))
    assert low is not None and '"pipeline"' in low.schedule.to_json()
    return low


@pytest.mark.parametrize("n", [64, 100])  # 100: tiles that do not divide the matrix
@pytest.mark.parametrize("vector", [1, 4])  # float or float4 copies
def test_double_buffered_simt_gemm_cuda_c_is_right(n, vector, rng):
    task = aus.Task(lambda: make("gemm", [n, n, n]), target=TARGET, name="sgemm")
    low = _pipelined(task, fetch_vector=vector)
    mod = task.build(low.schedule)
    assert "as_cp_async(" in mod.get_source()  # 4- or 16-byte copies, issued ahead
    a, b = _uniform(rng, (n, n)), _uniform(rng, (n, n))
    c = np.full((n, n), np.nan, "float32")
    run_on_host(mod, a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_double_buffered_simt_conv2d_cuda_c_is_right(rng):
    shape = [1, 16, 14, 14, 24, 3, 3, 1, 1]  # N C H W O KH KW stride pad
    task = aus.Task(lambda: make("conv2d", shape), target=TARGET, name="conv")
    low = _pipelined(task)
    x, w = _uniform(rng, (1, 16, 14, 14)), _uniform(rng, (24, 16, 3, 3))
    want = _conv_numpy(x, w, pad=1)
    out = np.full(want.shape, np.nan, "float32")
    run_on_host(task.build(low.schedule), x, w, out)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


# -- hand-written kernels that must be caught ------------------------------------------------

def _copy_module(n: int = 64) -> CudaModule:
    A = te.placeholder((n,), name="A")
    C = te.compute((n,), lambda i: A[i] + 1.0, name="C")
    return aus.build(te.create_schedule(C.op), [A, C], target=TARGET)


def _with_body(mod: CudaModule, body: str, grid: int = 1) -> CudaModule:
    """``mod`` with its one kernel's body replaced by ``body`` (same name and parameters)."""
    info = mod.source.kernels[0]
    sig = (f'extern "C" __global__ void {info.name}(const float* __restrict__ A, '
           "float* __restrict__ C) {")
    info = replace(info, grid=(E.const(grid), E.const(1), E.const(1)))
    source = replace(mod.source, code="\n".join([sig, body, "}"]), kernels=(info,))
    return CudaModule(mod.func, mod.target, source, mod.binary)


def _run(mod: CudaModule, rng: np.random.Generator, **kw) -> tuple[np.ndarray, np.ndarray]:
    n = int(mod.func.params[0].shape[0].value)
    a, c = _uniform(rng, (n,)), np.full((n,), np.nan, "float32")
    run_on_host(mod, a, c, **kw)
    return a, c


def test_hand_kernel_with_shared_memory_and_barrier_runs(rng):
    mod = _with_body(_copy_module(), """
  __shared__ __align__(16) float s[64];
  s[threadIdx.x] = A[threadIdx.x];
  __syncthreads();
  C[threadIdx.x] = s[(threadIdx.x + 1) % 64] * 2.0f;""")
    a, c = _run(mod, rng)
    np.testing.assert_array_equal(c, np.roll(a, -1) * 2)


def test_divergent_syncthreads_is_an_error_not_a_hang(rng):
    mod = _with_body(_copy_module(), """
  if (threadIdx.x < 3) { __syncthreads(); }
  C[threadIdx.x] = A[threadIdx.x];""")
    with pytest.raises(HostEmulationError, match=r"divergent __syncthreads.*kernel "
                       rf"{mod.kernel_names[0]} .*line 3") as info:  # line 1: signature
        _run(mod, rng)
    assert info.value.kernel == mod.kernel_names[0]


def test_a_thread_waiting_on_an_mbarrier_lets_the_others_run(rng):
    """Thread 0 waits for an arrival that thread 63 makes later (in the forward order, after
    thread 0 has started waiting): the wait yields instead of spinning the one OS thread."""
    mod = _with_body(_copy_module(), """
  __shared__ __align__(16) float s[64];
  const unsigned bar = as_wg_base(s);
  if (threadIdx.x == 0) as_mbar_init(bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    while (!as_mbar_try_wait(bar, 0)) {}
    C[0] = A[63];
  } else {
    if (threadIdx.x == 63) as_mbar_arrive(bar);
    C[threadIdx.x] = A[threadIdx.x];
  }""")
    for order in ("forward", "reverse"):
        a, c = _run(mod, rng, order=order)
        np.testing.assert_array_equal(c, np.concatenate([a[63:], a[1:]]))


def test_waiting_on_an_mbarrier_no_one_completes_is_an_error_not_a_hang(rng):
    mod = _with_body(_copy_module(), """
  __shared__ __align__(16) float s[64];
  const unsigned bar = as_wg_base(s);
  if (threadIdx.x == 0) as_mbar_init(bar, 2);
  __syncthreads();
  if (threadIdx.x == 5) as_mbar_arrive(bar);
  while (!as_mbar_try_wait(bar, 0)) {}
  C[threadIdx.x] = A[threadIdx.x];""")
    with pytest.raises(HostEmulationError, match="mbarrier phase that no thread or copy"):
        _run(mod, rng)


def test_a_named_barrier_orders_only_the_threads_it_counts(rng):
    """bar.sync 1, 32: the first warp exchanges values through shared memory while the
    second copies on its own, never at that barrier."""
    mod = _with_body(_copy_module(), """
  __shared__ __align__(16) float s[64];
  if (threadIdx.x < 32) {
    s[threadIdx.x] = A[threadIdx.x];
    as_bar_sync(1, 32);
    C[threadIdx.x] = s[31 - threadIdx.x];
  } else {
    C[threadIdx.x] = A[threadIdx.x];
  }""")
    for order in ("forward", "reverse"):
        a, c = _run(mod, rng, order=order)
        np.testing.assert_array_equal(c, np.concatenate([a[31::-1], a[32:]]))


def test_a_named_barrier_too_few_threads_reach_is_an_error_not_a_hang(rng):
    mod = _with_body(_copy_module(), """
  if (threadIdx.x < 32) as_bar_sync(1, 64);
  C[threadIdx.x] = A[threadIdx.x];""")
    with pytest.raises(HostEmulationError, match="barrier 1 for 64 threads, which never all"):
        _run(mod, rng)


def test_threads_at_different_syncthreads_is_an_error(rng):
    mod = _with_body(_copy_module(), """
  if (threadIdx.x % 2) { __syncthreads(); }
  else { __syncthreads(); }
  C[threadIdx.x] = A[threadIdx.x];""")
    # barriers are told apart by their source line
    with pytest.raises(HostEmulationError, match="line 3 while thread 0 waits at .* line 4"):
        _run(mod, rng)


@pytest.mark.parametrize("checked", [True, False])
def test_out_of_bounds_store_is_caught(checked, rng):
    mod = _with_body(_copy_module(), "  C[threadIdx.x + 1] = A[threadIdx.x];")
    # checked: the access itself; unchecked: the guard zone after the buffer
    want = r"C\[64\] out of bounds" if checked else "wrote outside buffer C"
    with pytest.raises(HostEmulationError, match=want):
        _run(mod, rng, checked=checked)


def test_out_of_bounds_load_is_caught(rng):
    mod = _with_body(_copy_module(), "  C[threadIdx.x] = A[(int)threadIdx.x - 1];")
    with pytest.raises(HostEmulationError, match=r"reads A\[-1\] out of bounds"):
        _run(mod, rng)


def test_missing_barrier_is_a_race(rng):
    mod = _with_body(_copy_module(), """
  __shared__ __align__(16) float s[64];
  s[threadIdx.x] = A[threadIdx.x];
  C[threadIdx.x] = s[(threadIdx.x + 1) % 64];""")
    with pytest.raises(HostEmulationError, match=r"data race.*s\[1\].*no __syncthreads"):
        _run(mod, rng)


def test_blocks_writing_one_element_is_a_race(rng):
    mod = _with_body(_copy_module(), "  C[threadIdx.x] = A[threadIdx.x] + (float)blockIdx.x;",
                     grid=2)
    with pytest.raises(HostEmulationError, match=r"block \(1, 0, 0\).*another block"):
        _run(mod, rng)


def test_misaligned_vector_access_is_caught(rng):
    mod = _with_body(_copy_module(), """
  if (threadIdx.x == 0) { *(float2*)(&C[1]) = *(const float2*)(&A[1]); }""")
    with pytest.raises(HostEmulationError, match="misaligned vector access"):
        _run(mod, rng)


@pytest.mark.parametrize("checked", [True, False])
def test_dynamic_shared_memory_runs_as_static_arrays_on_the_host(rng, checked):
    """A kernel over 48 KB of shared memory (carved out of one dynamic allocation on the GPU)
    runs on the host, checked for races too, with each carved buffer a shared array."""
    from autosched.testing.gpu_sgemm_schedule import sgemm_schedule

    s, args = sgemm_schedule(64, 64, 128, tile=64, reg=4, bk=128)
    mod = aus.build(s, args, target="cuda -arch=sm_90")
    assert mod.source.kernels[0].dynamic_shared == 65536
    a, b = _uniform(rng, (64, 128)), _uniform(rng, (128, 64))
    c = np.full((64, 64), np.nan, "float32")
    run = run_on_host(mod, a, b, c, checked=checked)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert run.warnings == ()


@pytest.mark.parametrize("dtype, lanes", [("float16", 8), ("float32", 4)])
def test_vectorized_gather_shares_its_index_arithmetic(dtype, lanes, rng):
    """The patches of a padded convolution with a horizontal stride (im2col, as the explicit
    GPU convolutions write them), ``lanes`` elements a thread: each lane gathers alone, the
    divisions by the tensor's extents that the lanes share are computed once, and the lanes
    are stored as one 16-byte access (halves: a uint4 of eight)."""
    from autosched.te import ops

    x = te.placeholder((2, 5, 12, 16), dtype=dtype, name="x")
    col = ops.im2col(x, (3, 3), stride=(1, 2), padding=(1, 1, 1, 1))  # 12 x 8 output pixels
    s = te.create_schedule(col.op)
    for t in col.op.input_tensors:  # the zero padding, read where the patches are
        s[t].compute_inline()
    st = s[col]
    flat = st.fuse(*col.op.axis)  # 2 x 45 x 96
    rest, lane = st.split(flat, factor=lanes)
    st.vectorize(lane)
    block, thread = st.split(rest, factor=8640 // lanes // 27)
    st.bind(block, te.thread_axis("blockIdx.x"))
    st.bind(thread, te.thread_axis("threadIdx.x"))
    mod = aus.build(s, [x, col], target=TARGET)
    src = mod.get_source()
    lane_lines = [ln for ln in src.splitlines() if "as_vs" in ln and "=" in ln
                  and "*(" not in ln and "[" + str(lanes) + "]" not in ln]
    assert len(lane_lines) == lanes, src
    assert not any("/" in ln or "%" in ln for ln in lane_lines), "\n".join(lane_lines)
    assert ("*(uint4*)" if dtype == "float16" else "*(float4*)") in src
    xa = rng.uniform(-1, 1, (2, 5, 12, 16)).astype(dtype)
    got = np.full(tuple(int(d) for d in col.shape), np.nan, dtype)
    run = run_on_host(mod, xa, got)
    pad = np.pad(xa, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.stack([pad[:, :, ky:ky + 12, kx:kx + 15:2] for ky in range(3) for kx in range(3)],
                    axis=2)  # (N, C, KH * KW, OH, OW)
    np.testing.assert_array_equal(got, want.reshape(got.shape))
    assert run.warnings == ()


def test_vectorized_gather_reads_its_index_only_under_its_guard(rng):
    """A lane's index read from memory (a gather through an index tensor) is not computed
    once before the lanes, where it would leave its guard: rows past the index tensor's end
    read nothing (the host emulator checks every access)."""
    n, rows = 5, 8
    idx = te.placeholder((n,), dtype="int32", name="idx")
    table = te.placeholder((6 * 8,), dtype="float16", name="table")
    out = te.compute((rows, 8), lambda i, j: te.if_then_else(
        i < n, table[idx[i] * 8 + j] * te.const(2, "float16"), te.const(0, "float16")),
        name="out")
    s = te.create_schedule(out.op)
    i, j = out.op.axis
    s[out].vectorize(j)
    s[out].bind(i, te.thread_axis("threadIdx.x"))
    mod = aus.build(s, [idx, table, out], target=TARGET)
    assert "*(uint4*)" in mod.get_source()
    ia = rng.integers(0, 6, n).astype("int32")
    ta = rng.uniform(-1, 1, 6 * 8).astype("float16")
    got = np.full((rows, 8), np.nan, "float16")
    run_on_host(mod, ia, ta, got, checked=True)
    want = np.zeros((rows, 8), "float16")
    want[:n] = ta.reshape(6, 8)[ia] * 2
    np.testing.assert_array_equal(got, want)
