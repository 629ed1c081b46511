"""Normalisations: softmax, log_softmax, layer_norm, instance_norm, batch_norm_inference.

Statistics are reductions (tag ``reduce``) followed by elementwise stages, so a schedule can
fuse them. softmax subtracts the max before exponentiating (no overflow); norms compute the
variance in two passes, sum((x - mean)^2) / n, which stays accurate when |mean| >> std.

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((2, 5, 16), name="x")
    g = te.placeholder((16,), name="gamma")
    b = te.placeholder((16,), name="beta")
    y = ops.layer_norm(x, g, b, axis=-1, eps=1e-5)
    p = ops.softmax(x, axis=1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autosched.errors import TEError
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr
from autosched.te.ops import args
from autosched.te.ops.reduction import reduce
from autosched.te.ops.tags import BROADCAST, ELEMWISE
from autosched.te.tensor import Tensor, compute


def _kept(i: Sequence[Expr], axes: tuple[int, ...]) -> tuple[Any, ...]:
    """Index a keepdims statistic: reduced axes read position 0."""
    return tuple(0 if d in axes else v for d, v in enumerate(i))


def _shifted_exp(x: Tensor, ax: int, op: str) -> tuple[Tensor, Tensor, Tensor]:
    args.tensor(x, op)
    args.float_dtype(x, op)
    peak = reduce(x, ax, True, R.max, f"T_{op}_maxelem", op)
    e = compute(x.shape, lambda *i: I.exp(x[i] - peak[_kept(i, (ax,))]),
                name=f"T_{op}_exp", tag=BROADCAST)
    total = reduce(e, ax, True, R.sum, f"T_{op}_expsum", op)
    return peak, e, total


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along ``axis``: stages ``T_softmax_maxelem``,
    ``T_softmax_exp``, ``T_softmax_expsum``, ``T_softmax_norm``."""
    args.tensor(x, "softmax")
    ax = args.axis(axis, x.ndim, "softmax")
    _, e, total = _shifted_exp(x, ax, "softmax")
    return compute(x.shape, lambda *i: e[i] / total[_kept(i, (ax,))], name="T_softmax_norm",
                   tag=BROADCAST)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """x - max - log(sum(exp(x - max))) along ``axis``."""
    args.tensor(x, "log_softmax")
    ax = args.axis(axis, x.ndim, "log_softmax")
    peak, _, total = _shifted_exp(x, ax, "log_softmax")

    def body(*i: Expr) -> Expr:
        k = _kept(i, (ax,))
        return x[i] - peak[k] - I.log(total[k])

    return compute(x.shape, body, name="T_log_softmax", tag=BROADCAST)


def moments(x: Tensor, axes: tuple[int, ...], op: str) -> tuple[Tensor, Tensor]:
    """Mean and (biased) variance over ``axes``, both with the reduced axes kept as size 1."""
    n = args.prod([args.static_shape(x, op)[d] for d in axes])
    total = reduce(x, axes, True, R.sum, f"T_{op}_sum", op)
    mean = compute(total.shape, lambda *i: total[i] * (1.0 / n), name=f"T_{op}_mean",
                   tag=ELEMWISE)

    def dev2(*i: Expr) -> Expr:
        d = x[i] - mean[_kept(i, axes)]
        return d * d

    sq = compute(x.shape, dev2, name=f"T_{op}_dev2", tag=BROADCAST)
    sq_total = reduce(sq, axes, True, R.sum, f"T_{op}_sqsum", op)
    var = compute(sq_total.shape, lambda *i: sq_total[i] * (1.0 / n), name=f"T_{op}_var",
                  tag=ELEMWISE)
    return mean, var


def _affine_param(p: Tensor | None, shape: tuple[Any, ...], what: str, op: str,
                  x: Tensor, required: bool = False) -> Tensor | None:
    if p is None:
        if required:
            raise TEError(f"{op}: {what} is required")
        return None
    args.tensor(p, op, what)
    if tuple(p.shape) != tuple(shape):
        raise TEError(f"{op}: {what} {p.name} has shape {p.shape}, expected {shape} (the "
                      f"normalised dims of {x.name} {x.shape})")
    if p.dtype != x.dtype:
        raise TEError(f"{op}: {what} {p.name} is {p.dtype} but {x.name} is {x.dtype}")
    return p


def layer_norm(
    x: Tensor, gamma: Tensor | None, beta: Tensor | None, axis: int | Sequence[int] = -1,
    eps: float = 1e-5,
) -> Tensor:
    """(x - mean) / sqrt(var + eps) * gamma + beta, statistics over ``axis`` (an int or a tuple;
    an int is that one axis, as TVM: ONNX's axis=k means the tuple (k, ..., ndim-1)).
    gamma and beta (or None) have the shape of the normalised dims, in order."""
    op = "layer_norm"
    args.tensor(x, op)
    args.float_dtype(x, op)
    axes = args.axes(axis, x.ndim, op)
    shape = tuple(x.shape[d] for d in axes)
    g = _affine_param(gamma, shape, "gamma", op, x)
    b = _affine_param(beta, shape, "beta", op, x)
    mean, var = moments(x, axes, op)

    def body(*i: Expr) -> Expr:
        k = _kept(i, axes)
        y = (x[i] - mean[k]) * I.rsqrt(var[k] + eps)
        p = tuple(i[d] for d in axes)
        if g is not None:
            y = y * g[p]
        return y + b[p] if b is not None else y

    return compute(x.shape, body, name="T_layer_norm", tag=BROADCAST)


def instance_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    """ONNX InstanceNormalization for (N, C, ...): statistics per (n, c) over the spatial dims,
    then * gamma[c] + beta[c]."""
    op = "instance_norm"
    args.tensor(x, op)
    args.float_dtype(x, op)
    if x.ndim < 3:
        raise TEError(f"{op}: needs (N, C, spatial...) input, got {x.shape}")
    axes = tuple(range(2, x.ndim))
    g = _affine_param(gamma, (x.shape[1],), "gamma", op, x, required=True)
    b = _affine_param(beta, (x.shape[1],), "beta", op, x, required=True)
    assert g is not None and b is not None  # for the type checker: required=True raised
    mean, var = moments(x, axes, op)

    def body(*i: Expr) -> Expr:
        k = _kept(i, axes)
        return (x[i] - mean[k]) * I.rsqrt(var[k] + eps) * g[i[1]] + b[i[1]]

    return compute(x.shape, body, name="T_instance_norm", tag=BROADCAST)


def batch_norm_inference(
    x: Tensor, gamma: Tensor, beta: Tensor, mean: Tensor, var: Tensor, eps: float = 1e-5,
    axis: int = 1,
) -> Tensor:
    """(x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c], c the index along ``axis``;
    the four parameters are 1-d of length x.shape[axis] (ONNX BatchNormalization, inference).
    One broadcast stage ``T_batch_norm``."""
    op = "batch_norm_inference"
    args.tensor(x, op)
    args.float_dtype(x, op)
    ax = args.axis(axis, x.ndim, op)
    params = [_affine_param(p, (x.shape[ax],), what, op, x, required=True)
              for p, what in ((gamma, "gamma"), (beta, "beta"), (mean, "mean"), (var, "var"))]
    g, b, m, v = params
    assert g is not None and b is not None and m is not None and v is not None  # required

    def body(*i: Expr) -> Expr:
        c = i[ax]
        return (x[i] - m[c]) * I.rsqrt(v[c] + eps) * g[c] + b[c]

    return compute(x.shape, body, name="T_batch_norm", tag=BROADCAST)
