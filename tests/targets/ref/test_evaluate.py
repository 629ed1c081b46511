"""The reference evaluator on hand-built loop IR: CPU loop nests and GPU kernels vs numpy."""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
import pytest

from autosched.driver import build_func
from autosched.errors import CompileError, RuntimeError_
from autosched.targets.ref.evaluate import compile_func, evaluate
from autosched.targets.ref.pyrender import kernels
from autosched.targets.target import parse
from autosched.te import intrin
from autosched.te.expr import Call, Cast, Var, as_expr, cast, const, select
from autosched.tir import ir

F32 = "float32"


def c(v: int | float) -> ir.Expr:
    return const(v)


def buf(name: str, shape: tuple, dtype: str = F32, scope: str = "global") -> ir.Buffer:
    return ir.Buffer(name, tuple(as_expr(d) for d in shape), dtype, scope)


def loop(v: Var, extent: object, body: ir.Stmt, kind: str = "serial", lo: object = 0) -> ir.For:
    return ir.For(v, as_expr(lo), as_expr(extent), kind, body)


def thread(v: Var, extent: object, tag: str, body: ir.Stmt) -> ir.For:
    return ir.For(v, c(0), as_expr(extent), "thread", body, thread_tag=tag)


def ld(b: ir.Buffer, *idx: object) -> ir.Load:
    return ir.Load(b, tuple(as_expr(i) for i in idx))


def st(b: ir.Buffer, idx: tuple, value: object) -> ir.Store:
    return ir.Store(b, tuple(as_expr(i) for i in idx), as_expr(value, like=b.dtype))


def rand(rng: np.random.Generator, shape: tuple, dtype: str = F32) -> np.ndarray:
    return (rng.standard_normal(shape) + 0.5).astype(dtype)


# ---------------------------------------------------------------------------------------------
# CPU loop nests


@pytest.mark.parametrize("shape", [(7, 1), (13, 5), (1, 1)])
def test_elementwise_2d(rng: np.random.Generator, shape: tuple) -> None:
    A, B, C = buf("A", shape), buf("B", shape), buf("C", shape)
    i, j = Var("i"), Var("j")
    body = loop(i, shape[0], loop(j, shape[1], st(C, (i, j), ld(A, i, j) * ld(B, i, j) + 1.5),
                                  "vectorized"), "parallel")
    a, b = rand(rng, shape), rand(rng, shape)
    out = np.full(shape, np.nan, F32)
    evaluate(ir.PrimFunc("ew", (A, B, C), body), a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) * b + 1.5, rtol=1e-6, atol=1e-6)


