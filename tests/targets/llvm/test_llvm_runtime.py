"""The LLVM host module: parallel loops on the thread pool, argument checks, timing, printing, export,
the compile cache."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from autosched.errors import CompileError, RuntimeError_
from autosched.targets.llvm import compile as llvm_compile
from autosched.targets.llvm import threadpool
from autosched.targets.target import parse
from autosched.te import expr as E
from autosched.tir import ir
from tests.support import ROOT
from tests.support.backends import garbage
from tests.support.llvm_ir import buf, build, loop, rand


def _par_kernel(m: int = 37, n: int = 29, inner: str = "serial", target: str = "llvm",
                name: str = "k"):
    """C[i, j] = A[i, j] * 2 + i with the i loop parallel."""
    A, C = buf("A", (m, n)), buf("C", (m, n))
    i, j = E.Var("i"), E.Var("j")
    value = ir.Load(A, (i, j)) * 2.0 + E.cast("float32", i)
    return build(loop(i, m, loop(j, n, ir.Store(C, (i, j), value), inner), "parallel"), [A, C],
                 name=name, target=target)


def most_threads_ran(mod, call, want: int, seconds: float = 20.0) -> int:
    """Call until ``want`` threads ran one call (workers join a region only if they come in
    time: on a busy machine the first calls may run on the caller alone); the most seen."""
    import time

    most, deadline = 0, time.monotonic() + seconds
    while most < want and time.monotonic() < deadline:
        before = mod.threads_ran
        call()
        most = max(most, mod.threads_ran - before)
    return most


def test_parallel_runs_on_several_threads(rng):
    mod = _par_kernel(300, 129)
    assert "autosched_parallel" in mod.get_llvm_ir()
    a = rand(rng, (300, 129), "float32")
    out = garbage((300, 129), "float32")
    mod.num_threads = 3
    before = mod.threads_ran
    mod(a, out)
    np.testing.assert_allclose(out, a * 2 + np.arange(300)[:, None], rtol=1e-6)
    assert 1 <= mod.threads_ran - before <= 3
    assert most_threads_ran(mod, lambda: mod(a, out), 3) == 3
    np.testing.assert_allclose(out, a * 2 + np.arange(300)[:, None], rtol=1e-6)


@pytest.mark.parametrize("runtime", ["pool", "gomp"])
def test_process_with_spinning_threads_exits_cleanly(runtime):
    # llvmlite dlcloses its libraries at exit; libgomp's workers still spin with the active
    # wait policy, so without autosched pinning libgomp the exiting process segfaulted; the
    # pool's workers spin in JIT code, which must stay mapped until the process ends
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np
        from tests.targets.llvm.test_llvm_runtime import _par_kernel
        mod = _par_kernel(64, 33)
        a = np.random.default_rng(1).uniform(-1, 1, (64, 33)).astype("float32")
        c = np.empty_like(a)
        mod.num_threads = 2
        mod(a, c)
        expect = a * 2 + np.arange(64, dtype="float32")[:, None]
        assert np.allclose(c, expect) and mod.threads_ran > 0
        print("ran")
    """)
    env = dict(os.environ, OMP_WAIT_POLICY="active", PYTHONPATH=str(ROOT),
               AUTOSCHED_PARALLEL=runtime)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0 and "ran" in out.stdout, (out.returncode, out.stderr[-2000:])


def test_thread_count_from_the_target(rng):
    a = rand(rng, (5, 3), "float32")
    for n in (1, 2, 7):  # 7 threads for 5 iterations: two threads get no work, still correct
        mod = _par_kernel(5, 3, inner="vectorized", target=f"llvm -num-cores={n}")
        out = garbage((5, 3), "float32")
        before = mod.threads_ran
        mod(a, out)
        ran = mod.threads_ran - before
        assert mod.threads == n and (ran == 1 if n == 1 else 1 <= ran <= n)
        np.testing.assert_allclose(out, a * 2 + np.arange(5)[:, None], rtol=1e-6)
    assert parse("llvm").num_cores == len(os.sched_getaffinity(0))
    for bad in ("zero", "0", "-2"):
        with pytest.raises(CompileError, match=f"-num-cores={bad}: expected a positive"):
            parse(f"llvm -num-cores={bad}")


@pytest.mark.parametrize("runtime", ["pool", "gomp"])
def test_every_iteration_runs_once_however_the_loop_is_cut(rng, monkeypatch, runtime):
    # C[i, j] += A[i, j]: an iteration run twice or never shows; more threads than iterations,
    # than homes (parallel.MAX_HOMES) and homes of unequal length
    monkeypatch.setenv("AUTOSCHED_PARALLEL", runtime)
    for m, threads in ((1, 2), (3, 4), (17, 2), (17, 3), (100, 20), (301, 7)):
        A, C = buf("A", (m, 5)), buf("C", (m, 5))
        i, j = E.Var("i"), E.Var("j")
        add = ir.Store(C, (i, j), ir.Load(C, (i, j)) + ir.Load(A, (i, j)))
        mod = build(loop(i, m, loop(j, 5, add), "parallel"), [A, C], name=f"acc_{runtime}")
        assert threadpool.calls(mod.get_llvm_ir()) == (runtime == "pool")
        mod.num_threads = threads
        a, c = rand(rng, (m, 5), "float32"), rand(rng, (m, 5), "float32")
        out = c.copy()
        for _ in range(3):
            mod(a, out)
        np.testing.assert_allclose(out, c + a + a + a, rtol=1e-5, err_msg=f"{m} x {threads}")


