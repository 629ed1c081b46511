"""A text report on an ONNX model (``autosched inspect model.onnx``): operator counts and
converter coverage, then, when every op is supported, autosched.graph.inspect's report on the
imported graph (FLOPs per op type, the tasks the graph compiler would tune).

Example::

    from importers.inspect import inspect_model
    print(inspect_model("resnet18.onnx", shapes={"input": (1, 3, 224, 224)}))
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from autosched.graph.inspect import inspect, table
from importers.contrib import DEFAULT_DOMAINS, qualified
from importers.onnx import from_onnx, importable, load


def inspect_model(model: str | os.PathLike | Any,
                  shapes: Mapping[str, tuple[int, ...]] | None = None,
                  target: str = "llvm", tasks: bool = True) -> str:
    """The report for an ONNX file or ModelProto. A model with unsupported ops still gets its
    operator counts and coverage, with the unsupported nodes listed."""
    proto = load(model)
    counts: dict[str, int] = {}
    for n in proto.graph.node:
        op = n.op_type if n.domain in DEFAULT_DOMAINS else qualified(n.domain, n.op_type)
        counts[op] = counts.get(op, 0) + 1
    missing = {op: n for op, n in counts.items() if not importable(op)}
    if missing:
        total = sum(counts.values())
        lines = [f"model {proto.graph.name or 'model'}: {len(proto.graph.node)} nodes"]
        lines += table(sorted((op, str(n), "yes" if importable(op) else "NO")
                              for op, n in counts.items()), ("op type", "count", "supported"))
        lines.append(f"coverage: {total - sum(missing.values())}/{total} nodes supported; "
                     f"unsupported: {', '.join(sorted(missing))}")
        return "\n".join(lines)
    graph = from_onnx(proto, shapes)
    folded = len(proto.graph.node) - len(graph.nodes)
    report = inspect(graph, target, tasks)
    return report + (f"\n({folded} nodes folded into constants at import)" if folded else "")
