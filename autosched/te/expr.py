"""The expression IR: immutable nodes with structural equality and a cached structural hash.

Every node is a frozen dataclass. ``==`` between expressions builds a comparison node (as in
TVM), whose truth value is structural equality, so expressions work as dict keys and in ``in``
tests. Variables and operations are identified by a unique id, never by name; the workload key
of a DAG (see ``dag.py``) renumbers them canonically, so names never leak into it.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Union

import numpy as np

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te.opcodes import Op, OpKind

_uids = itertools.count()
_uid_pid = -1


def next_uid() -> int:
    """A process-unique id. Each process numbers from its own base (pid << 40), so variables
    made in a worker never collide with ones unpickled from the parent."""
    global _uids, _uid_pid
    pid = os.getpid()
    if pid != _uid_pid:
        _uid_pid = pid
        _uids = itertools.count((pid << 40) + 1)
    return next(_uids)


_field_names: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The dataclass field names of an IR node class (dataclasses.fields is slow per call)."""
    names = _field_names.get(cls)
    if names is None:
        names = _field_names[cls] = tuple(f.name for f in fields(cls))
    return names


class Node:
    """Base of all IR nodes: structural hash cached at construction."""

    _hash: int  # set by __post_init__, outside the dataclass fields of the subclasses

    def __post_init__(self) -> None:
        cls = type(self)
        fields_of = _field_getters.get(cls) or _field_getter(cls)
        # a tuple's hash is its items' (a node's is cached): no walk below the direct fields
        object.__setattr__(self, "_hash", hash((cls.__name__, fields_of(self))))

    def __hash__(self) -> int:
        return self._hash

    # Pickling drops the cached hash and recomputes it on load: str hashes differ per process.
    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        self.__post_init__()


_field_getters: dict[type, Callable[[Any], Any]] = {}


def _field_getter(cls: type) -> Callable[[Any], Any]:
    """A function from a node of ``cls`` to its field values (one C call)."""
    names = field_names(cls)
    get = operator.attrgetter(*names) if names else (lambda _: ())
    _field_getters[cls] = get
    return get