def test_nested_parallel_runs_serially_inside(rng):
    m, n = 6, 50
    A, C = buf("A", (m, n)), buf("C", (m, n))
    i, j = E.Var("i"), E.Var("j")
    body = loop(i, m, loop(j, n, ir.Store(C, (i, j), ir.Load(A, (i, j)) + 1.0), "parallel"),
                "parallel")
    mod = build(body, [A, C])
    mod.num_threads = 2
    assert mod.get_llvm_ir(optimized=False).count("call void @\"autosched_parallel\"") == 1
    a = rand(rng, (m, n), "float32")
    out = garbage((m, n), "float32")
    before = mod.threads_ran
    mod(a, out)
    assert 1 <= mod.threads_ran - before <= 2
    np.testing.assert_allclose(out, a + 1, rtol=1e-6)


def test_parallel_loop_with_local_buffer_and_outer_variables(rng):
    """Allocations inside a parallel body are per thread; outer loop variables are captured."""
    b_, m, n = 3, 8, 40
    A, C = buf("A", (b_, m, n)), buf("C", (b_, m))
    L = buf("L", (n,), scope="local")
    t, i, j, k = E.Var("t"), E.Var("i"), E.Var("j"), E.Var("k")
    inner = ir.Allocate(L, ir.seq(
        loop(j, n, ir.Store(L, (j,), ir.Load(A, (t, i, j)) * ir.Load(A, (t, i, j))), "vectorized"),
        ir.Store(C, (t, i), E.const(0.0)),
        loop(k, n, ir.Store(C, (t, i), ir.Load(C, (t, i)) + ir.Load(L, (k,))))))
    mod = build(loop(t, b_, loop(i, m, inner, "parallel")), [A, C])
    mod.num_threads = 2
    a = rand(rng, (b_, m, n), "float32")
    out = garbage((b_, m), "float32")
    mod(a, out)
    np.testing.assert_allclose(out, (a * a).sum(-1), rtol=1e-5)


def _add_kernel():
    A, B, C = buf("A", (4, 6)), buf("B", (4, 6), "int32"), buf("C", (4, 6))
    i, j = E.Var("i"), E.Var("j")
    value = ir.Load(A, (i, j)) + E.cast("float32", ir.Load(B, (i, j)))
    return build(loop(i, 4, loop(j, 6, ir.Store(C, (i, j), value))), [A, B, C], name="addk")


@pytest.mark.parametrize("bad,match", [
    (lambda a, b, c: (a, b), "takes 3 arguments"),
    (lambda a, b, c: (a.astype("float64"), b, c), "parameter A expects dtype float32"),
    (lambda a, b, c: (a, b, c[:, :5]), "parameter C expects shape"),
    (lambda a, b, c: (a, b.reshape(24), c), "parameter B expects shape .*rank 1, not 2"),
    (lambda a, b, c: (a, b, np.asfortranarray(c)), "parameter C expects a C-contiguous array"),
    (lambda a, b, c: (a.tolist(), b, c), "parameter A expects a numpy array"),
    (lambda a, b, c: (a, b, a), "parameters C and A share memory"),
])
def test_argument_checks_name_the_parameter(bad, match, rng):
    mod = _add_kernel()
    a, b = rand(rng, (4, 6), "float32"), rand(rng, (4, 6), "int32")
    c = garbage((4, 6), "float32")
    with pytest.raises(RuntimeError_, match=match):
        mod(*bad(a, b, c))


def test_read_only_output_is_rejected(rng):
    mod = _add_kernel()
    a, b = rand(rng, (4, 6), "float32"), rand(rng, (4, 6), "int32")
    c = garbage((4, 6), "float32")
    c.flags.writeable = False
    with pytest.raises(RuntimeError_, match="parameter C expects a writable array"):
        mod(a, b, c)


def test_misaligned_arrays_are_copied_and_written_back(rng):
    mod = _add_kernel()
    raw_a = np.empty(25, "float32")[1:]  # 4 bytes past a 16-byte boundary
    raw_c = np.empty(25, "float32")[1:]
    a = raw_a.reshape(4, 6)
    a[:] = rand(rng, (4, 6), "float32")
    c = raw_c.reshape(4, 6)
    assert a.ctypes.data % 16 and c.ctypes.data % 16
    b = rand(rng, (4, 6), "int32")
    mod(a, b, c)
    np.testing.assert_allclose(c, a + b, rtol=1e-6)


