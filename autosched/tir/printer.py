"""Readable text for loop IR: Python-like nested loops."""

from __future__ import annotations

from autosched.tir import ir


def _ann(s: ir.For) -> str:
    tags = []
    if s.kind == "thread":
        tags.append(f"bind={s.thread_tag}")
    elif s.kind != "serial":
        tags.append(s.kind)
    tags.extend(f"{k}={v}" for k, v in s.annotations)
    return f"  # {', '.join(tags)}" if tags else ""


def _lines(s: ir.Stmt, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    if isinstance(s, ir.Seq):
        for c in s.stmts:
            _lines(c, depth, out)
    elif isinstance(s, ir.For):
        lo = "" if _is_zero(s.min) else f"{s.min}, "
        hi = s.extent if _is_zero(s.min) else s.min + s.extent
        out.append(f"{pad}for {s.var.name} in range({lo}{hi}):{_ann(s)}")
        _lines(s.body, depth + 1, out)
    elif isinstance(s, ir.Store):
        idx = ", ".join(str(i) for i in s.indices)
        out.append(f"{pad}{s.buffer.name}[{idx}] = {s.value}")
    elif isinstance(s, ir.IfThenElse):
        out.append(f"{pad}if {s.cond}:")
        _lines(s.then_body, depth + 1, out)
        if s.else_body is not None:
            out.append(f"{pad}else:")
            _lines(s.else_body, depth + 1, out)
    elif isinstance(s, ir.Allocate):
        shape = ", ".join(str(d) for d in s.buffer.shape)
        out.append(f"{pad}{s.buffer.name} = allocate(({shape},), {s.buffer.dtype}, {s.buffer.scope!r})")
        _lines(s.body, depth, out)
    elif isinstance(s, ir.LetStmt):
        out.append(f"{pad}{s.var.name} = {s.value}")
        _lines(s.body, depth, out)
    elif isinstance(s, ir.Barrier):
        out.append(f"{pad}barrier({s.scope!r})")
    else:
        out.append(f"{pad}<{type(s).__name__}>")


def _is_zero(e) -> bool:  # noqa: ANN001
    from autosched.te.expr import Const

    return isinstance(e, Const) and e.value == 0


def stmt_str(s: ir.Stmt) -> str:
    out: list[str] = []
    _lines(s, 0, out)
    return "\n".join(out)


def func_str(f: ir.PrimFunc) -> str:
    params = ", ".join(
        f"{b.name}: {b.dtype}[{', '.join(str(d) for d in b.shape)}]" for b in f.params
    )
    out = [f"def {f.name}({params}):"]
    _lines(f.body, 1, out)
    return "\n".join(out)
