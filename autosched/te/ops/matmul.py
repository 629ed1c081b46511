"""Matrix products: dense, matmul (numpy semantics), batch_matmul, and panel_matmul (a
constant right operand stored as column panels, for CPUs).

All three reduce over K with ``te.sum`` and accumulate in ``out_dtype`` (default: the inputs'
dtype; give ``out_dtype="int32"`` for int8 inputs, and the operands are cast before multiplying).
A bias is added in a separate broadcast stage ``T_add``.

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((8, 64), name="x")
    w = te.placeholder((32, 64), name="w")        # (N, K), as ONNX Gemm with transB=1
    b = te.placeholder((32,), name="b")
    y = ops.dense(x, w, b)                        # (8, 32)
"""

from __future__ import annotations

from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import reduce as R
from autosched.te.expr import Expr, cast
from autosched.te.ops import args
from autosched.te.ops.broadcast import add, broadcast_shape
from autosched.te.tensor import Tensor, compute, reduce_axis


def _operand(v: Expr, out_dtype: str) -> Expr:
    return v if v.dtype == out_dtype else cast(out_dtype, v)


def _product(
    a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool, out_dtype: str | None,
    name: str, tag: str, op: str,
) -> Tensor:
    """(..., M, K) x (..., K, N) -> (..., M, N) with broadcast batch dims (both >= 2-d)."""
    args.same_dtype([a, b], op)
    out_dt = dt.check(out_dtype or a.dtype)
    if out_dt == "bool" or a.dtype == "bool":
        raise TEError(f"{op}: cannot multiply bool tensors ({a.name}, {b.name})")
    m, ka = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    kb, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if not args.same_dim(ka, kb):
        raise TEError(
            f"{op}: inner dims differ: {a.name} {a.shape}{' (transposed)' * transpose_a} has "
            f"K={ka}, {b.name} {b.shape}{' (transposed)' * transpose_b} has K={kb}"
        )
    batch = broadcast_shape([a.shape[:-2], b.shape[:-2]], f"{op} (batch dims of {a.shape} and "
                            f"{b.shape})")
    k = reduce_axis((0, ka), name="k")
    nb = len(batch)

    def batch_index(t: Tensor, i: tuple[Expr, ...]) -> list[Any]:
        lead = nb - (t.ndim - 2)
        return [0 if args.is_one(s) and not args.is_one(batch[lead + d]) else i[lead + d]
                for d, s in enumerate(t.shape[:-2])]

    def body(*i: Expr) -> Expr:
        row, col = i[nb], i[nb + 1]
        ai = batch_index(a, i) + ([k, row] if transpose_a else [row, k])
        bi = batch_index(b, i) + ([col, k] if transpose_b else [k, col])
        return R.sum(_operand(a[tuple(ai)], out_dt) * _operand(b[tuple(bi)], out_dt), axis=k)

    return compute((*batch, m, n), body, name=name, tag=tag)


def _with_bias(out: Tensor, bias: Tensor | None, op: str) -> Tensor:
    if bias is None:
        return out
    args.tensor(bias, op, "bias")
    if bias.dtype != out.dtype:
        raise TEError(f"{op}: bias {bias.name} is {bias.dtype} but the product is {out.dtype}")
    result = add(out, bias)
    if tuple(result.shape) != tuple(out.shape):
        raise TEError(f"{op}: bias shape {bias.shape} would grow the output {out.shape}")
    return result


def dense(x: Tensor, w: Tensor, bias: Tensor | None = None, out_dtype: str | None = None) -> Tensor:
    """y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]): x (M, K), w (N, K), bias (N,) or any
    shape that broadcasts to (M, N). Compute ``T_dense``, tag ``dense``."""
    args.tensor(x, "dense", "data")
    args.tensor(w, "dense", "weight")
    args.ndim_is(x, 2, "dense", "data")
    args.ndim_is(w, 2, "dense", "weight")
    out = _product(x, w, False, True, out_dtype, "T_dense", "dense", "dense")
    return _with_bias(out, bias, "dense")


