"""A direct numpy interpreter of TE graphs, independent of scheduling and lowering.

Each ComputeOp is evaluated over its whole index space at once: data axes and reduce axes become
broadcast numpy index arrays, a compute body becomes array arithmetic, a reduction folds the
reduce dims. It is an oracle for the operator tests: no loop IR, no backend, no shared code with
either. ``te.if_then_else`` keeps its lazy meaning: a read under a false condition may be out of
bounds (its indices are clamped and the value discarded), while an out-of-bounds read under a
true condition raises IndexError naming the tensor, so the oracle catches bad index arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autosched.te import expr as E
from autosched.te.dag import topo_ops
from autosched.te.opcodes import Op
from autosched.te.tensor import ComputeOp, PlaceholderOp, Tensor

_erf = np.vectorize(math.erf, otypes=[np.float64])

_CALLS = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "sin": np.sin, "cos": np.cos, "log2": np.log2,
    "exp2": np.exp2, "log1p": np.log1p, "expm1": np.expm1, "abs": np.abs,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": lambda x: _erf(x).astype(x.dtype),
}


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
    return np.where((a < 0) == (b < 0), q, -q).astype(np.result_type(a, b))


_BINARY = {
    Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.true_divide,
    Op.FLOORDIV: lambda a, b: np.floor_divide(a, np.where(b == 0, 1, b)),
    Op.FLOORMOD: lambda a, b: np.mod(a, np.where(b == 0, 1, b)),
    Op.TRUNCDIV: _trunc_div,
    Op.TRUNCMOD: lambda a, b: a - _trunc_div(a, b) * b,
    Op.MIN: np.minimum, Op.MAX: np.maximum, Op.POW: np.power,
    Op.AND: np.logical_and, Op.OR: np.logical_or,
}
_COMPARE = {Op.EQ: np.equal, Op.NE: np.not_equal, Op.LT: np.less, Op.LE: np.less_equal,
            Op.GT: np.greater, Op.GE: np.greater_equal}
_REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}


class _Eval:
    def __init__(self, values: dict[int, np.ndarray], env: dict[int, np.ndarray]):
        self.values = values  # op uid -> array
        self.env = env  # var uid -> index array

    def __call__(self, e: E.Expr, mask: Any) -> np.ndarray:
        dtype = np.dtype(e.dtype)
        if isinstance(e, E.Const):
            return np.array(e.value, dtype=dtype)
        if isinstance(e, E.Var):
            return self.env[e.uid]
        if isinstance(e, E.Binary):
            a, b = self(e.a, mask), self(e.b, mask)
            return np.asarray(_BINARY[e.op](a, b)).astype(dtype, copy=False)
        if isinstance(e, E.Compare):
            return np.asarray(_COMPARE[e.op](self(e.a, mask), self(e.b, mask)))
        if isinstance(e, E.Not):
            return np.logical_not(self(e.a, mask))
        if isinstance(e, E.Select):
            c = self(e.cond, mask)
            t = self(e.true_value, np.logical_and(mask, c))
            f = self(e.false_value, np.logical_and(mask, np.logical_not(c)))
            return np.where(c, t, f).astype(dtype, copy=False)
        if isinstance(e, E.Cast):
            v = self(e.value, mask)
            if np.issubdtype(dtype, np.integer) and np.issubdtype(v.dtype, np.floating):
                v = np.where(np.asarray(mask), v, 0)  # garbage under a false guard may be inf
            return np.asarray(v).astype(dtype)
        if isinstance(e, E.Call):
            return np.asarray(_CALLS[e.name](*[self(a, mask) for a in e.args])).astype(dtype)
        if isinstance(e, E.TensorRead):
            return self.read(e, mask)
        raise TypeError(f"te_interp: cannot evaluate {type(e).__name__}: {e}")

    def read(self, e: E.TensorRead, mask: Any) -> np.ndarray:
        data = self.values[e.tensor.op.uid]
        idx = [np.asarray(self(i, mask)).astype(np.int64) for i in e.indices]
        full = np.broadcast_shapes(np.shape(mask), *[i.shape for i in idx])
        live = np.broadcast_to(mask, full)
        for d, i in enumerate(idx):
            bad = np.logical_and(live, np.logical_or(i < 0, i >= data.shape[d]))
            if bad.any():
                where = np.argwhere(bad)[0]
                raise IndexError(
                    f"te_interp: read of {e.tensor.name} {data.shape} out of bounds on dim {d}: "
                    f"index {np.broadcast_to(i, full)[tuple(where)]} (expression {e})"
                )
        clipped = tuple(np.clip(i, 0, max(n - 1, 0)) for i, n in zip(idx, data.shape))
        return data[clipped] if clipped else data[()]


def _compute(op: ComputeOp, values: dict[int, np.ndarray]) -> np.ndarray:
    shape = [int(a.dom.extent.value) for a in op.axis]
    body = op.body
    raxes = list(body.axis) if isinstance(body, E.Reduce) else []
    rshape = [int(a.dom.extent.value) for a in raxes]
    rmins = [int(a.dom.min.value) for a in raxes]
    rank = len(shape) + len(raxes)
    env: dict[int, np.ndarray] = {}
    for d, (iv, n) in enumerate(zip(list(op.axis) + raxes, shape + rshape)):
        view = [1] * rank
        view[d] = n
        lo = rmins[d - len(shape)] if d >= len(shape) else 0
        env[iv.var.uid] = (np.arange(n, dtype=np.int64) + lo).astype(iv.var.dtype).reshape(view)
    ev = _Eval(values, env)
    full = tuple(shape + rshape)
    if not isinstance(body, E.Reduce):
        return np.broadcast_to(ev(body, np.ones((1,) * rank, bool)), full).copy()
    cond = np.ones((1,) * rank, bool)
    if body.condition is not None:
        cond = np.broadcast_to(ev(body.condition, cond), full)
    src = np.broadcast_to(ev(body.source, cond), full)
    ident = ev(body.combiner.identity, cond)
    src = np.where(cond, src, ident).astype(body.dtype)
    axes = tuple(range(len(shape), rank))
    name = body.combiner.name
    if name in _REDUCE:
        out = _REDUCE[name](src, axis=axes, dtype=src.dtype) if name in ("sum", "prod") else (
            _REDUCE[name](src, axis=axes))
    else:  # a custom combiner: fold it over the flattened reduce dims
        flat = src.reshape(tuple(shape) + (-1,))
        acc = np.broadcast_to(ident, tuple(shape)).astype(body.dtype)
        comb = body.combiner
        for k in range(flat.shape[-1]):
            fold = _Eval(values, {comb.lhs.uid: acc, comb.rhs.uid: flat[..., k]})
            acc = np.asarray(fold(comb.result, True)).astype(body.dtype)
        out = acc
    if body.init is not None:
        init = np.broadcast_to(_Eval(values, env)(body.init, True), full)[..., *([0] * len(raxes))]
        comb = body.combiner
        fold = _Eval(values, {comb.lhs.uid: init, comb.rhs.uid: out})
        out = fold(comb.result, True)
    return np.asarray(out).astype(body.dtype)


def evaluate(outputs: Tensor | list[Tensor], inputs: dict[Tensor, np.ndarray]) -> list[np.ndarray]:
    """Values of ``outputs`` given arrays for the placeholders they read."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    values: dict[int, np.ndarray] = {}
    for t, a in inputs.items():
        arr = np.asarray(a)
        if arr.dtype != np.dtype(t.dtype) or arr.shape != tuple(t.shape):
            raise ValueError(f"te_interp: input {t.name} wants {t.dtype}{tuple(t.shape)}, "
                             f"got {arr.dtype}{arr.shape}")
        values[t.op.uid] = arr
    with np.errstate(all="ignore"):
        for op in topo_ops(outs):
            if isinstance(op, PlaceholderOp):
                if op.uid not in values:
                    raise ValueError(f"te_interp: no array for placeholder {op.name}")
                continue
            values[op.uid] = _compute(op, values)
    return [values[t.op.uid] for t in outs]
