"""Hopper's warpgroup tiles: the wgmma main loop (targets/cuda/wgmma.py), the gemm_block
tensorize step, its host emulation (host_prelude.py) and the sketch rule
(search/sketch_mma.wgmma_rule), against numpy with the precision's tolerance. On a GPU they run
in tests/targets/cuda/test_cuda_gpu.py's way (``-m gpu``)."""

from __future__ import annotations

import numpy as np
import pytest

from autosched import te
from autosched.errors import RuntimeError_, ScheduleError
from autosched.search.space import Candidate, SearchSpace
from autosched.search.task import Task
from autosched.targets.cuda.host_emulate import unavailable
from autosched.targets.cuda.nvrtc import compile_cuda
from autosched.targets.cuda.tma import TensorMap
from autosched.targets.cuda.wgmma import MainLoop, WgmmaGemm, gemm_source, wgmma_fragment
from autosched.te import ops
from tests.support.nvrtc import needs_nvrtc
from tests.targets.cuda.test_wmma import PRECISION, _check, _inputs, _matmul, _reference

EMULATE = "cuda -arch=sm_90 -emulate=host"
needs_host = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _candidate(space: SearchSpace, **knobs: int) -> Candidate:
    """The wgmma sketch's candidate with its defaults, ``knobs`` (by suffix) changed."""
    index = next(n for n, sk in enumerate(space.sketches)
                 if any(r.kind == "wgmma" for r in sk.rules))
    return Candidate(index, tuple((k.name, knobs.get(k.name.rsplit(".", 1)[1], k.default()))
                                  for k in space.sketches[index].knobs))


def _run(args: list[te.Tensor], rng: np.random.Generator, dtype: str = "float16",
         target: str = EMULATE, **knobs: int) -> list[np.ndarray]:
    task = Task(args[-1:], args=args, target=target, precision=PRECISION[dtype])
    space = SearchSpace(task)
    low = space.lower(_candidate(space, **knobs))
    assert low is not None and low.schedule is not None, "the wgmma candidate did not lower"
    arrays = _inputs(args, rng)
    mod = task.build(low.schedule)
    assert "as_wgmma_m64n" in mod.get_source()
    SOURCES.append(mod.get_source())
    mod(*arrays)
    return arrays


SOURCES: list[str] = []  # what _run built, last last