def test_bound_call_sees_new_contents_and_thread_count(rng):
    mod = _par_kernel()
    a = rand(rng, (37, 29), "float32")
    out = garbage((37, 29), "float32")
    call = mod.bind(a, out)
    call()
    np.testing.assert_allclose(out, a * 2 + np.arange(37)[:, None], rtol=1e-6)
    a[:] = rand(rng, (37, 29), "float32")  # same arrays, new contents
    mod.num_threads = 2
    before = mod.threads_ran
    call()
    np.testing.assert_allclose(out, a * 2 + np.arange(37)[:, None], rtol=1e-6)
    assert 1 <= mod.threads_ran - before <= 2
    assert most_threads_ran(mod, call, 2) == 2
    with pytest.raises(RuntimeError_, match="takes 2 arguments"):
        mod.bind(a)  # checked once, at bind time


def test_bound_call_with_misaligned_arrays_copies_each_time(rng):
    mod = _add_kernel()
    a = np.empty(25, "float32")[1:].reshape(4, 6)
    c = np.empty(25, "float32")[1:].reshape(4, 6)
    b = rand(rng, (4, 6), "int32")
    call = mod.bind(a, b, c)
    for _ in range(2):
        a[:] = rand(rng, (4, 6), "float32")
        call()
        np.testing.assert_allclose(c, a + b, rtol=1e-6)


def test_symbolic_size_mismatch_between_params(rng):
    n = E.Var("n")
    A, C = buf("A", (n,)), buf("C", (n,))
    i = E.Var("i")
    mod = build(loop(i, n, ir.Store(C, (i,), ir.Load(A, (i,)))), [A, C])
    with pytest.raises(RuntimeError_, match=r"parameter C .*dimension 0 should be n = 5 \(from parameter A\)"):
        mod(rand(rng, (5,), "float32"), garbage((4,), "float32"))


def test_time_returns_positive_statistics(rng):
    mod = _add_kernel()
    a, b = rand(rng, (4, 6), "float32"), rand(rng, (4, 6), "int32")
    c = garbage((4, 6), "float32")
    res = mod.time(a, b, c, number=5, repeat=4, min_repeat_ms=2)
    assert len(res.samples) == 4 and all(t > 0 for t in res.samples)
    assert res.min <= res.median <= max(res.samples) and res.mean > 0
    np.testing.assert_allclose(c, a + b, rtol=1e-6)


def test_printing_llvm_ir_and_assembly():
    mod = _add_kernel()
    assert "define i32 @\"addk\"" in mod.get_llvm_ir(optimized=False)
    assert "noalias" in mod.get_llvm_ir(optimized=False)
    asm = mod.get_assembly()
    assert "addk:" in asm and ".text" in asm


def test_export_library_and_call_through_ctypes(tmp_path, rng):
    mod = _par_kernel(9, 17, inner="vectorized")
    path = mod.export_library(tmp_path / "k.so")
    lib = ctypes.CDLL(str(path))
    a = rand(rng, (9, 17), "float32")
    out = garbage((9, 17), "float32")
    ptr = ctypes.c_void_p
    lib.k.argtypes = [ptr, ptr]
    lib.k(a.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out, a * 2 + np.arange(9)[:, None], rtol=1e-6)
    obj = mod.save_object(tmp_path / "k.o")
    assert open(obj, "rb").read(4) == b"\x7fELF"


def test_compile_cache_reuses_identical_modules():
    llvm_compile._cache.clear()
    _add_kernel()
    _add_kernel()  # fresh uids, same IR text: one compilation
    assert len(llvm_compile._cache) == 1


def test_host_module_pickles_and_runs_after_loading(rng):
    import pickle

    mod = _par_kernel(7, 9)
    again = pickle.loads(pickle.dumps(mod))
    a = rand(rng, (7, 9), "float32")
    out = garbage((7, 9), "float32")
    again(a, out)
    np.testing.assert_allclose(out, a * 2 + np.arange(7)[:, None], rtol=1e-6)
    assert pickle.loads(pickle.dumps(mod.portable())).get_llvm_ir() == mod.get_llvm_ir()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one")
def test_a_pinned_process_defaults_to_its_own_cores() -> None:
    """Under ``taskset`` or a container's cpuset, the host target's threads and the build
    workers were the machine's whole core count: parallel loops oversubscribed the cores the
    process may use."""
    from autosched.search.protocol import MeasureOptions

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[:1])
    try:
        assert parse("llvm").num_cores == 1
        assert parse("llvm -num-cores=3").num_cores == 3  # said out loud: kept
        assert MeasureOptions().build_workers == 1
    finally:
        os.sched_setaffinity(0, cores)
    assert parse("llvm").num_cores == len(cores)