def test_reduction_with_init(rng: np.random.Generator) -> None:
    M, K, N = 11, 17, 6
    A, B, C = buf("A", (M, K)), buf("B", (K, N)), buf("C", (M, N))
    i, j, k = Var("i"), Var("j"), Var("k")
    body = loop(i, M, loop(j, N, ir.seq(
        st(C, (i, j), 0.0),
        loop(k, K, st(C, (i, j), ld(C, i, j) + ld(A, i, k) * ld(B, k, j)), "unrolled"),
    )))
    a, b = rand(rng, (M, K)), rand(rng, (K, N))
    out = rand(rng, (M, N))
    evaluate(ir.PrimFunc("mm", (A, B, C), body), a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_max_reduction_from_minus_inf(rng: np.random.Generator) -> None:
    A, R = buf("A", (5, 9)), buf("R", (5,))
    i, k = Var("i"), Var("k")
    body = loop(i, 5, ir.seq(st(R, (i,), -math.inf),
                             loop(k, 9, st(R, (i,), intrin.max(ld(R, i), ld(A, i, k))))))
    a = rand(rng, (5, 9))
    out = np.zeros(5, F32)
    evaluate(ir.PrimFunc("rmax", (A, R), body), a, out)
    np.testing.assert_array_equal(out, a.max(axis=1))


def _pad_conv(guarded: bool) -> tuple[ir.PrimFunc, int, int]:
    """out[i] = sum_k pad(A)[i + k] * W[k] with one element of zero padding on each side."""
    n, kw = 10, 3
    A, W, Out = buf("A", (n,)), buf("W", (kw,)), buf("Out", (n,))
    i, k = Var("i"), Var("k")
    pos = i + k - 1
    read = select((pos >= 0) & (pos < n), ld(A, pos), 0.0) if guarded else ld(A, pos)
    body = loop(i, n, ir.seq(st(Out, (i,), 0.0),
                             loop(k, kw, st(Out, (i,), ld(Out, i) + read * ld(W, k)))))
    return ir.PrimFunc("conv1d", (A, W, Out), body), n, kw


def test_select_guards_padding_read_out_of_bounds(rng: np.random.Generator) -> None:
    func, n, kw = _pad_conv(guarded=True)
    a, w = rand(rng, (n,)), rand(rng, (kw,))
    out = np.zeros(n, F32)
    evaluate(func, a, w, out)
    padded = np.concatenate([[0], a, [0]]).astype(np.float64)
    want = np.array([padded[i:i + kw] @ w for i in range(n)])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    # The same read without the select goes out of bounds and must say where.
    func, n, kw = _pad_conv(guarded=False)
    with pytest.raises(RuntimeError_, match=r"load out of bounds: A\[-1\] with shape \(10,\)"):
        evaluate(func, a, w, out)


def test_nested_allocate_and_let(rng: np.random.Generator) -> None:
    # out[i] = sum_j (a[i, j] * 2) ** 2 through a row buffer and a scalar temporary.
    M, N = 6, 7
    A, Out = buf("A", (M, N)), buf("Out", (M,))
    row, acc = buf("row", (N,), scope="local"), buf("acc", (), scope="local")
    i, j, x = Var("i"), Var("j"), Var("x", F32)
    body = loop(i, M, ir.Allocate(row, ir.seq(
        loop(j, N, st(row, (j,), ld(A, i, j) * 2.0)),
        ir.Allocate(acc, ir.seq(
            st(acc, (), 0.0),
            loop(j, N, ir.LetStmt(x, ld(row, j), st(acc, (), ld(acc) + x * x))),
            st(Out, (i,), ld(acc)),
        )),
    )))
    a = rand(rng, (M, N))
    out = np.zeros(M, F32)
    evaluate(ir.PrimFunc("nested", (A, Out), body), a, out)
    np.testing.assert_allclose(out, ((2 * a.astype(np.float64)) ** 2).sum(axis=1), rtol=1e-5)


def test_unwritten_allocation_is_visible() -> None:
    Out, Iout = buf("Out", (3,)), buf("Iout", (3,), "int32")
    t, u = buf("t", (3,), scope="local"), buf("u", (3,), "int32", scope="local")
    i = Var("i")
    body = ir.Allocate(t, ir.Allocate(u, ir.seq(
        st(t, (0,), 1.0), st(u, (0,), 1),
        loop(i, 3, ir.seq(st(Out, (i,), ld(t, i)), st(Iout, (i,), ld(u, i)))),
    )))
    out, iout = np.zeros(3, F32), np.zeros(3, np.int32)
    evaluate(ir.PrimFunc("garbage", (Out, Iout), body), out, iout)
    assert out[0] == 1 and np.isnan(out[1:]).all()
    assert iout[0] == 1 and (iout[1:] == np.int32(-1515870811)).all()  # bytes 0xA5


def _unary_func(name: str, dtype: str, fn) -> ir.PrimFunc:  # noqa: ANN001
    n = 64
    A, B = buf("A", (n,), dtype), buf("B", (n,), dtype)
    i = Var("i")
    return ir.PrimFunc(name, (A, B), loop(i, n, st(B, (i,), fn(ld(A, i)))))


_NP_UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh, "erf": np.vectorize(math.erf), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "abs": np.abs, "sin": np.sin,
    "cos": np.cos, "log2": np.log2, "exp2": np.exp2, "log1p": np.log1p, "expm1": np.expm1,
}
_POSITIVE = ("log", "sqrt", "rsqrt", "log2", "log1p")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(_NP_UNARY))
def test_intrinsic_matches_numpy(rng: np.random.Generator, name: str, dtype: str) -> None:
    x = rng.uniform(-4, 4, 64)
    if name in _POSITIVE:
        x = np.abs(x) + 0.05
    if name in ("round", "floor", "ceil"):
        x[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0, -3.0]  # ties round half to even
    a = x.astype(dtype)
    out = np.zeros(64, dtype)
    evaluate(_unary_func(name, dtype, getattr(intrin, name)), a, out)
    want = _NP_UNARY[name](a.astype(np.float64)).astype(dtype)
    tol = 2e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def test_intrinsics_give_ieee_answers_where_python_raises() -> None:
    cases = {
        "log": ([0.0, -1.0], [-np.inf, np.nan]), "sqrt": ([-1.0], [np.nan]),
        "exp": ([1000.0, -np.inf], [np.inf, 0.0]), "rsqrt": ([0.0], [np.inf]),
        "sin": ([np.inf], [np.nan]), "floor": ([np.inf, np.nan], [np.inf, np.nan]),
        "round": ([-np.inf], [-np.inf]), "exp2": ([2000.0], [np.inf]),
        "log1p": ([-1.0], [-np.inf]), "sigmoid": ([-1000.0, 1000.0], [0.0, 1.0]),
    }
    for name, (xs, want) in cases.items():
        n = len(xs)
        A, B = buf("A", (n,), "float64"), buf("B", (n,), "float64")
        i = Var("i")
        f = ir.PrimFunc(name, (A, B), loop(i, n, st(B, (i,), getattr(intrin, name)(ld(A, i)))))
        out = np.zeros(n)
        evaluate(f, np.array(xs), out)
        np.testing.assert_array_equal(out, np.array(want), err_msg=name)


def _binary_func(op, dtype: str, n: int) -> ir.PrimFunc:  # noqa: ANN001
    A, B, C = buf("A", (n,), dtype), buf("B", (n,), dtype), buf("C", (n,), dtype)
    i = Var("i")
    return ir.PrimFunc("bin", (A, B, C), loop(i, n, st(C, (i,), op(ld(A, i), ld(B, i)))))


