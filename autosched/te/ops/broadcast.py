"""Binary (and ternary) elementwise operators with numpy broadcasting.

Shapes align from the right; a dim of 1 (or a missing leading dim) stretches to the other
operand's dim; any other mismatch is a TEError naming the op and both shapes. One operand may be a
Python scalar, which takes the tensor's dtype (see autosched/te/dtype.py: an int literal fits any
number dtype, a float literal needs a float tensor). Tensors of different dtypes do not mix (int32
with int64 widens to int64); cast first. Same-shape results carry tag ``elemwise``, stretched ones
``broadcast``.

Example::

    from autosched import te
    from autosched.te import ops
    a = te.placeholder((4, 1, 5), name="a")
    b = te.placeholder((3, 1), name="b")
    c = ops.add(a, b)                   # shape (4, 3, 5)
    d = ops.where(ops.greater(c, 0.0), c, 0.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from autosched.errors import TEError
from autosched.te import dtype as dt
from autosched.te import intrin as I
from autosched.te.expr import Const, Expr, compare, logical
from autosched.te.opcodes import Op
from autosched.te.ops import args
from autosched.te.ops.tags import BROADCAST, ELEMWISE
from autosched.te.tensor import Tensor, compute

Shape = tuple[args.Dim, ...]


def broadcast_shape(shapes: Sequence[Shape], op: str) -> Shape:
    """The numpy broadcast of ``shapes``, or TEError naming ``op`` and every shape."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[args.Dim] = []
    for d in range(rank):
        dim: args.Dim = 1
        for s in shapes:
            k = d - (rank - len(s))
            if k < 0 or args.is_one(s[k]):
                continue
            if args.is_one(dim):
                dim = s[k]
            elif not args.same_dim(dim, s[k]):
                listed = " and ".join(str(tuple(x)) for x in shapes)
                raise TEError(f"{op}: shapes {listed} do not broadcast (dim {d} of the result)")
        out.append(dim)
    return tuple(out)


def broadcast_index(x: Tensor, out_shape: Shape, index: Sequence[Expr]) -> tuple[args.Dim, ...]:
    """The index into ``x`` that output element ``index`` (of ``out_shape``) reads."""
    lead = len(out_shape) - x.ndim
    return tuple(
        0 if args.is_one(s) and not args.is_one(out_shape[lead + k]) else index[lead + k]
        for k, s in enumerate(x.shape)
    )


def broadcast_to(x: Tensor, shape: Sequence[args.Dim]) -> Tensor:
    """``x`` stretched to ``shape`` (numpy.broadcast_to)."""
    args.tensor(x, "broadcast_to")
    target = tuple(shape)
    if broadcast_shape([x.shape, target], "broadcast_to") != target:
        raise TEError(f"broadcast_to: cannot broadcast {x.shape} to {target}")
    return compute(
        target, lambda *i: x[broadcast_index(x, target, i)], name="T_broadcast_to", tag=BROADCAST
    )


def elementwise(
    operands: Sequence[Any],
    fn: Callable[..., Any],
    name: str,
    op: str,
    dtype_of: Callable[[list[str]], str] | None = None,
) -> Tensor:
    """Apply ``fn`` to broadcast reads of ``operands`` (tensors or Python scalars).

    ``dtype_of`` picks the dtype that scalars take from the tensors' dtypes (default: the first
    tensor's)."""
    tensors = [t for t in operands if isinstance(t, Tensor)]
    if not tensors:
        raise TEError(f"{op}: needs at least one tensor operand, got {list(operands)!r}")
    dtype = (dtype_of or (lambda ds: ds[0]))([t.dtype for t in tensors])
    consts = {
        n: v if isinstance(v, Const) else args.scalar(v, dtype, op)
        for n, v in enumerate(operands)
        if not isinstance(v, Tensor)
    }
    shape = broadcast_shape([t.shape for t in tensors], op)
    stretched = any(
        t.ndim != len(shape) or any(not args.same_dim(a, b) for a, b in zip(t.shape, shape))
        for t in tensors
    )

    def body(*i: Expr) -> Any:
        values = [
            consts[n] if n in consts else v[broadcast_index(v, shape, i)]
            for n, v in enumerate(operands)
        ]
        return fn(*values)

    return compute(shape, body, name=name, tag=BROADCAST if stretched else ELEMWISE)


