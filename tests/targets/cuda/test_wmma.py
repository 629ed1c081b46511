"""Tensor cores: the tensorize step (schedule/schedule.py), its nvcuda::wmma code
(targets/cuda/wmma.py), the host emulation of wmma (host_prelude.py) and the tensor-core sketch
(search/sketch_mma.py), against numpy with the precision's tolerance."""

from __future__ import annotations

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import CompileError, ScheduleError
from autosched.schedule.schedule import Schedule
from autosched.search.space import Candidate, SearchSpace
from autosched.search.task import Task
from autosched.targets.cuda.host_emulate import unavailable
from autosched.targets.cuda.nvrtc import compile_cuda
from autosched.te import dtype as dt
from autosched.te import ops
from autosched.te.expr import cast
from autosched.te.ops.args import static_shape
from autosched.tir.tensor_intrin import ACCUMULATOR_SCOPE
from tests.support.nvrtc import needs_nvrtc

TARGET = "cuda -arch=sm_90"
EMULATE = "cuda -arch=sm_90 -emulate=host"
needs_host = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
PRECISION = {"float16": "fp16", "bfloat16": "bf16", "float32": "tf32"}  # by operand dtype


@pytest.fixture(autouse=True)
def _warp_tiles_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warp-level tiles on sm_90 too, where warpgroup tiles (test_wgmma.py) would lead."""
    monkeypatch.setenv("AUTOSCHED_WGMMA", "0")


def _matmul(m: int, n: int, k: int, dtype: str = "float16", widen: bool = False,
            batch: int = 0, transpose_b: bool = False) -> list[te.Tensor]:
    """[A, B, C]: C = f32(A) @ f32(B), as te ops build it, or (``widen``) through cast stages
    as the graph compiler's fp16 / bf16 tasks read half inputs."""
    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, m, k), dtype, name="A")
    b = te.placeholder((*lead, n, k) if transpose_b else (*lead, k, n), dtype, name="B")
    if widen:
        x = te.compute(a.shape, lambda *i: cast("float32", a[i]), name="A_f32")
        y = te.compute(b.shape, lambda *i: cast("float32", b[i]), name="B_f32")
        return [a, b, ops.matmul(x, y, transpose_b=transpose_b)]
    if batch:
        return [a, b, ops.batch_matmul(a, b, transpose_b=transpose_b, out_dtype="float32")]
    return [a, b, ops.matmul(a, b, transpose_b=transpose_b, out_dtype="float32")]


def _tc_candidate(space: SearchSpace, **knobs: int) -> Candidate:
    """The tensor-core sketch's candidate with its defaults, ``knobs`` (by suffix) changed."""
    index = next(n for n, sk in enumerate(space.sketches) if any(r.kind == "mma" for r in sk.rules))
    params = {}
    for k in space.sketches[index].knobs:
        suffix = k.name.rsplit(".", 1)[1]
        params[k.name] = knobs.get(suffix, k.default())
    return Candidate(index, tuple(params.items()))


def _inputs(args: list[te.Tensor], rng: np.random.Generator) -> list[np.ndarray]:
    """Random inputs for every argument but the last, and a NaN output."""
    shapes = [static_shape(t, "test") for t in args]
    out = [rng.uniform(-1, 1, s).astype(t.dtype) for t, s in zip(args[:-1], shapes)]
    return out + [np.full(shapes[-1], np.nan, args[-1].dtype)]