def test_integer_division_semantics(rng: np.random.Generator) -> None:
    a = rng.integers(-50, 50, 40).astype(np.int32)
    b = rng.integers(1, 9, 40).astype(np.int32) * rng.choice([-1, 1], 40).astype(np.int32)
    out = np.zeros(40, np.int32)
    for op, want in [
        (intrin.floordiv, a // b), (intrin.floormod, a % b),
        (intrin.truncdiv, np.trunc(a / b).astype(np.int32)), (intrin.truncmod, np.fmod(a, b)),
        (intrin.min, np.minimum(a, b)), (intrin.max, np.maximum(a, b)),
    ]:
        evaluate(_binary_func(op, "int32", 40), a, b, out)
        np.testing.assert_array_equal(out, want, err_msg=op.__name__)


def test_integer_division_by_zero_raises() -> None:
    f = _binary_func(intrin.floordiv, "int32", 2)
    with pytest.raises(RuntimeError_, match="bin: integer division by zero"):
        evaluate(f, np.array([3, 4], np.int32), np.array([1, 0], np.int32), np.zeros(2, np.int32))


def test_float_division_min_max_pow(rng: np.random.Generator) -> None:
    a = np.array([1.0, -1.0, 0.0, np.nan, 2.0, 3.0], F32)
    b = np.array([0.0, 0.0, 0.0, 1.0, np.nan, 0.5], F32)
    out = np.zeros(6, F32)
    with np.errstate(all="ignore"):
        for op, want in [
            (lambda x, y: x / y, a / b), (intrin.min, np.minimum(a, b)),
            (intrin.max, np.maximum(a, b)), (intrin.floordiv, np.floor(a / b)),
        ]:
            evaluate(_binary_func(op, F32, 6), a, b, out)
            np.testing.assert_array_equal(out, want)
        evaluate(_binary_func(intrin.pow, F32, 6), a, b, out)
        np.testing.assert_allclose(out, np.power(a, b), rtol=2e-7)
    x, y = np.abs(rand(rng, (30,))), rand(rng, (30,))
    evaluate(_binary_func(intrin.pow, F32, 30), x, y, out := np.zeros(30, F32))
    np.testing.assert_allclose(out, x.astype(np.float64) ** y, rtol=1e-6)


def test_casts_and_integer_wrapping(rng: np.random.Generator) -> None:
    n = 9
    X = buf("X", (n,), "float64")
    I32, I8, U8 = buf("I32", (n,), "int32"), buf("I8", (n,), "int8"), buf("U8", (n,), "uint8")
    F16, F32b, BL = buf("F16", (n,), "float16"), buf("F32", (n,), F32), buf("BL", (n,), "bool")
    i = Var("i")
    xi = cast("int32", ld(X, i))  # truncates toward zero
    body = loop(i, n, ir.seq(
        st(I32, (i,), xi),
        st(I8, (i,), cast("int8", xi * 37)),  # wraps
        st(U8, (i,), cast("uint8", xi) - cast("uint8", 200)),  # uint8 arithmetic wraps
        st(F16, (i,), cast("float16", ld(X, i))),
        st(F32b, (i,), Cast(F32, ld(X, i))),
        st(BL, (i,), cast("bool", xi)),
    ))
    x = np.concatenate([[-2.7, 2.7, -0.5, 0.0, 1e-3], rng.uniform(-300, 300, 4)])
    outs = [np.zeros(n, d) for d in ("int32", "int8", "uint8", "float16", F32, "bool")]
    evaluate(ir.PrimFunc("casts", (X, I32, I8, U8, F16, F32b, BL), body), x, *outs)
    ti = np.trunc(x).astype(np.int64)
    np.testing.assert_array_equal(outs[0], ti)
    np.testing.assert_array_equal(outs[1], (ti * 37).astype(np.int8))
    np.testing.assert_array_equal(outs[2], (ti.astype(np.uint8) - np.uint8(200)).astype(np.uint8))
    np.testing.assert_array_equal(outs[3], x.astype(np.float16))
    np.testing.assert_array_equal(outs[4], x.astype(F32))
    np.testing.assert_array_equal(outs[5], ti != 0)


def test_store_wraps_to_destination_dtype() -> None:
    A, B = buf("A", (3,), "int32"), buf("B", (3,), "int16")
    i = Var("i")
    f = ir.PrimFunc("wrap", (A, B), loop(i, 3, st(B, (i,), cast("int16", ld(A, i) * 1000))))
    a = np.array([40, -40, 70000], np.int32)
    out = np.zeros(3, np.int16)
    evaluate(f, a, out)
    np.testing.assert_array_equal(out, (a.astype(np.int64) * 1000).astype(np.int16))
    # int32 intermediates are exact; the store wraps them (70000 * 70000 overflows int32).
    C = buf("C", (3,), "int32")
    g = ir.PrimFunc("wrap32", (A, C), loop(i, 3, st(C, (i,), ld(A, i) * ld(A, i))))
    out32 = np.zeros(3, np.int32)
    evaluate(g, a, out32)
    np.testing.assert_array_equal(out32, (a.astype(np.int64) ** 2).astype(np.int32))


def test_float16_rounds_like_numpy(rng: np.random.Generator) -> None:
    n = 200
    A, B = buf("A", (n,), "float16"), buf("B", (n,), "float16")
    i = Var("i")
    # The sum of two halves, computed wider and stored to half: exact rounding of a + b.
    f = ir.PrimFunc("h", (A, B), loop(i, n, st(B, (i,), ld(A, i) * const(3.0, "float16"))))
    a = (rng.standard_normal(n) * 1e4).astype(np.float16)  # some products overflow to inf
    out = np.zeros(n, np.float16)
    evaluate(f, a, out)
    with np.errstate(over="ignore"):
        want = (a.astype(np.float64) * 3).astype(np.float16)
    np.testing.assert_array_equal(out, want)


def test_bool_logic_and_compare(rng: np.random.Generator) -> None:
    n = 20
    A, Out = buf("A", (n,)), buf("Out", (n,), "bool")
    i = Var("i")
    x = ld(A, i)
    cond = ((x > 0.5) & ~(x > 1.0)) | (x == const(0.25))
    f = ir.PrimFunc("logic", (A, Out), loop(i, n, st(Out, (i,), cond)))
    a = rand(rng, (n,))
    a[0] = 0.25
    out = np.zeros(n, bool)
    evaluate(f, a, out)
    np.testing.assert_array_equal(out, ((a > 0.5) & ~(a > 1.0)) | (a == 0.25))


def test_symbolic_shapes_bind_from_arrays(rng: np.random.Generator) -> None:
    n = Var("n")
    A, B = buf("A", (n, 3)), buf("B", (n, 3))
    i, j = Var("i"), Var("j")
    f = ir.PrimFunc("sym", (A, B), loop(i, n, loop(j, 3, st(B, (i, j), ld(A, i, j) - 1.0))))
    for rows in (1, 8):
        a = rand(rng, (rows, 3))
        out = np.zeros((rows, 3), F32)
        evaluate(f, a, out)
        np.testing.assert_allclose(out, a - 1, rtol=1e-6)
    with pytest.raises(RuntimeError_, match=r"parameter B .*given \(5, 3\): dimension 0 should be n = 4 \(from parameter A\)"):
        evaluate(f, np.ones((4, 3), F32), np.ones((5, 3), F32))


def test_argument_errors_name_parameter_and_shapes() -> None:
    A, B = buf("A", (4, 5)), buf("B", (4,), "int32")
    i = Var("i")
    f = ir.PrimFunc("args", (A, B), loop(i, 4, st(B, (i,), cast("int32", ld(A, i, 0)))))
    a, b = np.ones((4, 5), F32), np.ones(4, np.int32)
    with pytest.raises(RuntimeError_, match=r"args takes 2 arguments \(A, B\), given 1"):
        evaluate(f, a)
    with pytest.raises(RuntimeError_, match=r"parameter A expects shape \(4, 5\), given \(5, 4\)"):
        evaluate(f, np.ones((5, 4), F32), b)
    with pytest.raises(RuntimeError_, match=r"parameter A expects dtype float32, given dtype float64"):
        evaluate(f, np.ones((4, 5)), b)
    with pytest.raises(RuntimeError_, match=r"parameter B expects shape \(4,\), given \(4, 1\)"):
        evaluate(f, a, np.ones((4, 1), np.int32))
    with pytest.raises(RuntimeError_, match=r"parameter B expects a writable array .* read-only"):
        b.flags.writeable = False
        evaluate(f, a, b)


def test_out_of_bounds_store_names_buffer_and_index(rng: np.random.Generator) -> None:
    A, B = buf("A", (4, 3)), buf("B", (4, 3))
    i, j = Var("i"), Var("j")
    # j runs to 3, one past B's last column: flattened, B[0, 3] would alias B[1, 0].
    f = ir.PrimFunc("oob", (A, B), loop(i, 4, loop(j, 4, st(B, (i, j), ld(A, i, 0)))))
    out = np.zeros((4, 3), F32)
    with pytest.raises(RuntimeError_, match=r"store out of bounds: B\[0, 3\] with shape \(4, 3\)"):
        evaluate(f, rand(rng, (4, 3)), out)
    # A split loop whose tail is not guarded: index io * 3 + ii reaches 11 on a 10-element buffer.
    io, ii = Var("io"), Var("ii")
    C = buf("C", (10,))
    g = ir.PrimFunc("tail", (C,), loop(io, 4, loop(ii, 3, st(C, (io * 3 + ii,), 1.0))))
    with pytest.raises(RuntimeError_, match=r"store out of bounds: C\[10\] with shape \(10,\)"):
        evaluate(g, np.zeros(10, F32))
    # Without bounds checks the same function may run (it is the user's risk) but never lies
    # about the checked build.
    assert "_oob" not in compile_func(g, check_bounds=False).source


def _oob_cases() -> dict[str, tuple[ir.PrimFunc, list[np.ndarray]]]:
    """Functions whose guards look like bounds but do not prove them; each goes out of bounds."""
    n = Var("n")
    A, B, Idx = buf("A", (4,)), buf("B", (4,)), buf("Idx", (6,), "int32")
    S = buf("S", (n,))
    i = Var("i")

    def f(name: str, body: ir.Stmt, params: tuple = (A, B)) -> ir.PrimFunc:
        return ir.PrimFunc(name, params, body)

    ab = [np.ones(4, F32), np.ones(4, F32)]
    return {
        "guard too loose": (f("g1", loop(i, 6, ir.IfThenElse(i < 5, st(B, (i,), ld(A, i))))), ab),
        "le guard": (f("g2", loop(i, 6, ir.IfThenElse(i <= 4, st(B, (i,), ld(A, i))))), ab),
        "else branch": (f("g3", loop(i, 6, ir.IfThenElse(i < 4, st(B, (0,), 1.0),
                                                         st(B, (i,), 2.0)))), ab),
        "select false side": (f("g4", loop(i, 6, st(B, (0,), select(i < 4, 0.0, ld(A, i))))), ab),
        "guard on a load": (f("g5", loop(i, 6, ir.IfThenElse(
            ld(Idx, i) < 4, st(B, (0,), ld(A, ld(Idx, i))))), (A, B, Idx)),
            ab + [np.array([0, 1, 2, 3, -1, 0], np.int32)]),
        "symbolic extent": (f("g6", loop(i, n + 1, st(S, (i,), 1.0)), (S,)), [np.ones(3, F32)]),
        "negative min": (f("g7", loop(i, 3, st(B, (i,), 1.0), lo=-1)), ab),
    }


@pytest.mark.parametrize("case", sorted(_oob_cases()))
def test_bounds_checks_survive_guards_that_do_not_prove_them(case: str) -> None:
    func, arrays = _oob_cases()[case]
    with pytest.raises(RuntimeError_, match="out of bounds"):
        evaluate(func, *arrays)


def test_non_contiguous_output_is_written_back(rng: np.random.Generator) -> None:
    A, B = buf("A", (3, 4)), buf("B", (3, 4))
    i, j = Var("i"), Var("j")
    f = ir.PrimFunc("nc", (A, B), loop(i, 3, loop(j, 4, st(B, (i, j), ld(A, i, j) * 3.0))))
    a = rand(rng, (4, 3)).T  # a Fortran-ordered view
    big = np.zeros((3, 8), F32)
    evaluate(f, a, big[:, ::2])
    np.testing.assert_allclose(big[:, ::2], a * 3, rtol=1e-6)
    assert (big[:, 1::2] == 0).all()


def test_deep_loop_nest_beyond_python_block_limit(rng: np.random.Generator) -> None:
    depth = 26  # Python allows 20 nested loops per function
    A, B = buf("A", (2,)), buf("B", (2,))
    vs = [Var(f"i{d}") for d in range(depth)]
    body: ir.Stmt = st(B, (vs[-1],), ld(B, vs[-1]) + ld(A, vs[-1]))
    for d in reversed(range(depth)):
        body = loop(vs[d], 2 if d == depth - 1 else 1, body)
    a = rand(rng, (2,))
    out = np.zeros(2, F32)
    evaluate(ir.PrimFunc("deep", (A, B), body), a, out)
    np.testing.assert_allclose(out, a, rtol=1e-6)


def test_long_expression_chain(rng: np.random.Generator) -> None:
    n = 300  # Python allows 200 nested parentheses
    A, B = buf("A", (n,)), buf("B", (1,))
    e = ld(A, 0)
    for k in range(1, n):
        e = e + ld(A, k) * 2.0
    a, out = rand(rng, (n,)), np.zeros(1, F32)
    evaluate(ir.PrimFunc("chain", (A, B), st(B, (0,), e)), a, out)
    np.testing.assert_allclose(out, a[0] + 2 * a[1:].astype(np.float64).sum(), rtol=1e-5,
                               atol=1e-6 * np.abs(a).sum() * 2)


def test_gpu_deep_nest_with_barrier_inside(rng: np.random.Generator) -> None:
    # 22 size-1 serial loops inside a kernel, a barrier at the bottom: the rendered generator
    # moves the deep part into a nested generator (yield from) and must still step in lockstep.
    n, depth = 8, 22
    A, B = buf("A", (n,)), buf("B", (n,))
    sh = buf("sh", (n,), scope="shared")
    tx = Var("tx")
    inner: ir.Stmt = ir.seq(st(sh, (tx,), ld(A, tx)), ir.Barrier(),
                            st(B, (tx,), ld(sh, (tx + 3) % n)))
    for d in range(depth):
        inner = loop(Var(f"l{d}"), 1, inner)
    f = ir.PrimFunc("deepk", (A, B), ir.Allocate(sh, thread(tx, n, "threadIdx.x", inner)))
    assert "yield from" in compile_func(f).source
    a, out = rand(rng, (n,)), np.zeros(n, F32)
    evaluate(f, a, out)
    np.testing.assert_array_equal(out, np.roll(a, -3))


def test_ir_errors_are_compile_errors() -> None:
    A = buf("A", (2,))
    i, stray = Var("i"), Var("stray")
    with pytest.raises(CompileError, match="variable stray"):
        compile_func(ir.PrimFunc("f", (A,), loop(i, 2, st(A, (stray,), 1.0))))
    T = buf("T", (2,))
    with pytest.raises(CompileError, match="buffer T is accessed"):
        compile_func(ir.PrimFunc("g", (A,), loop(i, 2, st(A, (i,), ld(T, i)))))
    with pytest.raises(CompileError, match="no intrinsic 'gelu'"):
        compile_func(ir.PrimFunc("h", (A,), loop(i, 2, st(A, (i,), Call("gelu", (ld(A, i),), F32)))))
    with pytest.raises(CompileError, match="barrier outside"):
        compile_func(ir.PrimFunc("b", (A,), ir.Barrier()))


def test_speed_of_a_million_scalar_ops(rng: np.random.Generator) -> None:
    # 64 x 64 x 64 matmul with symbolic sizes (so every access is bounds-checked): about 10^6
    # scalar operations must take seconds, not minutes.
    m = Var("m")
    A, B, C = buf("A", (m, m)), buf("B", (m, m)), buf("C", (m, m))
    i, j, k = Var("i"), Var("j"), Var("k")
    body = loop(i, m, loop(j, m, ir.seq(
        st(C, (i, j), 0.0), loop(k, m, st(C, (i, j), ld(C, i, j) + ld(A, i, k) * ld(B, k, j))))))
    f = ir.PrimFunc("mm", (A, B, C), body)
    a, b, out = rand(rng, (64, 64)), rand(rng, (64, 64)), np.zeros((64, 64), F32)
    start = time.perf_counter()
    evaluate(f, a, b, out)
    assert time.perf_counter() - start < 10
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# GPU kernels


def matmul_kernel(M: int, N: int, K: int, T: int, barriers: tuple[bool, bool] = (True, True)):
    """C = A @ B with T x T blocks of T x T threads; each k-step the threads of a block copy one
    tile of A and one of B into shared memory (zero-padded at the edges), then multiply them."""
    A, B, C = buf("A", (M, K)), buf("B", (K, N)), buf("C", (M, N))
    As, Bs = buf("As", (T, T), scope="shared"), buf("Bs", (T, T), scope="shared")
    acc = buf("acc", (1,), scope="local")
    bx, by, tx, ty, ko, ki = (Var(n) for n in ("bx", "by", "tx", "ty", "ko", "ki"))
    row, col = by * T + ty, bx * T + tx
    load = ir.seq(
        st(As, (ty, tx), select((row < M) & (ko * T + tx < K), ld(A, row, ko * T + tx), 0.0)),
        st(Bs, (ty, tx), select((ko * T + ty < K) & (col < N), ld(B, ko * T + ty, col), 0.0)),
    )
    compute = loop(ki, T, st(acc, (0,), ld(acc, 0) + ld(As, ty, ki) * ld(Bs, ki, tx)), "unrolled")
    step = ir.seq(load, ir.Barrier() if barriers[0] else None, compute,
                  ir.Barrier() if barriers[1] else None)
    per_thread = ir.Allocate(acc, ir.seq(
        st(acc, (0,), 0.0),
        loop(ko, (K + T - 1) // T, step),
        ir.IfThenElse((row < M) & (col < N), st(C, (row, col), ld(acc, 0))),
    ))
    body = thread(bx, (N + T - 1) // T, "blockIdx.x", thread(by, (M + T - 1) // T, "blockIdx.y",
        ir.Allocate(As, ir.Allocate(Bs, thread(ty, T, "threadIdx.y",
                                               thread(tx, T, "threadIdx.x", per_thread))))))
    return ir.PrimFunc("matmul_gpu", (A, B, C), body)


@pytest.mark.parametrize("shape", [(37, 45, 50), (8, 8, 8), (1, 9, 3)])
def test_gpu_tiled_matmul_with_shared_memory(rng: np.random.Generator, shape: tuple) -> None:
    M, N, K = shape
    f = matmul_kernel(M, N, K, T=8)
    src = compile_func(f).source
    assert "_run_block" in src and "yield 1" in src  # lockstep threads with two barriers
    a, b, out = rand(rng, (M, K)), rand(rng, (K, N)), np.full((M, N), np.nan, F32)
    evaluate(f, a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_gpu_missing_barrier_gives_wrong_answer(rng: np.random.Generator) -> None:
    M, N, K = 16, 16, 24
    a, b = rand(rng, (M, K)), rand(rng, (K, N))
    want = a.astype(np.float64) @ b
    # No barrier between the tile copy and its use: threads read tile elements that their
    # neighbours have not written yet, which are NaN.
    early = matmul_kernel(M, N, K, T=8, barriers=(False, True))
    out = np.zeros((M, N), F32)
    evaluate(early, a, b, out, check_races=False)
    assert np.isnan(out).any()
    # No barrier before the next copy: early threads overwrite tiles that later threads of the
    # block still read.
    late = matmul_kernel(M, N, K, T=8, barriers=(True, False))
    out = np.zeros((M, N), F32)
    evaluate(late, a, b, out, check_races=False)
    assert not np.isnan(out).any()
    assert not np.allclose(out, want, rtol=1e-3, atol=1e-3)
    # The race checker (on by default) names the buffer, element and threads instead.
    with pytest.raises(RuntimeError_, match=r"data race in kernel matmul_gpu_kernel0 on shared "
                       r"buffer As\[0, 1\]: thread \(1, 0, 0\) of block \(0, 0, 0\) overwrites "
                       r"the value read by thread \(0, 0, 0\) of block \(0, 0, 0\) since the "
                       r"last barrier"):
        evaluate(early, a, b, out)
    with pytest.raises(RuntimeError_, match=r"data race .* on shared buffer [AB]s"):
        evaluate(late, a, b, out)


def test_gpu_shared_read_of_other_thread_without_barrier_sees_nan(rng: np.random.Generator) -> None:
    n = 16
    A, B = buf("A", (n,)), buf("B", (n,))
    sh = buf("sh", (n,), scope="shared")
    tx = Var("tx")

    def shift(with_barrier: bool) -> ir.PrimFunc:
        body = ir.seq(st(sh, (tx,), ld(A, tx)), ir.Barrier() if with_barrier else None,
                      st(B, (tx,), ld(sh, (tx + 1) % n)))
        return ir.PrimFunc("shift", (A, B), ir.Allocate(sh, thread(tx, n, "threadIdx.x", body)))

    a = rand(rng, (n,))
    out = np.zeros(n, F32)
    evaluate(shift(True), a, out)
    np.testing.assert_array_equal(out, np.roll(a, -1))
    evaluate(shift(False), a, out, check_races=False)
    assert np.isnan(out[: n - 1]).all()  # thread t read sh[t + 1] before thread t + 1 wrote it
    with pytest.raises(RuntimeError_, match=r"data race.*sh\[1\]: thread \(1, 0, 0\) .* "
                                            r"overwrites the value read by thread \(0, 0, 0\)"):
        evaluate(shift(False), a, out)


def test_gpu_race_checker_catches_races_that_lockstep_order_hides(rng: np.random.Generator) -> None:
    n = 16
    A, B = buf("A", (n,)), buf("B", (n,))
    sh = buf("sh", (n,), scope="shared")
    tx = Var("tx")
    # Thread t reads sh[t - 1] without a barrier: in threadIdx order thread t - 1 has already
    # written it, so the answer comes out right, yet on a GPU it is a race.
    body = ir.seq(st(sh, (tx,), ld(A, tx)), st(B, (tx,), ld(sh, (tx + n - 1) % n)))
    f = ir.PrimFunc("back", (A, B), ir.Allocate(sh, thread(tx, n, "threadIdx.x", body)))
    a = rand(rng, (n,))
    out = np.zeros(n, F32)
    evaluate(f, a, out, check_races=False)
    np.testing.assert_array_equal(out[1:], a[:-1])
    with pytest.raises(RuntimeError_, match=r"sh\[0\]: thread \(1, 0, 0\) of block \(0, 0, 0\) "
                                            r"reads the value written by thread \(0, 0, 0\)"):
        evaluate(f, a, out)


def test_gpu_race_checker_on_global_memory(rng: np.random.Generator) -> None:
    # A reduction axis bound to threads: every thread accumulates into the same element.
    A, S = buf("A", (8,)), buf("S", (1,))
    tx, bx = Var("tx"), Var("bx")
    acc = thread(tx, 8, "threadIdx.x", st(S, (0,), ld(S, 0) + ld(A, tx)))
    a = rand(rng, (8,))
    with pytest.raises(RuntimeError_, match=r"on global buffer S\[0\]: thread \(1, 0, 0\).*"
                                            r"reads the value written by thread \(0, 0, 0\)"):
        evaluate(ir.PrimFunc("red", (A, S), acc), a, np.zeros(1, F32))
    # Blocks never synchronise: two blocks writing different values to one element race even
    # with a barrier between.
    two = thread(bx, 2, "blockIdx.x", thread(tx, 4, "threadIdx.x", ir.seq(
        ir.Barrier(), ir.IfThenElse(tx == 0, st(S, (0,), ld(A, bx))))))
    with pytest.raises(RuntimeError_, match=r"overwrites the value written by thread \(0, 0, 0\) "
                                            r"of block \(0, 0, 0\) in another block"):
        evaluate(ir.PrimFunc("blocks", (A, S), two), a, np.zeros(1, F32))


def test_gpu_redundant_identical_writes_are_not_races(rng: np.random.Generator) -> None:
    # Every thread copies the whole tile (an unbound copy stage): the writes agree, so they
    # are benign; threads then read it after a barrier, and every block writes the same total.
    n = 8
    A, B, T = buf("A", (n,)), buf("B", (n,)), buf("T", (1,))
    sh = buf("sh", (n,), scope="shared")
    bx, tx, j = Var("bx"), Var("tx"), Var("j")
    body = ir.seq(
        loop(j, n, st(sh, (j,), ld(A, j) * 0.1)), ir.Barrier(),
        st(B, (tx,), ld(sh, (tx + 1) % n)), st(T, (0,), ld(sh, 0) + ld(sh, 1)),
    )
    f = ir.PrimFunc("copy", (A, B, T), thread(bx, 3, "blockIdx.x", ir.Allocate(
        sh, thread(tx, n, "threadIdx.x", body))))
    a, out, tot = rand(rng, (n,)), np.zeros(n, F32), np.zeros(1, F32)
    evaluate(f, a, out, tot)
    want = (a.astype(np.float64) * np.float32(0.1)).astype(F32)
    np.testing.assert_allclose(out, np.roll(want, -1), rtol=1e-6)
    np.testing.assert_allclose(tot, want[0] + np.float64(want[1]), rtol=1e-6)


def test_gpu_block_tree_reduction(rng: np.random.Generator) -> None:
    """Row sums, one block per row: 16 threads accumulate strided partial sums, reduce them in
    shared memory in log2(16) barrier-separated steps, and thread 0 (a second, narrower
    threadIdx.x loop) writes the result."""
    rows, n, T = 5, 37, 16
    A, S = buf("A", (rows, n)), buf("S", (rows,))
    part = buf("part", (T,), scope="shared")
    bx, tx, t0, k = Var("bx"), Var("tx"), Var("t0"), Var("k")
    steps: list[ir.Stmt] = []
    stride = T // 2
    while stride:
        steps += [ir.IfThenElse(tx < stride, st(part, (tx,), ld(part, tx) + ld(part, tx + stride))),
                  ir.Barrier()]
        stride //= 2
    per_thread = ir.seq(
        st(part, (tx,), 0.0),
        loop(k, (n + T - 1) // T, ir.IfThenElse(
            k * T + tx < n, st(part, (tx,), ld(part, tx) + ld(A, bx, k * T + tx)))),
        ir.Barrier(), *steps,
    )
    body = thread(bx, rows, "blockIdx.x", ir.Allocate(part, ir.seq(
        thread(tx, T, "threadIdx.x", per_thread),
        thread(t0, 1, "threadIdx.x", st(S, (bx,), ld(part, 0))),
    )))
    a = rand(rng, (rows, n))
    out = np.zeros(rows, F32)
    evaluate(ir.PrimFunc("rowsum", (A, S), body), a, out)
    np.testing.assert_allclose(out, a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_gpu_kernel_without_barriers_symbolic_launch_and_vthread(rng: np.random.Generator) -> None:
    # B[i] = A[i] * 2 with i = (bx * 32 + tx) * 2 + v over a symbolic n; the tail is guarded.
    n = Var("n")
    A, B = buf("A", (n,)), buf("B", (n,))
    bx, tx, v = Var("bx"), Var("tx"), Var("v")
    i = (bx * 32 + tx) * 2 + v
    inner = ir.For(v, c(0), c(2), "thread", ir.IfThenElse(i < n, st(B, (i,), ld(A, i) * 2.0)),
                   thread_tag="vthread")
    body = thread(bx, (n + 63) // 64, "blockIdx.x", thread(tx, 32, "threadIdx.x", inner))
    f = ir.PrimFunc("scale", (A, B), body)
    assert "_run_block" not in compile_func(f).source  # plain nested loops
    for size in (1, 100, 128):
        a = rand(rng, (size,))
        out = np.zeros(size, F32)
        evaluate(f, a, out)
        np.testing.assert_allclose(out, a * 2, rtol=1e-6)


def test_gpu_thread_loops_are_guards_with_min() -> None:
    # Two threadIdx.x loops of extents 8 and 3 in one kernel: 8 threads launch; the second loop
    # runs on threads 0..2 with its variable offset by its min (5), after a barrier because it
    # reads what threads 5..7 wrote.
    Out = buf("Out", (8,), "int32")
    tx, t2 = Var("tx"), Var("t2")
    body = thread(Var("bx"), 1, "blockIdx.x", ir.seq(
        thread(tx, 8, "threadIdx.x", st(Out, (tx,), tx)),
        ir.Barrier(),
        ir.For(t2, c(5), c(3), "thread", st(Out, (t2,), ld(Out, t2) * 10), thread_tag="threadIdx.x"),
    ))
    out = np.zeros(8, np.int32)
    evaluate(ir.PrimFunc("guards", (Out,), body), out)
    np.testing.assert_array_equal(out, [0, 1, 2, 3, 4, 50, 60, 70])


def test_gpu_divergent_barrier_is_an_error() -> None:
    Out = buf("Out", (8,))
    tx = Var("tx")
    early_exit = ir.seq(ir.IfThenElse(tx < 3, ir.Barrier()), st(Out, (tx,), 1.0))
    f = ir.PrimFunc("div", (Out,), thread(Var("bx"), 2, "blockIdx.x",
                                        thread(tx, 8, "threadIdx.x", early_exit)))
    with pytest.raises(RuntimeError_, match=r"divergent barrier in kernel div_kernel0.*barrier #0"):
        evaluate(f, np.zeros(8, F32))
    two_sites = ir.IfThenElse(tx < 3, ir.Barrier(), ir.Barrier())
    g = ir.PrimFunc("div2", (Out,), thread(tx, 8, "threadIdx.x", two_sites))
    with pytest.raises(RuntimeError_, match=r"div2_kernel0.*different barriers"):
        evaluate(g, np.zeros(8, F32))


def test_gpu_errors_name_kernel_block_and_thread() -> None:
    Out = buf("Out", (10,))
    bx, tx = Var("bx"), Var("tx")
    body = thread(bx, 3, "blockIdx.x", thread(tx, 4, "threadIdx.x", st(Out, (bx * 4 + tx,), 1.0)))
    with pytest.raises(RuntimeError_, match=r"Out\[10\].*kernel k_kernel0, blockIdx=\(2, 0, 0\), "
                                            r"threadIdx=\(2, 0, 0\)"):
        evaluate(ir.PrimFunc("k", (Out,), body), np.zeros(10, F32))
    inner = Var("inner")
    bad = loop(inner, 2, thread(tx, inner + 1, "threadIdx.x", st(Out, (tx,), 1.0)))
    with pytest.raises(CompileError, match=r"kernel k2_kernel0: .*depends on inner"):
        compile_func(ir.PrimFunc("k2", (Out,), thread(bx, 1, "blockIdx.x", bad)))


# ---------------------------------------------------------------------------------------------
# The "ref" target


def test_ref_target_module(rng: np.random.Generator) -> None:
    f = matmul_kernel(9, 10, 11, T=4)
    mod = build_func(f, parse("ref"))
    assert mod.func is f
    assert "def matmul_gpu(A, B, C)" in mod.get_source()
    a, b, out = rand(rng, (9, 11)), rand(rng, (11, 10)), np.zeros((9, 10), F32)
    mod(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    seconds = mod.time(a, b, out, repeat=3).median
    assert 0 < seconds < 30
    assert "_oob" not in mod.get_source()  # every index is provably in bounds: no checks
    assert "_tstore" in mod.get_source() and "_tstore" not in build_func(
        f, parse("ref -check-races=0")).get_source()
    conv, _, _ = _pad_conv(guarded=False)  # reads A[i + k - 1]: must be checked
    assert "_oob" in build_func(conv, parse("ref")).get_source()
    assert "_oob" not in build_func(conv, parse("ref -check-bounds=0")).get_source()
    assert compile_func(f) is compile_func(f)  # rendered once per function
    again = pickle.loads(pickle.dumps(mod))  # for measurement in worker processes
    out2 = np.zeros_like(out)
    again(a, b, out2)
    np.testing.assert_array_equal(out2, out)


def test_ref_target_refuses_kernels_a_gpu_cannot_launch() -> None:
    big = matmul_kernel(64, 64, 8, T=64)  # 64 x 64 = 4096 threads per block
    with pytest.raises(CompileError, match=r"matmul_gpu_kernel0 launches 4096 threads per block "
                                           r"\(64x64x1\); target ref allows 1024"):
        build_func(big, parse("ref"))
    Out = buf("Out", (4,))
    sh = buf("sh", (128, 128), "float32", "shared")  # 64 KiB
    tx = Var("tx")
    f = ir.PrimFunc("big_shared", (Out,), ir.Allocate(sh, thread(tx, 4, "threadIdx.x", ir.seq(
        st(sh, (tx, 0), 1.0), ir.Barrier(), st(Out, (tx,), ld(sh, tx, 0))))))
    with pytest.raises(CompileError, match=r"big_shared_kernel0 needs 65536 bytes of shared"):
        build_func(f, parse("ref"))
    out = np.zeros(4, F32)
    evaluate(f, out)  # the evaluator itself has no limits
    np.testing.assert_array_equal(out, 1.0)


@pytest.mark.parametrize("barrier", [True, False])
def test_gpu_shared_allocated_around_the_kernel_is_per_block(
    rng: np.random.Generator, barrier: bool
) -> None:
    # Only block 0 writes the tile; the other blocks read their own, fresh (NaN) tile.
    n, blocks = 4, 3
    A, B = buf("A", (n,)), buf("B", (n * blocks,))
    sh = buf("sh", (n,), scope="shared")
    bx, tx = Var("bx"), Var("tx")
    body = ir.seq(ir.IfThenElse(bx == 0, st(sh, (tx,), ld(A, tx))),
                  ir.Barrier() if barrier else None, st(B, (bx * n + tx,), ld(sh, tx)))
    f = ir.PrimFunc("around", (A, B), ir.Allocate(sh, thread(
        bx, blocks, "blockIdx.x", thread(tx, n, "threadIdx.x", body))))
    a, out = rand(rng, (n,)), np.zeros(n * blocks, F32)
    evaluate(f, a, out)
    np.testing.assert_array_equal(out[:n], a)
    assert np.isnan(out[n:]).all()
    assert kernels(f)[0].shared_bytes == 4 * n
