"""The converter registry: how each graph op type (ONNX's names) becomes TE computations.

A converter is ``fn(node, inputs, ctx) -> outputs``. ``inputs`` holds, per node input, a
``te.Tensor`` for a runtime value, a numpy array for a constant (initializer, Constant node,
folded subgraph) or None for an omitted optional input. It returns one value per node output:
a ``te.Tensor``, or a numpy array when the output follows from constants and shapes alone
(Shape, Size, ConstantOfShape, Range, shape arithmetic on constants). That is how importers fold
shape subgraphs: they run every converter once on placeholders and constants.

A converter that needs a tensor for a constant input (a Conv weight) calls ``ctx.const(array)``,
which makes a placeholder and records it in ``ctx.constants`` (placeholder -> array): whoever
builds the function binds those placeholders to the arrays. Inputs listed in
``CONST_INPUTS[op_type]`` (a Reshape's shape, a Slice's starts) must be numpy arrays: they fix
the output shape.

Example::

    import numpy as np
    from autosched import te
    from autosched.graph import Node
    from autosched.graph.ops import ConvertContext, convert
    x = te.placeholder((2, 3, 8, 8), name="x")
    w = np.ones((4, 3, 3, 3), "float32")
    ctx = ConvertContext(opset=17)
    node = Node("conv0", "Conv", ["x", "w"], ["y"], {"pads": [1, 1, 1, 1]})
    (y,) = convert(node, [x, w], ctx)           # te.Tensor (2, 4, 8, 8)
    # ctx.constants == {<placeholder w>: w}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autosched import te
from autosched.errors import ModelImportError, TEError
from autosched.graph.graph import Node
from autosched.te.ops.args import static_shape
from autosched.te.tensor import Tensor

Value = Tensor | np.ndarray
Converter = Callable[[Node, list[Value | None], "ConvertContext"], Sequence[Value]]

CONVERTERS: dict[str, Converter] = {}
CONST_INPUTS: dict[str, Callable[[int], tuple[int, ...]]] = {}


@dataclass
class ConvertContext:
    """What a converter may ask of its caller: the opset and tensors for constants.

    ``constants`` maps every placeholder that ``const`` made to its array; ``names`` maps
    ``id(array)`` of constant inputs to their value names, so placeholders are named after them.
    """

    opset: int = 17
    constants: dict[Tensor, np.ndarray] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    _made: dict[int, tuple[Tensor, np.ndarray]] = field(default_factory=dict)

    def const(self, value: Value | float | int | Sequence[Any], dtype: str | None = None) -> Tensor:
        """A tensor for ``value``: a Tensor unchanged, an array (or scalar) as a placeholder
        bound to it in ``constants``; the same array object always gives the same placeholder."""
        if isinstance(value, Tensor):
            return value
        arr = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=dtype)
        if dtype is not None and str(arr.dtype) != dtype:
            arr = arr.astype(dtype)
        made = self._made.get(id(arr))
        if made is not None:
            return made[0]
        name = self.names.get(id(arr), f"const{len(self._made)}")
        t = te.placeholder(arr.shape, dtype=str(arr.dtype), name=name)
        self._made[id(arr)] = (t, arr)  # keeps arr alive so its id is not reused
        self.constants[t] = arr
        return t


def register(*op_types: str, const_inputs: Callable[[int], tuple[int, ...]] | tuple[int, ...] = ()
             ) -> Callable[[Converter], Converter]:
    """Register a converter for ``op_types``. ``const_inputs``: the input positions that must be
    constants, or a function of the opset giving them."""
    positions = const_inputs if callable(const_inputs) else (lambda _opset, c=const_inputs: c)

    def deco(fn: Converter) -> Converter:
        for name in op_types:
            CONVERTERS[name] = fn
            CONST_INPUTS[name] = positions
        return fn

    return deco


def supported(op_type: str) -> bool:
    """Whether ``op_type`` (of the default ONNX domain) has a converter."""
    return op_type in CONVERTERS


def const_inputs(op_type: str, opset: int) -> tuple[int, ...]:
    """Input positions of ``op_type`` that must be constants (numpy) at ``opset``."""
    return CONST_INPUTS[op_type](opset) if op_type in CONST_INPUTS else ()


def convert(node: Node, inputs: Sequence[Value | None], ctx: ConvertContext) -> list[Value]:
    """Run the converter of ``node``; any error becomes a ModelImportError naming the node and
    its op type (and the input shapes)."""
    if node.op_type not in CONVERTERS:
        raise ModelImportError(f"node {node.name!r}: op type {node.op_type} is not supported")
    ins = list(inputs)
    for n in const_inputs(node.op_type, ctx.opset):
        value = optional(ins, n)
        if isinstance(value, Tensor):
            raise ModelImportError(
                f"node {node.name!r} ({node.op_type}): input {n} ({node.inputs[n]!r}) must be a "
                f"constant (it fixes the output shape), got a runtime tensor {value.shape}"
            )
    for name, v in zip(node.inputs, ins):
        if isinstance(v, np.ndarray):
            ctx.names.setdefault(id(v), _ident(name))
    try:
        outs = CONVERTERS[node.op_type](node, ins, ctx)
    except ModelImportError:
        raise
    except (TEError, ValueError, IndexError, KeyError, TypeError) as e:
        raise ModelImportError(
            f"node {node.name!r} ({node.op_type}) with inputs {describe(ins)}: {e}"
        ) from e
    if len(outs) < len(node.outputs):
        raise ModelImportError(
            f"node {node.name!r} ({node.op_type}): {len(node.outputs)} outputs requested, the "
            f"converter gives {len(outs)}"
        )
    return list(outs[: len(node.outputs)])


def describe(values: Sequence[Value | None]) -> str:
    """Shapes and dtypes of converter inputs, for error messages."""
    parts = []
    for v in values:
        if v is None:
            parts.append("None")
        elif isinstance(v, Tensor):
            parts.append(f"{v.dtype}{list(v.shape)}")
        else:
            parts.append(f"const {v.dtype}{list(v.shape)}")
    return "(" + ", ".join(parts) + ")"


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out or "const"


class OpError(ModelImportError):
    """Raised by converters for bad attributes or inputs; ``convert`` adds the node name."""


def fail(node: Node, msg: str) -> OpError:
    return OpError(f"node {node.name!r} ({node.op_type}): {msg}")


def optional(ins: Sequence[Value | None], pos: int) -> Value | None:
    """Input ``pos``, or None where the node omits it."""
    return ins[pos] if pos < len(ins) else None


def required(node: Node, ins: Sequence[Value | None], pos: int) -> Value:
    """Input ``pos``, which the op cannot do without."""
    value = optional(ins, pos)
    if value is None:
        raise fail(node, f"input {pos} is missing; the op requires it")
    return value


def tensor_input(ctx: ConvertContext, node: Node, ins: Sequence[Value | None], pos: int) -> Tensor:
    """Required input ``pos`` as a tensor (a constant becomes a placeholder bound to it)."""
    return ctx.const(required(node, ins, pos))


def shape_of(value: Value) -> tuple[int, ...]:
    """The static shape of a converter input (the importer binds every symbolic dim first)."""
    return value.shape if isinstance(value, np.ndarray) else static_shape(value, "import")


# the converters register themselves on import
from autosched.graph import (  # noqa: E402, F401
    fold,
    ops_control,
    ops_index,
    ops_linalg,
    ops_math,
    ops_nn,
    ops_quant,
    ops_rnn,
    ops_shape,
)