def matmul(
    a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False,
    bias: Tensor | None = None, out_dtype: str | None = None,
) -> Tensor:
    """numpy.matmul (ONNX MatMul): the last two dims multiply, leading dims broadcast; a 1-d
    ``a`` is a row (its M dim is dropped from the result), a 1-d ``b`` a column (N dropped).
    ``transpose_a`` / ``transpose_b`` swap the last two dims of a >= 2-d operand first.
    Compute ``T_matmul``, tag ``matmul``; bias broadcasts onto the result."""
    args.tensor(a, "matmul", "a")
    args.tensor(b, "matmul", "b")
    if a.ndim == 0 or b.ndim == 0:
        raise TEError(f"matmul: operands must be at least 1-d, got {a.shape} and {b.shape}")
    from autosched.te.ops.transform import reshape

    a2 = reshape(a, (1, *args.static_shape(a, "matmul"))) if a.ndim == 1 else a
    b2 = reshape(b, (*args.static_shape(b, "matmul"), 1)) if b.ndim == 1 else b
    out = _product(a2, b2, transpose_a and a.ndim > 1, transpose_b and b.ndim > 1, out_dtype,
                   "T_matmul", "matmul", "matmul")
    if a.ndim == 1 or b.ndim == 1:
        shape = list(args.static_shape(out, "matmul"))
        if b.ndim == 1:
            shape.pop(-1)
        if a.ndim == 1:
            shape.pop(-2 if b.ndim > 1 else -1)
        out = reshape(out, tuple(shape))
    return _with_bias(out, bias, "matmul")


def batch_matmul(
    a: Tensor, b: Tensor, transpose_a: bool = False, transpose_b: bool = False,
    out_dtype: str | None = None,
) -> Tensor:
    """out[i, m, n] = sum_k a[i, m, k] * b[i, k, n] for 3-d a (B, M, K) and b (B, K, N)
    ((B, N, K) with ``transpose_b``); a batch dim of 1 broadcasts. Note TVM's default is
    transpose_b=True; here it is False, as in numpy. Compute ``T_batch_matmul``."""
    args.tensor(a, "batch_matmul", "a")
    args.tensor(b, "batch_matmul", "b")
    args.ndim_is(a, 3, "batch_matmul", "a")
    args.ndim_is(b, 3, "batch_matmul", "b")
    return _product(a, b, transpose_a, transpose_b, out_dtype, "T_batch_matmul", "batch_matmul",
                    "batch_matmul")


def panel_matmul(a: Tensor, panels: Tensor, n: int, transpose_a: bool = False) -> Tensor:
    """a (..., M, K) (a 2-d ``a`` may be ``transpose_a``) times a (K, n) matrix stored as
    column panels: ``panels`` (ceil(n / P), K, P) holds column j at ``[j // P, :, j % P]``
    and zeros past column n (graph/passes.pack_gemm_weights packs a constant so). Each step
    of k then reads P contiguous elements, and a register tile of whole vectors can sum
    every column of the last, ragged panel. So the sums ``T_matmul`` (tag ``matmul``, attrs
    ``{"panel": P}``, which the CPU tile rule keeps its vectors inside of) cover all the
    panels' columns, and when n is fewer a stage ``T_matmul_columns`` keeps the first n: the
    padding is summed but never stored. Fused into its reader, the last tile's store is the
    only guarded statement (a masked vector store on CPUs); the multiply-adds run unguarded
    over whole vectors, where a guard inside them kept a 32-column tile over the ragged
    (K, N) weight from staying in registers (19.8 ms against 9.0 for ddddocr's Gemm).

    Example::

        x = te.placeholder((20, 1024), name="x")
        bp = te.placeholder((129, 1024, 64), name="bp")   # 8210 columns in panels of 64
        y = ops.panel_matmul(x, bp, 8210)                  # (20, 8210)
    """
    op = "panel_matmul"
    args.tensor(a, op, "a")
    args.tensor(panels, op, "panels")
    args.same_dtype([a, panels], op)
    args.ndim_is(panels, 3, op, "panels (ceil(n / P), K, P)")
    count, kb, p = args.static_shape(panels, op)
    if a.ndim < 2 or (transpose_a and a.ndim != 2):
        raise TEError(f"{op}: a {a.shape} must be at least 2-d (exactly 2-d when transposed)")
    m, ka = (a.shape[1], a.shape[0]) if transpose_a else (a.shape[-2], a.shape[-1])
    if not args.same_dim(ka, kb) or not 0 < n <= count * p or count != -(-n // p):
        raise TEError(f"{op}: a {a.shape}{' (transposed)' * transpose_a} and panels "
                      f"{panels.shape} do not hold a K={ka} by n={n} product")
    k = reduce_axis((0, ka), name="k")
    lead = tuple(a.shape[:-2])

    def body(*i: Expr) -> Expr:
        row, col = i[-2], i[-1]
        ai = (k, row) if transpose_a else (*i[:-2], row, k)
        return R.sum(a[ai] * panels[col // p, k, col % p], axis=k)

    sums = compute((*lead, m, count * p), body, name="T_matmul", tag="matmul",
                   attrs={"panel": p})
    if n == count * p:
        return sums
    return compute((*lead, m, n), lambda *i: sums[i], name="T_matmul_columns", tag="injective")