def _check(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    p = dt.precision(PRECISION[dtype])
    np.testing.assert_allclose(got, want, rtol=p.rtol, atol=p.atol * max(1.0, np.abs(want).max()))


def _reference(a: np.ndarray, b: np.ndarray, transpose_b: bool = False) -> np.ndarray:
    b64 = b.astype(np.float64)
    return a.astype(np.float64) @ (np.swapaxes(b64, -1, -2) if transpose_b else b64)


def _run_candidate(args: list[te.Tensor], rng: np.random.Generator, dtype: str = "float16",
                   target: str = EMULATE, **knobs: int) -> tuple[list[np.ndarray], Task]:
    task = Task(args[-1:], args=args, target=target, precision=PRECISION[dtype])
    space = SearchSpace(task)
    low = space.lower(_tc_candidate(space, **knobs))
    assert low is not None and low.schedule is not None
    arrays = _inputs(args, rng)
    task.build(low.schedule)(*arrays)
    return arrays, task


# -- the tensorize step --------------------------------------------------------------------

def _hand_schedule(args: list[te.Tensor], intrin: str = "wmma_16x16x16_f16") -> Schedule:
    from autosched.search.sketch_mma import schedule_mma

    s = te.create_schedule(args[-1].op)
    schedule_mma(s, args[-1].op.name, None, (2, 1), (1, 2), 2, intrin)
    return s


def test_tensorize_checks_the_nest() -> None:
    a, b, c = _matmul(32, 32, 32)
    s = te.create_schedule(c.op)
    i, j = s[c].op.axis
    (k,) = s[c].op.reduce_axis
    with pytest.raises(ScheduleError, match="unknown tensor intrinsic"):
        s[c].tensorize(i, "wmma_8x8x8")
    with pytest.raises(ScheduleError, match=r"extents \(16, 16, 16\)"):
        s[c].tensorize(i, "wmma_16x16x16_f16")
    io, ii = s[c].split(i, factor=16)
    jo, ji = s[c].split(j, factor=16)
    ko, ki = s[c].split(k, factor=16)
    s[c].reorder(io, jo, ko, ii, ji, ki)
    with pytest.raises(ScheduleError, match=f"in scope {ACCUMULATOR_SCOPE}"):
        s[c].tensorize(ii, "wmma_16x16x16_f16")  # the output is global, not fragments


@needs_nvrtc
@pytest.mark.parametrize(("dtype", "intrin", "ptx_type"), [
    ("float16", "wmma_16x16x16_f16", ".f16"), ("bfloat16", "wmma_16x16x16_bf16", ".bf16"),
    ("float32", "wmma_16x16x8_tf32", ".tf32")])
def test_tensorize_compiles_to_wmma_instructions(dtype, intrin, ptx_type) -> None:
    args = _matmul(48, 64, 40, dtype)
    mod = aus.build(_hand_schedule(args, intrin), args, target=TARGET)
    code = mod.get_source()
    for call in ("fill_fragment", "load_matrix_sync", "mma_sync", "store_matrix_sync"):
        assert f"nvcuda::wmma::{call}" in code
    ptx = compile_cuda(code, "sm_90", needs_headers=True, ptx=True).data.decode()
    assert "wmma.mma.sync" in ptx and "wmma.load.a" in ptx and "wmma.store.d" in ptx
    assert any(line.rstrip().split()[0].endswith(ptx_type)
               for line in ptx.splitlines() if "wmma.load.a" in line)
    assert ".local" not in ptx  # the fragments stay in registers


@needs_nvrtc
def test_tensorize_refuses_an_old_arch_and_global_operands_under_guards() -> None:
    args = _matmul(48, 64, 40)
    with pytest.raises(CompileError, match="needs sm_70"):
        aus.build(_hand_schedule(args), args, target="cuda -arch=sm_61")
    a, b, c = args
    s = te.create_schedule(c.op)
    cc = s.cache_write(c, ACCUMULATOR_SCOPE)
    i, j = s[c].op.axis
    io, ii = s[c].split(i, factor=16)
    jo, ji = s[c].split(j, factor=16)
    s[c].reorder(io, jo, ii, ji)
    block = s[c].fuse(io, jo)
    s[c].bind(block, te.thread_axis("blockIdx.x"))
    s[c].bind(s[c].fuse(ii, ji), te.thread_axis("threadIdx.x"))
    ci, cj = s[cc].op.axis
    (ck,) = s[cc].op.reduce_axis
    s[cc].compute_at(s[c], block)
    _, ti = s[cc].split(ci, factor=16)
    _, tj = s[cc].split(cj, factor=16)
    ko, tk = s[cc].split(ck, factor=16)
    s[cc].reorder(ko, ti, tj, tk)
    s[cc].tensorize(ti, "wmma_16x16x16_f16")
    for t, kind in ((a, "a"), (b, "b")):  # operand fragments loaded from global memory
        frag = s[s.cache_read(t, f"wmma.matrix_{kind}", [cc])]
        frag.compute_at(s[cc], ko)
        x, y = frag.op.axis
        xo, tx = frag.split(x, factor=16)
        yo, ty = frag.split(y, factor=16)
        frag.reorder(xo, yo, tx, ty)
        frag.tensorize(tx, f"wmma_load_{kind}_16x16x16_f16")
    with pytest.raises(CompileError, match="guarded and touches global buffer A"):
        aus.build(s, args, target=TARGET)


def test_storage_align_pads_rows_and_checks_its_arguments() -> None:
    a = te.placeholder((40, 30), "float16", name="A")
    b = te.compute(a.shape, lambda i, j: cast("float32", a[i, j]) * 2.0, name="B")
    c = te.compute(a.shape, lambda i, j: b[i, j] + 1.0, name="C")
    s = te.create_schedule(c.op)
    s[b].compute_at(s[c], s[c].op.axis[0])
    with pytest.raises(ScheduleError, match="second-to-last axis"):
        s[b].storage_align(s[b].op.axis[1], 16, 8)
    with pytest.raises(ScheduleError, match="offset < factor"):
        s[b].storage_align(s[b].op.axis[0], 8, 8)
    with pytest.raises(ScheduleError, match="an output keeps"):
        s[c].storage_align(s[c].op.axis[0], 16, 8)
    s[b].storage_align(s[b].op.axis[0], 16, 8)
    text = str(aus.lower(s, [a, c]))
    assert "B = allocate((1, 40,)" in text  # 30 -> the least >= 30 that is 8 modulo 16
    again = Schedule.from_json(c, s.to_json())
    assert str(aus.lower(again, [a, c])) == text and ".storage_align(" in s.to_python()


@needs_nvrtc
def test_tensorize_replays_from_json() -> None:
    args = _matmul(48, 64, 40)
    s = _hand_schedule(args)
    assert "tensorize" in s.to_json() and ".tensorize(" in s.to_python()
    again = Schedule.from_json(args[-1], s.to_json())
    assert again.to_json() == s.to_json()
    assert (aus.build(again, args, target=TARGET).get_source()
            == aus.build(s, args, target=TARGET).get_source())


# -- host emulation against numpy ----------------------------------------------------------

@needs_nvrtc
@needs_host
def test_tf32_hand_schedule_on_host_matches_numpy(rng) -> None:
    args = _matmul(40, 48, 36, dtype="float32")
    s = _hand_schedule(args, "wmma_16x16x8_tf32")
    a, b, c = _inputs(args, rng)
    aus.build(s, args, target=EMULATE)(a, b, c)
    _check(c, _reference(a, b), "float32")
    assert np.abs(c - _reference(a, b)).max() > 1e-6  # the operands were rounded to tf32



@needs_nvrtc
@needs_host
@pytest.mark.parametrize("shape", [(64, 64, 64), (40, 72, 50), (17, 33, 16)])
def test_hand_schedule_on_host_matches_numpy(shape, rng) -> None:
    args = _matmul(*shape)
    a, b, c = _inputs(args, rng)
    aus.build(_hand_schedule(args), args, target=EMULATE)(a, b, c)
    _check(c, _reference(a, b), "float16")


@needs_nvrtc
@needs_host
@pytest.mark.parametrize(("dtype", "widen", "transpose_b", "knobs"), [
    ("float16", False, False, {}),
    ("float16", True, True, {"warps_m": 1, "frags_n": 1, "k_chunk": 4, "pad": 0, "stages": 3}),
    ("bfloat16", True, False, {"warps_n": 4, "frags_m": 4, "frags_n": 1, "k_chunk": 1,
                               "stages": 1}),
    ("float32", False, False, {"k_chunk": 4, "stages": 1}),  # a tf32 task
    ("float32", False, False, {"k_chunk": 2, "stages": 2}),
])
def test_sketch_candidate_on_host_matches_numpy(dtype, widen, transpose_b, knobs, rng) -> None:
    args = _matmul(72, 40, 56, dtype, widen=widen, transpose_b=transpose_b)
    (a, b, c), _ = _run_candidate(args, rng, dtype, **knobs)
    _check(c, _reference(a, b, transpose_b), dtype)


@needs_nvrtc
@needs_host
@pytest.mark.parametrize("stages", [1, 2])
def test_batch_matmul_on_host_matches_numpy(stages, rng) -> None:
    args = _matmul(24, 40, 72, batch=3)
    (a, b, c), _ = _run_candidate(args, rng, frags_m=1, stages=stages)
    _check(c, _reference(a, b), "float16")


@needs_nvrtc
@needs_host
def test_transposed_operands_and_a_broadcast_batch_on_host_match_numpy(rng) -> None:
    a = te.placeholder((3, 56, 40), "float16", name="A")  # (batch, K, M)
    b = te.placeholder((1, 48, 56), "float16", name="B")  # (1, N, K), broadcast over batch
    args = [a, b, ops.matmul(a, b, transpose_a=True, transpose_b=True, out_dtype="float32")]
    (xa, xb, got), _ = _run_candidate(args, rng)
    assert got.shape == (3, 40, 48)
    _check(got, _reference(np.swapaxes(xa, -1, -2), xb, transpose_b=True), "float16")


@needs_nvrtc
@needs_host
@pytest.mark.parametrize("stages", [1, 2])
def test_fused_bias_relu_epilogue_on_host_matches_numpy(stages, rng) -> None:
    a, b, mm = _matmul(40, 48, 80)
    bias = te.placeholder((48,), "float32", name="bias")
    out = te.compute(mm.shape, lambda i, j: te.max(mm[i, j] + bias[j], 0.0), name="T_relu")
    args = [a, b, bias, out]
    (xa, xb, xbias, got), task = _run_candidate(args, rng, stages=stages)
    rules = SearchSpace(task).sketches[1].rules
    assert [r.kind for r in rules] == ["mma"]  # the epilogue fused into the tile's output
    _check(got, np.maximum(_reference(xa, xb) + xbias, 0.0), "float16")


@needs_nvrtc
@needs_host
@pytest.mark.parametrize("target", [EMULATE, "cuda -arch=sm_90 -emulate=ir"])
def test_graph_shaped_half_dense_with_bias_relu_on_host_matches_numpy(target, rng) -> None:
    """As graph/compiler.py builds an fp16 Gemm + Relu: half inputs read through cast stages,
    the weight (N, K), the output rounded to half where it is written (four halves of a row
    a thread, stored as one 8-byte access); in the CUDA C and in the loop IR (where every lane
    of a warp computes the whole tile)."""
    a = te.placeholder((40, 56), "float16", name="A")
    w = te.placeholder((48, 56), "float16", name="W")
    bias = te.placeholder((48,), "float16", name="bias")
    x, y, z = (te.compute(t.shape, lambda *i, t=t: cast("float32", t[i]), name=f"{t.name}_f32")
               for t in (a, w, bias))
    mm = ops.dense(x, y)
    out = te.compute(mm.shape, lambda i, j: cast("float16", te.max(mm[i, j] + z[j], 0.0)),
                     name="store_y")
    (xa, xw, xbias, got), task = _run_candidate([a, w, bias, out], rng, target=target)
    want = np.maximum(_reference(xa, xw, transpose_b=True) + xbias.astype(np.float64), 0.0)
    _check(got.astype(np.float32), want, "float16")
    if target == EMULATE:
        space = SearchSpace(task)
        source = task.build(space.lower(_tc_candidate(space)).schedule).get_source()
        assert "*(uint2*)(&v_store_y[" in source


# -- the search space --------------------------------------------------------------------------

def test_fp32_tasks_keep_the_simt_sketch_only() -> None:
    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 64), name="B")
    task = Task(ops.matmul(a, b), target=TARGET)
    space = SearchSpace(task)
    assert len(space.sketches) == 1
    assert [r.kind for r in space.sketches[0].rules] == ["gpu_tile"]
    assert "tensorize" not in space.default_schedule().to_json()
    tf32 = SearchSpace(Task(ops.matmul(a, b), target=TARGET, precision="tf32"))
    assert [[r.kind for r in s.rules] for s in tf32.sketches] == [["gpu_tile"], ["mma"]]