def _promoted(op: str) -> Callable[[list[str]], str]:
    def pick(dtypes: list[str]) -> str:
        out = dtypes[0]
        for d in dtypes[1:]:
            out = dt.promote(out, d, op)
        return out

    return pick


def _arith(op: str, fn: Callable[[Expr, Expr], Expr], a: Any, b: Any) -> Tensor:
    def checked(x: Expr, y: Expr) -> Expr:
        if x.dtype == "bool" or y.dtype == "bool":
            raise TEError(f"{op}: arithmetic on bool operands; use ops.cast first")
        return fn(x, y)

    return elementwise([a, b], checked, f"T_{op}", op, _promoted(op))


def _mixed(op: str, a: Any, b: Any) -> None:
    """Name both operands when dtype promotion fails (te's own message names no op)."""
    ta = [t for t in (a, b) if isinstance(t, Tensor)]
    if len(ta) == 2:
        try:
            dt.promote(ta[0].dtype, ta[1].dtype, op)
        except TEError:
            raise TEError(
                f"{op}: cannot mix {ta[0].name}:{ta[0].dtype} {ta[0].shape} with "
                f"{ta[1].name}:{ta[1].dtype} {ta[1].shape}; use ops.cast first"
            ) from None


def add(a: Any, b: Any) -> Tensor:
    """a + b with broadcasting (compute ``T_add``)."""
    _mixed("add", a, b)
    return _arith("add", lambda x, y: x + y, a, b)


def subtract(a: Any, b: Any) -> Tensor:
    _mixed("subtract", a, b)
    return _arith("subtract", lambda x, y: x - y, a, b)


def multiply(a: Any, b: Any) -> Tensor:
    _mixed("multiply", a, b)
    return _arith("multiply", lambda x, y: x * y, a, b)


def _trunc(v: Expr) -> Expr:
    return I.if_then_else(v < 0, I.ceil(v), I.floor(v))


def divide(a: Any, b: Any) -> Tensor:
    """a / b. Floats: true division. Integers: rounds toward zero, as C and ONNX Div do
    (use floor_divide for Python's //)."""
    _mixed("divide", a, b)

    def fn(x: Expr, y: Expr) -> Expr:
        return x / y if dt.is_float(x.dtype) else I.truncdiv(x, y)

    return _arith("divide", fn, a, b)


def floor_divide(a: Any, b: Any) -> Tensor:
    """floor(a / b) (Python's //) for floats and integers."""
    _mixed("floor_divide", a, b)

    def fn(x: Expr, y: Expr) -> Expr:
        return I.floor(x / y) if dt.is_float(x.dtype) else I.floordiv(x, y)

    return _arith("floor_divide", fn, a, b)


def floor_mod(a: Any, b: Any) -> Tensor:
    """a - floor(a / b) * b: the remainder takes the divisor's sign (Python's %, ONNX Mod)."""
    _mixed("floor_mod", a, b)

    def fn(x: Expr, y: Expr) -> Expr:
        return x - I.floor(x / y) * y if dt.is_float(x.dtype) else I.floormod(x, y)

    return _arith("floor_mod", fn, a, b)


def mod(a: Any, b: Any) -> Tensor:
    """a - trunc(a / b) * b: the remainder takes the dividend's sign (C's %, fmod, ONNX Mod
    with fmod=1)."""
    _mixed("mod", a, b)

    def fn(x: Expr, y: Expr) -> Expr:
        return x - _trunc(x / y) * y if dt.is_float(x.dtype) else I.truncmod(x, y)

    return _arith("mod", fn, a, b)


