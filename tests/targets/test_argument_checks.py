"""Every backend checks a call's arguments the same way (autosched/tir/params.py) and words
each mismatch the same: the count, dtype, rank, constant and symbolic dimensions, contiguity and
writability, on the reference evaluator, the CPU backend and CUDA C emulated on the host."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import RuntimeError_
from autosched.targets.cuda.host_emulate import unavailable
from tests.support.backends import garbage, random_array
from tests.support.nvrtc import NVRTC_SKIP

CUDA_HOST = pytest.param(
    "cuda -emulate=host",
    marks=pytest.mark.skipif(NVRTC_SKIP is not None or unavailable() is not None,
                             reason=str(NVRTC_SKIP or unavailable())),
)
TARGETS = ["ref", "llvm", CUDA_HOST]

Arrays = tuple[np.ndarray, ...]


def _add(target: str):  # noqa: ANN202
    """C[n, 6] = A[n, 6] + B[6], built for ``target``."""
    n = te.var("n")
    A = te.placeholder((n, 6), name="A")
    B = te.placeholder((6,), name="B")
    C = te.compute((n, 6), lambda i, j: A[i, j] + B[j], name="C")
    return aus.build(te.create_schedule(C.op), [A, B, C], target=target)


def _inputs(rng: np.random.Generator, rows: int = 4) -> Arrays:
    return random_array(rng, (rows, 6)), random_array(rng, (6,)), garbage((rows, 6), "float32")


def _read_only(c: np.ndarray) -> np.ndarray:
    c.flags.writeable = False
    return c


FAILURES: list[tuple[str, Callable[[Arrays], Arrays], str]] = [
    ("count", lambda x: x[:2], "takes 3 arguments (A, B, C), given 2"),
    ("dtype", lambda x: (x[0].astype("float64"), x[1], x[2]),
     ": parameter A expects dtype float32, given dtype float64"),
    ("rank", lambda x: (x[0], x[1].reshape(2, 3), x[2]),
     ": parameter B expects shape (6,), given (2, 3): rank 2, not 1"),
    ("constant dimension", lambda x: (x[0], np.ones(5, "float32"), x[2]),
     ": parameter B expects shape (6,), given (5,): dimension 0 should be 6"),
    ("inconsistent variable", lambda x: (x[0], x[1], garbage((5, 6), "float32")),
     ": parameter C expects shape (n, 6), given (5, 6): dimension 0 should be n = 4 "
     "(from parameter A)"),
    ("read-only output", lambda x: (x[0], x[1], _read_only(x[2])),
     ": parameter C expects a writable array (the function writes it), given a read-only one"),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind,bad,message", FAILURES, ids=[f[0] for f in FAILURES])
def test_mismatch_names_parameter_expected_and_given(target, kind, bad, message, rng) -> None:
    mod = _add(target)
    with pytest.raises(RuntimeError_, match=re.escape(message) + "$"):
        mod(*bad(_inputs(rng)))


@pytest.mark.parametrize("target", ["llvm", CUDA_HOST])
def test_strided_array_is_rejected_where_it_would_be_passed_as_is(target, rng) -> None:
    a, b, c = _inputs(rng)
    with pytest.raises(RuntimeError_, match=r": parameter A expects a C-contiguous array, given "
                                            r"strides \(4, 16\) \(use np.ascontiguousarray\)$"):
        _add(target)(np.asfortranarray(a), b, c)


def test_reference_evaluator_copies_strided_arrays_in_and_out(rng) -> None:
    a, b, _ = _inputs(rng)
    c = np.asfortranarray(garbage((4, 6), "float32"))
    _add("ref")(np.asfortranarray(a), b, c)
    np.testing.assert_allclose(c, a + b, rtol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_host_backends_take_numpy_arrays(target, rng) -> None:
    a, b, c = _inputs(rng)
    with pytest.raises(RuntimeError_, match=r": parameter B expects a numpy array, given a list$"):
        _add(target)(a, b.tolist(), c)


@pytest.mark.parametrize("target", TARGETS)
def test_symbolic_rows_run(target, rng) -> None:
    for rows in (1, 7):
        a, b, c = _inputs(rng, rows)
        _add(target)(a, b, c)
        np.testing.assert_allclose(c, a + b, rtol=1e-6)
