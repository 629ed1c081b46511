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


def _producers(op: Operation) -> Iterator[Operation]:
    return (t.op for t in tensors_read(op.body)) if isinstance(op, ComputeOp) else iter(())


def topo_ops(outputs: Sequence[Tensor]) -> list[Operation]:
    """Every operation the outputs depend on, producers before consumers, in a stable order:
    a depth-first post-order, inputs in first-read order (iterative, since a chain of
    stages can be deeper than Python's recursion limit)."""
    order: list[Operation] = []
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


class _Canon:
    """Serialises a DAG with operations and variables numbered by first appearance."""

    def __init__(self) -> None:
        self.ops: dict[int, int] = {}
        self.vars: dict[int, str] = {}

    def var(self, v: E.Var) -> str:
        if v.uid not in self.vars:
            self.vars[v.uid] = f"v{len(self.vars)}"
        return self.vars[v.uid]

    def value(self, x: Any) -> Any:
        if isinstance(x, E.Var):
            return ["Var", self.var(x), x.type]
        if isinstance(x, Tensor):
            return ["T", self.ops[x.op.uid], x.value_index]
        if isinstance(x, tuple):
            return [self.value(v) for v in x]
        if isinstance(x, E.Node):
            out: list[Any] = [type(x).__name__]
            for f in fields(x):  # type: ignore[arg-type]
                if isinstance(x, E.CommReducer) and f.name == "name":
                    continue
                out.append(self.value(getattr(x, f.name)))
            return out
        if isinstance(x, float):
            return repr(x)
        return x

    def op(self, op: Operation) -> Any:
        self.ops[op.uid] = len(self.ops)
        if isinstance(op, PlaceholderOp):
            return ["placeholder", self.value(op.shape), op.dtype]
        assert isinstance(op, ComputeOp)
        return ["compute", self.value(op.axis), self.value(op.reduce_axis), self.value(op.body)]


def workload_key(outputs: Sequence[Tensor]) -> str:
    """A stable hash of the computation: independent of tensor names and object identity."""
    canon = _Canon()
    body = [canon.op(op) for op in topo_ops(outputs)]
    body.append(["outputs", [canon.value(t) for t in outputs]])
    text = json.dumps(body, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]