def power(a: Any, b: Any) -> Tensor:
    """a ** b (float; integers only for non-negative exponents)."""
    _mixed("power", a, b)
    return _arith("power", I.pow, a, b)


def maximum(a: Any, b: Any) -> Tensor:
    _mixed("maximum", a, b)
    return _arith("maximum", I.max, a, b)


def minimum(a: Any, b: Any) -> Tensor:
    _mixed("minimum", a, b)
    return _arith("minimum", I.min, a, b)


def _comparison(op: str, cmp: Op) -> Callable[[Any, Any], Tensor]:
    def fn(a: Any, b: Any) -> Tensor:
        _mixed(op, a, b)
        return elementwise([a, b], lambda x, y: compare(cmp, x, y), f"T_{op}", op, _promoted(op))

    fn.__name__ = op
    fn.__doc__ = f"Broadcast comparison ({cmp}); the result is a bool tensor (``T_{op}``)."
    return fn


equal = _comparison("equal", Op.EQ)
not_equal = _comparison("not_equal", Op.NE)
less = _comparison("less", Op.LT)
less_equal = _comparison("less_equal", Op.LE)
greater = _comparison("greater", Op.GT)
greater_equal = _comparison("greater_equal", Op.GE)


def _logic(op: str, fn: Callable[[Expr, Expr], Expr], a: Any, b: Any) -> Tensor:
    for v in (a, b):
        if isinstance(v, Tensor) and v.dtype != "bool":
            raise TEError(f"{op}: needs bool tensors, got {v.name}:{v.dtype}; compare first")
    return elementwise([a, b], fn, f"T_{op}", op)


def logical_and(a: Any, b: Any) -> Tensor:
    return _logic("logical_and", lambda x, y: logical(Op.AND, x, y), a, b)


def logical_or(a: Any, b: Any) -> Tensor:
    return _logic("logical_or", lambda x, y: logical(Op.OR, x, y), a, b)


def logical_xor(a: Any, b: Any) -> Tensor:
    return _logic("logical_xor", lambda x, y: compare(Op.NE, x, y), a, b)


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``cond`` holds, else ``b``, all three broadcast (numpy.where). ``cond`` must
    be bool (compare first); ``a`` and ``b`` share a dtype, or one is a scalar."""
    if isinstance(cond, Tensor) and cond.dtype != "bool":
        raise TEError(f"where: condition {cond.name} must be bool, got {cond.dtype}")
    if not isinstance(cond, Tensor) and not isinstance(cond, bool):
        raise TEError(f"where: condition must be a bool tensor or bool, got {cond!r}")
    values = [v for v in (a, b) if isinstance(v, Tensor)]
    if len(values) == 2:
        _mixed("where", a, b)
    if values:
        dtype = dt.promote(values[0].dtype, values[-1].dtype, "where")
    elif isinstance(a, float) or isinstance(b, float):
        dtype = "float32"
    elif isinstance(a, bool) and isinstance(b, bool):
        dtype = "bool"
    else:
        dtype = "int32"
    av = a if isinstance(a, Tensor) else args.scalar(a, dtype, "where")
    bv = b if isinstance(b, Tensor) else args.scalar(b, dtype, "where")
    operands = [cond if isinstance(cond, Tensor) else args.scalar(cond, "bool", "where"), av, bv]

    def fn(c: Expr, x: Expr, y: Expr) -> Expr:
        return I.if_then_else(c, x, y)

    return elementwise(operands, fn, "T_where", "where", lambda ds: "bool")


def binary_op(a: Any, b: Any, fn: Callable[[Expr, Expr], Any], name: str) -> Tensor:
    """A custom broadcast binary op: ``binary_op(a, b, lambda x, y: x * y + 1, "T_fma1")``."""
    return elementwise([a, b], fn, name, name, _promoted(name))