def test_half_tasks_offer_tensor_cores_beside_the_simt_default() -> None:
    args = _matmul(64, 64, 64, widen=True)
    space = SearchSpace(Task(args[-1:], args=args, target=TARGET, precision="fp16"))
    assert [[r.kind for r in s.rules if r.kind != "inline"] for s in space.sketches] == [
        ["gpu_tile"], ["mma"]]
    assert space.default_candidate().sketch == 0
    small = _matmul(64, 64, 8)  # K below one fragment
    assert len(SearchSpace(Task(small[-1:], args=small, target=TARGET)).sketches) == 1


@needs_nvrtc
def test_large_half_matmuls_default_to_tensor_cores() -> None:
    """From 128 output rows and columns the tensor-core tile is the untuned default (blocks
    full: 4.4x the SIMT default at 4096^3 on an H100); the SIMT sketch stays for the search."""
    args = _matmul(256, 128, 40, widen=True)
    space = SearchSpace(Task(args[-1:], args=args, target=TARGET, precision="fp16"))
    assert [[r.kind for r in s.rules if r.kind != "inline"] for s in space.sketches] == [
        ["mma"], ["gpu_tile"]]
    sch = space.default_schedule()
    code = aus.build(sch, args, target=TARGET).get_source()
    assert "nvcuda::wmma::mma_sync" in code
    narrow = _matmul(256, 96, 40, widen=True)  # 96 columns: SIMT stays the default
    space = SearchSpace(Task(narrow[-1:], args=narrow, target=TARGET, precision="fp16"))
    assert space.sketches[0].rules[-1].kind == "gpu_tile"


