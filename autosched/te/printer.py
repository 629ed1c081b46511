"""Expression printing in Python syntax with minimal parentheses."""

from __future__ import annotations

from autosched.te import expr as E

_ATOM = 10


def expr_str(e: E.Expr) -> str:
    return _fmt(e)[0]


def _wrap(e: E.Expr, min_prec: int, right: bool = False) -> str:
    text, prec = _fmt(e)
    if prec < min_prec or (right and prec == min_prec):
        return f"({text})"
    return text


def _fmt(e: E.Expr) -> tuple[str, int]:
    if isinstance(e, E.Const):
        if e.dtype == "bool":
            return ("True" if e.value else "False"), _ATOM
        if e.dtype in ("int32", "float32"):
            text = repr(e.value)
            return text, (_ATOM if e.value >= 0 else 6)
        return f"{e.dtype}({e.value!r})", _ATOM
    if isinstance(e, E.Var):
        return e.name, _ATOM
    if isinstance(e, E.Binary):
        op, prec = e.op, e.op.precedence
        if op.symbol is None:
            return f"{op}({_fmt(e.a)[0]}, {_fmt(e.b)[0]})", _ATOM
        return f"{_wrap(e.a, prec)} {op.symbol} {_wrap(e.b, prec, right=True)}", prec
    if isinstance(e, E.Compare):
        return f"{_wrap(e.a, 4)} {e.op.symbol} {_wrap(e.b, 4)}", e.op.precedence
    if isinstance(e, E.Not):
        return f"not {_wrap(e.a, 2)}", 2
    if isinstance(e, E.Select):
        return f"select({_fmt(e.cond)[0]}, {_fmt(e.true_value)[0]}, {_fmt(e.false_value)[0]})", _ATOM
    if isinstance(e, E.Cast):
        return f"{e.type}({_fmt(e.value)[0]})", _ATOM
    if isinstance(e, E.Call):
        return f"{e.name}({', '.join(_fmt(a)[0] for a in e.args)})", _ATOM
    if isinstance(e, E.TensorRead):
        return f"{e.tensor.name}[{', '.join(_fmt(i)[0] for i in e.indices)}]", _ATOM
    if isinstance(e, E.Reduce):
        axes = ", ".join(a.name for a in e.axis)
        where = f", where={_fmt(e.condition)[0]}" if e.condition is not None else ""
        return f"{e.combiner.name}({_fmt(e.source)[0]}, axis=[{axes}]{where})", _ATOM
    if hasattr(e, "buffer") and hasattr(e, "indices"):
        return _fmt_load(e)
    return type(e).__name__, _ATOM


def _fmt_load(e) -> tuple[str, int]:  # noqa: ANN001
    return f"{e.buffer.name}[{', '.join(_fmt(i)[0] for i in e.indices)}]", _ATOM
