"""Every schedule primitive: numerics against numpy (through each CPU backend), the loop nest it
makes, JSON round trip and replay, and the errors misuse gets."""

from __future__ import annotations

import json

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import LowerError, ScheduleError
from autosched.schedule.schedule import Schedule
from tests.support.backends import CPU_TARGETS, random_array, run, tolerance

# -- workloads ---------------------------------------------------------------------------------


def matmul(M: int = 19, N: int = 13, K: int = 11):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def matmul_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def check_matmul(s: Schedule, A, B, C, target: str, rng) -> None:
    a = random_array(rng, A.shape)
    b = random_array(rng, B.shape)
    (c,) = run(s, [A, B, C], [a, b], target)
    np.testing.assert_allclose(c, matmul_ref(a, b), **tolerance("float32"))


def check_replay(s: Schedule, outputs, args) -> None:
    """JSON round trip rebuilds the identical loop nest; the printed Python does too."""
    text = str(aus.lower(s, args))
    again = Schedule.from_json(outputs, s.to_json())
    assert str(aus.lower(again, args)) == text
    fresh = te.create_schedule([t.op for t in outputs])
    env = {"s": fresh, "te": te}
    for st in fresh.stages:
        env[st.name.replace(".", "_")] = st.op.output()
    for line in s.to_python().splitlines():
        exec(line, env)  # noqa: S102 - the schedule's own printed calls
        for st in fresh.stages:  # tensors made by cache_read / cache_write / rfactor
            env.setdefault(st.name.replace(".", "_"), st.op.output())
    assert str(aus.lower(fresh, args)) == text


# -- primitives ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("factor", [1, 4, 5, 19, 32])
def test_split_factor(target, factor, rng):
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, ii = s[C].split(i, factor=factor)
    assert (io.name, ii.name) == ("i.outer", "i.inner")
    check_matmul(s, A, B, C, target, rng)
    check_replay(s, [C], [A, B, C])


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("nparts", [1, 3, 13])
def test_split_nparts(target, nparts, rng):
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    _, j = s[C].op.axis
    jo, ji = s[C].split(j, nparts=nparts)
    f = aus.lower(s, [A, B, C])
    assert f"for j.outer in range({nparts})" in str(f)
    check_matmul(s, A, B, C, target, rng)
    check_replay(s, [C], [A, B, C])


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_tile_reorder_loop_nest(target, rng):
    A, B, C = matmul(16, 12, 8)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    (k,) = s[C].op.reduce_axis
    io, jo, ii, ji = s[C].tile(i, j, 4, 6)
    s[C].reorder(io, jo, k, ii, ji)
    text = str(aus.lower(s, [A, B, C]))
    loops = [ln.strip().split(" in ")[0] for ln in text.splitlines() if ln.strip().startswith("for")]
    # init nest (ii, ji) sits before the reduction; then k, ii, ji
    assert loops == ["for i.outer", "for j.outer", "for i.inner", "for j.inner",
                     "for k", "for i.inner", "for j.inner"]
    assert "if " not in text  # 4 and 6 divide 16 and 12: no guards
    check_matmul(s, A, B, C, target, rng)
    check_replay(s, [C], [A, B, C])


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_fuse_three_axes_non_dividing(target, rng):
    X = te.placeholder((3, 5, 7), name="X")
    Y = te.compute((3, 5, 7), lambda a, b, c: X[a, b, c] * 2.0 + 1.0, name="Y")
    s = te.create_schedule(Y.op)
    a, b, c = s[Y].op.axis
    f = s[Y].fuse(a, b, c)
    fo, fi = s[Y].split(f, factor=8)
    s[Y].parallel(fo)
    s[Y].vectorize(fi)
    x = random_array(rng, (3, 5, 7))
    (y,) = run(s, [X, Y], [x], target)
    np.testing.assert_allclose(y, x * 2 + 1, **tolerance("float32"))
    assert "a.b.c.fused.outer" in str(aus.lower(s, [X, Y]))
    check_replay(s, [Y], [X, Y])


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_annotations_and_pragma(target, rng):
    A, B, C = matmul(8, 16, 6)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    (k,) = s[C].op.reduce_axis
    jo, ji = s[C].split(j, factor=8)
    s[C].reorder(i, jo, k, ji)
    s[C].parallel(i)
    s[C].vectorize(ji)
    s[C].unroll(k)
    s[C].pragma(i, "auto_unroll_max_step", 16)
    s[C].pragma(i, "unroll_explicit", True)
    text = str(aus.lower(s, [A, B, C]))
    assert "# parallel, auto_unroll_max_step=16, unroll_explicit=True" in text
    assert "# vectorized" in text and "# unrolled" in text
    check_matmul(s, A, B, C, target, rng)
    check_replay(s, [C], [A, B, C])


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_compute_inline_and_root(target, rng):
    X = te.placeholder((10, 9), name="X")
    Y = te.compute((10, 9), lambda i, j: X[i, j] + 1.0, name="Y")
    Z = te.compute((10, 9), lambda i, j: Y[i, j] * Y[i, j], name="Z")
    s = te.create_schedule(Z.op)
    s[Y].compute_inline()
    text = str(aus.lower(s, [X, Z]))
    assert "Y" not in text.split("):", 1)[1]
    x = random_array(rng, (10, 9))
    (z,) = run(s, [X, Z], [x], target)
    np.testing.assert_allclose(z, (x + 1) ** 2, **tolerance("float32"))
    s2 = te.create_schedule(Z.op)
    s2[Y].compute_at(s2[Z], s2[Z].op.axis[0])
    s2[Y].compute_root()
    assert "allocate((10, 9,)" in str(aus.lower(s2, [X, Z]))
    (z2,) = run(s2, [X, Z], [x], target)
    np.testing.assert_allclose(z2, (x + 1) ** 2, **tolerance("float32"))
    check_replay(s, [Z], [X, Z])


