"""Integer arithmetic: exact simplified forms, and randomized checks of soundness against
Python's own integer semantics (floor division and modulus round toward negative infinity)."""

from __future__ import annotations

import random

import pytest

from autosched.te import expr as E
from autosched.te.expr import Var
from autosched.tir import ir
from autosched.tir.arith import const_bound, interval, interval_extent, prove, simplify


def V(name: str, dtype: str = "int32") -> Var:
    return Var(name, dtype)


def s(e: E.Expr, bounds: dict | None = None) -> str:
    return str(simplify(e, bounds))


def same(a: E.Expr, b: E.Expr) -> bool:
    return E.structural_equal(a, b)


# ---------------------------------------------------------------------------------------------
# exact forms


def test_linear_forms_print_in_input_order():
    io, ii, i, j, x = V("io"), V("ii"), V("i"), V("j"), V("x")
    assert s(io * 8 + ii) == "io * 8 + ii"
    assert s(i * 64 + j * 4 + 3) == "i * 64 + j * 4 + 3"
    assert s((i * 16 + 2) * 4 + j * 4 - 5) == "i * 64 + j * 4 + 3"
    assert s(x * 1) == "x" and s(x + 0) == "x" and s(1 * x + 0 * x) == "x"
    assert s(x * 0) == "0" and s(x - x) == "0" and s((x + 3) - (x + 1)) == "2"
    assert s(x - i) == "x - i" and s(3 - x) == "3 - x"
    assert s(0 - x) == "x * -1"
    assert s(i + j - i) == "j"