@needs_host
def test_the_tensor_core_default_on_host_matches_numpy(rng) -> None:
    args = _matmul(128, 144, 24, widen=True)
    task = Task(args[-1:], args=args, target=EMULATE, precision="fp16")
    a, b, c = _inputs(args, rng)
    task.build(SearchSpace(task).default_schedule())(a, b, c)
    _check(c, _reference(a, b), "float16")


# -- feeding the tensor cores: vector copies ----------------------------------------------

def _default_source(args: list[te.Tensor], target: str = TARGET, stages: int = 2) -> str:
    """The CUDA C of the tensor-core sketch's defaults with a pipeline of ``stages``."""
    task = Task(args[-1:], args=args, target=target, precision="fp16")
    space = SearchSpace(task)
    low = space.lower(_tc_candidate(space, stages=stages))
    assert low is not None and low.schedule is not None
    return aus.build(low.schedule, args, target=target).get_source()


COPY_BYTES = {"uint4": 16, "uint2": 8, "unsigned int": 4}


def _ptx(code: str, arch: str = "sm_90") -> str:
    return compile_cuda(code, arch, needs_headers=True, ptx=True).data.decode()


@needs_nvrtc
def test_operand_tiles_move_16_bytes_per_thread() -> None:
    """Rows of 8k halves: each thread copies 8 of them with one 128-bit load and store (on
    sm_75, which has no cp.async: the pipeline's copies are plain ones), and 4 floats of the
    staged output tile."""
    code = _default_source(_matmul(256, 128, 64), "cuda -arch=sm_75")
    assert "cp_async" not in code
    ptx = _ptx(code, "sm_75")
    assert "ld.global.nc.v4.u32" in ptx and "st.shared.v4.u32" in ptx
    assert "ld.global.nc.u16" not in ptx  # no copy of one element
    assert "ld.shared.v4.f32" in ptx and "st.global.v4.f32" in ptx  # the float32 output too
    assert "st.global.f32" not in ptx


