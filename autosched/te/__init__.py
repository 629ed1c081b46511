"""Tensor expressions: declare what to compute (the bottom layer; see docs/ARCHITECTURE.md).

Example::

    from autosched import te
    A = te.placeholder((64, 32), name="A")
    B = te.placeholder((32, 16), name="B")
    k = te.reduce_axis((0, 32), name="k")
    C = te.compute((64, 16), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
"""

from collections.abc import Callable
from typing import Any

from autosched.te.dag import ComputeDAG, workload_key
from autosched.te.expr import (
    Call,
    Cast,
    CommReducer,
    Compare,
    Const,
    Expr,
    IterVar,
    Range,
    Reduce,
    Select,
    TensorRead,
    Var,
    cast,
    const,
    select,
    structural_equal,
)
from autosched.te.intrin import (
    abs,
    all,
    any,
    ceil,
    cos,
    erf,
    exp,
    exp2,
    expm1,
    floor,
    floordiv,
    floormod,
    if_then_else,
    log,
    log1p,
    log2,
    pow,
    round,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    tanh,
    truncdiv,
    truncmod,
)
from autosched.te.reduce import comm_reducer, max, min, prod, sum
from autosched.te.tensor import (
    ComputeOp,
    PlaceholderOp,
    Tensor,
    compute,
    placeholder,
    reduce_axis,
    thread_axis,
    var,
)

# create_schedule(ops): a default schedule for the given output operations (or tensors), the
# spelling TVM users know. Schedules sit in the layer above te, so te only declares the name and
# the root package binds it to autosched.schedule.schedule.create_schedule on import.
create_schedule: Callable[[Any], Any]


__all__ = [
    "Call", "Cast", "CommReducer", "Compare", "ComputeDAG", "ComputeOp", "Const", "Expr",
    "IterVar", "PlaceholderOp", "Range", "Reduce", "Select", "Tensor", "TensorRead", "Var",
    "abs", "all", "any", "cast", "ceil", "comm_reducer", "compute", "const", "cos",
    "create_schedule", "erf", "exp", "exp2", "expm1", "floor", "floordiv", "floormod",
    "if_then_else", "log", "log1p", "log2", "max", "min", "placeholder", "pow", "prod",
    "reduce_axis", "round", "rsqrt", "select", "sigmoid", "sin", "sqrt", "structural_equal",
    "sum", "tanh", "thread_axis", "truncdiv", "truncmod", "var", "workload_key",
]
