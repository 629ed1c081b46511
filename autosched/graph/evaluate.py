"""One node on concrete inputs: its converter's TE outputs under the plain schedule
(``te.create_schedule``), built for a target and run once. Constant folding runs it on the
reference backend (exact, memory-safe, nothing to compile); importers.reference runs a whole
graph node by node with it.

Example::

    from autosched.graph.evaluate import run_node
    (y,) = run_node(node, [x, w], constant=[False, True], opset=17, target="ref")
"""

from __future__ import annotations

import numpy as np

from autosched import te
from autosched.driver import build
from autosched.graph.graph import Node
from autosched.graph.ops import ConvertContext, Value, convert, shape_of
from autosched.te.dag import topo_ops
from autosched.te.tensor import PlaceholderOp, Tensor


def run_node(node: Node, ins: list[np.ndarray | None], constant: list[bool], opset: int,
             target: str = "llvm") -> list[np.ndarray]:
    """Outputs of ``node`` on concrete inputs; inputs flagged ``constant`` reach the converter
    as numpy arrays, the others as placeholders. An output with no name is an empty array."""
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
    bound = {**feeds, **ctx.constants}
    results: list[np.ndarray | None] = [None] * len(outs)
    kernels: list[tuple[int, Tensor]] = []
    for n, o in enumerate(outs):
        if not isinstance(o, Tensor):
            results[n] = np.asarray(o)
        elif isinstance(o.op, PlaceholderOp):
            results[n] = bound[o]
        elif node.outputs[n]:
            kernels.append((n, o))
    if kernels:
        for (n, _), a in zip(kernels, _run([t for _, t in kernels], bound, target)):
            results[n] = a
    return [r if r is not None else np.empty(0) for r in results]


def _run(tensors: list[Tensor], bound: dict[Tensor, np.ndarray], target: str
         ) -> list[np.ndarray]:
    """The values of ``tensors``, whose placeholders are all ``bound``."""
    params = [op.output() for op in topo_ops(tensors) if isinstance(op, PlaceholderOp)]
    mod = build(te.create_schedule([t.op for t in tensors]), params + tensors, target=target)
    arrays = [np.empty(shape_of(t), dtype=t.dtype) for t in tensors]
    # np.require keeps 0-d arrays 0-d (ascontiguousarray makes them 1-d)
    mod(*[np.require(bound[p], requirements="C") for p in params], *arrays)
    return arrays
