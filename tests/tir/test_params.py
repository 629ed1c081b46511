"""Binding a call's arguments to a PrimFunc's parameters (autosched/tir/params.py): the sizes
bound, and one exact message for each kind of mismatch."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autosched.errors import RuntimeError_
from autosched.te.expr import Var, as_expr
from autosched.tir import ir
from autosched.tir.params import bind_arrays, bind_params

n, m = Var("n"), Var("m")


def buf(name: str, *shape: object, dtype: str = "float32") -> ir.Buffer:
    return ir.Buffer(name, tuple(as_expr(d) for d in shape), dtype)


A, B, C = buf("A", n, 3), buf("B", n * 2, m), buf("C", m, dtype="int32")
PARAMS = (A, B, C)


def fails(given: list, message: str) -> None:
    with pytest.raises(RuntimeError_, match=f"^{re.escape(message)}$"):
        bind_params("f", PARAMS, given)


def test_sizes_bind_from_the_first_parameter_that_has_them() -> None:
    env = bind_params("f", PARAMS, [((5, 3), "float32"), ((10, 7), "float32"), ((7,), "int32")])
    assert env == {n.uid: 5, m.uid: 7}


def test_unknown_shapes_and_dtypes_are_not_checked() -> None:
    env = bind_params("f", PARAMS, [((5, 3), None), (None, None), ((7,), np.dtype("int32"))])
    assert env == {n.uid: 5, m.uid: 7}


def test_count() -> None:
    fails([((5, 3), "float32")], "f takes 3 arguments (A, B, C), given 1")


def test_dtype() -> None:
    fails([((5, 3), "float64"), ((10, 7), None), ((7,), None)],
          "f: parameter A expects dtype float32, given dtype float64")


def test_rank() -> None:
    fails([((15,), None), ((10, 7), None), ((7,), None)],
          "f: parameter A expects shape (n, 3), given (15,): rank 1, not 2")


def test_constant_dimension() -> None:
    fails([((5, 4), None), ((10, 7), None), ((7,), None)],
          "f: parameter A expects shape (n, 3), given (5, 4): dimension 1 should be 3")


def test_inconsistent_variable() -> None:
    fails([((5, 3), None), ((10, 7), None), ((8,), None)],
          "f: parameter C expects shape (m,), given (8,): dimension 0 should be m = 7 "
          "(from parameter B)")


def test_expression_dimension() -> None:
    fails([((5, 3), None), ((11, 7), None), ((7,), None)],
          f"f: parameter B expects shape ({n * 2}, m), given (11, 7): dimension 0 should be "
          f"{n * 2} = 10 (n = 5 from parameter A)")


def test_missing_variable_is_named() -> None:
    fails([(None, None), ((10, 7), None), ((7,), None)],
          "f: parameter A expects shape (n, 3), given no shape: no argument gives n")
    only_expr = buf("D", n + 1)
    with pytest.raises(RuntimeError_, match=r"^g: parameter D .*given \(4,\): no argument gives n$"):
        bind_params("g", (only_expr,), [((4,), None)])


def test_arrays_are_checked_for_type_contiguity_and_writability(rng) -> None:
    a = rng.uniform(-1, 1, (5, 3)).astype("float32")
    b = rng.uniform(-1, 1, (10, 7)).astype("float32")
    c = rng.integers(1, 9, 7).astype("int32")
    assert bind_arrays("f", PARAMS, (a, b, c), written={C.uid}) == {n.uid: 5, m.uid: 7}
    with pytest.raises(RuntimeError_, match=r"^f: parameter A expects a numpy array, given a list$"):
        bind_arrays("f", PARAMS, (a.tolist(), b, c), written={C.uid})
    with pytest.raises(RuntimeError_, match=r"^f: parameter B expects a C-contiguous array, given "
                                            r"strides \(4, 40\)"):
        bind_arrays("f", PARAMS, (a, np.asfortranarray(b), c), written={C.uid})
    assert bind_arrays("f", PARAMS, (a, np.asfortranarray(b), c), written={C.uid},
                       contiguous=False) == {n.uid: 5, m.uid: 7}
    c.flags.writeable = False
    bind_arrays("f", PARAMS, (a, b, c), written={B.uid})
    with pytest.raises(RuntimeError_, match=r"^f: parameter C expects a writable array \(the "
                                            r"function writes it\), given a read-only one$"):
        bind_arrays("f", PARAMS, (a, b, c), written={C.uid})