@needs_nvrtc
@pytest.mark.parametrize(("dtype", "k", "vector"), [("float16", 52, "uint2"),
                                                    ("float16", 54, "unsigned int"),
                                                    ("bfloat16", 56, "uint4")])
def test_operand_copies_shrink_to_what_the_rows_allow(dtype, k, vector) -> None:
    """A's rows of 52 halves are 8-byte aligned (4 halves a copy), of 54 only 4-byte (2); B's
    rows (136 halves) stay 16-byte copies, elements alone only where a vector straddles the
    tensor's edge."""
    code = _default_source(_matmul(200, 136, k, dtype))
    assert f"as_cp_async(({vector}*)(&v_A_shared" in code
    assert "as_cp_async((uint4*)(&v_B_shared" in code
    # rows of A past the 200th: cp.async reads nothing (src-size 0) and zero-fills
    assert f"? {COPY_BYTES[vector]} : 0);" in code
    ptx = _ptx(code)
    assert f"cp.async.c{'g' if vector == 'uint4' else 'a'}.shared.global" in ptx


@needs_nvrtc
def test_two_stages_pipeline_the_k_loop_with_cp_async() -> None:
    """Two tiles per operand: chunk k + 1 fetched by cp.async (16 bytes a thread) before the
    mmas of chunk k, one commit, one wait and one barrier per chunk (the untuned default);
    stages=1 has none."""
    args = _matmul(256, 128, 64)
    code = _default_source(args)
    loop = code[code.index("for (int v_k_outer"):code.index("nvcuda::wmma::store_matrix_sync")]
    assert loop.count("as_cp_async_wait<0>();") == 1 and loop.count("__syncthreads();") == 1
    assert loop.index("as_cp_async((uint4*)") < loop.index("as_cp_async_commit();") \
        < loop.index("mma_sync")
    ptx = _ptx(code)
    for op in ("cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group 0"):
        assert op in ptx
    assert "ld.global" not in ptx.split("wmma.store")[0]  # every operand load is a cp.async
    task = Task(args[-1:], args=args, target=TARGET, precision="fp16")
    space = SearchSpace(task)
    low = space.lower(_tc_candidate(space, stages=1))
    assert low is not None and low.schedule is not None
    plain = aus.build(low.schedule, args, target=TARGET).get_source()
    assert "cp_async" not in plain and ".pipeline(" not in low.schedule.to_python()
    assert ".pipeline(2)" in space.default_schedule().to_python()


