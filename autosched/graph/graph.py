"""The graph IR: what an importer returns and what the graph compiler consumes.

A Graph is a list of nodes in topological order. Every value (graph input, constant, node
output) has a name and a ValueInfo (static shape and dtype, known after the importer binds the
symbolic dims). Constants (initializers, Constant nodes, folded subgraphs) live in
``constants`` as numpy arrays. A node keeps its source op type (e.g. the ONNX op type) and its
attributes; ``autosched.graph.ops`` maps each op type to a converter that builds its TE
computation from its inputs, so the compiler can put any group of nodes into one task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A Conv node attribute the graph passes add (never an ONNX one): "IHWO" when the pass
# autosched.graph.passes.pack_conv_weights stored its constant weight output channels last.
KERNEL_LAYOUT = "autosched.kernel_layout"
# A RecurrentCell attribute: "kn" when its R is stored transposed, (H, G*H), "panels" when
# transposed in column panels, (ceil(G*H / P), H, P) (passes.pack_gemm_weights, rnn.R_LAYOUTS).
R_LAYOUT = "autosched.r_layout"
# A Gemm / MatMul attribute: n, the columns of its constant B, when passes.pack_gemm_weights
# stored B as column panels, (ceil(n / P), K, P), zero past column n (te.ops.panel_matmul).
B_PANELS = "autosched.b_panels"

# A MatMulInteger / ConvInteger / QLinear* attribute (passes.dot4_products): the 8-bit
# dot-product tensor intrinsic (tir/tensor_intrin.py) whose lanes and operand dtypes its
# constant 8-bit weight is stored packed for (te.ops.quant.matmul_dot4, conv2d_dot4).
DOT4 = "autosched.dot4"

# An Im2Col attribute (passes.gemm_convs): 1 when the patches are gathered inside the matmul
# that reads them (fuse.py puts both in one kernel) instead of written by a kernel of their own.
IMPLICIT = "autosched.implicit"
# A node attribute: 1 when its outputs stay float32 under half precisions (graph/precision.py),
# as the partial sums of a GEMM whose K passes.gemm_convs or passes.split_matmuls splits.
FP32_OUTPUT = "autosched.fp32_output"

# Op types that autosched's own passes create (never ONNX ones): a model may not use them.
INTERNAL_OP_TYPES = frozenset({"WinogradInput", "WinogradOutput", "Im2Col", "IfSelect",
                               "RuntimeFill", "RuntimeRange"})


@dataclass(frozen=True)
class ValueInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}{list(self.shape)}"


@dataclass
class Node:
    """One operator application. ``inputs`` may hold "" for an omitted optional input."""

    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{', '.join(self.outputs)} = {self.op_type}({', '.join(self.inputs)})  # {self.name}"


@dataclass
class Graph:
    inputs: list[ValueInfo]
    outputs: list[str]
    nodes: list[Node]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, ValueInfo] = field(default_factory=dict)
    name: str = "model"
    opset: int = 0

    def producer(self, value: str) -> Node | None:
        for n in self.nodes:
            if value in n.outputs:
                return n
        return None

    def consumers(self, value: str) -> list[Node]:
        return [n for n in self.nodes if value in n.inputs]

    def op_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.op_type] = out.get(n.op_type, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"graph {self.name} (opset {self.opset})"]
        lines += [f"  input {v}" for v in self.inputs]
        lines += [f"  const {k}: {a.dtype}{list(a.shape)}" for k, a in self.constants.items()]
        lines += [f"  {n}" for n in self.nodes]
        lines += [f"  output {self.values.get(o, o)}" for o in self.outputs]
        return "\n".join(lines)