def test_each_accumulator_of_a_slab_has_one_thread() -> None:
    for n in (8, 64, 256):
        seen = {wgmma_fragment(lane, warp, i) for warp in range(4) for lane in range(32)
                for i in range(n // 2)}
        assert seen == {(r, c) for r in range(64) for c in range(n)}


def test_main_loop_checks_what_the_instruction_takes() -> None:
    assert MainLoop().check() is None
    assert "K-major" in (MainLoop("float32").check() or "")
    assert "block_m" in (MainLoop(block_m=96).check() or "")
    assert "block_n" in (MainLoop(block_n=96).check() or "")  # MN-major B: 64 at a time
    assert MainLoop(block_n=96, b_k_major=True).check() is None
    assert "accumulators" in (MainLoop(block_m=256, block_n=256).check() or "")
    assert "stages" in (MainLoop(stages=2).check() or "")
    assert "shared memory" in (MainLoop(block_n=256, stages=6).check() or "")
    assert "16 bytes" in (MainLoop().rows_fit(64, 100) or "")
    assert "TMA" in (MainLoop(producer=True).check() or "")
    assert MainLoop(tma=True, producer=True).threads == 3 * 128


def test_tensor_maps_check_what_the_copy_takes() -> None:
    assert TensorMap("float16", (3, 300, 4096), (1, 128, 64)).check() is None
    assert "not 128" in (TensorMap("float32", (64, 64), (64, 64)).check() or "")  # 256 bytes
    assert "not 128" in (TensorMap("float16", (64, 64), (64, 32)).check() or "")
    assert "16 bytes" in (TensorMap("float16", (64, 100), (64, 64)).check() or "")
    assert "box" in (TensorMap("float16", (512, 64), (512, 64)).check() or "")
    assert "rank" in (TensorMap("float16", (1,) * 6, (1,) * 6).check() or "")
    assert TensorMap("float16", (5, 7, 64), (1, 7, 64)).strides() == [128, 7 * 128]


def test_a_tma_main_loop_reads_each_operand_through_its_map() -> None:
    spec = WgmmaGemm(300, 256, 200, MainLoop(block_n=256, tma=True), batch=2, b_batch_stride=0)
    a, b = spec.reads()
    assert a.map == TensorMap("float16", (2, 300, 200), (1, 128, 64)) and a.k_dim == 2
    # B (K, N) broadcast over the batch: atoms of 64 columns, every K row of the tile
    assert b.map == TensorMap("float16", (1, 200, 256), (1, 64, 64)) and b.row_dim == 2
    kernel = gemm_source(spec).split('extern "C"')[1]
    assert kernel.count("as_tma_load3(") == 1 + 4 and "as_wg_cp16(" not in kernel


@needs_nvrtc
@pytest.mark.parametrize("producer", [False, True])
def test_tma_main_loops_compile_to_bulk_tensor_copies(producer) -> None:
    spec = WgmmaGemm(4096, 4096, 4096, MainLoop(block_n=256, tma=True, producer=producer))
    binary = compile_cuda(gemm_source(spec), "sm_90a", needs_headers=True, ptx=True)
    text = binary.data.decode()
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes" in text
    assert "mbarrier.try_wait.parity" in text and ".local" not in text
    assert ("setmaxnreg.inc.sync.aligned.u32 232" in text) == producer
    cubin = compile_cuda(gemm_source(spec), "sm_90a", needs_headers=True)
    assert "insufficient register" not in cubin.log  # accumulators never serialize wgmma


def test_encoding_a_tensor_map_without_a_driver_says_so(monkeypatch) -> None:
    from autosched.targets.cuda import tma

    tma._encoder.cache_clear()
    monkeypatch.setattr(tma.ctypes, "CDLL", _no_library)
    try:
        with pytest.raises(RuntimeError_, match="TMA copies need libcuda.so.1"):
            tma.encode(TensorMap("float16", (64, 64), (64, 64)), 1 << 20)
    finally:
        tma._encoder.cache_clear()
    with pytest.raises(RuntimeError_, match="not 128"):
        tma.encode(TensorMap("float32", (64, 64), (64, 64)), 1 << 20)


def _no_library(name: str) -> None:
    raise OSError(f"{name}: cannot open shared object file")


@needs_nvrtc
@pytest.mark.parametrize(("dtype", "b_k_major", "ptx"), [
    ("float16", False, "m64n128k16.f32.f16.f16"), ("bfloat16", True, "m64n128k16.f32.bf16.bf16"),
    ("float32", True, "m64n128k8.f32.tf32.tf32")])
def test_standalone_kernel_compiles_to_wgmma(dtype, b_k_major, ptx) -> None:
    spec = WgmmaGemm(256, 256, 256, MainLoop(dtype, b_k_major=b_k_major))
    code = gemm_source(spec)
    text = compile_cuda(code, "sm_90a", needs_headers=dtype != "float32", ptx=True).data.decode()
    assert f"wgmma.mma_async.sync.aligned.{ptx}" in text
    assert "cp.async.cg.shared.global" in text and ".local" not in text


@needs_host
@pytest.mark.parametrize(("shape", "dtype", "transpose_b", "knobs"), [
    ((200, 136, 200), "float16", False, {}),  # every edge ragged
    ((128, 128, 64), "float16", False, {"warpgroups": 1, "block_m": 64, "stages": 3}),
    ((130, 96, 72), "float16", True, {"block_n": 192}),
    ((64, 256, 96), "bfloat16", False, {"block_m": 64, "warpgroups": 1, "block_n": 256}),
    ((96, 72, 40), "float32", True, {"block_n": 64, "stages": 5}),
    ((200, 136, 200), "float16", False, {"epilogue": 0}),  # staged through the shared tile
    ((64, 256, 96), "bfloat16", False, {"block_m": 64, "warpgroups": 1, "epilogue": 0}),
])
def test_wgmma_tile_on_host_matches_numpy(shape, dtype, transpose_b, knobs, rng) -> None:
    m, n, k = shape
    args = _matmul(m, n, k, dtype, transpose_b=transpose_b)
    a, b, c = _run(args, rng, dtype, **knobs)
    _check(c, _reference(a, b, transpose_b), dtype)


@needs_host
@pytest.mark.parametrize(("shape", "transpose_b", "knobs"), [
    ((200, 136, 200), False, {}),  # 384 threads over 128 x 128: the epilogue overhangs
    ((130, 296, 200), False, {"block_n": 256}),
    ((130, 96, 72), True, {"block_n": 192, "stages": 3}),
    ((64, 256, 96), False, {"block_m": 64, "warpgroups": 1, "block_n": 256}),
    ((200, 136, 200), False, {"epilogue": 0}),
])
def test_wgmma_tile_with_a_producer_warpgroup_on_host_matches_numpy(
        shape, transpose_b, knobs, monkeypatch, rng) -> None:
    """A warpgroup of its own copies by TMA (mbarriers between it and the computing ones,
    which wait for each other only before storing); its threads join the epilogue."""
    monkeypatch.setenv("AUTOSCHED_TMA", "1")
    args = _matmul(*shape, "float16", transpose_b=transpose_b)
    a, b, c = _run(args, rng, "float16", producer=1, **knobs)
    _check(c, _reference(a, b, transpose_b), "float16")
    kernel = SOURCES[-1].split('extern "C"')[1]
    assert "as_wg_setmaxnreg_dec<" in kernel and "as_bar_sync(1, " in kernel


def test_a_producer_warpgroup_is_offered_only_with_tma(monkeypatch) -> None:
    for flag, knobs in (("0", set()), ("1", {"producer"})):
        monkeypatch.setenv("AUTOSCHED_TMA", flag)
        args = _matmul(512, 512, 256, "float16")
        task = Task(args[-1:], args=args, target="cuda -arch=sm_90", precision="fp16")
        (names,) = [n for n in ({k.name.rsplit(".", 1)[1] for k in sk.knobs}
                                for sk in SearchSpace(task).sketches) if "warpgroups" in n]
        assert knobs <= names and ("producer" in names) == (flag == "1")


@needs_host
@pytest.mark.parametrize("tma", ["1", "0"])
def test_wgmma_tile_copies_by_tma_unless_turned_off(tma, monkeypatch, rng) -> None:
    """With AUTOSCHED_TMA=1 the main loop copies by TMA (the host encodes a descriptor of each
    operand, passed before the buffers); with 0 every thread copies by cp.async."""
    monkeypatch.setenv("AUTOSCHED_TMA", tma)
    args = _matmul(136, 200, 72, "float16", transpose_b=True)
    a, b, c = _run(args, rng, "float16", block_n=128)
    _check(c, _reference(a, b, True), "float16")
    kernel = SOURCES[-1].split('extern "C"')[1]
    assert ("const __grid_constant__ as_tensor_map as_tm1" in kernel) == (tma == "1")
    assert ("as_wg_cp16(" in kernel) == (tma == "0")


@needs_host
@pytest.mark.parametrize("epilogue", [1, 0])
def test_wgmma_broadcast_batch_and_fused_epilogue_on_host_match_numpy(epilogue, rng) -> None:
    """A convolution's per-image form (its weights broadcast over the batch) with a bias and
    ReLU fused into the output: computed from the accumulators, or from the staging tile."""
    w = te.placeholder((72, 48), "float16", name="W")
    x = te.placeholder((3, 48, 80), "float16", name="X")
    bias = te.placeholder((72,), "float32", name="bias")
    y = ops.matmul(w, x, out_dtype="float32")
    out = te.compute(y.shape, lambda n, i, j: te.max(y[n, i, j] + bias[i], 0.0), name="relu")
    arrays = _run([w, x, bias, out], rng, epilogue=epilogue)
    want = np.maximum(_reference(arrays[0], arrays[1]) + arrays[2][:, None], 0.0)
    _check(arrays[3], want, "float16")


@needs_host
@pytest.mark.parametrize(("n", "producer"), [(136, 0), (75, 0), (136, 1)])
def test_a_half_output_is_written_from_the_accumulators(n, producer, monkeypatch, rng) -> None:
    """A half output with a residual added: each thread rounds the two accumulators it holds
    of a row and stores them as one half2 (rows of an odd count of halves: each alone, the
    last pair straddling the edge); the shared tile is never written."""
    monkeypatch.setenv("AUTOSCHED_TMA", str(producer))
    a = te.placeholder((130, 72), "float16", name="A")
    b = te.placeholder((n, 72), "float16", name="B")
    res = te.placeholder((130, n), "float16", name="R")
    y = ops.matmul(a, b, transpose_b=True, out_dtype="float32")
    out = te.compute(y.shape, lambda i, j: te.cast("float16", y[i, j] + te.cast("float32",
                                                                               res[i, j])),
                     name="out")
    knobs = {"producer": 1} if producer else {}
    xa, xb, xr, got = _run([a, b, res, out], rng, block_n=64, **knobs)
    want = _reference(xa, xb, True) + xr.astype(np.float64)
    _check(got.astype(np.float32), want, "float16")
    kernel = SOURCES[-1].split('extern "C"')[1]
    assert ("*(unsigned int*)(&v_out[" in kernel) == (n % 2 == 0)
    assert "wg_acc[wg_s][wg_i + 1]" in kernel
    assert "v_T_matmul[" not in kernel.split("as_wg_base(v_T_matmul)")[1]


@needs_host
def test_an_operand_viewed_through_a_reshape_and_a_transpose_is_read_in_place(rng) -> None:
    """Attention's Q heads: (b, s, 768) viewed as (b, 12, s, 64) (a reshape splitting the
    last dim, a transpose keeping it last) and multiplied by K^T on warpgroups, the main loop
    copying Q's tiles straight from its rows of 768 (no kernel writing the heads); a view
    that moves the last dim (K^T from the same rows) is no warpgroup operand."""
    from autosched.search.sketch_mma import offers_wgmma
    from autosched.te.ops import transform as T

    x = te.placeholder((2, 128, 384), "float16", name="x")
    q = T.transpose(T.reshape(x, (2, 128, 6, 64)), (0, 2, 1, 3))
    k = te.placeholder((2, 6, 64, 128), "float16", name="k")
    y = ops.matmul(q, k, out_dtype="float32")
    xa, ka, got = _run([x, k, y], rng)
    want = xa.astype(np.float64).reshape(2, 128, 6, 64).transpose(0, 2, 1, 3) @ ka
    _check(got, want, "float16")
    assert "(long long)wg_r * 384 + wg_kk" in SOURCES[-1]  # Q's rows, in place
    kt = T.transpose(T.reshape(x, (2, 128, 6, 64)), (0, 2, 3, 1))  # (b, 6, 64, s)
    z = ops.matmul(q, kt, out_dtype="float32")
    task = Task([z], args=[x, z], target="cuda -arch=sm_90", precision="fp16")
    assert not offers_wgmma(task.schedule(), "T_matmul", "fp16", task.target)


def test_an_epilogue_nest_runs_only_inside_a_main_loop() -> None:
    """The pragma that marks a block tile's epilogue on a nest that no main loop reads is a
    compile error, not a nest every thread runs whole."""
    from autosched.errors import CompileError
    from autosched.schedule.lower import lower
    from autosched.targets.cuda.codegen import generate
    from autosched.targets.target import parse

    x = te.placeholder((128, 128), name="X")
    y = te.compute(x.shape, lambda i, j: x[i, j] * 2.0, name="Y")
    s = te.create_schedule(y.op)
    i, j = s[y].op.axis
    bo, bi = s[y].split(i, factor=64)
    s[y].bind(bo, te.thread_axis("blockIdx.x"))
    s[y].pragma(bi, "wgmma_epilogue", 128)
    with pytest.raises(CompileError, match="epilogue nest of loop i.inner reads 0 block tiles"):
        generate(lower(s, [x, y], name="twice"), parse("cuda -arch=sm_90"))


def test_wgmma_is_offered_on_sm90_only_and_leads_where_blocks_fill_a_wave() -> None:
    args = _matmul(1024, 768, 128)  # 8 x 6 blocks of 128 x 128
    for target, first in (("cuda -arch=sm_90", "wgmma"), ("cuda -arch=sm_80", "mma"),
                          ("cuda -arch=sm_100", "mma")):
        kinds = [[r.kind for r in sk.rules if r.kind in ("mma", "wgmma", "gpu_tile")]
                 for sk in SearchSpace(Task(args[-1:], args=args, target=target,
                                            precision="fp16")).sketches]
        assert kinds[0] == [first], (target, kinds)
        assert (["wgmma"] in kinds) == (first == "wgmma")
    few = _matmul(512, 1024, 128)  # 32 blocks: the warp tiles lead, warpgroups come last
    kinds = [[r.kind for r in sk.rules if r.kind != "inline"] for sk in SearchSpace(
        Task(few[-1:], args=few, target="cuda -arch=sm_90", precision="fp16")).sketches]
    assert kinds == [["mma"], ["gpu_tile"], ["wgmma"]]
    ragged = _matmul(256, 250, 128)  # B's rows of 250 halves: no 16-byte chunks
    kinds = [r.kind for sk in SearchSpace(Task(ragged[-1:], args=ragged, target="cuda -arch=sm_90",
                                               precision="fp16")).sketches for r in sk.rules]
    assert "wgmma" not in kinds


def test_gemm_block_tensorize_checks_the_nest() -> None:
    a, b, c = _matmul(256, 256, 64)
    s = te.create_schedule(c.op)
    cc = s.cache_write(c, "shared")
    i, j = s[cc].op.axis
    io, ii = s[cc].split(i, factor=96)
    with pytest.raises(ScheduleError, match="multiple of 64 rows"):
        s[cc].tensorize(ii, "wgmma_block_f16")
    with pytest.raises(ScheduleError, match="needs an int >= 3"):
        s[cc].pragma(ii, "wgmma_stages", 2)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "dtype", "transpose_b", "knobs"), [
    ((200, 136, 200), "float16", False, {}),
    ((512, 512, 256), "float16", False, {"block_n": 256, "stages": 3}),
    ((130, 96, 72), "bfloat16", True, {"block_n": 192}),
    ((256, 192, 96), "float32", True, {"warpgroups": 1, "block_m": 128}),
    ((1000, 520, 584), "float16", False, {"block_n": 192, "tma": 1}),
    ((1000, 520, 584), "float16", True, {"block_n": 192, "tma": 1, "producer": 1}),
    ((1000, 520, 584), "float16", False, {"block_n": 256, "tma": 1, "producer": 1}),
    ((300, 384, 200), "bfloat16", False, {"block_n": 192, "stages": 5, "tma": 1,
                                          "producer": 1}),
])
def test_wgmma_tile_on_gpu_matches_numpy(shape, dtype, transpose_b, knobs, rng,
                                         monkeypatch) -> None:
    monkeypatch.setenv("AUTOSCHED_TMA", str(knobs.pop("tma", 0)))
    m, n, k = shape
    args = _matmul(m, n, k, dtype, transpose_b=transpose_b)
    a, b, c = _run(args, rng, dtype, target="cuda", **knobs)
    _check(c, _reference(a, b, transpose_b), dtype)


def test_cached_picks_are_kept_apart_by_the_settings_that_change_the_sketches(
        monkeypatch) -> None:
    """A pick made with TMA on may hold a producer warpgroup, which a compile with TMA off
    cannot build: the two settings read different entries of the pick cache."""
    from autosched.search.tune import _PickCache

    args = _matmul(512, 512, 256, "float16")
    task = Task(args[-1:], args=args, target="cuda -arch=sm_90", precision="fp16")
    names = set()
    for tma in ("0", "1"):
        for wgmma in ("0", "1"):
            monkeypatch.setenv("AUTOSCHED_TMA", tma)
            monkeypatch.setenv("AUTOSCHED_WGMMA", wgmma)
            names.add(_PickCache(0)._name(task))
    assert len(names) == 4