@needs_nvrtc
def test_pipeline_step_checks_and_replays() -> None:
    args = _matmul(96, 64, 80)
    s = te.create_schedule(args[-1].op)
    with pytest.raises(ScheduleError, match="into shared memory"):
        s[args[-1]].pipeline(2)
    from autosched.search.sketch_mma import schedule_mma

    s = te.create_schedule(args[-1].op)
    schedule_mma(s, args[-1].op.name, None, (2, 1), (1, 2), 2, "wmma_16x16x16_f16", True, 3)
    with pytest.raises(ScheduleError, match="stages must be 1 to 4"):
        s["A.shared"].pipeline(5)
    assert s.to_python().count(".pipeline(3)") == 2
    again = Schedule.from_json(args[-1], s.to_json())
    assert aus.build(again, args, target=TARGET).get_source() == \
        aus.build(s, args, target=TARGET).get_source()
    assert "as_cp_async_wait<1>();" in aus.build(s, args, target=TARGET).get_source()


@needs_nvrtc
@needs_host
@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize("k", [20, 80])
@pytest.mark.parametrize("target", [EMULATE, "cuda -arch=sm_90 -emulate=ir"])
def test_pipelined_hand_schedule_matches_numpy(stages, k, target, rng) -> None:
    """K in chunks of 32: one chunk (fetched by the prologue alone) or three, the last one
    ragged; on the host (cp.async as a copy, races checked) and in the loop IR (the reference
    evaluator checks barriers)."""
    from autosched.search.sketch_mma import schedule_mma

    args = _matmul(40, 72, k)
    s = te.create_schedule(args[-1].op)
    schedule_mma(s, args[-1].op.name, None, (2, 1), (1, 2), 2, "wmma_16x16x16_f16", True,
                 stages)
    a, b, c = _inputs(args, rng)
    aus.build(s, args, target=target)(a, b, c)
    _check(c, _reference(a, b), "float16")


@needs_nvrtc
@needs_host
@pytest.mark.parametrize("shape", [(200, 136, 52), (130, 144, 54), (128, 129, 33)])
def test_vector_copies_zero_fill_ragged_tiles_on_host(shape, rng) -> None:
    """Tiles that overhang the tensor: the copy is zero-filled by vectors inside and element
    by element at the edges (lanes partly outside), and the product still matches numpy."""
    args = _matmul(*shape)
    task = Task(args[-1:], args=args, target=EMULATE, precision="fp16")
    a, b, c = _inputs(args, rng)
    task.build(SearchSpace(task).default_schedule())(a, b, c)
    _check(c, _reference(a, b), "float16")