def conv1d_pad(n: int = 17, r: int = 3):
    X = te.placeholder((n,), name="X")
    W = te.placeholder((r,), name="W")
    P = te.compute((n + r - 1,), lambda i: te.if_then_else(te.all(i >= 1, i < n + 1), X[i - 1], 0.0), name="P")
    k = te.reduce_axis((0, r), name="k")
    Y = te.compute((n,), lambda i: te.sum(P[i + k] * W[k], axis=k), name="Y")
    return X, W, P, Y


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("factor", [4, 5])
def test_compute_at_region(target, factor, rng):
    X, W, P, Y = conv1d_pad(17, 3)
    s = te.create_schedule(Y.op)
    (i,) = s[Y].op.axis
    io, ii = s[Y].split(i, factor=factor)
    s[P].compute_at(s[Y], io)
    text = str(aus.lower(s, [X, W, Y]))
    assert f"P = allocate(({factor + 2},)" in text  # a window of factor + r - 1 inputs
    x, w = random_array(rng, (17,)), random_array(rng, (3,))
    (y,) = run(s, [X, W, Y], [x, w], target)
    xp = np.pad(x.astype(np.float64), 1)
    ref = np.array([xp[t:t + 3] @ w for t in range(17)])
    np.testing.assert_allclose(y, ref, **tolerance("float32"))
    check_replay(s, [Y], [X, W, Y])


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_cache_write_local_and_cache_read(target, rng):
    A, B, C = matmul(16, 12, 10)
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    AA = s.cache_read(A, "local", [CC])
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 4, 4)
    s[CC].compute_at(s[C], jo)
    (k,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(k, factor=3)
    ci, cj = s[CC].op.axis
    s[CC].reorder(ko, ci, ki, cj)
    s[AA].compute_at(s[CC], ko)
    s[C].vectorize(ji)
    text = str(aus.lower(s, [A, B, C]))
    assert "C.local = allocate((4, 4,), float32, 'local')" in text
    assert "A.local = allocate((4, 3,), float32, 'local')" in text
    check_matmul(s, A, B, C, target, rng)
    check_replay(s, [C], [A, B, C])


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("factor", [4, 7])
def test_rfactor(target, factor, rng):
    X = te.placeholder((5, 30), name="X")
    k = te.reduce_axis((0, 30), name="k")
    Y = te.compute((5,), lambda i: te.sum(X[i, k], axis=k), name="Y")
    s = te.create_schedule(Y.op)
    ko, ki = s[Y].split(s[Y].op.reduce_axis[0], factor=factor)
    YF = s.rfactor(Y, ki)
    assert tuple(YF.shape) == (factor, 5)
    kf, yi = s[YF].op.axis
    (kr,) = s[YF].op.reduce_axis
    s[YF].reorder(yi, kr, kf)
    s[YF].vectorize(kf)
    x = random_array(rng, (5, 30))
    (y,) = run(s, [X, Y], [x], target)
    np.testing.assert_allclose(y, x.astype(np.float64).sum(axis=1), **tolerance("float32"))
    check_replay(s, [Y], [X, Y])


def test_bind_gpu_schedule_on_reference(rng):
    """A shared-memory tiled matmul bound to blocks and threads, run by the reference
    evaluator's CUDA semantics (barriers respected)."""
    A, B, C = matmul(32, 24, 20)
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    AS = s.cache_read(A, "shared", [CC])
    BS = s.cache_read(B, "shared", [CC])
    i, j = s[C].op.axis
    bi, ti = s[C].split(i, factor=8)
    bj, tj = s[C].split(j, factor=8)
    s[C].reorder(bi, bj, ti, tj)
    s[C].bind(bi, te.thread_axis("blockIdx.y"))
    s[C].bind(bj, te.thread_axis("blockIdx.x"))
    s[C].bind(ti, te.thread_axis("threadIdx.y"))
    s[C].bind(tj, te.thread_axis("threadIdx.x"))
    s[CC].compute_at(s[C], tj)
    (k,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(k, factor=4)
    s[AS].compute_at(s[CC], ko)
    s[BS].compute_at(s[CC], ko)
    for X in (AS, BS):
        x0, x1 = s[X].op.axis
        f = s[X].fuse(x0, x1)
        fo, fi = s[X].split(f, factor=8)
        s[X].bind(fi, te.thread_axis("threadIdx.x"))
        s[X].bind(fo, te.thread_axis("threadIdx.y"))
    text = str(aus.lower(s, [A, B, C]))
    assert "A.shared = allocate((8, 4,), float32, 'shared')" in text
    assert "barrier('shared')" in text
    check_matmul(s, A, B, C, "ref", rng)
    check_replay(s, [C], [A, B, C])


def test_fuse_of_no_axes_binds_a_scalar_reduction(rng):
    """fuse() with no axes (TVM's meaning): a new outermost loop of one iteration, which a
    reduction to a scalar binds to a block whose threads share the reduction."""
    X = te.placeholder((3, 700), name="X")
    i, k = te.reduce_axis((0, 3), name="i"), te.reduce_axis((0, 700), name="k")
    Y = te.compute((), lambda: te.max(X[i, k], axis=[i, k]), name="Y")
    s = te.create_schedule(Y.op)
    f = s[Y].fuse(*s[Y].op.reduce_axis)
    _, fi = s[Y].split(f, factor=64)
    YF = s.rfactor(Y, fi)
    s[YF].set_scope("shared")
    one = s[Y].fuse()
    assert one.dom.extent.value == 1 and s[Y].leaf[0] is one
    with pytest.raises(ScheduleError, match="already has an axis named singleton"):
        s[Y].fuse()
    b, t = s[Y].split(one, factor=1)
    s[Y].bind(b, te.thread_axis("blockIdx.x"))
    s[Y].bind(t, te.thread_axis("threadIdx.x"))
    s[YF].compute_at(s[Y], b)
    s[YF].bind(s[YF].op.axis[0], te.thread_axis("threadIdx.x"))
    x = random_array(rng, (3, 700))
    (y,) = run(s, [X, Y], [x], "ref")
    assert y == x.max()
    check_replay(s, [Y], [X, Y])


def test_rfactor_after_fuse_of_no_axes():
    X = te.placeholder((30,), name="X")
    k = te.reduce_axis((0, 30), name="k")
    Y = te.compute((), lambda: te.sum(X[k], axis=k), name="Y")
    s = te.create_schedule(Y.op)
    s[Y].fuse()
    _, ki = s[Y].split(k, factor=5)
    with pytest.raises(ScheduleError, match="only splits and fusions of reduction axes"):
        s.rfactor(Y, ki)


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_size_one_dims(target, rng):
    A, B, C = matmul(1, 1, 7)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, ii = s[C].split(i, factor=4)
    s[C].vectorize(ii)
    check_matmul(s, A, B, C, target, rng)


def test_steps_json_has_version_and_names():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    s[C].split(s[C].op.axis[0], factor=4)
    data = __import__("json").loads(s.to_json())
    assert data["version"] == 1
    assert data["steps"] == [{"kind": "split", "stage": "C", "axis": "i", "factor": 4, "nparts": None}]


# -- errors ----------------------------------------------------------------------------------


def test_split_factor_zero():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    with pytest.raises(ScheduleError, match="split factor 0 for axis i of C"):
        s[C].split(s[C].op.axis[0], factor=0)


def test_reorder_axes_of_another_stage():
    X = te.placeholder((4, 4), name="X")
    Y = te.compute((4, 4), lambda i, j: X[i, j] + 1.0, name="Y")
    Z = te.compute((4, 4), lambda i, j: Y[i, j] * 2.0, name="Z")
    s = te.create_schedule(Z.op)
    yi, _ = s[Y].op.axis
    zi, zj = s[Z].op.axis
    with pytest.raises(ScheduleError, match="axis i is not a leaf axis of this stage .it belongs to stage Y"):
        s[Z].reorder(zj, yi)


def test_vectorize_reduction_axis():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    with pytest.raises(ScheduleError, match="cannot vectorize reduction axis k of C"):
        s[C].vectorize(s[C].op.reduce_axis[0])


def test_compute_at_not_enclosing_every_use():
    X = te.placeholder((8,), name="X")
    Y = te.compute((8,), lambda i: X[i] + 1.0, name="Y")
    Z = te.compute((8,), lambda i: Y[i] * 2.0, name="Z")
    W = te.compute((8,), lambda i: Y[i] * 3.0, name="W")
    s = te.create_schedule([Z.op, W.op])
    s[Y].compute_at(s[Z], s[Z].op.axis[0])
    with pytest.raises(ScheduleError, match="W reads Y outside that loop"):
        aus.lower(s, [X, Z, W])


def test_bind_thread_axis_twice():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    s[C].bind(i, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match="threadIdx.x is already bound to axis i of C"):
        s[C].bind(j, te.thread_axis("threadIdx.x"))


def test_fuse_not_adjacent():
    X = te.placeholder((2, 3, 4), name="X")
    Y = te.compute((2, 3, 4), lambda a, b, c: X[a, b, c] + 1.0, name="Y")
    s = te.create_schedule(Y.op)
    a, b, c = s[Y].op.axis
    with pytest.raises(ScheduleError, match="axes a, c are not adjacent"):
        s[Y].fuse(a, c)


def test_inline_reduction_and_output():
    A, B, C = matmul()
    D = te.compute(C.shape, lambda i, j: C[i, j] + 1.0, name="D")
    s = te.create_schedule(D.op)
    with pytest.raises(ScheduleError, match="cannot compute_inline C: it is a reduction"):
        s[C].compute_inline()
    with pytest.raises(ScheduleError, match="cannot compute_inline D: it is an output"):
        s[D].compute_inline()


def test_cache_write_after_split_and_bad_scope():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    with pytest.raises(ScheduleError, match="unknown scope 'register'"):
        s.cache_write(C, "register")
    s[C].split(s[C].op.axis[0], factor=2)
    with pytest.raises(ScheduleError, match="cache_write of C must come before other steps"):
        s.cache_write(C, "local")


def test_unknown_pragma_and_bad_json():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    with pytest.raises(ScheduleError, match="unknown pragma 'fast'"):
        s[C].pragma(s[C].op.axis[0], "fast", 1)
    with pytest.raises(ScheduleError, match="unknown schedule step kind 'explode'"):
        Schedule.from_json([C], '{"version": 1, "steps": [{"kind": "explode", "stage": "C"}]}')
    with pytest.raises(ScheduleError, match="no stage named Q"):
        Schedule.from_json([C], '{"version": 1, "steps": [{"kind": "compute_root", "stage": "Q"}]}')


def test_missing_args():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    with pytest.raises(LowerError, match="placeholder B is read but is not in args"):
        aus.lower(s, [A, C])
    with pytest.raises(LowerError, match="output C is not in args"):
        aus.lower(s, [A, B])


# -- TVM's meaning of the tensor's axes after DAG-changing steps ---------------------------


@pytest.mark.parametrize("target", CPU_TARGETS)
@pytest.mark.parametrize("scope", ["global", "local"])
def test_tensor_axes_schedule_the_output_after_cache_write(target, scope, rng):
    # TVM: after CC = s.cache_write(C, ...), C.op.axis are the axes of the copy-out stage C;
    # the cache gets fresh axes of the same names (so recorded steps replay unchanged)
    A, B, C = matmul(21, 18, 9)
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, scope)
    assert [a.name for a in s[CC].op.axis] == [a.name for a in C.op.axis] == ["i", "j"]
    assert {a.var.uid for a in s[CC].op.axis}.isdisjoint(a.var.uid for a in C.op.axis)
    assert s[CC].op.reduce_axis == C.op.reduce_axis
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 8, 8)
    s[CC].compute_at(s[C], jo)
    ko, ki = s[CC].split(C.op.reduce_axis[0], factor=4)
    s[CC].reorder(ko, *s[CC].op.axis, ki)
    s[C].parallel(io)
    with pytest.raises(ScheduleError, match="axis i is not a leaf axis of this stage"):
        s[CC].split(C.op.axis[0], factor=2)
    check_matmul(s, A, B, C, target, rng)
    check_replay(s, [C], [A, B, C])