def test_floordiv_floormod_with_bounds():
    io, ii, i, j, x = V("io"), V("ii"), V("i"), V("j"), V("x")
    b = {ii: (0, 7)}
    assert s((io * 8 + ii) // 8, b) == "io"
    assert s((io * 8 + ii) % 8, b) == "ii"
    assert s((io * 8 + ii + 8) // 8, b) == "io + 1"
    assert s((io * 8 + ii) // 8) == "io + ii // 8"  # ii unbounded: keep the residue
    assert s((i * 16 + j) // 4) == "i * 4 + j // 4"
    assert s((i * 16 + j) % 4) == "j % 4"
    assert s((x * 4) % 2) == "0"
    assert s((x * 4) % 8) == "x % 2 * 4"
    assert s((x * 4) // 8) == "x // 2"
    assert s((x * 4 + 1) % 8) == "x % 2 * 4 + 1"
    assert s((x * 4 + 5) // 8) == "(x + 1) // 2"
    assert s((x * 6 + 4) % 4) == "x % 2 * 2"
    assert s((x * 9 - 1) % 4) == "(x + 3) % 4"
    assert s(x // 1) == "x" and s(x % 1) == "0"
    assert s((x // 4) // 2) == "x // 8"
    assert s((x % 8) % 4) == "x % 4"
    assert s(x % 8 % 3) == "x % 8 % 3"  # 3 does not divide 8
    assert s(x % 16, {x: (0, 15)}) == "x"
    assert s(x // 16, {x: (0, 15)}) == "0"
    assert s(x // 16, {x: (-16, -1)}) == "-1"
    assert s(x % 16, {x: (-16, -1)}) == "x + 16"
    assert s(E.Const(7, "int32") // 2) == "3" and s(E.binary("floordiv", -7, 2)) == "-4"
    # a tile's lane (under 16) on a base that is a multiple of 16, over panels of 32 columns:
    # which panel does not depend on the lane, the column in it moves one a lane
    lane = {ii: (0, 15)}

    def ls(e: E.Expr, bounds: dict) -> str:
        return str(simplify(e, bounds, lanes=True))

    assert ls((io * 16 + ii) // 32, lane) == "io // 2"
    assert ls((io * 16 + ii) % 32, lane) == "io % 2 * 16 + ii"
    assert ls((io * 48 + j * 16 + ii) // 64, lane) == "(io * 3 + j) // 4"
    assert ls((io * 16 + ii + 16) // 32, lane) == "(io + 1) // 2"
    assert ls((io * 16 + ii) // 32, {ii: (0, 16)}) == "(io * 16 + ii) // 32"  # may cross
    assert s((io * 16 + ii) // 32, lane) == "(io * 16 + ii) // 32"  # only when asked


def test_division_by_negative_constants_follows_python():
    x = V("x")
    e = E.binary("floordiv", x, -4)
    m = E.binary("floormod", x, -4)
    for v in range(-20, 20):
        assert evaluate(simplify(e), {x.uid: v}) == v // -4
        assert evaluate(simplify(m), {x.uid: v}) == v % -4


def test_fused_index_recombines():
    fo, fi = V("fo"), V("fi")
    f = fo * 32 + fi
    assert s(f // 7 * 7 + f % 7) == "fo * 32 + fi"
    x = V("x")
    assert s((x + 5) // 4 * 4 + (x + 5) % 4) == "x + 5"
    g = fo * 9 + fi  # the modulus reduces 9 to 1; the pair still recombines
    assert s(g // 4 * 4 + g % 4) == "fo * 9 + fi"
    assert s(g // 4 * 8 + g % 4 * 2 + 1) == "fo * 18 + fi * 2 + 1"
    assert s(g // 4 * 4 + g % 8) == "(fo * 9 + fi) // 4 * 4 + (fo + fi) % 8"  # no pair


def test_remainder_written_out_becomes_floormod():
    x, y = V("x"), V("y")
    assert s(x - x // 4 * 4) == "x % 4"
    assert s(x * 2 - x // 4 * 8 + y) == "y + x % 4 * 2"
    assert s((x + y) // 3 * 3 - x - y) == "(x + y) % 3 * -1"
    assert s(x - x // 4 * 8) == "x - x // 4 * 8"  # not a remainder
    lo, hi = interval(x - x // 4 * 4, {x: (0, 31)})
    assert (str(lo), str(hi)) == ("0", "3")


def test_trunc_division_when_operands_are_signed_known():
    x = V("x")
    assert s(E.binary("truncdiv", x, 4), {x: (0, 100)}) == "x // 4"
    assert s(E.binary("truncmod", x * 8 + 3, 4), {x: (0, 100)}) == "3"
    assert s(E.binary("truncdiv", x, 4), {x: (-9, 9)}) == "truncdiv(x, 4)"
    assert s(E.binary("truncdiv", x, 4), {x: (-9, 0)}) == "x * -1 // 4 * -1"


def test_min_max_select_compare():
    x, y, i = V("x"), V("y"), V("i")
    b = {x: (0, 7), y: (8, 9)}
    assert s(E.binary("min", x, y), b) == "x"
    assert s(E.binary("max", x, y), b) == "y"
    assert s(E.binary("min", x, x)) == "x"
    assert s(E.binary("max", x + 1, x)) == "x + 1"
    assert s(E.binary("min", x, y)) == "min(x, y)"
    assert s(E.binary("min", E.binary("min", x, 5), 3)) == "min(x, 3)"
    assert s(E.binary("max", 3, E.binary("max", i, E.binary("max", 5, i + 1)))) == "max(5, i + 1)"
    assert s(E.binary("min", E.binary("max", x, 2), E.binary("max", x, 2))) == "max(x, 2)"
    assert s(E.binary("max", E.binary("min", i, 9), E.binary("min", i, 9) + 1)) == "min(i, 9) + 1"
    assert s(x < y, b) == "True" and s(x >= y, b) == "False"
    assert s(x == y, b) == "False" and s(x != y, b) == "True"
    assert s(x + 1 > x) == "True"
    assert s(i < 4) == "i < 4"
    assert s(i + 3 < 10) == "i < 7"
    assert s(10 <= i + 3) == "i >= 7"
    assert s(i * 4 + 3 < 10) == "i < 2"
    assert s(i * 4 + 3 <= 10) == "i <= 1"
    assert s(i * 4 > 9) == "i > 2"
    assert s(i * 4 >= 9) == "i >= 3"
    assert s(i * 4 == 9) == "False" and s(i * 4 != 9) == "True"
    assert s(i * 4 == 8) == "i == 2"
    assert s(3 - i < 1) == "i > 2"
    assert s(x + i < y) == "x + i < y"
    assert s(i * 4 + x < i * 4 + 8) == "x < 8"
    assert s(i * 4 + x < i * 3 + y) == "i + x - y < 0"
    assert s(E.select(x < y, x, y), b) == "x"
    assert s(E.select(i < 4, x, x)) == "x"
    assert s(E.logical("and", x < y, i < 4), b) == "i < 4"
    assert s(E.logical("or", x < y, i < 4), b) == "True"
    assert s(E.Not(x < y), b) == "False"
    assert s(E.Not(i < 4)) == "i >= 4"


def test_non_linear_products_meet_in_one_form():
    x, y, n = V("x"), V("y"), V("n")
    assert s(x * 2 * y - y * x * 2) == "0"
    assert s((x * 2 + 4) * y) == "x * y * 2 + y * 4"
    assert s((0 - x) * y + x * y) == "0"
    assert s(x * n + y * n - (x + y) * n) == "0"
    assert s(n * x + 3) == "n * x + 3"
    assert s(x * (y * n) - n * x * y) == "0"
    assert s((x + 1) * (y - 1)) == "x * y - x + y - 1"
    # wide sums stay factored: distributing products of products would grow exponentially
    vs = [V(f"v{k}") for k in range(5)]
    a = vs[0] * 2 + vs[1] * 4 + vs[2] * 6 + vs[3] * 2 + 2
    assert s(a * (vs[4] + 1 + x + y)) == "(v0 + v1 * 2 + v2 * 3 + v3 + 1) * (v4 + x + y + 1) * 2"


def test_extent_one_loops_fold_to_constants():
    io, ii, x = V("io"), V("ii"), V("x")
    assert s(io * 8 + ii, {io: (0, 0), ii: (0, 7)}) == "ii"
    assert s(x * 4 + 1, {x: (3, 3)}) == "13"
    assert interval(io * 8 + ii, {ii: (0, 7)}, {io: (2, 2)}) is not None
    lo, hi = interval(io * 8 + ii, {ii: (0, 7)}, {io: (2, 2)})
    assert (str(lo), str(hi)) == ("16", "23")


def test_casts_and_int64():
    x = V("x")
    n = V("n", "int64")
    assert s(E.cast("int64", E.Const(3, "int32"))) == "int64(3)"
    e = simplify(n * 2 + x)  # x widens through a Cast
    assert e.dtype == "int64" and str(e) == "n * int64(2) + int64(x)"
    assert s(E.cast("int32", E.cast("int64", x))) == "x"
    assert s(E.cast("int64", x + 0)) == "int64(x)"


def test_floats_fold_only_exactly():
    a = V("a", "float32")
    one, zero = E.Const(1.0, "float32"), E.Const(0.0, "float32")
    assert same(simplify(E.Binary("mul", a, one)), a)
    assert same(simplify(E.Binary("add", zero, a)), a)
    # no reassociation: (a + 1) + 2 stays
    e = E.Binary("add", E.Binary("add", a, one), E.Const(2.0, "float32"))
    assert same(simplify(e), e)
    # constants fold in float32, not float64
    c = simplify(E.Binary("add", E.Const(0.1, "float32"), E.Const(0.2, "float32")))
    import numpy as np

    assert c.value == float(np.float32(0.1) + np.float32(0.2)) and c.dtype == "float32"
    assert simplify(E.Binary("sub", a, a)).dtype == "float32"
    assert not isinstance(simplify(E.Binary("sub", a, a)), E.Const)  # a - a is NaN for inf


def test_narrow_ints_wrap_and_are_not_reassociated():
    u = V("u", "uint8")
    e = E.Binary("add", E.Const(200, "uint8"), E.Const(100, "uint8"))
    assert simplify(e).value == 44
    assert same(simplify(E.Binary("add", u, E.Const(0, "uint8"))), u)


def test_load_and_tensor_read_are_atoms_with_simplified_indices():
    from autosched.te.tensor import placeholder

    i, j = V("i"), V("j")
    buf = ir.Buffer("B", (E.Const(16, "int32"),), "int32")
    ld = ir.Load(buf, (i * 4 + j - j,))
    assert s(ld + ld) == "B[i * 4] * 2"
    A = placeholder((16, 16), name="A", dtype="int32")
    assert s(A[i + 0, j * 1] - A[i, j]) == "0"


def test_const_bound():
    i, j, x, n = V("i"), V("j"), V("x"), V("n")
    b = {i: (0, 7), j: (0, 3)}
    assert const_bound(i * 4 + j - 1, b) == (-1, 30)
    assert const_bound(i * 4 - j, b) == (-3, 28)
    assert const_bound(i - i, {}) == (0, 0)  # exact on the linear form
    assert const_bound(x, {}) == (None, None)
    assert const_bound(x + i, b) == (None, None)
    assert const_bound(x % 8) == (0, 7)
    assert const_bound(i * j, b) == (0, 21)
    assert const_bound((i - 3) * (j - 1), b) == (-6, 8)
    assert const_bound(i // 3, b) == (0, 2)
    assert const_bound(E.binary("floordiv", 100, n), {n: (3, 10)}) == (10, 33)
    assert const_bound(E.binary("floormod", x, n), {n: (3, 10)}) == (0, 9)
    assert const_bound(E.binary("min", i, j + 10), b) == (0, 7)
    assert const_bound(E.select(x < 3, i, j + 20), b) == (0, 23)
    assert const_bound(E.cast("int64", i), b) == (0, 7)


def test_one_analyzer_serves_many_calls():
    from autosched.tir.arith import Analyzer

    io, ii = V("io"), V("ii")
    b = {ii: (0, 7)}
    ana = Analyzer(b)
    for e in [(io * 8 + ii) // 8, (io * 8 + ii) % 8, io * 8 + ii < io * 8 + 8]:
        assert same(ana.simplify(e), simplify(e, b))
    assert ana.prove(ii < 8) is True and ana.prove(io < 8) is None
    assert ana.const_bound(ii * 2 - 1) == (-1, 13)


def test_prove():
    i, j, x = V("i"), V("j"), V("x")
    b = {i: (0, 7), j: (0, 3)}
    assert prove(i * 4 + j < 32, b) is True
    assert prove(i * 4 + j < 31, b) is None
    assert prove(i * 4 + j >= 32, b) is False
    assert prove(x < x + 1) is True
    assert prove(x < 3) is None


def test_interval_examples():
    io, ii, i, r, f = V("io"), V("ii"), V("i"), V("r"), V("f")
    lo, hi = interval(io * 32 + ii, {ii: (0, 31)})
    assert (str(lo), str(hi)) == ("io * 32", "io * 32 + 31")
    lo, hi = interval(i + r - 1, {i: (io * 4, io * 4 + 3), r: (0, 2)})
    assert (str(lo), str(hi)) == ("io * 4 - 1", "io * 4 + 4")
    assert interval_extent(lo, hi) == 6
    lo, hi = interval(f // 7, {f: (0, 48)})
    assert (str(lo), str(hi)) == ("0", "6")
    lo, hi = interval(i * -2 + 10, {i: (0, 3)})
    assert (str(lo), str(hi)) == ("4", "10")


def test_interval_floormod_minmax_select_and_data_dependent():
    io, ii, x, k = V("io"), V("ii"), V("x"), V("k")
    lo, hi = interval((io * 32 + ii) % 64, {ii: (0, 31)})
    assert (str(lo), str(hi)) == ("io % 2 * 32", "io % 2 * 32 + 31")
    lo, hi = interval((io * 32 + ii) % 48, {ii: (0, 31)})
    assert (str(lo), str(hi)) == ("0", "47")
    lo, hi = interval(E.binary("min", ii, 20), {ii: (0, 31)})
    assert (str(lo), str(hi)) == ("0", "20")
    lo, hi = interval(E.select(x < 2, ii, ii + 5), {ii: (0, 3)})
    assert (str(lo), str(hi)) == ("0", "8")
    lo, hi = interval(ii * k, {ii: (0, 3)}, {k: (1, 100)})
    assert (str(lo), str(hi)) == ("0", "k * 3")
    buf = ir.Buffer("idx", (E.Const(16, "int32"),), "int32")
    assert interval(ir.Load(buf, (ii,)), {ii: (0, 3)}) is None
    u8 = ir.Buffer("q", (E.Const(16, "int32"),), "uint8")
    lo, hi = interval(E.cast("int32", ir.Load(u8, (ii,))), {ii: (0, 3)})
    assert (str(lo), str(hi)) == ("0", "255")
    # a Load that does not depend on the swept variable is a fixed symbol
    lo, hi = interval(ir.Load(buf, (x,)) + ii, {ii: (0, 3)})
    assert (str(lo), str(hi)) == ("idx[x]", "idx[x] + 3")


def test_interval_extent_of_divided_ranges():
    io, fo, fi = V("io"), V("fo"), V("fi")
    # io*32 // 7 .. (io*32 + 31) // 7 covers 5 or 6 values whatever io is
    assert interval_extent(io * 32 // 7, (io * 32 + 31) // 7) == 6
    assert interval_extent(io * 32 // 8, (io * 32 + 31) // 8) == 4
    # a fused loop split by 32 and read back as (f // 56, f % 56)
    f = fo * 32 + fi
    lo, hi = interval(f // 56, {fi: (0, 31)})
    assert interval_extent(lo, hi) == 2
    lo, hi = interval(f % 56, {fi: (0, 31)})
    assert (str(lo), str(hi)) == ("0", "55")
    assert const_bound((io + 9) // 4 - io // 4) == (2, 3)


def test_bounds_of_clamped_and_selected_terms():
    io = V("io")
    # regions clamped to a tensor's shape
    lo = E.binary("max", io * 4 - 1, 0)
    hi = E.binary("min", io * 4 + 4, 99)
    assert interval_extent(lo, hi, {io: (0, 24)}) == 6
    assert interval_extent(lo, hi) == 6
    assert const_bound(E.select(io < 3, io * 2, io * 2 + 5) - io * 2) == (0, 5)
    assert const_bound(E.binary("min", io, 5) - io) == (None, 0)
    assert const_bound(E.binary("max", io, 5) - io) == (0, None)
    assert const_bound(io - E.binary("min", io, 5)) == (0, None)


# ---------------------------------------------------------------------------------------------
# reference evaluation with Python semantics


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b,
    "floormod": lambda a, b: a % b,
    "truncdiv": _tdiv,
    "truncmod": lambda a, b: a - _tdiv(a, b) * b,
    "min": min,
    "max": max,
    "and": lambda a, b: a and b,
    "or": lambda a, b: a or b,
}
_CMPS = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}


def evaluate(e: E.Expr, env: dict[int, int]) -> int | bool:
    if isinstance(e, E.Const):
        return e.value
    if isinstance(e, E.Var):
        return env[e.uid]
    if isinstance(e, E.Binary):
        return _OPS[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, E.Compare):
        return _CMPS[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, E.Not):
        return not evaluate(e.a, env)
    if isinstance(e, E.Select):
        return evaluate(e.true_value if evaluate(e.cond, env) else e.false_value, env)
    if isinstance(e, E.Cast):
        v = evaluate(e.value, env)
        return bool(v) if e.type == "bool" else int(v)
    raise AssertionError(f"cannot evaluate {type(e).__name__}")


# ---------------------------------------------------------------------------------------------
# random expressions

BOX = {"x": (-6, 9), "y": (0, 15), "z": (1, 4)}


def random_expr(rnd: random.Random, vs: list[Var], depth: int) -> E.Expr:
    if depth == 0 or rnd.random() < 0.15:
        if rnd.random() < 0.7:
            return rnd.choice(vs)
        return E.const(rnd.randint(-10, 10))
    kind = rnd.random()
    a = random_expr(rnd, vs, depth - 1)
    if kind < 0.25:
        return E.binary(rnd.choice(["add", "sub"]), a, random_expr(rnd, vs, depth - 1))
    if kind < 0.4:
        return E.binary("mul", a, rnd.choice([-3, -1, 2, 4, 8]))
    if kind < 0.45:
        return E.binary("mul", a, random_expr(rnd, vs, depth - 1))
    if kind < 0.7:
        op = rnd.choice(["floordiv", "floormod", "floordiv", "floormod", "truncdiv", "truncmod"])
        return E.binary(op, a, rnd.choice([1, 2, 3, 4, 8, 16, -4, -3]))
    if kind < 0.75:
        # a bounded positive divisor
        return E.binary(rnd.choice(["floordiv", "floormod"]), a, vs[2])
    if kind < 0.85:
        return E.binary(rnd.choice(["min", "max"]), a, random_expr(rnd, vs, depth - 1))
    if kind < 0.9:
        # the remainder and fused-index patterns, with the parts possibly mismatched
        c = rnd.choice([2, 3, 4, 8])
        b = a if rnd.random() < 0.7 else a + rnd.choice([c, 1])
        if rnd.random() < 0.5:
            return a * rnd.choice([1, 2]) - E.binary("floordiv", b, c) * c
        return E.binary("floordiv", a, c) * c + E.binary("floormod", b, c)
    cond = E.compare(rnd.choice(list(_CMPS)), a, random_expr(rnd, vs, depth - 1))
    if rnd.random() < 0.3:
        cond = E.logical(rnd.choice(["and", "or"]), cond, E.compare("lt", vs[0], vs[1]))
    return E.select(cond, random_expr(rnd, vs, depth - 1), random_expr(rnd, vs, depth - 1))


def sample(rnd: random.Random, vs: list[Var], box: dict) -> dict[int, int]:
    return {v.uid: rnd.randint(*box[v.name]) for v in vs}


# fixed seeds reproduce; one fresh seed per run explores (it is printed in every message)
SEEDS = [*range(1000, 1008), random.randrange(10**9)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lanes", [False, True])
def test_random_simplify_is_sound_and_bounded(seed: int, lanes: bool):
    rnd = random.Random(seed)
    vs = [V("x"), V("y"), V("z")]
    bounds = {v: BOX[v.name] for v in vs}
    for _ in range(150):
        e = random_expr(rnd, vs, 4)
        out = simplify(e, bounds, lanes)
        again = simplify(e, bounds, lanes)
        assert same(out, again), f"non-deterministic on {e}"
        assert same(simplify(out, bounds, lanes), out), f"not idempotent: {e} -> {out}"
        lo, hi = const_bound(e, bounds)
        for _ in range(12):
            env = sample(rnd, vs, BOX)
            want = evaluate(e, env)
            got = evaluate(out, env)
            assert got == want, f"seed {seed}: {e} -> {out} at {env}: {got} != {want}"
            assert (lo is None or lo <= want) and (hi is None or want <= hi), (
                f"seed {seed}: const_bound {lo, hi} of {e} misses {want} at {env}"
            )


@pytest.mark.parametrize("seed", range(4))
def test_random_simplify_without_bounds_and_negative_values(seed: int):
    rnd = random.Random(2000 + seed)
    vs = [V("x"), V("y"), V("z")]
    wide = {"x": (-50, 50), "y": (-50, 50), "z": (1, 7)}
    for _ in range(150):
        e = random_expr(rnd, vs, 4)
        out = simplify(e, {vs[2]: wide["z"]})
        for _ in range(10):
            env = sample(rnd, vs, wide)
            assert evaluate(out, env) == evaluate(e, env), f"{e} -> {out} at {env}"


@pytest.mark.parametrize("seed", range(4))
def test_random_prove_is_sound(seed: int):
    rnd = random.Random(3000 + seed)
    vs = [V("x"), V("y"), V("z")]
    bounds = {v: BOX[v.name] for v in vs}
    decided = 0
    for _ in range(150):
        cond = E.compare(rnd.choice(list(_CMPS)), random_expr(rnd, vs, 3), random_expr(rnd, vs, 3))
        verdict = prove(cond, bounds)
        if verdict is None:
            continue
        decided += 1
        for _ in range(10):
            env = sample(rnd, vs, BOX)
            assert evaluate(cond, env) == verdict, f"prove({cond}) = {verdict} wrong at {env}"
    assert decided > 0


@pytest.mark.parametrize("seed", range(6))
def test_random_interval_contains_every_value(seed: int):
    rnd = random.Random(4000 + seed)
    o, x, y, z = V("o"), V("x"), V("y"), V("z")
    vs = [x, y, z]
    # x sweeps a window that moves with the fixed outer variable o; y a constant range
    ranges = {x: (o * 4 - 6, o * 4 + 3), y: (0, 15)}
    bounds = {o: (-2, 3), z: BOX["z"]}
    found = 0
    for _ in range(120):
        e = random_expr(rnd, vs + [o], 4)
        res = interval(e, ranges, bounds)
        if res is None:
            continue
        found += 1
        lo_e, hi_e = res
        for _ in range(12):
            ov = rnd.randint(*bounds[o])
            env = {o.uid: ov, x.uid: rnd.randint(ov * 4 - 6, ov * 4 + 3)}
            env[y.uid] = rnd.randint(0, 15)
            env[z.uid] = rnd.randint(*BOX["z"])
            want = evaluate(e, env)
            lo, hi = evaluate(lo_e, env), evaluate(hi_e, env)
            assert lo <= want <= hi, f"interval {res} of {e} misses {want} at {env}"
            ext = interval_extent(lo_e, hi_e, bounds)
            assert ext is None or hi - lo + 1 <= ext, f"extent {ext} < {hi - lo + 1} for {res}"
    assert found > 60


def test_large_expressions_stay_fast():
    import time

    # built with raw nodes: the checked builders format their operands into error text
    # (Binary.dtype recurses down the left spine, so chains stay a few hundred deep)
    vs = [V(f"v{k}") for k in range(8)]
    terms: list[E.Expr] = [E.Binary("mul", vs[k % 8], E.const(k % 5 - 2)) for k in range(4000)]
    while len(terms) > 1:  # a balanced sum of 4000 terms
        terms = [
            E.Binary("add", *terms[k : k + 2]) if k + 1 < len(terms) else terms[k]
            for k in range(0, len(terms), 2)
        ]
    e = terms[0]
    chain: E.Expr = E.const(0)
    for k in range(296):  # whole cycles of 8: every v_k is added and subtracted alike
        chain = E.Binary("sub", E.Binary("add", chain, vs[k % 8]), vs[(k * 3) % 8])
    shared = vs[0] * 3 + vs[1]
    for _ in range(40):  # a DAG with exponential tree size
        shared = E.Binary("floordiv", E.Binary("add", shared, shared), E.const(2))
    t = time.perf_counter()
    out = simplify(e)
    assert str(simplify(chain)) == "0"
    simplify(shared, {v: (0, 100) for v in vs})
    assert time.perf_counter() - t < 2.0
    assert len(str(out)) < 200


def test_logical_chains_flatten_and_keep_the_tightest_limits():
    i, j, x = V("i"), V("j"), V("x")
    a, b = i < 100, j * 8 + x < 60
    assert s(E.logical("and", E.logical("and", a, b), b)) == "i < 100 and j * 8 + x < 60"
    assert s(E.logical("and", i < 60, i < 64)) == "i < 60"
    assert s(E.logical("and", E.logical("and", i < 64, j < 3), i <= 59)) == "j < 3 and i <= 59"
    assert s(E.logical("or", i < 60, i < 64)) == "i < 64"
    assert s(E.logical("and", i >= 2, i > 5)) == "i > 5"
    assert s(E.logical("and", i >= 7, i < 7)) == "False"
    assert s(E.logical("or", i >= 3, i < 5)) == "True"
    assert s(E.logical("and", i >= 3, i < 5)) == "i >= 3 and i < 5"
    assert s(E.logical("or", i >= 6, i < 5)) == "i >= 6 or i < 5"
    assert s(E.logical("and", E.logical("or", i < 3, j < 3), i < 3)) == "(i < 3 or j < 3) and i < 3"
    assert s(E.logical("and", i < 3, E.Not(E.Not(j < 3)))) == "i < 3 and j < 3"


@pytest.mark.parametrize("seed", range(4))
def test_random_logical_chains_are_sound(seed: int):
    rnd = random.Random(5000 + seed)
    vs = [V("x"), V("y"), V("z")]
    bounds = {v: BOX[v.name] for v in vs[1:]}  # x unbounded
    idx = [vs[0], vs[0] * 2 + 1, vs[1], vs[0] + vs[1]]

    def cond(depth: int) -> E.Expr:
        if depth == 0 or rnd.random() < 0.3:
            return E.compare(rnd.choice(list(_CMPS)), rnd.choice(idx), rnd.randint(-8, 12))
        c = E.logical(rnd.choice(["and", "or"]), cond(depth - 1), cond(depth - 1))
        return E.Not(c) if rnd.random() < 0.2 else c

    for _ in range(100):
        c = cond(4)
        out = simplify(c, bounds)
        assert same(simplify(out, bounds), out), f"not idempotent: {c} -> {out}"
        for _ in range(15):
            env = sample(rnd, vs, {**BOX, "x": (-10, 14)})
            assert evaluate(out, env) == evaluate(c, env), f"{c} -> {out} at {env}"