# -- on a GPU (skipped here; the same checks, run on the device) ---------------------------

@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "dtype", "widen"), [((128, 96, 80), "float16", True),
                                                       ((40, 72, 50), "float16", False),
                                                       ((64, 64, 48), "bfloat16", True),
                                                       ((48, 40, 36), "float32", False)])
def test_sketch_candidate_on_gpu_matches_numpy(shape, dtype, widen, rng) -> None:
    args = _matmul(*shape, dtype=dtype, widen=widen)
    task = Task(args[-1:], args=args, target="cuda", precision=PRECISION[dtype])
    space = SearchSpace(task)
    low = space.lower(_tc_candidate(space))
    assert low is not None and low.schedule is not None
    a, b, c = _inputs(args, rng)
    task.build(low.schedule)(a, b, c)
    _check(c, _reference(a, b), dtype)


@pytest.mark.gpu
def test_fused_epilogue_on_gpu_matches_numpy(rng) -> None:
    a, b, mm = _matmul(72, 48, 40, widen=True)
    bias = te.placeholder((48,), "float32", name="bias")
    out = te.compute(mm.shape, lambda i, j: te.max(mm[i, j] + bias[j], 0.0), name="T_relu")
    (xa, xb, xbias, got), _ = _run_candidate([a, b, bias, out], rng, target="cuda")
    _check(got, np.maximum(_reference(xa, xb) + xbias, 0.0), "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [1, 2, 3])
@pytest.mark.parametrize(("shape", "batch"), [((256, 128, 64), 0), ((200, 136, 52), 0),
                                              ((130, 144, 54), 0), ((72, 40, 56), 3)])
def test_pipelined_copies_on_gpu_match_numpy(stages, shape, batch, rng) -> None:
    """cp.async with 16-, 8- and 4-byte copies, ragged tiles and a batch, per pipeline depth."""
    args = _matmul(*shape, batch=batch)
    (a, b, c), _ = _run_candidate(args, rng, target="cuda", stages=stages)
    _check(c, _reference(a, b), "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [1, 2])
def test_pipelined_fused_epilogue_on_gpu_matches_numpy(stages, rng) -> None:
    a, b, mm = _matmul(136, 200, 72, widen=True)
    bias = te.placeholder((200,), "float32", name="bias")
    out = te.compute(mm.shape, lambda i, j: te.max(mm[i, j] + bias[j], 0.0), name="T_relu")
    (xa, xb, xbias, got), _ = _run_candidate([a, b, bias, out], rng, target="cuda",
                                             stages=stages)
    _check(got, np.maximum(_reference(xa, xb) + xbias, 0.0), "float16")


@needs_nvrtc
@needs_host
@pytest.mark.parametrize(("shape", "batch", "knobs"), [
    ((64, 64, 48), 0, {}),
    ((128, 64, 32), 0, {"warps_m": 4, "frags_n": 1, "stages": 1}),
    ((32, 64, 64), 2, {"frags_m": 1, "stages": 3}),
    ((128, 128, 64), 0, {"frags_m": 4, "frags_n": 4}),   # gpu_hgemm's 128 x 128 tile
])
def test_direct_store_into_the_output_on_host_matches_numpy(shape, batch, knobs, rng) -> None:
    """Fragments stored straight into the output (no staging tile): no shared buffer for the
    accumulators in the kernel, and the same result."""
    args = _matmul(*shape, batch=batch)
    (a, b, c), task = _run_candidate(args, rng, direct=1, **knobs)
    _check(c, _reference(a, b), "float16")
    space = SearchSpace(task)
    staged = task.lower(space.schedule(_tc_candidate(space, **knobs)))
    direct = task.lower(space.schedule(_tc_candidate(space, direct=1, **knobs)))
    from autosched.targets.cuda import shared_bytes

    assert shared_bytes(direct) < shared_bytes(staged)


def test_direct_store_is_refused_where_it_cannot_store_whole_fragments() -> None:
    for args in (_matmul(72, 40, 56), ):   # 72 rows: a 64-row tile overhangs
        task = Task(args[-1:], args=args, target=TARGET, precision="fp16")
        space = SearchSpace(task)
        assert space.lower(_tc_candidate(space, direct=1)) is None
        assert space.lower(_tc_candidate(space)) is not None


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "batch", "knobs"), [
    ((256, 128, 64), 0, {}), ((128, 128, 96), 3, {"warps_m": 4, "frags_m": 2, "stages": 3})])
