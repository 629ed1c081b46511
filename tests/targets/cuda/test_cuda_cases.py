"""GPU schedules that CI checks without a GPU: each case's CUDA C compiles with NVRTC and the
lowered, thread-bound loop IR (the very function codegen renders, default schedule applied)
computes the numpy answer in the reference evaluator, which runs threads with CUDA semantics.
tests/targets/cuda/test_cuda_gpu.py runs the same cases on a GPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.targets.target import parse
from tests.support.backends import random_array, tolerance
from tests.support.nvrtc import needs_nvrtc

TARGET = "cuda -arch=sm_90"


@dataclass(frozen=True)
class Case:
    """A schedule (``make`` returns (schedule, args); the last arg is the output) and its numpy
    reference on the input arrays."""

    name: str
    make: Callable[[], tuple]
    ref: Callable[..., np.ndarray]
    dtype: str = "float32"
    source_has: tuple[str, ...] = ()
    rtol: float | None = None


def _ew_unbound(shape: tuple[int, ...], dtype: str = "float32"):
    def make():
        A = te.placeholder(shape, dtype=dtype, name="A")
        B = te.placeholder(shape, dtype=dtype, name="B")
        C = te.compute(shape, lambda *i: te.exp(A[i]) * B[i] + 1.0, name="C")
        return te.create_schedule(C.op), [A, B, C]

    return make


def _ew_bound():
    n = 1000  # not a multiple of the 64 threads: the tail block is guarded

    def make():
        A = te.placeholder((n,), name="A")
        C = te.compute((n,), lambda i: te.sigmoid(A[i]) + te.tanh(A[i]) * te.erf(A[i]), name="C")
        s = te.create_schedule(C.op)
        bx, tx = s[C].split(C.op.axis[0], factor=64)
        s[C].bind(bx, te.thread_axis("blockIdx.x"))
        s[C].bind(tx, te.thread_axis("threadIdx.x"))
        return s, [A, C]

    return make


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf)(x.astype(np.float64))


def _vector4():
    def make():
        A = te.placeholder((64, 48), name="A")
        B = te.placeholder((64, 48), name="B")
        C = te.compute((64, 48), lambda i, j: A[i, j] * 2.0 + B[i, j], name="C")
        s = te.create_schedule(C.op)
        i, j = C.op.axis
        jo, jv = s[C].split(j, factor=4)
        s[C].bind(i, te.thread_axis("blockIdx.x"))
        s[C].bind(jo, te.thread_axis("threadIdx.x"))
        s[C].vectorize(jv)
        return s, [A, B, C]

    return make


def _row_sum(bound: bool):
    m, n = 67, 129

    def make():
        A = te.placeholder((m, n), name="A")
        k = te.reduce_axis((0, n), name="k")
        C = te.compute((m,), lambda i: te.sum(A[i, k], axis=k), name="C")
        s = te.create_schedule(C.op)
        if bound:
            bx, tx = s[C].split(C.op.axis[0], factor=32)
            s[C].bind(bx, te.thread_axis("blockIdx.x"))
            s[C].bind(tx, te.thread_axis("threadIdx.x"))
        return s, [A, C]

    return make


def _int_div():
    def make():
        A = te.placeholder((50,), dtype="int32", name="A")
        B = te.placeholder((50,), dtype="int32", name="B")
        C = te.compute((50,), lambda i: te.floordiv(A[i], B[i]) * 100 + te.floormod(A[i], B[i]),
                       name="C")
        return te.create_schedule(C.op), [A, B, C]

    return make


def _two_stages():
    def make():
        A = te.placeholder((33, 17), name="A")
        B = te.compute((33, 17), lambda i, j: A[i, j] * 3.0, name="B")
        C = te.compute((17, 33), lambda j, i: B[i, j] + A[i, j], name="C")
        return te.create_schedule(C.op), [A, C]

    return make


def _symbolic():
    def make():
        n = te.var("n")
        A = te.placeholder((n, 5), name="A")
        C = te.compute((n, 5), lambda i, j: A[i, j] - 0.5, name="C")
        return te.create_schedule(C.op), [A, C]

    return make


def tiled_matmul(M: int, N: int, K: int, tile: int = 16, bk: int = 8):
    """A shared-memory tiled matmul: cache_read "shared" + compute_at + bind, register
    accumulators from cache_write "local"."""

    def make():
        A = te.placeholder((M, K), name="A")
        B = te.placeholder((K, N), name="B")
        k = te.reduce_axis((0, K), name="k")
        C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        s = te.create_schedule(C.op)
        CL = s.cache_write(C, "local")
        AS = s.cache_read(A, "shared", [CL])
        BS = s.cache_read(B, "shared", [CL])
        i, j = s[C].op.axis
        bi, ti = s[C].split(i, factor=tile)
        bj, tj = s[C].split(j, factor=tile)
        tio, tii = s[C].split(ti, factor=2)
        s[C].reorder(bi, bj, tio, tj, tii)
        s[C].bind(bi, te.thread_axis("blockIdx.y"))
        s[C].bind(bj, te.thread_axis("blockIdx.x"))
        s[C].bind(tio, te.thread_axis("threadIdx.y"))
        s[C].bind(tj, te.thread_axis("threadIdx.x"))
        s[CL].compute_at(s[C], tj)
        ci, cj = s[CL].op.axis
        ko, ki = s[CL].split(s[CL].op.reduce_axis[0], factor=bk)
        s[CL].reorder(ko, ki, ci, cj)
        s[AS].compute_at(s[CL], ko)
        s[BS].compute_at(s[CL], ko)
        for X in (AS, BS):
            f = s[X].fuse(*s[X].op.axis)
            _, fi = s[X].split(f, factor=tile)
            s[X].bind(fi, te.thread_axis("threadIdx.x"))
        return s, [A, B, C]

    return make


def sgemm(M: int, N: int, K: int, tile: int = 32, reg: int = 4, bk: int = 8):
    from autosched.testing.gpu_sgemm_schedule import sgemm_schedule

    return lambda: sgemm_schedule(M, N, K, tile=tile, reg=reg, bk=bk)


CASES = [
    Case("ew_unbound_2d", _ew_unbound((37, 1, 29)), lambda a, b: np.exp(a) * b + 1.0,
         source_has=("__launch_bounds__(256)", "expf(")),
    Case("ew_unbound_half", _ew_unbound((70, 3), "float16"),
         lambda a, b: (np.exp(a.astype(np.float32)).astype(np.float16) * b + np.float16(1)),
         dtype="float16", source_has=("cuda_fp16.h", "__half2float")),
    Case("ew_unbound_f64", _ew_unbound((9, 13), "float64"), lambda a, b: np.exp(a) * b + 1.0,
         dtype="float64", source_has=("exp(",)),
    Case("ew_bound_guarded", _ew_bound(),
         lambda a: _sigmoid(a) + np.tanh(a) * _erf(a),
         source_has=("blockIdx.x", "tanhf(", "erff(", "as_sigmoidf(")),
    Case("vector4", _vector4(), lambda a, b: a * 2.0 + b, source_has=("float4",)),
    Case("row_sum_bound", _row_sum(True), lambda a: a.sum(axis=1)),
    Case("row_sum_default", _row_sum(False), lambda a: a.sum(axis=1)),
    Case("int_floordiv", _int_div(), lambda a, b: (a // b) * 100 + (a % b), dtype="int32",
         source_has=("as_floordiv(", "as_floormod(")),
    Case("two_stages", _two_stages(), lambda a: (a * 3.0 + a).T, source_has=("_kernel1",)),
    Case("symbolic", _symbolic(), lambda a: a - 0.5),
    Case("tiled_matmul", tiled_matmul(37, 45, 29), lambda a, b: a @ b,
         source_has=("__shared__", "__syncthreads();")),
    Case("sgemm_small", sgemm(64, 96, 40), lambda a, b: a @ b,
         source_has=("float4", "__shared__", "#pragma unroll")),
    # 64 KB of shared tiles: more than a kernel may declare statically
    Case("sgemm_dynamic_shared", sgemm(64, 64, 128, tile=64, reg=4, bk=128), lambda a, b: a @ b,
         source_has=("extern __shared__ __align__(128) unsigned char as_dyn_smem[];",
                     "reinterpret_cast<float*>(as_dyn_smem + 32768);")),
]


def make_inputs(case: Case, args: list, rng: np.random.Generator,
                sizes: dict[str, int] | None = None) -> list[np.ndarray]:
    from autosched.te.expr import Var

    out = []
    for t in args[:-1]:
        shape = tuple(sizes[d.name] if isinstance(d, Var) else int(d.value) for d in t.op.shape)
        a = random_array(rng, shape, t.dtype)
        if case.name == "int_floordiv" and t.name == "B":
            a = np.where(a == 0, 3, a).astype(t.dtype)  # no division by zero
        out.append(a)
    return out


def output_for(args: list, inputs: list[np.ndarray]) -> np.ndarray:
    from autosched.te.expr import Var

    t = args[-1]
    if any(isinstance(d, Var) for d in t.op.shape):
        shape = inputs[0].shape
    else:
        shape = tuple(int(d.value) for d in t.op.shape)
    out = np.empty(shape, dtype=t.dtype)
    out.fill(np.nan if t.dtype.startswith("float") else 77)  # unwritten elements show
    return out


def check_close(case: Case, got: np.ndarray, inputs: list[np.ndarray]) -> None:
    want = case.ref(*inputs)
    tol = tolerance(case.dtype)
    if case.rtol is not None:
        tol = dict(rtol=case.rtol, atol=case.rtol)
    assert not np.isnan(got.astype(np.float64)).any(), f"{case.name}: unwritten output elements"
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want).astype(np.float64),
                               err_msg=case.name, **tol)


SIZES = {"n": 23}


@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_compiles_and_evaluates(case: Case, rng: np.random.Generator) -> None:
    from autosched.targets.cuda import build_module
    from autosched.targets.ref.evaluate import evaluate

    s, args = case.make()
    func = aus.lower(s, args)
    mod = build_module(func, parse(TARGET))
    src = mod.get_source()
    assert 'extern "C" __global__' in src and "__restrict__" in src
    for text in case.source_has:
        assert text in src, f"{case.name}: {text!r} missing from\n{src}"
    assert mod.cubin and mod.binary.kind == "cubin"
    inputs = make_inputs(case, args, rng, SIZES)
    out = output_for(args, inputs)
    evaluate(mod.func, *inputs, out)  # the bound function codegen rendered
    check_close(case, out, inputs)
