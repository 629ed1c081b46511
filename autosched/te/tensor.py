"""Tensors and the operations that produce them: placeholder and compute."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te.expr import (
    Const,
    Expr,
    ExprLike,
    IterVar,
    Range,
    Reduce,
    TensorRead,
    Var,
    as_expr,
    const,
    next_uid,
)


class Operation:
    """Base of PlaceholderOp and ComputeOp. Identified by uid: two placeholders with the same
    name and shape are different inputs."""

    uid: int
    name: str

    def __hash__(self) -> int:
        return hash(("op", self.uid))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Operation) and other.uid == self.uid

    def output(self, index: int = 0) -> Tensor:
        assert isinstance(self, PlaceholderOp | ComputeOp), "an operation is one of the two kinds"
        return Tensor(self, index)


@dataclass(frozen=True, eq=False)
class PlaceholderOp(Operation):
    name: str
    shape: tuple[Expr, ...]
    dtype: str
    uid: int = field(default_factory=next_uid)

    __hash__ = Operation.__hash__
    __eq__ = Operation.__eq__


@dataclass(frozen=True, eq=False)
class ComputeOp(Operation):
    """``name[axis] = body``. A reduction body is a Reduce node at the top of ``body``."""

    name: str
    axis: tuple[IterVar, ...]
    body: Expr
    reduce_axis: tuple[IterVar, ...] = ()
    tag: str = ""
    attrs: tuple[tuple[str, Any], ...] = ()
    uid: int = field(default_factory=next_uid)

    __hash__ = Operation.__hash__
    __eq__ = Operation.__eq__

    def __post_init__(self) -> None:
        # cached: reading a tensor asks its op's dtype, which would otherwise walk the DAG
        object.__setattr__(self, "_dtype", self.body.dtype)

    @property
    def shape(self) -> tuple[Expr, ...]:
        return tuple(a.dom.extent for a in self.axis)

    @property
    def dtype(self) -> str:
        return self._dtype  # type: ignore[attr-defined]  # set by __post_init__, not a field

    @property
    def input_tensors(self) -> list[Tensor]:
        from autosched.te.visit import tensors_read

        return tensors_read(self.body)


@dataclass(frozen=True)
class Tensor:
    """The result of an operation. Index it to read it: ``A[i, j]``."""

    op: PlaceholderOp | ComputeOp
    value_index: int = 0

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def dtype(self) -> str:
        return self.op.dtype

    @property
    def shape(self) -> tuple[int | Expr, ...]:
        """Static dims as Python ints, symbolic dims as expressions."""
        return tuple(int(s.value) if isinstance(s, Const) else s for s in self.op.shape)

    @property
    def ndim(self) -> int:
        return len(self.op.shape)

    def __getitem__(self, indices: Any) -> TensorRead:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != self.ndim:
            raise TEError(
                f"wrong number of indices for {self.name}: it has {self.ndim} dims "
                f"{self.shape}, got {len(indices)} indices"
            )
        exprs = []
        for axis_no, index in enumerate(indices):
            if isinstance(index, slice):
                raise TEError(f"slices are not supported when indexing {self.name} (dim {axis_no})")
            e = as_expr(index, like=dt.INDEX)
            if not dt.is_int(e.dtype):
                raise TEError(
                    f"index {axis_no} of {self.name} must be an integer, got {e.dtype} ({e})"
                )
            exprs.append(e)
        return TensorRead(self, tuple(exprs))

    def __str__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype})"

    __repr__ = __str__


def _shape(shape: Sequence[ExprLike] | ExprLike, what: str) -> tuple[Expr, ...]:
    dims = shape if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for n, s in enumerate(dims):
        e = as_expr(s, like=dt.INDEX)
        if not dt.is_int(e.dtype):
            raise TEError(f"dim {n} of {what} must be an integer, got {e.dtype} ({e})")
        if isinstance(e, Const) and e.value < 0:
            raise TEError(f"dim {n} of {what} is negative: {e.value}")
        out.append(e)
    return tuple(out)


def placeholder(shape: Sequence[ExprLike] | ExprLike, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor. ``te.placeholder((M, K), name="A")``; dims may be ``te.var``."""
    return PlaceholderOp(name, _shape(shape, f"placeholder {name}"), dt.check(dtype)).output()


