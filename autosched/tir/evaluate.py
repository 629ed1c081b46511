"""Integer evaluation of index expressions: constants, and values at given variable values
(launch sizes and buffer sizes at call time, strides in the search).

The ops compute what ``opcodes.Op.fold`` says (floor and truncating division exactly), casts
pass integers through, and only the taken side of a select is evaluated.

Example::

    eval_int((n + 255) // 256, {n.uid: 1000})    # 4
    const_int(E.Binary(Op.MUL, E.const(4), E.const(8)))    # 32
"""

from __future__ import annotations

from autosched.te import expr as E
from autosched.te.opcodes import Op, OpKind

_CLOSED = (Op.ADD, Op.SUB, Op.MUL, Op.MIN, Op.MAX)  # never raise, never leave the integers


def const_int(e: E.Expr) -> int | None:
    """The value of ``e`` when it is an integer constant or folds to one (None otherwise)."""
    if isinstance(e, E.Const):
        return e.value if type(e.value) is int else None
    if isinstance(e, E.Binary) and e.op in _CLOSED:
        a, b = const_int(e.a), const_int(e.b)
        return None if a is None or b is None else e.op.fold(a, b)
    return None


def eval_int(e: E.Expr, env: dict[int, int]) -> int:
    """The value of the integer expression ``e`` with variables given by uid in ``env``.
    Raises ValueError for a variable ``env`` lacks or a node that is not integer arithmetic
    (a load, a call, true division)."""
    if isinstance(e, E.Const):
        return int(e.value)
    if isinstance(e, E.Var):
        if e.uid not in env:
            raise ValueError(f"{e.name} has no value here")
        return env[e.uid]
    if isinstance(e, E.Cast):
        return eval_int(e.value, env)
    if isinstance(e, E.Binary) and e.op.kind is OpKind.ARITH and e.op is not Op.DIV:
        return e.op.fold(eval_int(e.a, env), eval_int(e.b, env))
    if isinstance(e, E.Select):
        return eval_int(e.true_value if eval_bool(e.cond, env) else e.false_value, env)
    raise ValueError(f"cannot evaluate {e} as an integer")


def eval_bool(e: E.Expr, env: dict[int, int]) -> bool:
    """The truth of the condition ``e`` over integers (see ``eval_int``)."""
    if isinstance(e, E.Const):
        return bool(e.value)
    if isinstance(e, E.Compare):
        return bool(e.op.fold(eval_int(e.a, env), eval_int(e.b, env)))
    if isinstance(e, E.Binary) and e.op.kind is OpKind.LOGICAL:
        return bool(e.op.fold(eval_bool(e.a, env), eval_bool(e.b, env)))
    if isinstance(e, E.Not):
        return not eval_bool(e.a, env)
    raise ValueError(f"cannot evaluate {e} as a condition")
