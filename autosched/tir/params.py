"""Check a call's arguments against a PrimFunc's parameters and bind its size variables.

Every backend checks its arguments the same way before it runs: the count, then for each
parameter the dtype, the rank and every dimension. A size variable takes its value from the
first parameter that has it as a whole dimension; every dimension is then checked against its
expression. An argument may leave its shape or dtype unknown (None: a raw device pointer), and
is then not checked for it. Each failure is a ``RuntimeError_`` of one line that names the
function and the parameter and sets what was expected against what was given.

Example::

    n = Var("n")
    A = ir.Buffer("A", (n, const(3)), "float32")
    bind_params("f", (A,), [((4, 3), "float32")])      # {n.uid: 4}
    bind_params("f", (A,), [((4, 2), "float32")])
    # RuntimeError_: f: parameter A expects shape (n, 3), given (4, 2): dimension 1 should be 3
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from autosched.errors import RuntimeError_
from autosched.te import expr as E
from autosched.te.visit import free_vars
from autosched.tir import ir
from autosched.tir.evaluate import eval_int

#: What one argument tells of itself: its shape and its dtype, each None where it does not say.
Given = tuple[Sequence[int] | None, Any]


def bind_params(func_name: str, params: Sequence[ir.Buffer], given: Sequence[Given]
                ) -> dict[int, int]:
    """Check ``given`` (one (shape, dtype) per parameter) against ``params``; the value of each
    size variable: {variable uid: size}."""
    check_count(func_name, params, len(given))
    bound_by: dict[int, str] = {}
    env: dict[int, int] = {}
    for buf, (shape, dtype) in zip(params, given):
        if dtype is not None and np.dtype(dtype) != np.dtype(buf.dtype):
            raise mismatch(func_name, buf, f"dtype {buf.dtype}", f"dtype {np.dtype(dtype)}")
        if shape is None:
            continue
        if len(shape) != len(buf.shape):
            raise mismatch(func_name, buf, f"shape {shape_str(buf.shape)}",
                           f"{_given_str(shape)}: rank {len(shape)}, not {len(buf.shape)}")
        for dim, n in zip(buf.shape, shape):
            if isinstance(dim, E.Var) and dim.uid not in env:
                env[dim.uid] = int(n)
                bound_by[dim.uid] = buf.name
    for buf, (shape, _) in zip(params, given):
        _check_dims(func_name, buf, shape, env, bound_by)
    return env


def _check_dims(func_name: str, buf: ir.Buffer, shape: Sequence[int] | None,
                env: dict[int, int], bound_by: dict[int, str]) -> None:
    """Check each dimension of ``shape`` against its expression in ``buf.shape``, and that
    every variable of them is bound even where the argument gave no shape."""
    unbound = sorted({v.name for d in buf.shape for v in free_vars(d) if v.uid not in env})
    if unbound:
        raise mismatch(func_name, buf, f"shape {shape_str(buf.shape)}",
                       f"{_given_str(shape)}: no argument gives {', '.join(unbound)}")
    for d, (dim, n) in enumerate(zip(buf.shape, shape or ())):
        want = eval_int(dim, env)
        if want != n:
            raise mismatch(func_name, buf, f"shape {shape_str(buf.shape)}",
                           f"{_given_str(shape)}: dimension {d} should be "
                           f"{_dim_str(dim, want, env, bound_by)}")


def bind_arrays(func_name: str, params: Sequence[ir.Buffer], arrays: Sequence[Any],
                written: Collection[int], contiguous: bool = True) -> dict[int, int]:
    """``bind_params`` for numpy arrays, then ``check_array`` on each (``written``: the uids of
    the parameters the function writes)."""
    check_count(func_name, params, len(arrays))
    for buf, arr in zip(params, arrays):
        if not isinstance(arr, np.ndarray):
            raise mismatch(func_name, buf, "a numpy array", f"a {type(arr).__name__}")
    env = bind_params(func_name, params, [(arr.shape, arr.dtype) for arr in arrays])
    for buf, arr in zip(params, arrays):
        check_array(func_name, buf, arr, buf.uid in written, contiguous)
    return env


def check_array(func_name: str, buf: ir.Buffer, arr: np.ndarray, written: bool,
                contiguous: bool = True) -> None:
    """Check that a host array can be passed as it is: C-contiguous (where ``contiguous``; a
    backend that copies strided arrays passes False) and writable where the function writes."""
    if contiguous and not arr.flags.c_contiguous:
        raise mismatch(func_name, buf, "a C-contiguous array",
                       f"strides {arr.strides} (use np.ascontiguousarray)")
    if written and not arr.flags.writeable:
        raise mismatch(func_name, buf, "a writable array (the function writes it)",
                       "a read-only one")


def check_count(func_name: str, params: Sequence[ir.Buffer], count: int) -> None:
    """Check that a call passes one argument per parameter."""
    if count != len(params):
        names = ", ".join(b.name for b in params)
        raise RuntimeError_(
            f"{func_name} takes {len(params)} arguments ({names}), given {count}"
        )


def mismatch(func_name: str, buf: ir.Buffer, expected: str, given: str) -> RuntimeError_:
    """The one wording of an argument that does not fit its parameter."""
    return RuntimeError_(f"{func_name}: parameter {buf.name} expects {expected}, given {given}")


def shape_str(shape: Sequence[Any]) -> str:
    """A shape as Python writes a tuple: ``(n, 3)``, ``(4,)``."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _given_str(shape: Sequence[int] | None) -> str:
    return "no shape" if shape is None else shape_str(tuple(int(n) for n in shape))


def _dim_str(dim: E.Expr, want: int, env: dict[int, int], bound_by: dict[int, str]) -> str:
    if isinstance(dim, E.Const):
        return str(want)
    if isinstance(dim, E.Var):
        return f"{dim.name} = {want} (from parameter {bound_by[dim.uid]})"
    bound = ", ".join(f"{v.name} = {env[v.uid]} from parameter {bound_by[v.uid]}"
                      for v in sorted(free_vars(dim), key=lambda v: v.name))
    return f"{dim} = {want} ({bound})"
