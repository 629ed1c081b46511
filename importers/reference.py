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

from autosched.errors import ModelImportError
from autosched.graph.evaluate import run_node
from autosched.graph.graph import Graph


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
