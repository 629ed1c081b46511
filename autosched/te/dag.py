"""ComputeDAG: the operations behind a set of output tensors, and its workload key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import Any

from autosched.te import expr as E
from autosched.te.tensor import ComputeOp, Operation, PlaceholderOp, Tensor
from autosched.te.visit import tensors_read


def _producers(op: Operation) -> Iterator[PlaceholderOp | ComputeOp]:
    return (t.op for t in tensors_read(op.body)) if isinstance(op, ComputeOp) else iter(())


def topo_ops(outputs: Sequence[Tensor]) -> list[PlaceholderOp | ComputeOp]:
    """Every operation the outputs depend on, producers before consumers, in a stable order:
    a depth-first post-order, inputs in first-read order (iterative, since a chain of
    stages can be deeper than Python's recursion limit)."""
    order: list[PlaceholderOp | ComputeOp] = []
    seen: set[int] = set()
    for t in outputs:
        if t.op.uid in seen:
            continue
        seen.add(t.op.uid)
        stack = [(t.op, _producers(t.op))]
        while stack:
            op, pending = stack[-1]
            nxt = next((p for p in pending if p.uid not in seen), None)
            if nxt is None:
                stack.pop()
                order.append(op)
            else:
                seen.add(nxt.uid)
                stack.append((nxt, _producers(nxt)))
    return order


class ComputeDAG:
    """The operations of ``outputs`` in topological order, with a name-independent key."""

    def __init__(self, outputs: Tensor | Sequence[Tensor]):
        self.outputs: list[Tensor] = [outputs] if isinstance(outputs, Tensor) else list(outputs)
        self.ops = topo_ops(self.outputs)
        self.placeholders = [op.output() for op in self.ops if isinstance(op, PlaceholderOp)]
        self.workload_key = workload_key(self.outputs)

    def consumers(self, op: Operation) -> list[ComputeOp]:
        return [c for c in self.ops if isinstance(c, ComputeOp) and any(t.op == op for t in tensors_read(c.body))]

    def flop_count(self) -> int:
        from autosched.te.flops import flop_count

        return flop_count(self.ops)

    def __str__(self) -> str:
        lines = []
        for op in self.ops:
            if isinstance(op, PlaceholderOp):
                lines.append(f"{op.name} = placeholder({_shape(op.shape)}, {op.dtype})")
            else:
                idx = ", ".join(a.name for a in op.axis)
                lines.append(f"{op.name}[{idx}] = {op.body}")
        return "\n".join(lines)


def _shape(shape: tuple[E.Expr, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


class _Seq(list):
    """A list the serialiser writes element by element (a plain list field is a JSON leaf)."""


class _Raw(str):
    """Punctuation written as is."""


class _Canon:
    """Serialises a DAG as JSON with operations and variables numbered by first appearance.

    Iterative, with an explicit stack: a chain of thousands of operations is deeper than
    Python's recursion limit (and json.dumps recurses too). The text is what json.dumps with
    separators (",", ":") makes of the nested lists, so workload keys stay the same."""

    def __init__(self) -> None:
        self.ops: dict[int, int] = {}
        self.vars: dict[int, str] = {}

    def var(self, v: E.Var) -> str:
        if v.uid not in self.vars:
            self.vars[v.uid] = f"v{len(self.vars)}"
        return self.vars[v.uid]

    def parts(self, x: Any) -> list[Any] | None:
        """The elements ``x`` serialises as a JSON list of, or None for a JSON leaf."""
        if isinstance(x, E.Var):
            return ["Var", self.var(x), x.type]
        if isinstance(x, Tensor):
            return ["T", self.ops[x.op.uid], x.value_index]
        if isinstance(x, (tuple, _Seq)):
            return list(x)
        if isinstance(x, E.Node):
            return [type(x).__name__] + [
                # every Node subclass is a dataclass, the base itself is not
                getattr(x, f.name) for f in fields(x)  # type: ignore[arg-type]
                if not (isinstance(x, E.CommReducer) and f.name == "name")]
        return None

    def text(self, x: Any) -> str:
        out: list[str] = []
        stack: list[Any] = [x]
        while stack:
            item = stack.pop()
            if type(item) is _Raw:
                out.append(item)
                continue
            parts = self.parts(item)
            if parts is None:
                leaf = repr(item) if isinstance(item, float) else item
                out.append(json.dumps(leaf, separators=(",", ":")))
                continue
            stack.append(_Raw("]"))
            for k in range(len(parts) - 1, -1, -1):
                stack.append(parts[k])
                if k:
                    stack.append(_Raw(","))
            stack.append(_Raw("["))
        return "".join(out)

    def op(self, op: Operation) -> str:
        self.ops[op.uid] = len(self.ops)
        if isinstance(op, PlaceholderOp):
            return self.text(_Seq(["placeholder", op.shape, op.dtype]))
        assert isinstance(op, ComputeOp)
        return self.text(_Seq(["compute", op.axis, op.reduce_axis, op.body]))


def workload_key(outputs: Sequence[Tensor]) -> str:
    """A stable hash of the computation: independent of tensor names and object identity."""
    canon = _Canon()
    body = [canon.op(op) for op in topo_ops(outputs)]
    body.append(canon.text(_Seq(["outputs", tuple(outputs)])))
    text = "[" + ",".join(body) + "]"
    return hashlib.sha256(text.encode()).hexdigest()[:24]