def structural_equal(a: Any, b: Any) -> bool:
    """Deep equality of IR values (nodes, tuples, scalars)."""
    if a is b:
        return True
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b)
            and all(structural_equal(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, Node) or isinstance(b, Node):
        if type(a) is not type(b) or hash(a) != hash(b):
            return False
        if isinstance(a, (Var,)):
            return a.uid == b.uid
        return all(
            structural_equal(getattr(a, name), getattr(b, name)) for name in field_names(type(a))
        )
    return bool(a == b) and type(a) is type(b)


ExprLike = Union["Expr", int, float, bool]


class ExprOps:
    """Python operators that build expressions. Mixed into Expr and IterVar."""

    def _expr(self) -> Expr:
        raise NotImplementedError

    def __add__(self, o: ExprLike) -> Expr:
        return binary(Op.ADD, self, o)

    def __radd__(self, o: ExprLike) -> Expr:
        return binary(Op.ADD, o, self)

    def __sub__(self, o: ExprLike) -> Expr:
        return binary(Op.SUB, self, o)

    def __rsub__(self, o: ExprLike) -> Expr:
        return binary(Op.SUB, o, self)

    def __mul__(self, o: ExprLike) -> Expr:
        return binary(Op.MUL, self, o)

    def __rmul__(self, o: ExprLike) -> Expr:
        return binary(Op.MUL, o, self)

    def __truediv__(self, o: ExprLike) -> Expr:
        return binary(Op.DIV, self, o)

    def __rtruediv__(self, o: ExprLike) -> Expr:
        return binary(Op.DIV, o, self)

    def __floordiv__(self, o: ExprLike) -> Expr:
        return binary(Op.FLOORDIV, self, o)

    def __rfloordiv__(self, o: ExprLike) -> Expr:
        return binary(Op.FLOORDIV, o, self)

    def __mod__(self, o: ExprLike) -> Expr:
        return binary(Op.FLOORMOD, self, o)

    def __rmod__(self, o: ExprLike) -> Expr:
        return binary(Op.FLOORMOD, o, self)

    def __neg__(self) -> Expr:
        e = as_expr(self)
        return binary(Op.SUB, const(0, e.dtype), e)

    def __lt__(self, o: ExprLike) -> Expr:
        return compare(Op.LT, self, o)

    def __le__(self, o: ExprLike) -> Expr:
        return compare(Op.LE, self, o)

    def __gt__(self, o: ExprLike) -> Expr:
        return compare(Op.GT, self, o)

    def __ge__(self, o: ExprLike) -> Expr:
        return compare(Op.GE, self, o)

    def __eq__(self, o: object) -> Expr:  # type: ignore[override]  # builds a node, as in TVM
        return compare(Op.EQ, self, o)

    def __ne__(self, o: object) -> Expr:  # type: ignore[override]  # builds a node, as in TVM
        return compare(Op.NE, self, o)

    def __and__(self, o: ExprLike) -> Expr:
        return logical(Op.AND, self, o)

    def __rand__(self, o: ExprLike) -> Expr:
        return logical(Op.AND, o, self)

    def __or__(self, o: ExprLike) -> Expr:
        return logical(Op.OR, self, o)

    def __ror__(self, o: ExprLike) -> Expr:
        return logical(Op.OR, o, self)

    def __invert__(self) -> Expr:
        return Not(_bool_operand(as_expr(self), "~"))

    def __bool__(self) -> bool:
        raise TEError(
            f"the truth value of the symbolic expression {self} is unknown; "
            "use te.if_then_else / te.all / te.any instead of Python's if / and / or"
        )

    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class Expr(ExprOps, Node):
    """Base of expression nodes. Every expression has a dtype."""

    def _expr(self) -> Expr:
        return self

    @property
    def dtype(self) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        from autosched.te.printer import expr_str

        return expr_str(self)

    def __repr__(self) -> str:
        return str(self)

    def astype(self, dtype: str) -> Expr:
        return cast(dtype, self)


@dataclass(frozen=True, eq=False, repr=False)
class Const(Expr):
    value: int | float | bool
    type: str

    @property
    def dtype(self) -> str:
        return self.type


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    """A scalar variable: loop index, symbolic size, or reduction combiner operand."""

    name: str
    type: str = dt.INDEX
    uid: int = field(default_factory=next_uid)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(("Var", self.uid)))

    @property
    def dtype(self) -> str:
        return self.type


def _as_op(node: Binary | Compare) -> None:
    """Store the op as its enum entry (builders and unpickled nodes may pass its name)."""
    if type(node.op) is not Op:
        object.__setattr__(node, "op", Op(node.op))


@dataclass(frozen=True, eq=False, repr=False)
class Binary(Expr):
    """An arithmetic op (add sub mul div floordiv floormod truncdiv truncmod min max pow) on
    numbers, or a logical one (and or) on bools; ``opcodes.Op`` says what each computes."""

    op: Op
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        _as_op(self)
        super().__post_init__()
        object.__setattr__(self, "_dtype", self.a.dtype)  # no recursion down long chains

    @property
    def dtype(self) -> str:
        return self._dtype  # type: ignore[attr-defined]  # set by __post_init__, not a field

    def __setstate__(self, state: dict) -> None:
        super().__setstate__({k: v for k, v in state.items() if k != "_dtype"})


@dataclass(frozen=True, eq=False, repr=False)
class Compare(Expr):
    """eq ne lt le gt ge; the result is bool. ``bool(a == b)`` is structural equality."""

    op: Op
    a: Expr
    b: Expr

    def __post_init__(self) -> None:
        _as_op(self)
        super().__post_init__()

    @property
    def dtype(self) -> str:
        return "bool"

    def __bool__(self) -> bool:
        if self.op is Op.EQ:
            return structural_equal(self.a, self.b)
        if self.op is Op.NE:
            return not structural_equal(self.a, self.b)
        return ExprOps.__bool__(self)


@dataclass(frozen=True, eq=False, repr=False)
class Not(Expr):
    a: Expr

    @property
    def dtype(self) -> str:
        return "bool"


@dataclass(frozen=True, eq=False, repr=False)
class Select(Expr):
    """``cond ? true_value : false_value``. Only the taken branch is evaluated, so a branch may
    read out of bounds where the condition excludes it (padding relies on this)."""

    cond: Expr
    true_value: Expr
    false_value: Expr

    @property
    def dtype(self) -> str:
        return self.true_value.dtype


