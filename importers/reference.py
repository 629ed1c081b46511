"""Run an imported Graph node by node, one default-scheduled kernel per node (no fusion, no
tuning): the simplest executor, for checking converters against onnxruntime and for the ONNX
backend tests. The graph compiler (autosched.graph.compiler) is the fast path.

Example::

    from importers import from_onnx
    from importers.reference import run_nodes
    g = from_onnx("model.onnx", shapes={"x": (1, 3, 32, 32)})
    (y,) = run_nodes(g, {"x": x_array})
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import autosched as aus
from autosched import te
from autosched.errors import ModelImportError
from autosched.graph.graph import Graph, Node
from autosched.graph.ops import ConvertContext, Value, convert
from autosched.te.tensor import PlaceholderOp, Tensor


def run_node(node: Node, ins: list[np.ndarray | None], constant: list[bool], opset: int,
             target: str = "llvm") -> list[np.ndarray]:
    """Outputs of ``node`` on concrete inputs; inputs flagged ``constant`` reach the converter
    as numpy arrays, the others as placeholders."""
    ctx = ConvertContext(opset=opset)
    feeds: dict[Tensor, np.ndarray] = {}
    args: list[Value | None] = []
    for k, (v, is_const) in enumerate(zip(ins, constant)):
        if v is None or is_const:
            args.append(v)
            continue
        ph = te.placeholder(v.shape, dtype=str(v.dtype), name=f"in{k}")
        feeds[ph] = v
        args.append(ph)
    outs = convert(node, args, ctx)
    results: list[np.ndarray | None] = [None] * len(outs)
    kernels: list[tuple[int, Tensor]] = []
    for n, o in enumerate(outs):
        if not isinstance(o, Tensor):
            results[n] = np.asarray(o)
        elif isinstance(o.op, PlaceholderOp):
            results[n] = {**feeds, **ctx.constants}[o]
        elif node.outputs[n]:
            kernels.append((n, o))
    if kernels:
        tensors = [t for _, t in kernels]
        bound = {**feeds, **ctx.constants}
        read = _placeholders_read(tensors)
        params = [p for p in bound if p.op in read]
        s = te.create_schedule([t.op for t in tensors])
        mod = aus.build(s, params + tensors, target=target)
        arrays = [np.empty(tuple(int(d) for d in t.shape), dtype=t.dtype) for t in tensors]
        # np.require keeps 0-d arrays 0-d (ascontiguousarray makes them 1-d)
        mod(*[np.require(bound[p], requirements="C") for p in params], *arrays)
        for (n, _), a in zip(kernels, arrays):
            results[n] = a
    return [r if r is not None else np.empty(0) for r in results]


def _placeholders_read(outputs: list[Tensor]) -> set[PlaceholderOp]:
    """The placeholders the outputs depend on (the kernel's parameters)."""
    seen: set[int] = set()
    found: set[PlaceholderOp] = set()
    stack = [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.uid in seen:
            continue
        seen.add(op.uid)
        if isinstance(op, PlaceholderOp):
            found.add(op)
        else:
            stack.extend(t.op for t in op.input_tensors)
    return found


def run_nodes(graph: Graph, feeds: Mapping[str, np.ndarray], target: str = "llvm"
              ) -> list[np.ndarray]:
    """The graph's outputs, in order, for ``feeds`` {input name: array}."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    for vi in graph.inputs:
        if vi.name not in feeds:
            raise ModelImportError(f"run_nodes: no value fed for input {vi.name!r} {vi}")
        arr = np.asarray(feeds[vi.name])
        if tuple(arr.shape) != vi.shape:
            raise ModelImportError(f"run_nodes: input {vi.name!r} has shape {arr.shape}, the "
                                   f"graph was imported for {vi.shape}")
        env[vi.name] = arr.astype(vi.dtype, copy=False)
    for node in graph.nodes:
        ins = [env[name] if name else None for name in node.inputs]
        flags = [name in graph.constants for name in node.inputs]
        for name, v in zip(node.outputs, run_node(node, ins, flags, graph.opset, target)):
            if name:
                env[name] = v
    return [env[name] for name in graph.outputs]
