"""Einstein summation (numpy.einsum, ONNX Einsum) as one compute: each output element is the
sum, over the labels missing from the output, of the product of the operands.

The equation is ``"ab,bc->ac"``; without ``->`` the output is the labels used once, in
alphabetical order. ``...`` stands for the leading broadcast dims of an operand (aligned to
the right across operands, as numpy does); a label repeated in one operand reads its diagonal.
Matrix products, batched products, transposes, traces, reductions and outer products are all
instances.

Example::

    from autosched import te
    from autosched.te.ops.einsum import einsum
    a = te.placeholder((2, 3, 4), name="a")
    b = te.placeholder((2, 4, 5), name="b")
    c = einsum("bij,bjk->bik", a, b)             # batch matmul, (2, 3, 5)
"""

from __future__ import annotations

from collections.abc import Sequence

from autosched.errors import TEError
from autosched.te import reduce as R
from autosched.te.expr import Expr
from autosched.te.ops import args
from autosched.te.ops.tags import INJECTIVE, REDUCE
from autosched.te.tensor import Tensor, compute, reduce_axis

# An operand's labels: letters, or ints for the dims "..." stands for (0 = the outermost of
# the broadcast dims shared by all operands).
Label = str | int


def parse(equation: str, ranks: Sequence[int]) -> tuple[list[list[Label]], list[Label]]:
    """The labels of each operand and of the output, with ``...`` expanded to ints."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise TEError(f"einsum: equation {equation!r} has {len(terms)} operands, "
                      f"{len(ranks)} were given")
    width = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    labels = [_term(t, r, width, equation) for t, r in zip(terms, ranks)]
    if arrow:
        out = _term(rhs, None, width, equation)
    else:
        letters = [c for t in labels for c in t if isinstance(c, str)]
        out = list(range(width)) + sorted(c for c in set(letters) if letters.count(c) == 1)
    if len(set(out)) != len(out):
        raise TEError(f"einsum: output {rhs!r} of {equation!r} repeats a label")
    used = {c for t in labels for c in t}
    if any(c not in used for c in out):
        raise TEError(f"einsum: output {rhs!r} of {equation!r} has a label no operand has")
    return labels, out


def _term(term: str, rank: int | None, width: int, equation: str) -> list[Label]:
    head, dots, tail = term.partition("...")
    if any(not c.isalpha() for c in head + tail) or "..." in tail:
        raise TEError(f"einsum: term {term!r} of {equation!r} must be letters and at most one "
                      "'...'")
    if rank is None:
        n = width if dots else 0
    else:
        n = rank - len(head) - len(tail)
        if n < 0 or (n and not dots):
            raise TEError(f"einsum: term {term!r} of {equation!r} does not match an operand "
                          f"of rank {rank}")
    return [*head, *range(width - n, width), *tail]


def _sizes(labels: list[list[Label]], tensors: Sequence[Tensor], equation: str
           ) -> dict[Label, int]:
    """The extent of every label; 1 broadcasts against any extent."""
    size: dict[Label, int] = {}
    for t, term in zip(tensors, labels):
        for c, n in zip(term, args.static_shape(t, "einsum")):
            have = size.get(c, 1)
            if n != 1 and have not in (1, n):
                raise TEError(f"einsum: label {c!r} of {equation!r} is {have} in one operand "
                              f"and {n} in {t.name} {t.shape}")
            size[c] = max(have, n)
    return size


def einsum(equation: str, *tensors: Tensor) -> Tensor:
    """The einsum of ``tensors`` by ``equation`` (one dtype for all)."""
    if not tensors:
        raise TEError("einsum: needs at least one operand")
    for t in tensors:
        args.tensor(t, "einsum")
    args.same_dtype(list(tensors), "einsum")
    labels, out = parse(equation, [t.ndim for t in tensors])
    size = _sizes(labels, tensors, equation)
    summed = [c for c in dict.fromkeys(c for term in labels for c in term) if c not in out]
    rvs = {c: reduce_axis((0, size[c]), name=f"k_{c}") for c in summed}

    def body(*o: Expr) -> Expr:
        at: dict[Label, Expr] = {**dict(zip(out, o)), **{c: v.var for c, v in rvs.items()}}
        reads = [t[tuple(0 if n == 1 and size[c] != 1 else at[c]
                         for c, n in zip(term, args.static_shape(t, "einsum")))]
                 for t, term in zip(tensors, labels)]
        prod: Expr = reads[0]
        for v in reads[1:]:
            prod = prod * v
        return R.sum(prod, axis=list(rvs.values())) if rvs else prod

    return compute(tuple(size[c] for c in out), body, name="T_einsum",
                   tag=REDUCE if rvs else INJECTIVE)