@dataclass(frozen=True, eq=False, repr=False)
class Cast(Expr):
    type: str
    value: Expr

    @property
    def dtype(self) -> str:
        return self.type


@dataclass(frozen=True, eq=False, repr=False)
class Call(Expr):
    """A math intrinsic (exp, log, sqrt, ...) applied to its arguments."""

    name: str
    args: tuple[Expr, ...]
    type: str

    @property
    def dtype(self) -> str:
        return self.type


@dataclass(frozen=True, eq=False, repr=False)
class TensorRead(Expr):
    """``tensor[indices]``: a read of a placeholder or of another compute's result."""

    tensor: Any  # autosched.te.tensor.Tensor (import cycle)
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.tensor.dtype


@dataclass(frozen=True, eq=False)
class Range(Node):
    """The half-open interval [min, min + extent)."""

    min: Expr
    extent: Expr

    @staticmethod
    def of(extent: ExprLike | tuple | Range) -> Range:
        if isinstance(extent, Range):
            return extent
        if isinstance(extent, tuple):
            lo, hi = extent
            lo_e, hi_e = as_expr(lo), as_expr(hi)
            return Range(lo_e, hi_e - lo_e)
        return Range(const(0, dt.INDEX), as_expr(extent))


@dataclass(frozen=True, eq=False)
class IterVar(ExprOps, Node):
    """A loop axis: a variable with its domain. kind is "data", "reduce" or "thread"."""

    var: Var
    dom: Range
    kind: str = "data"
    thread_tag: str = ""

    def _expr(self) -> Expr:
        return self.var

    @property
    def name(self) -> str:
        return self.var.name

    @property
    def dtype(self) -> str:
        return self.var.dtype

    def __str__(self) -> str:
        return self.var.name

    __repr__ = __str__
    __hash__ = Node.__hash__


@dataclass(frozen=True, eq=False)
class CommReducer(Node):
    """A commutative reduction: ``result`` combines ``lhs`` (the accumulator) with ``rhs``;
    ``identity`` is its neutral element."""

    name: str
    lhs: Var
    rhs: Var
    result: Expr
    identity: Expr


@dataclass(frozen=True, eq=False, repr=False)
class Reduce(Expr):
    """A reduction of ``source`` over ``axis`` where ``condition`` holds. ``init`` (when given)
    replaces the identity as the starting value."""

    combiner: CommReducer
    source: Expr
    axis: tuple[IterVar, ...]
    condition: Expr | None = None
    init: Expr | None = None

    @property
    def dtype(self) -> str:
        return self.source.dtype


# ---------------------------------------------------------------------------------------------
# Construction helpers with dtype checking and constant folding


def const(value: int | float | bool, dtype: str | None = None) -> Const:
    """A constant. Without dtype: bool, int32 or float32 by the Python type."""
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int32" if isinstance(value, int) else "float32"
    dt.check(dtype)
    if dtype == "bool":
        return Const(bool(value), dtype)
    if dt.is_float(dtype):
        # rounded to the dtype, so every backend (and the float64 evaluator) sees one value
        return Const(float(np.dtype(dtype).type(value)), dtype)
    if isinstance(value, float) and not value.is_integer():
        raise TEError(f"constant {value} does not fit integer dtype {dtype}")
    return Const(int(value), dtype)


