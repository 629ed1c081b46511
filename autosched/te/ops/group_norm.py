"""Group normalization (ONNX GroupNormalization): statistics over each group of channels and
all spatial positions, then a per-channel scale and bias.

Example::

    from autosched import te
    from autosched.te.ops.group_norm import group_norm
    x = te.placeholder((2, 6, 5, 7), name="x")
    g, b = te.placeholder((6,), name="g"), te.placeholder((6,), name="b")
    y = group_norm(x, g, b, groups=3)               # (2, 6, 5, 7)
"""

from __future__ import annotations

from autosched.errors import TEError
from autosched.te import intrin as I
from autosched.te.expr import Expr, cast
from autosched.te.ops import args
from autosched.te.ops.reduction import mean
from autosched.te.ops.tags import BROADCAST, ELEMWISE
from autosched.te.ops.transform import reshape
from autosched.te.tensor import Tensor, compute


def group_norm(x: Tensor, scale: Tensor, bias: Tensor, groups: int, eps: float = 1e-5,
               stat_dtype: str = "float32") -> Tensor:
    """(x - mean) / sqrt(var + eps) * scale[c] + bias[c] over groups of C / groups channels;
    the statistics in ``stat_dtype`` (float32 for float16 inputs, as ONNX's stash_type)."""
    args.tensor(x, "group_norm")
    args.float_dtype(x, "group_norm")
    shape = args.static_shape(x, "group_norm")
    if len(shape) < 2 or groups < 1 or shape[1] % groups:
        raise TEError(f"group_norm: channels of {x.name} {shape} are not a multiple of "
                      f"{groups} groups")
    for t in (scale, bias):
        if args.static_shape(t, "group_norm") != (shape[1],):
            raise TEError(f"group_norm: {t.name} {t.shape} must have one value per channel "
                          f"({shape[1]})")
    n, c = shape[0], shape[1]
    xs = x if x.dtype == stat_dtype else compute(
        shape, lambda *i: cast(stat_dtype, x[i]), name="T_group_norm_cast", tag=ELEMWISE)
    grouped = reshape(xs, (n, groups, args.prod(shape[1:]) // groups))
    mu = mean(grouped, axis=2, keepdims=True)
    centered = compute(grouped.shape, lambda a, g, k: grouped[a, g, k] - mu[a, g, 0],
                       name="T_group_norm_center", tag=BROADCAST)
    var = mean(compute(grouped.shape, lambda *i: centered[i] * centered[i],
                       name="T_group_norm_square", tag=ELEMWISE), axis=2, keepdims=True)
    per_group = c // groups
    inner = args.prod(shape[2:])

    def body(*i: Expr) -> Expr:
        g = I.floordiv(i[1], per_group)
        k = I.floormod(i[1], per_group) * inner + _flat(i[2:], shape[2:])
        y = centered[i[0], g, k] * I.rsqrt(var[i[0], g, 0] + eps)
        y = y if y.dtype == x.dtype else cast(x.dtype, y)
        return y * scale[i[1]] + bias[i[1]]

    return compute(shape, body, name="T_group_norm", tag=BROADCAST)


def _flat(index: tuple[Expr, ...], dims: tuple[int, ...]) -> Expr | int:
    """Row-major offset of ``index`` in ``dims``."""
    out: Expr | int = 0
    for v, d in zip(index, dims):
        out = out * d + v
    return out