def var(name: str = "v", dtype: str = "int32") -> Var:
    """A scalar variable, e.g. a symbolic size: ``n = te.var("n")``."""
    return Var(name, dt.check(dtype))


_REDUCE_VARS: set[int] = set()


def is_reduce_var(v: Var) -> bool:
    return v.uid in _REDUCE_VARS


def reduce_axis(dom: ExprLike | tuple[ExprLike, ExprLike] | Range, name: str = "rv") -> IterVar:
    """A reduction axis over ``range(dom)`` or ``range(lo, hi)`` when ``dom`` is a pair."""
    iv = IterVar(Var(name), Range.of(dom), "reduce")
    _REDUCE_VARS.add(iv.var.uid)
    return iv


def thread_axis(dom: str | ExprLike | tuple | Range | None = None, tag: str = "",
                name: str = "") -> IterVar:
    """A GPU thread index: ``te.thread_axis("threadIdx.x")``; ``name`` names its variable (the
    tag by default), as in ``te.thread_axis((0, 2), "vthread", name="vx")``."""
    if isinstance(dom, str):
        tag, dom = dom, None
    if not tag:
        raise TEError("thread_axis needs a tag such as 'blockIdx.x' or 'threadIdx.x'")
    if not isinstance(name, str):
        raise TEError(f"thread_axis {tag}: name must be a str, got {name!r}")
    valid = [f"{k}.{d}" for k in ("blockIdx", "threadIdx", "vthread") for d in "xyz"] + ["vthread"]
    if tag not in valid:
        raise TEError(f"unknown thread tag {tag!r}; expected one of {', '.join(valid)}")
    rng = Range.of(dom) if dom is not None else Range(const(0), const(0))
    return IterVar(Var(name or tag), rng, "thread", tag)


def _arg_names(fcompute: Callable[..., Any], ndim: int, name: str) -> list[str]:
    params = list(inspect.signature(fcompute).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return [f"i{n}" for n in range(ndim)]
    # parameters with defaults (lambda i, f=f: ...) are captured values, not indices
    params = [p for p in params if p.default is p.empty and p.kind is not p.KEYWORD_ONLY]
    if len(params) != ndim:
        raise TEError(
            f"compute {name}: the function takes {len(params)} indices "
            f"({', '.join(p.name for p in params)}) but the shape has {ndim} dims"
        )
    return [p.name for p in params]


# A compute attribute (``attrs={MATERIALIZE: 1}``): the stage is computed on its own, never
# inlined into its readers by the sketches (a layout that a tensorized nest reads as memory).
MATERIALIZE = "materialize"


def compute(
    shape: Sequence[ExprLike] | ExprLike,
    fcompute: Callable[..., ExprLike],
    name: str = "compute",
    tag: str = "",
    attrs: dict[str, Any] | None = None,
) -> Tensor:
    """A tensor defined elementwise: ``te.compute((M, N), lambda i, j: A[i, j] * 2, name="B")``.

    A reduction is written as ``te.sum(expr, axis=k)`` (or max / min / a comm_reducer) at the
    top of the body.
    """
    dims = _shape(shape, f"compute {name}")
    names = _arg_names(fcompute, len(dims), name)
    axis = tuple(IterVar(Var(n), Range(const(0), d), "data") for n, d in zip(names, dims))
    body = as_expr(fcompute(*axis))
    from autosched.te.visit import check_body

    check_body(body, axis, name)
    reduce_axes = body.axis if isinstance(body, Reduce) else ()
    return ComputeOp(
        name, axis, body, reduce_axes, tag, tuple(sorted((attrs or {}).items()))
    ).output()
