"""Einsum and GroupNormalization against onnxruntime on fresh random inputs (llvm, through the
graph compiler)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from autosched import te  # noqa: E402
from autosched.errors import TEError  # noqa: E402
from autosched.te.ops.einsum import einsum  # noqa: E402
from tests.support.onnx_node import compare, rand  # noqa: E402

EQUATIONS = [
    ("ij,jk->ik", [(5, 7), (7, 3)]),              # matmul
    ("bij,bjk->bik", [(2, 5, 7), (2, 7, 3)]),     # batch matmul
    ("...ij,...jk", [(3, 2, 5, 7), (3, 1, 7, 3)]),  # broadcast batch, implicit output
    ("ij->ji", [(5, 7)]),                         # transpose
    ("bhqd,bhkd->bhqk", [(1, 2, 5, 3), (1, 2, 6, 3)]),  # attention scores
    ("ij->i", [(5, 7)]),                          # row sums
    ("ii->i", [(5, 5)]),                          # diagonal
    ("ii", [(5, 5)]),                             # trace
    ("i,j->ij", [(5,), (3,)]),                    # outer product
    ("i,i", [(7,), (7,)]),                        # dot
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),  # bilinear
]


@pytest.mark.parametrize("equation,shapes", EQUATIONS)
def test_einsum(equation: str, shapes: list[tuple]) -> None:
    names = [f"x{k}" for k in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    compare(node, {n: rand(s) for n, s in zip(names, shapes)}, atol=1e-4)


def test_einsum_bad_equation_names_it() -> None:
    a = te.placeholder((2, 3), name="a")
    with pytest.raises(TEError, match="'ij,jk->ik' has 2 operands"):
        einsum("ij,jk->ik", a)
    with pytest.raises(TEError, match="label 'j'.*is 3 in one operand and 4"):
        einsum("ij,jk->ik", a, te.placeholder((4, 5), name="b"))


@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 7), 3), ((1, 4, 9), 4), ((3, 8, 2, 3), 1)])
def test_group_norm(shape: tuple, groups: int) -> None:
    c = shape[1]
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups,
                            epsilon=1e-3)
    compare(node, {"x": rand(shape) * 3 + 1, "s": rand((c,)), "b": rand((c,))}, atol=1e-4)


def test_group_norm_opset18_per_group_scale() -> None:
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    x, s, b = rand((2, 6, 4, 3)), rand((2,)), rand((2,))
    # onnxruntime dropped opset 18's per-group form: check against numpy
    from tests.support.onnx_node import model, run_autosched

    (y,) = run_autosched(model([node], {"x": x}, {"s": s, "b": b}, ("y",), opset=18), {"x": x})
    g = x.reshape(2, 2, -1)
    norm = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5))
    want = norm.reshape(x.shape) * np.repeat(s, 3)[:, None, None] + np.repeat(b, 3)[:, None, None]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("equation,shapes", [("...ij,...jk->...ik", [(3, 2, 5, 7), (2, 7, 4)]),
                                             ("...i,i...->...", [(2, 3, 5), (5, 1, 3)]),
                                             ("b...,b->...", [(4, 1, 6), (4,)])])
def test_einsum_ellipsis_broadcast_like_numpy(equation: str, shapes: list[tuple]) -> None:
    """Ellipses of different widths align to the right; size-1 dims broadcast (onnxruntime
    refuses both, numpy is the reference)."""
    from tests.support.helpers import run_te

    arrays = [rand(s) for s in shapes]
    phs = [te.placeholder(s, name=f"x{k}") for k, s in enumerate(shapes)]
    (got,) = run_te([einsum(equation, *phs)], dict(zip(phs, arrays)), "llvm")
    np.testing.assert_allclose(got, np.einsum(equation, *arrays), rtol=1e-4, atol=1e-5)