def as_expr(value: Any, like: str | None = None) -> Expr:
    """Turn a Python scalar, IterVar or Expr into an Expr. ``like`` is the dtype of the other
    operand, for the literal rules in dtype.py."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, IterVar):
        return value.var
    if isinstance(value, bool):
        return const(value, "bool")
    if isinstance(value, int):
        if like is not None and like != "bool":
            return const(value, like)
        return const(value, "int32" if -(2**31) <= value < 2**31 else "int64")
    if isinstance(value, float):
        if like is None or dt.is_float(like):
            return const(value, like or "float32")
        raise TEError(f"cannot mix a float literal {value} with {like} without te.cast")
    if hasattr(value, "dtype") and hasattr(value, "item") and getattr(value, "shape", None) == ():
        return const(value.item(), str(value.dtype))
    raise TEError(f"cannot use {value!r} (a {type(value).__name__}) as an expression")


def _operands(a: Any, b: Any, what: str) -> tuple[Expr, Expr]:
    if isinstance(a, (Expr, IterVar)):
        ea = as_expr(a)
        eb = as_expr(b, like=ea.dtype)
    else:
        eb = as_expr(b)
        ea = as_expr(a, like=eb.dtype)
    if ea.dtype == eb.dtype and ea.dtype not in dt.STORAGE_TYPES:
        return ea, eb
    target = dt.promote(ea.dtype, eb.dtype, _Lazy(lambda: f"{what}({ea}, {eb})"))
    return _widen(ea, target), _widen(eb, target)


class _Lazy:
    """A message formatted only if an error needs it (printing expressions is not free)."""

    def __init__(self, fn: Any):
        self.fn = fn

    def __str__(self) -> str:
        return self.fn()

    __format__ = lambda self, spec: format(str(self), spec)  # noqa: E731


def _widen(e: Expr, dtype: str) -> Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        return const(e.value, dtype)
    return Cast(dtype, e)


def _bool_operand(e: Expr, what: str) -> Expr:
    if e.dtype != "bool":
        raise TEError(f"{what} needs bool operands, got {e.dtype} ({e}); compare first")
    return e


def _op(name: str, kind: OpKind) -> Op:
    op = name if type(name) is Op else Op(name)
    if op.kind is not kind:
        raise TEError(f"{op} is a {op.kind} op; this builder takes {kind} ops")
    return op


def binary(op: str, a: Any, b: Any) -> Expr:
    """Build ``a op b`` (an arithmetic ``Op`` or its name) with the promotion rules of
    dtype.py, folding constants."""
    op = _op(op, OpKind.ARITH)
    ea, eb = _operands(a, b, op)
    dtype = ea.dtype
    if dtype == "bool":
        raise TEError(f"arithmetic {op} on bool operands ({ea}, {eb}); cast to a number first")
    if op is Op.DIV and not dt.is_float(dtype):
        raise TEError(
            f"'/' on {dtype} operands ({ea}, {eb}) is ambiguous; use // (floordiv) or te.truncdiv"
        )
    if op.int_only and dt.is_float(dtype):
        raise TEError(f"{op} needs integer operands, got {dtype} ({ea}, {eb})")
    if isinstance(ea, Const) and isinstance(eb, Const):
        if not (op.divides and eb.value == 0):
            return const(op.fold(ea.value, eb.value), dtype)
    return Binary(op, ea, eb)


def compare(op: str, a: Any, b: Any) -> Expr:
    """Build the comparison ``a op b`` (a comparison ``Op`` or its name), folding constants."""
    op = _op(op, OpKind.COMPARE)
    ea, eb = _operands(a, b, op)
    if isinstance(ea, Const) and isinstance(eb, Const):
        return const(bool(op.fold(ea.value, eb.value)), "bool")
    return Compare(op, ea, eb)


def logical(op: str, a: Any, b: Any) -> Expr:
    """Build ``a and b`` / ``a or b`` on bools, dropping constant operands."""
    op = _op(op, OpKind.LOGICAL)
    ea = _bool_operand(as_expr(a, like="bool"), op)
    eb = _bool_operand(as_expr(b, like="bool"), op)
    for x, y in ((ea, eb), (eb, ea)):
        if isinstance(x, Const):
            return y if bool(x.value) == (op is Op.AND) else x
    return Binary(op, ea, eb)


def cast(dtype: str, value: Any) -> Expr:
    """Convert ``value`` to ``dtype`` (C semantics: float to int truncates toward zero)."""
    dt.check(dtype)
    e = as_expr(value)
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        if dtype == "bool":
            return const(bool(e.value), dtype)
        if dt.is_float(dtype):
            return const(float(e.value), dtype)
        if dt.is_int(dtype) and not (isinstance(e.value, float) and not math.isfinite(e.value)):
            return const(int(e.value), dtype)
    return Cast(dtype, e)


def select(cond: Any, true_value: Any, false_value: Any) -> Expr:
    c = _bool_operand(as_expr(cond, like="bool"), "select condition")
    t, f = _operands(true_value, false_value, "select")
    if isinstance(c, Const):
        return t if c.value else f
    return Select(c, t, f)
