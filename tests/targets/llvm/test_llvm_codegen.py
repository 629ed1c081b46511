"""The LLVM backend on hand-built loop IR: every dtype, operator, intrinsic and cast against
numpy, scalar and vectorized; loops of each kind; allocations; guarded loads."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import numpy as np
import pytest

from autosched.errors import CompileError
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te import intrin
from autosched.tir import ir
from tests.support.backends import garbage
from tests.support.llvm_ir import buf, build, c, loop, rand, tol

ALL = list(dt.ALL_TYPES)


def _elementwise(op, dtype: str, n: int, kind: str, out_dtype: str | None = None):
    """C[i] = op(A[i], B[i]) over ``n`` elements with the loop of ``kind``."""
    A, B = buf("A", (n,), dtype), buf("B", (n,), dtype)
    out = out_dtype or dtype
    C = buf("C", (n,), out)
    i = E.Var("i")
    body = loop(i, n, ir.Store(C, (i,), op(ir.Load(A, (i,)), ir.Load(B, (i,)))), kind)
    return build(body, [A, B, C]), out


def _run2(mod, a, b, out_dtype):
    out = garbage(a.shape, out_dtype)
    mod(a, b, out)
    return out


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("dtype", ALL)
def test_add_mul_every_dtype(dtype, kind, rng):
    n = 37
    if dtype == "bool":
        mod, out = _elementwise(lambda a, b: E.logical("or", a, b), dtype, n, kind)
        a, b = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
        np.testing.assert_array_equal(_run2(mod, a, b, out), a | b)
        return
    mod, out = _elementwise(lambda a, b: a * b + a - b, dtype, n, kind)
    a, b = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    with np.errstate(over="ignore"):
        want = a * b + a - b
    np.testing.assert_allclose(_run2(mod, a, b, out), want, **tol(dtype))


INT_OPS = {
    "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b,
    "truncdiv": lambda a, b: np.trunc(a / b).astype(a.dtype),
    "truncmod": lambda a, b: np.fmod(a, b), "min": np.minimum, "max": np.maximum,
}


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint32"])
@pytest.mark.parametrize("op", list(INT_OPS))
def test_integer_division_semantics(op, dtype, kind, rng):
    n = 64
    mod, out = _elementwise(lambda a, b: E.binary(op, a, b), dtype, n, kind)
    a = rand(rng, (n,), dtype)
    b = rand(rng, (n,), dtype)
    b[b == 0] = 3
    a[:4] = [7, 7, 1, 0] if dtype.startswith("u") else [-7, 7, -1, 0]
    b[:4] = [2, 3, 5, 4] if dtype.startswith("u") else [2, -2, 5, -3]
    np.testing.assert_array_equal(_run2(mod, a, b, out), INT_OPS[op](a, b))


FLOAT_BINARY = [(op, d) for op in ("div", "min", "max", "pow", "floordiv")
                for d in ("float16", "float32", "float64")
                if (op, d) != ("floordiv", "float16")]  # float16 floor(a/b) rounds the quotient first


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("op,dtype", FLOAT_BINARY)
def test_float_binary(op, dtype, kind, rng):
    n = 21
    mod, out = _elementwise(lambda a, b: E.binary(op, a, b), dtype, n, kind)
    a, b = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    if op == "pow":
        a = np.abs(a) + np.asarray(0.5, dtype)
    b[np.abs(b) < 0.1] = 0.5
    ref = {"div": np.divide, "min": np.minimum, "max": np.maximum, "pow": np.power,
           "floordiv": np.floor_divide}[op]
    want = ref(a.astype("float64"), b.astype("float64")).astype(dtype)
    got = _run2(mod, a, b, out)
    np.testing.assert_allclose(got, want, **tol(dtype) if dtype != "float16" else
                               dict(rtol=5e-3, atol=5e-3))


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("op", ["lt", "le", "gt", "ge", "eq", "ne"])
@pytest.mark.parametrize("dtype", ["float32", "int16", "uint8"])
def test_compare_to_bool(op, dtype, kind, rng):
    n = 50
    mod, out = _elementwise(lambda a, b: E.compare(op, a, b), dtype, n, kind, "bool")
    a, b = rand(rng, (n,), dtype), rand(rng, (n,), dtype)
    b[:10] = a[:10]
    ref = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}[op]
    np.testing.assert_array_equal(_run2(mod, a, b, out), ref(a, b))


NUMPY_UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "sin": np.sin, "cos": np.cos, "log2": np.log2,
    "exp2": np.exp2, "log1p": np.log1p, "expm1": np.expm1, "abs": np.abs,
}


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf)(x)


NUMPY_UNARY["erf"] = _erf


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("name", sorted(NUMPY_UNARY))
def test_intrinsics(name, dtype, kind, rng):
    n = 40
    A, C = buf("A", (n,), dtype), buf("C", (n,), dtype)
    i = E.Var("i")
    fn = getattr(intrin, name)
    mod = build(loop(i, n, ir.Store(C, (i,), fn(ir.Load(A, (i,)))), kind), [A, C])
    a = rand(rng, (n,), dtype)
    if name in ("log", "sqrt", "rsqrt", "log2", "log1p"):
        a = np.abs(a) + np.asarray(0.1, dtype)
    if name in ("round", "floor", "ceil"):
        a[:4] = np.array([0.5, -0.5, 1.5, 2.5]).astype(dtype)  # round half to even
    out = garbage((n,), dtype)
    mod(a, out)
    want = NUMPY_UNARY[name](a.astype("float64")).astype(dtype)
    t = {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=3e-6, atol=3e-6),
         "float64": dict(rtol=1e-13, atol=1e-13)}[dtype]
    np.testing.assert_allclose(out, want, **t)


def test_vector_exp_range_and_special_values(rng):
    """float32 exp on vectors is computed inline: about 1 ulp over the whole range, denormal
    results near the bottom, inf above ln(FLT_MAX), NaN kept."""
    special = np.array([0.0, -0.0, 1.0, -1.0, 88.72, 88.73, 89.0, -87.3, -87.4, -100.0,
                        -103.0, -110.0, np.inf, -np.inf, np.nan, 1e-8], "float32")
    a = np.concatenate([special, rng.uniform(-100, 88.7, 1000).astype("float32"),
                        rng.uniform(-1, 1, 96).astype("float32")])
    n = a.size
    A, C = buf("A", (n,), "float32"), buf("C", (n,), "float32")
    i = E.Var("i")
    mod = build(loop(i, n, ir.Store(C, (i,), intrin.exp(ir.Load(A, (i,)))), "vectorized"), [A, C])
    out = garbage((n,), "float32")
    mod(a, out)
    with np.errstate(over="ignore"):
        want = np.exp(a.astype("float64")).astype("float32")
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))
    finite = np.isfinite(want)
    tiny = np.finfo(np.float32).tiny
    np.testing.assert_allclose(out[finite], want[finite], rtol=4e-7, atol=tiny * 2 ** -20)


def test_erf_inline_ulps_and_lanes_agree(rng):
    """float32 erf is computed inline: within 3 ulp of erf on [-6, 6] around both of its
    pieces' edges, +-1 at +-inf, NaN kept, and a vectorized loop gives a serial loop's bits
    (a GELU epilogue vectorized and one left scalar agree); no libm call per lane."""
    special = np.array([0.0, -0.0, 1e-30, -1e-8, 0.875, -0.875, 0.87500006, 3.925, -3.925,
                        3.92, 10.0, -1e30, np.inf, -np.inf, np.nan], "float32")
    a = np.concatenate([special, rng.uniform(-6, 6, 4000).astype("float32"),
                        rng.uniform(0.8, 0.95, 500).astype("float32"),
                        np.linspace(-1, 1, 501, dtype="float32")])
    n = a.size
    outs = []
    for kind in ("serial", "vectorized"):
        A, C = buf("A", (n,), "float32"), buf("C", (n,), "float32")
        i = E.Var("i")
        mod = build(loop(i, n, ir.Store(C, (i,), intrin.erf(ir.Load(A, (i,)))), kind), [A, C])
        assert "erff" not in mod.get_llvm_ir(), kind
        outs.append(garbage((n,), "float32"))
        mod(a, outs[-1])
    np.testing.assert_array_equal(outs[0].view("uint32"), outs[1].view("uint32"))
    out = outs[1]
    want = _erf(a.astype("float64"))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(a))
    ok = ~np.isnan(a)
    ulp = np.spacing(np.abs(want[ok]).astype("float32")).astype("float64")
    worst = (np.abs(out[ok] - want[ok]) / np.maximum(ulp, 2.0 ** -149)).max()
    assert worst <= 3, f"{worst:.2f} ulp"
    A, C = buf("A", (64,), "float16"), buf("C", (64,), "float16")   # float16 goes through it
    i = E.Var("i")
    mod = build(loop(i, 64, ir.Store(C, (i,), intrin.erf(ir.Load(A, (i,)))), "vectorized"),
                [A, C])
    assert "erff" not in mod.get_llvm_ir()


CASTS = [("float32", "int32"), ("float64", "uint8"), ("int32", "float32"), ("uint8", "float64"),
         ("int64", "int8"), ("int8", "int64"), ("uint8", "int32"), ("int32", "uint16"),
         ("float32", "float16"), ("float16", "float64"), ("float64", "float16"),
         ("bool", "float32"),
         ("float32", "bool"), ("int16", "bool"), ("bool", "int32"), ("uint32", "float32")]


@pytest.mark.parametrize("kind", ["serial", "vectorized"])
@pytest.mark.parametrize("src,dst", CASTS)
def test_casts(src, dst, kind, rng):
    n = 33
    A, C = buf("A", (n,), src), buf("C", (n,), dst)
    i = E.Var("i")
    mod = build(loop(i, n, ir.Store(C, (i,), E.cast(dst, ir.Load(A, (i,)))), kind), [A, C])
    a = rand(rng, (n,), src)
    if src.startswith("float") and dst.startswith("u"):
        a = np.abs(a) * 20
    elif src.startswith("float") and not dst.startswith("float") and dst != "bool":
        a = a * 20
    if dst == "bool" or src == "bool":
        a[:3] = np.zeros(3, src)
    out = garbage((n,), dst)
    mod(a, out)
    np.testing.assert_array_equal(out, a.astype(dst))


def test_reshape_indices_load_as_one_vector(rng):
    """A[p // 7, p % 7] moves by one element per lane (its row-major offset is p): one vector
    load, not a per-lane gather; a stride-2 read (A[2p // 7, 2p % 7]) still gathers."""
    A, C, D = buf("A", (4, 7)), buf("C", (16,)), buf("D", (8,))
    po, pi = E.Var("po"), E.Var("pi")
    p = po * 8 + pi
    body = ir.Seq((
        loop(po, 2, loop(pi, 8, ir.Store(C, (p,), ir.Load(A, (intrin.floordiv(p, 7), intrin.floormod(p, 7)))
                                         + 1.0), "vectorized")),
        loop(pi, 8, ir.Store(D, (pi,), ir.Load(A, (intrin.floordiv(pi * 2, 7),
                                                   intrin.floormod(pi * 2, 7)))), "vectorized"),
    ))
    mod = build(body, [A, C, D])
    text = mod.get_llvm_ir(optimized=False)
    assert text.count("load <8 x float>") == 1
    a = rand(rng, (4, 7), "float32")
    c, d = garbage((16,), "float32"), garbage((8,), "float32")
    mod(a, c, d)
    np.testing.assert_allclose(c, a.reshape(-1)[:16] + 1, rtol=1e-6)
    np.testing.assert_array_equal(d, a.reshape(-1)[0:16:2])


@pytest.mark.parametrize("guard", ["none", "select", "if"])
def test_lane_patterns_load_as_vectors(guard, rng):
    """A Winograd output transform reads ``rows[.., x.o * 4 + x.i // 4]`` and
    ``at[x.i % 4, r]`` over 16 lanes of x.i: each lane's element sits a constant distance
    from lane 0's (0, 0, 0, 0, 1, ... and 0, 6, 12, 18, 0, ...), so both load as one vector
    and a shuffle instead of lane by lane (900 x 161: 49 -> 41 ms), under a padding select
    or a guard of the tile's overhang too (x < 41 of 48)."""
    n, size = 41, 12 if guard == "none" else 11
    A, B, C = buf("A", (size,)), buf("B", (4, 6)), buf("C", (48,))
    xo, xi = E.Var("xo"), E.Var("xi")
    x = xo * 16 + xi
    r = 5
    rows, at = ir.Load(A, (xo * 4 + intrin.floordiv(xi, 4),)), ir.Load(B, (intrin.floormod(xi, 4), c(r)))
    value, inside = rows * at, x < n
    if guard == "select":  # each read under the tile's padding select, as lowering writes it
        value = E.Select(inside, rows, c(0.0)) * E.Select(inside, at, c(0.0))
        store = ir.Store(C, (x,), value + 1.0)
    elif guard == "if":
        store = ir.IfThenElse(inside, ir.Store(C, (x,), value + 1.0), None)
    else:
        store = ir.Store(C, (x,), value + 1.0)
    mod = build(loop(xo, 3, loop(xi, 16, store, "vectorized")), [A, B, C])
    lane_by_lane = r"insertelement <\d+ x float> .*, i32 [1-9]\d*$"
    assert not re.search(lane_by_lane, mod.get_llvm_ir(optimized=False), re.M)
    a, b = rand(rng, (size,), "float32"), rand(rng, (4, 6), "float32")
    out = garbage((48,), "float32")
    mod(a, b, out)
    xs = np.arange(48)
    want = a[np.minimum(xs // 4, size - 1)] * b[xs % 4, r] + 1.0
    if guard == "select":
        want[n:] = 1.0
    if guard == "if":
        np.testing.assert_allclose(out[:n], want[:n], rtol=1e-6)
        assert np.isnan(out[n:]).all()
    else:
        np.testing.assert_allclose(out, want, rtol=1e-6)


def test_vectorized_emits_vector_types(rng):
    n = 64
    A, B, C = buf("A", (4, n)), buf("B", (n,)), buf("C", (4, n))
    i, j = E.Var("i"), E.Var("j")
    body = loop(i, 4, loop(j, 16, ir.Store(C, (i, j), ir.Load(A, (i, j)) * ir.Load(B, (j,))
                                           + 2.0), "vectorized"))
    mod = build(body, [A, B, C])
    text = mod.get_llvm_ir(optimized=False)
    assert "<16 x float>" in text and "load <16 x float>" in text
    assert "store <16 x float>" in text
    a, b = rand(rng, (4, n), "float32"), rand(rng, (n,), "float32")
    out = rand(rng, (4, n), "float32")
    before = out.copy()
    mod(a, b, out)
    np.testing.assert_allclose(out[:, :16], a[:, :16] * b[:16] + 2, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out[:, 16:], before[:, 16:])


@pytest.mark.parametrize("extent", [1, 3, 8, 56, 100, 200])
def test_vectorized_odd_extents(extent, rng):
    """Widths the CPU lacks are cut into native pieces plus a power-of-two remainder."""
    A, C = buf("A", (extent,)), buf("C", (extent,))
    i = E.Var("i")
    mod = build(loop(i, extent, ir.Store(C, (i,), ir.Load(A, (i,)) * 3.0), "vectorized"),
                [A, C])
    a = rand(rng, (extent,), "float32")
    out = garbage((extent,), "float32")
    mod(a, out)
    np.testing.assert_allclose(out, a * 3, rtol=1e-6)


def test_vectorized_strided_gather_and_scatter(rng):
    A, C = buf("A", (48,)), buf("C", (40,))
    i, v = E.Var("i"), E.Var("v")
    # C[v * 5 + i] = A[v * 3 + i * i] : strided store, strided/nonlinear load
    body = loop(i, 5, loop(v, 8, ir.Store(C, (v * 5 + i,),
                                          ir.Load(A, (v * 3 + i * i,)) + 1.0), "vectorized"))
    mod = build(body, [A, C])
    a = rand(rng, (48,), "float32")
    out = garbage((40,), "float32")
    mod(a, out)
    want = np.empty(40, "float32")
    for ii in range(5):
        for vv in range(8):
            want[vv * 5 + ii] = a[vv * 3 + ii * ii] + 1
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.parametrize("dtype,op", [("float32", "add"), ("float64", "mul"), ("int32", "add"),
                                      ("int32", "max"), ("float32", "min"), ("uint8", "min")])
def test_vectorized_reduction_into_invariant_store(dtype, op, rng):
    """acc[i] = acc[i] op A[i, v] with v vectorized: a vector reduction."""
    m, n = 6, 16
    A, C = buf("A", (m, n), dtype), buf("C", (m,), dtype)
    i, v = E.Var("i"), E.Var("v")
    init = {"add": 0, "mul": 1, "max": -1000, "min": 1000}[op]
    init_v = E.const(init if dtype != "uint8" or op != "min" else 255, dtype)
    if dtype.startswith("float"):
        init_v = E.const(float(init), dtype)
    acc = ir.Load(C, (i,))
    body = loop(i, m, ir.seq(
        ir.Store(C, (i,), init_v),
        loop(v, n, ir.Store(C, (i,), E.binary(op, acc, ir.Load(A, (i, v)))), "vectorized")))
    mod = build(body, [A, C])
    assert "llvm.vector.reduce" in mod.get_llvm_ir(optimized=False)
    a = rand(rng, (m, n), dtype)
    if op == "mul":
        a = (np.abs(a) * 0.5 + 0.75).astype(dtype)
    out = garbage((m,), dtype)
    mod(a, out)
    ref = {"add": np.sum, "mul": np.prod, "max": np.max, "min": np.min}[op]
    want = ref(a.astype("float64") if dtype.startswith("float") else a, axis=1).astype(dtype)
    # a float sum rounds relative to its terms, not to the result they may cancel down to
    terms = np.abs(a).astype("float64").sum(axis=1) if dtype == "float32" and op == "add" else 0
    np.testing.assert_allclose(out, want, rtol=1e-5 if dtype != "float64" else 1e-12,
                               atol=float(np.max(terms)) * 1e-6)


def test_reduction_serial_and_unrolled(rng):
    m, k = 9, 13
    A, C = buf("A", (m, k)), buf("C", (m,))
    i, r = E.Var("i"), E.Var("r")
    for kind in ("serial", "unrolled"):
        body = loop(i, m, ir.seq(
            ir.Store(C, (i,), c(0.0)),
            loop(r, k, ir.Store(C, (i,), ir.Load(C, (i,)) + ir.Load(A, (i, r))), kind)))
        mod = build(body, [A, C])
        a = rand(rng, (m, k), "float32")
        out = garbage((m,), "float32")
        mod(a, out)
        np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-5, atol=1e-5)
    text = mod.get_llvm_ir(optimized=False)
    assert len(re.findall(r"^for\.head(\.\d+)?:", text, re.M)) == 1  # only the i loop


def test_local_accumulator_and_large_global_allocation(rng):
    """A small local buffer lives on the stack (entry-block alloca); a large global one on the
    heap (aligned_alloc / free)."""
    m, n = 50, 300
    A, C = buf("A", (m, n)), buf("C", (m, n))
    T = buf("T", (m, n), scope="global")  # 60 KB: heap
    L = buf("L", (n,), scope="local")  # 1.2 KB: stack
    i, j, j2, j3 = E.Var("i"), E.Var("j"), E.Var("j2"), E.Var("j3")
    body = ir.Allocate(T, ir.seq(
        loop(i, m, loop(j, n, ir.Store(T, (i, j), ir.Load(A, (i, j)) * 2.0))),
        loop(i, m, ir.Allocate(L, ir.seq(
            loop(j2, n, ir.Store(L, (j2,), ir.Load(T, (i, j2)) + 1.0), "vectorized"),
            loop(j3, n, ir.Store(C, (i, j3), ir.Load(L, (j3,)) * ir.Load(L, (j3,)))))))))
    mod = build(body, [A, C])
    text = mod.get_llvm_ir(optimized=False)
    assert '@"aligned_alloc"' in text and '@"free"' in text and "alloca [300 x float]" in text
    a = rand(rng, (m, n), "float32")
    out = garbage((m, n), "float32")
    mod(a, out)
    np.testing.assert_allclose(out, (a * 2 + 1) ** 2, rtol=1e-5)


@contextlib.contextmanager
def page_edge(n: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """``n`` random float32 that end where a page no one may read begins (and start right
    after one), so a stray read past either end faults."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    pages = -(-n * 4 // page)
    mem = mmap.mmap(-1, (pages + 2) * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base, page, 0) == 0
    assert libc.mprotect(base + (pages + 1) * page, page, 0) == 0
    a = np.frombuffer(mem, dtype="float32", count=n, offset=(pages + 1) * page - n * 4)
    a[:] = rand(rng, (n,), "float32")
    try:
        yield a
    finally:
        libc.mprotect(base, (pages + 2) * page, 3)  # readable again before it is unmapped


@pytest.mark.parametrize("kind", ["serial", "vectorized", "unrolled"])
def test_guarded_select_never_reads_out_of_bounds(kind, rng):
    """Padding: select(0 < i <= n, A[i - 1], 0) reads A only where the guard holds. The
    vectorized form is a masked load; A sits at the edge of an mmap'd page so a stray read
    faults."""
    n = 1024  # one page of float32
    A, C = buf("A", (n,)), buf("C", (n + 2,))
    i = E.Var("i")
    guard = E.logical("and", E.compare("ge", i, 1), E.compare("le", i, n))
    value = E.select(guard, ir.Load(A, (i - 1,)), c(-1.0))
    mod = build(loop(i, n + 2, ir.Store(C, (i,), value), kind), [A, C])
    with page_edge(n, rng) as a:
        out = garbage((n + 2,), "float32")
        mod(a, out)
        np.testing.assert_array_equal(out, np.concatenate([[-1.0], a, [-1.0]]).astype("float32"))


@pytest.mark.parametrize("stride", [2, 3, 4])
@pytest.mark.parametrize("padded", [False, True])
def test_strided_loads_are_wide_loads_and_a_shuffle(stride, padded, rng):
    """A[x * s + k] (a stride-s convolution's row, s <= 4) is one masked load of s vectors
    and a shuffle, not a scalar load per lane; with the tile's tail guard and under a padding
    select too. A ends at a page no one may read, so loading the s - 1 elements past the last
    lane would fault."""
    w, taps, lanes = 37, 3, 16  # 37 outputs: two full vectors and a tail of 5
    n = (w - 1) * stride + taps  # the last output's last tap is A's last element
    A, C = buf("A", (n,)), buf("C", (taps, w))
    k, xo, xi = E.Var("k"), E.Var("xo"), E.Var("xi")
    x = xo * lanes + xi
    at = x * stride + k
    value: E.Expr = ir.Load(A, (at - 1,)) if padded else ir.Load(A, (at,))
    if padded:  # A shifted right by one, zero before its start
        value = E.select(E.compare("ge", at, 1), value, c(0.0))
    store = ir.Store(C, (k, x), value * 2.0)
    body = loop(k, taps, loop(xo, -(-w // lanes), loop(
        xi, lanes, ir.IfThenElse(E.compare("lt", x, w), store), "vectorized")))
    mod = build(body, [A, C])
    text = mod.get_llvm_ir(optimized=False)
    assert f"llvm.masked.load.v{lanes * stride}f32" in text
    assert "insertelement <16 x float>" not in text  # no lane-by-lane gather
    with page_edge(n, rng) as a:
        out = garbage((taps, w), "float32")
        mod(a, out)
        src = np.concatenate([[0.0], a[:-1]]).astype("float32") if padded else a
        want = np.stack([src[kk:kk + (w - 1) * stride + 1:stride] for kk in range(taps)]) * 2
        np.testing.assert_array_equal(out, want)


def test_if_then_else_let_seq_and_lane_dependent_branch(rng):
    n = 24
    A, C, D = buf("A", (n,)), buf("C", (n,)), buf("D", (n,))
    i, x = E.Var("i"), E.Var("x", "float32")
    for kind in ("serial", "vectorized"):
        body = loop(i, n, ir.LetStmt(x, ir.Load(A, (i,)) * 2.0, ir.seq(
            ir.IfThenElse(E.compare("lt", i, 10), ir.Store(C, (i,), x), ir.Store(C, (i,), -x)),
            ir.IfThenElse(E.compare("gt", x, 0.0), ir.Store(D, (i,), x)))), kind)
        mod = build(body, [A, C, D])
        a = rand(rng, (n,), "float32")
        out_c, out_d = garbage((n,), "float32"), np.full((n,), 5.0, "float32")
        mod(a, out_c, out_d)
        idx = np.arange(n)
        np.testing.assert_allclose(out_c, np.where(idx < 10, 2 * a, -2 * a), rtol=1e-6)
        np.testing.assert_allclose(out_d, np.where(2 * a > 0, 2 * a, 5.0), rtol=1e-6)


def test_symbolic_sizes_are_int64_params_after_the_pointers(rng):
    n, m = E.Var("n"), E.Var("m")
    A, C = buf("A", (n, m)), buf("C", (n, m))
    i, j = E.Var("i"), E.Var("j")
    mod = build(loop(i, n, loop(j, m, ir.Store(C, (i, j), ir.Load(A, (i, j)) + 1.0),
                                "vectorized")), [A, C], name="addone")
    assert mod.c_declaration() == (
        "int32_t addone(float *restrict A, float *restrict C, int64_t n, int64_t m);")
    for shape in [(3, 5), (1, 17), (8, 1)]:
        a = rand(rng, shape, "float32")
        out = garbage(shape, "float32")
        mod(a, out)
        np.testing.assert_allclose(out, a + 1, rtol=1e-6)


def test_gpu_binding_is_a_compile_error():
    A = buf("A", (8,))
    i = E.Var("i")
    body = ir.For(i, c(0), c(8), "thread", ir.Store(A, (i,), c(1.0)), thread_tag="threadIdx.x")
    with pytest.raises(CompileError, match="threadIdx.x"):
        build(body, [A])


@pytest.mark.parametrize("explicit", [True, False])
def test_auto_unroll_pragma_unrolls_small_nests(explicit, rng):
    """auto_unroll_max_step=16 on the outer loop: the 3x4 inner nest (12 runs) is unrolled,
    the outer loop (5 x 12 = 60 runs) is not."""
    A, C = buf("A", (5, 3, 4)), buf("C", (5, 3, 4))
    i, j, k = E.Var("i"), E.Var("j"), E.Var("k")
    inner = loop(j, 3, loop(k, 4, ir.Store(C, (i, j, k), ir.Load(A, (i, j, k)) + 1.0)))
    pragmas = (("auto_unroll_max_step", 16), ("unroll_explicit", explicit))
    body = ir.For(i, c(0), c(5), "serial", inner, annotations=pragmas)
    mod = build(body, [A, C])
    text = mod.get_llvm_ir(optimized=False)
    assert len(re.findall(r"^for\.head(\.\d+)?:", text, re.M)) == (1 if explicit else 3)
    assert ("llvm.loop.unroll.full" in text) == (not explicit)
    a = rand(rng, (5, 3, 4), "float32")
    out = garbage((5, 3, 4), "float32")
    mod(a, out)
    np.testing.assert_allclose(out, a + 1, rtol=1e-6)


def test_lane_dependent_guard_becomes_masked_loads_and_stores(rng):
    """The tail tile of a split the loop does not divide: ``if xo * 16 + xi < n`` around
    contiguous accesses runs as masked vector code, and touches no element past the end."""
    n = 37
    A, C = buf("A", (n,)), buf("C", (n,))
    S = buf("S", (1,))
    xo, xi = E.Var("xo"), E.Var("xi")
    x = xo * 16 + xi
    store = ir.Store(C, (x,), ir.Load(A, (x,)) * ir.Load(S, (c(0),)) + 1.0)
    body = loop(xo, 3, loop(xi, 16, ir.IfThenElse(E.compare("lt", x, n), store), "vectorized"))
    mod = build(body, [A, S, C])
    text = mod.get_llvm_ir(optimized=False)
    assert "llvm.masked.store.v16f32" in text and "llvm.masked.load.v16f32" in text
    a, sc = rand(rng, (n,), "float32"), rand(rng, (1,), "float32")
    big = garbage((n + 11,), "float32")
    out = big[:n]
    mod(a, sc, out)
    np.testing.assert_allclose(out, a * sc[0] + 1, rtol=1e-6, atol=1e-6)
    assert np.isnan(big[n:]).all()


@pytest.mark.parametrize("extent", [3, 7, 12, 15])
def test_vectorized_loops_narrower_than_the_width_are_powers_of_two(extent, rng):
    """A 15-lane gather loop was one <15 x float>, which LLVM 22's SLP vectorizer miscompiled
    in a Winograd input transform on AVX-512 (some lanes wrong, depending on the transform
    matrix's values): loops narrower than the CPU's lanes are cut into powers of two too."""
    n = 64
    A, C = buf("A", (n * 4,)), buf("C", (4, n))
    i, j = E.Var("i"), E.Var("j")
    body = loop(i, 4, loop(j, extent, ir.Store(C, (i, j), ir.Load(A, ((j * 41 + i) % 97 * 2,))
                                               * 3.0), "vectorized"))
    mod = build(body, [A, C])
    widths = {int(w) for w in re.findall(r"<(\d+) x float>", mod.get_llvm_ir(optimized=False))}
    assert all(w & (w - 1) == 0 for w in widths), widths
    a = rand(rng, (n * 4,), "float32")
    out = garbage((4, n), "float32")
    mod(a, out)
    want = np.array([[a[(jj * 41 + ii) % 97 * 2] * 3 for jj in range(extent)] for ii in range(4)])
    np.testing.assert_allclose(out[:, :extent], want, rtol=1e-6)
    assert np.isnan(out[:, extent:]).all()


@pytest.mark.parametrize("pieces", [3, 5, 6])
def test_vectorized_loops_of_odd_multiples_of_the_width_are_cut_into_native_vectors(pieces, rng):
    """A vectorized loop of 3 x the CPU's lanes (48 floats on AVX-512) was one <48 x float>,
    which LLVM widens to 64 lanes element by element (a 1x1 conv ran 20x slower): every
    vector type is a power of two now, and the values are right."""
    from autosched.targets.target import parse

    lanes = parse("llvm").vector_bits // 32
    n = pieces * lanes
    A, B, C = buf("A", (3, n)), buf("B", (n,)), buf("C", (3, n))
    i, j = E.Var("i"), E.Var("j")
    body = loop(i, 3, loop(j, n, ir.Store(C, (i, j), ir.Load(A, (i, j)) * ir.Load(B, (j,))
                                          + 1.0), "vectorized"))
    mod = build(body, [A, B, C])
    widths = {int(w) for w in re.findall(r"<(\d+) x float>", mod.get_llvm_ir(optimized=False))}
    assert widths and all(w & (w - 1) == 0 for w in widths), widths
    a, b = rand(rng, (3, n), "float32"), rand(rng, (n,), "float32")
    out = garbage((3, n), "float32")
    mod(a, b, out)
    np.testing.assert_allclose(out, a * b + 1.0, rtol=1e-5, atol=1e-6)  # a multiply-add may fuse