def test_direct_store_on_gpu_matches_numpy(shape, batch, knobs, rng) -> None:
    (a, b, c), _ = _run_candidate(_matmul(*shape, batch=batch), rng, target="cuda", direct=1,
                                  **knobs)
    _check(c, _reference(a, b), "float16")


@pytest.mark.parametrize("seen", [0, 40])
def test_zero_measurement_picks_put_tensor_cores_first(seen, monkeypatch) -> None:
    """Where a task can run on tensor cores, model_candidates' first pick uses them even
    when the model ranks SIMT candidates higher, whichever sketch the untuned default takes
    (64 rows: SIMT); SIMT picks stay as fallbacks after them. A model trained on no
    tensor-core records gets the sketch's default tile first; one that saw some, its own
    order (the default last of the tensor-core picks)."""
    from autosched.schedule.steps import step_from_dict
    from autosched.search import evolution
    from autosched.search.tune import model_candidates

    args = _matmul(64, 128, 64, widen=True)
    task = Task(args[-1:], args=args, target=TARGET, precision="fp16")
    space = SearchSpace(task)
    assert space.sketches[1].tensor_cores   # the default stays SIMT here
    default = space.lower(space.sketch_defaults()[1])
    real = evolution.EvolutionarySearch.next_batch

    def simt_on_top(self, n, model, measured, seeds=()):  # noqa: ANN001, ANN202
        batch = real(self, n, model, measured, seeds)
        return sorted(batch, key=lambda low: low.candidate.sketch == 1)

    class Model:
        trained = True
        tensor_core_records = seen

        def predict(self, feats):  # noqa: ANN001, ANN202  SIMT (sketch 1) scores 1, mma 0
            return np.array([1.0 if i < len(feats) // 2 else 0.0 for i in range(len(feats))])

    monkeypatch.setattr(evolution.EvolutionarySearch, "next_batch", simt_on_top)
    picks = model_candidates(task, Model(), candidates=6, seed=1)
    kinds = []
    for steps in picks:
        sch = task.schedule([step_from_dict(d) for d in steps])
        kinds.append("nvcuda::wmma::mma_sync" in aus.build(sch, args, target=TARGET).get_source())
    assert kinds[0] and not all(kinds), kinds
    assert kinds == sorted(kinds, reverse=True), kinds   # every tensor-core pick before SIMT
    default_steps = [st.to_dict() for st in default.schedule.steps]
    where = picks.index(default_steps)
    assert where == (0 if not seen else kinds.count(True) - 1), (where, kinds)


def test_training_data_counts_tensor_core_records() -> None:
    """A log's stats count the records whose steps tensorize (what the shipped manifest says
    and what tells the picks whether the model has seen tensor-core tiles)."""
    import time

    from autosched.search.record import MeasureRecord, target_fingerprint
    from autosched.search.training_data import samples_from_records

    args = _matmul(128, 128, 64, widen=True)
    task = Task(args[-1:], args=args, target=TARGET, precision="fp16")
    space = SearchSpace(task)
    simt = next(i for i, sk in enumerate(space.sketches) if not sk.tensor_cores)
    lows = [space.lower(_tc_candidate(space)), space.lower(space.sketch_defaults()[simt])]
    fp = target_fingerprint(task.target)
    records = [MeasureRecord(task.workload_key, task.name, fp,
                             [st.to_dict() for st in low.schedule.steps], [1e-4, 1.1e-4],
                             timestamp=time.time()) for low in lows]
    _, stats = samples_from_records(records, {task.workload_key: task}, "half.jsonl")
    assert (stats.used, stats.tensor_cores) == (2, 1)
    assert stats.as_dict()["tensor_cores"] == 1
