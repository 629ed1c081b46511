"""A text report on a graph: operator counts, converter coverage, FLOPs per op type and the
tasks the graph compiler would tune (``autosched inspect model.onnx`` through
importers.inspect.inspect_model).

Example::

    from autosched.graph.inspect import inspect
    print(inspect(graph))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from autosched import te
from autosched.graph.fold import lazy_inputs
from autosched.graph.graph import Graph, Node
from autosched.graph.ops import ConvertContext, convert, supported
from autosched.te.flops import flop_count
from autosched.te.tensor import Operation, PlaceholderOp, Tensor


def node_ops(node: Node, graph: Graph) -> list[Operation]:
    """The TE operations one node's converter builds (placeholders for its runtime inputs)."""
    ins: list[Any] = []
    for name in node.inputs:
        if not name:
            ins.append(None)
        elif name in graph.constants:
            ins.append(graph.constants[name])
        else:
            vi = graph.values[name]
            ins.append(te.placeholder(vi.shape, dtype=vi.dtype, name="in"))
    if all(not i or i in graph.constants for i in node.inputs):
        ins = lazy_inputs(node, ins, graph.opset)  # left unfolded: too large to compute here
    outs = convert(node, ins, ConvertContext(opset=graph.opset))
    seen: dict[int, Operation] = {}
    stack = [t.op for t in outs if isinstance(t, Tensor)]
    while stack:
        op = stack.pop()
        if op.uid in seen or isinstance(op, PlaceholderOp):
            continue
        seen[op.uid] = op
        stack.extend(t.op for t in op.input_tensors)
    return list(seen.values())


def flops_by_op(graph: Graph) -> dict[str, int]:
    """Floating-point operations per op type, summed over the graph's nodes."""
    out: dict[str, int] = {}
    for node in graph.nodes:
        out[node.op_type] = out.get(node.op_type, 0) + flop_count(node_ops(node, graph))
    return out


def table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
    """Report lines: the header and rows in columns, the first left-aligned."""
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    fmt = "  ".join(f"{{:{'<' if k == 0 else '>'}{w}}}" for k, w in enumerate(widths))
    return ["  " + fmt.format(*header)] + ["  " + fmt.format(*r) for r in rows]


def _gflops(n: int) -> str:
    return f"{n / 1e9:.4f}"


def inspect(graph: Graph, target: str = "llvm", tasks: bool = True) -> str:
    """Counts, FLOPs per op type and (unless ``tasks`` is false) the tasks to tune."""
    lines = [f"model {graph.name} (opset {graph.opset})"]
    lines += [f"  input  {v}" for v in graph.inputs]
    lines += [f"  output {graph.values[o]}" for o in graph.outputs]
    n_params = sum(int(np.prod(a.shape)) for a in graph.constants.values())
    lines.append(f"  {len(graph.nodes)} nodes, {len(graph.constants)} constants "
                 f"({n_params} elements)")
    counts = graph.op_counts()
    flops = flops_by_op(graph)
    total = sum(flops.values())
    lines.append("operators:")
    rows = [(op, str(n), _gflops(flops.get(op, 0)),
             f"{100 * flops.get(op, 0) / total:.1f}%" if total else "-")
            for op, n in sorted(counts.items(), key=lambda kv: (-flops.get(kv[0], 0), kv[0]))]
    lines += table(rows, ("op type", "count", "GFLOP", "share"))
    lines.append(f"  total {_gflops(total)} GFLOP")
    n_supported = sum(n for op, n in counts.items() if supported(op))
    lines.append(f"coverage: {n_supported}/{sum(counts.values())} nodes supported")
    if tasks:
        lines += _tasks(graph, target)
    return "\n".join(lines)


def _tasks(graph: Graph, target: str) -> list[str]:
    from autosched.graph.compiler import extract_tasks  # the search, with xgboost: on demand

    found, weights = extract_tasks(graph, target)
    lines = [f"tasks to tune ({target}): {len(found)} distinct, {sum(weights)} kernels"]
    rows = [(t.name, str(w), _gflops(t.flop_count), _gflops(t.flop_count * w))
            for t, w in zip(found, weights)]
    return lines + table(rows, ("task", "weight", "GFLOP", "GFLOP x weight"))

