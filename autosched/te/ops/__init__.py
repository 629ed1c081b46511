"""The operator library: TE builders for the operators of common models (TVM topi's names).

Every operator takes and returns ``te.Tensor`` values built with te.compute / te.reduce_axis,
so its result can be scheduled, fused and tuned like a hand-written compute. Stages carry tags
(see ``tags.py``) that the auto-scheduler reads as hints. Bad arguments raise TEError naming
the operator and the values.

Example::

    from autosched import te
    from autosched.te import ops
    x = te.placeholder((1, 3, 32, 32), name="x")
    w = te.placeholder((8, 3, 3, 3), name="w")
    y = ops.relu(ops.conv2d_nchw(x, w, stride=1, padding=1))
    z = ops.global_avg_pool2d(y)                    # (1, 8, 1, 1)
"""

from autosched.te.ops import tags
from autosched.te.ops.broadcast import (
    add,
    binary_op,
    broadcast_shape,
    broadcast_to,
    divide,
    equal,
    floor_divide,
    floor_mod,
    greater,
    greater_equal,
    less,
    less_equal,
    logical_and,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    mod,
    multiply,
    not_equal,
    power,
    subtract,
    where,
)
from autosched.te.ops.conv import (
    conv2d_nchw,
    conv2d_nhwc,
    conv2d_transpose_nchw,
    depthwise_conv2d_nchw,
    im2col,
)
from autosched.te.ops.elemwise import (
    abs,
    cast,
    ceil,
    clip,
    cos,
    elu,
    erf,
    exp,
    exp2,
    expm1,
    floor,
    gelu,
    hard_sigmoid,
    hard_swish,
    identity,
    leaky_relu,
    log,
    log1p,
    log2,
    logical_not,
    negative,
    prelu,
    reciprocal,
    relu,
    round,
    rsqrt,
    selu,
    sigmoid,
    sign,
    sin,
    softplus,
    softsign,
    sqrt,
    square,
    tanh,
    unary,
)
from autosched.te.ops.matmul import batch_matmul, dense, matmul, panel_matmul
from autosched.te.ops.norm import (
    batch_norm_inference,
    instance_norm,
    layer_norm,
    log_softmax,
    softmax,
)
from autosched.te.ops.pool import avg_pool2d, global_avg_pool2d, global_max_pool2d, max_pool2d
from autosched.te.ops.reduction import argmax, argmin, max, mean, min, prod, sum
from autosched.te.ops.resize import resize2d
from autosched.te.ops.transform import (
    concat,
    concatenate,
    expand_dims,
    flatten,
    gather,
    pad,
    reshape,
    split,
    squeeze,
    strided_slice,
    take,
    transpose,
)
from autosched.te.ops.winograd import (
    winograd_input,
    winograd_matrices,
    winograd_output,
    winograd_weight,
)

neg = negative

__all__ = [
    "abs", "add", "argmax", "argmin", "avg_pool2d", "batch_matmul", "batch_norm_inference",
    "binary_op", "broadcast_shape", "broadcast_to", "cast", "ceil", "clip", "concat",
    "concatenate", "conv2d_nchw", "conv2d_nhwc", "conv2d_transpose_nchw", "im2col", "cos", "dense",
    "depthwise_conv2d_nchw", "divide", "elu", "equal", "erf", "exp", "exp2", "expand_dims",
    "expm1", "flatten", "floor", "floor_divide", "floor_mod", "gather", "gelu",
    "global_avg_pool2d", "global_max_pool2d", "greater", "greater_equal", "hard_sigmoid",
    "hard_swish", "identity", "instance_norm", "layer_norm", "leaky_relu", "less", "less_equal",
    "log", "log1p", "log2", "log_softmax", "logical_and", "logical_not", "logical_or",
    "logical_xor", "matmul", "max", "max_pool2d", "maximum", "mean", "min", "minimum", "mod",
    "multiply", "neg", "negative", "not_equal", "pad", "panel_matmul", "power", "prelu", "prod",
    "reciprocal", "relu", "reshape", "resize2d", "round", "rsqrt", "selu", "sigmoid", "sign",
    "sin", "softmax", "softplus", "softsign", "split", "sqrt", "square", "squeeze", "strided_slice",
    "sub", "subtract", "sum", "tags", "take", "tanh", "transpose", "unary", "where",
    "winograd_input", "winograd_matrices", "winograd_output", "winograd_weight",
]

sub = subtract