@pytest.mark.parametrize("target", CPU_TARGETS)
def test_tensor_axes_schedule_the_output_after_rfactor(target, rng):
    X = te.placeholder((13, 30), name="X")
    k = te.reduce_axis((0, 30), name="k")
    Y = te.compute((13,), lambda i: te.sum(X[i, k], axis=k), name="Y")
    s = te.create_schedule(Y.op)
    ko, ki = s[Y].split(k, factor=8)
    YF = s.rfactor(Y, ki)
    yo, yi = s[Y].split(Y.op.axis[0], factor=4)
    s[YF].compute_at(s[Y], yi)
    x = random_array(rng, (13, 30))
    (y,) = run(s, [X, Y], [x], target)
    np.testing.assert_allclose(y, x.astype(np.float64).sum(axis=1), **tolerance("float32"))
    check_replay(s, [Y], [X, Y])
    assert tuple(YF.shape) == (8, 13)


def test_nested_split_that_overhangs_its_parent_is_guarded(rng):
    # k (10) = k.outer * 4 + k.inner, and k.inner (4) split into 3 parts of 2: k.inner reaches
    # 5, so k = 4 comes from (0, 4) and (1, 0) unless k.inner < 4 is checked too
    A = te.placeholder((10,), name="A")
    k = te.reduce_axis((0, 10), name="k")
    C = te.compute((1,), lambda i: te.sum(A[k], axis=k), name="C")
    s = te.create_schedule(C.op)
    ko, ki = s[C].split(k, factor=4)
    s[C].split(ki, nparts=3)
    a = random_array(rng, (10,))
    (c,) = run(s, [A, C], [a], "llvm")
    np.testing.assert_allclose(c, [a.astype(np.float64).sum()], **tolerance("float32"))


@pytest.mark.parametrize("factor", ["8", [8], 8.0, -4, True, 2**40])
def test_step_json_with_a_malformed_value_is_a_schedule_error(factor):
    """Steps read from JSON are data from outside: a string, list, float, negative or huge
    factor is refused by name when the step is read (it failed later, with a TypeError)."""
    from autosched.schedule.schedule import Schedule

    A = te.placeholder((16,), name="A")
    B = te.compute((16,), lambda i: A[i] * 2.0, name="B")
    text = json.dumps({"version": 1, "steps": [
        {"kind": "split", "stage": "B", "axis": "i", "factor": factor, "nparts": None}]})
    with pytest.raises(ScheduleError, match="step split field factor must be"):
        Schedule.from_json(B, text)
