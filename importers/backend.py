"""An onnx.backend.base.Backend over from_onnx and the node-by-node runner, for ONNX's own
backend test suite (tests/test_onnx_conformance.py).

ONNX node tests feed shape-like operands (a Reshape's shape, a Slice's starts) as graph inputs;
this backend turns such inputs into initializers with the values of the run, since autosched
compiles for static shapes.

Example::

    import onnx.backend.test
    from importers.backend import AutoschedBackend
    suite = onnx.backend.test.BackendTest(AutoschedBackend, __name__)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from autosched.errors import ModelImportError
from autosched.graph.ops import const_inputs
from importers.onnx import from_onnx, opset_of
from importers.reference import run_nodes


def freeze_shape_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                        integers: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` where graph inputs read at constant-only positions (and, with
    ``integers``, every integer input) are initializers holding their ``feeds`` values."""
    opset = opset_of(model, "ONNX model")
    frozen: set[str] = set()
    for node in model.graph.node:
        for k in const_inputs(node.op_type, opset):
            if k < len(node.input) and node.input[k] in feeds:
                frozen.add(node.input[k])
    if integers:
        frozen |= {n for n, a in feeds.items() if np.issubdtype(a.dtype, np.integer)}
    if not frozen:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for name in sorted(frozen):
        out.graph.initializer.append(onnx.numpy_helper.from_array(feeds[name], name))
    kept = [vi for vi in out.graph.input if vi.name not in frozen]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    return out


class AutoschedRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, target: str = "llvm") -> None:
        self.model = model
        self.target = target

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        inits = {i.name for i in self.model.graph.initializer}
        names = [vi.name for vi in self.model.graph.input if vi.name not in inits]
        arrays: Sequence[np.ndarray] = (
            [inputs[n] for n in names] if isinstance(inputs, dict) else list(inputs))
        feeds = {n: np.asarray(a) for n, a in zip(names, arrays)}
        model = freeze_shape_inputs(self.model, feeds)
        runtime = {vi.name for vi in model.graph.input}
        try:
            graph = from_onnx(model, {n: a.shape for n, a in feeds.items() if n in runtime})
        except ModelImportError as e:
            if "to be a constant" not in str(e):
                raise
            # a shape computed from integer inputs (CenterCropPad's target shape): fold them
            model = freeze_shape_inputs(self.model, feeds, integers=True)
            runtime = {vi.name for vi in model.graph.input}
            graph = from_onnx(model, {n: a.shape for n, a in feeds.items() if n in runtime})
        return tuple(run_nodes(graph, {n: a for n, a in feeds.items() if n in runtime},
                               target=self.target))


class AutoschedBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return True

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any
                ) -> AutoschedRep:
        super().prepare(model, device, **kwargs)
        return AutoschedRep(model)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"
