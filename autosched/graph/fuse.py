"""Operator fusion: group a graph's nodes into kernels.

Each group is one task. A group starts at an anchor (any node whose output is not a plain
elementwise function of one producer's output: convolutions, matmuls, pooling, reductions,
layout changes) and absorbs the elementwise and broadcast nodes that follow it, as long as the
value it extends has no other reader and is not a graph output (conv + bias + activation +
residual add become one kernel). Chains of injective nodes fuse the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autosched.graph.graph import Graph, Node

# Outputs are elementwise in the first input (other inputs broadcast into it).
ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Relu", "LeakyRelu", "PRelu",
    "Sigmoid", "Tanh", "Erf", "Gelu", "HardSigmoid", "HardSwish", "Clip", "Exp", "Log", "Sqrt",
    "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Where", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Cast", "Identity", "Dropout",
    "BatchNormalization",
}


@dataclass
class Group:
    """Nodes computed by one kernel; ``outputs`` are the values read outside it."""

    nodes: list[Node]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "_".join(n.op_type.lower() for n in self.nodes)[:60]


def fuse(graph: Graph, runtime: set[str]) -> list[Group]:
    """Groups in execution order. ``runtime`` are the values computed at run time (not
    constants); constant-only nodes never reach here (the importer folded them)."""
    readers: dict[str, int] = {}
    for n in graph.nodes:
        for i in set(n.inputs):
            readers[i] = readers.get(i, 0) + 1
    outputs = set(graph.outputs)
    groups: list[Group] = []
    owner: dict[str, Group] = {}
    for node in graph.nodes:
        if not any(o in runtime for o in node.outputs):
            continue
        target = None
        if node.op_type in ELEMENTWISE and len(node.outputs) == 1:
            for i in node.inputs:
                g = owner.get(i)
                if g is None or i in outputs or readers.get(i, 0) != 1:
                    continue
                if graph.values[i].shape == graph.values[node.outputs[0]].shape:
                    target = g
                    break
        if target is None:
            target = Group([])
            groups.append(target)
        target.nodes.append(node)
        for o in node.outputs:
            owner[o] = target
    for g in groups:
        made = {o for n in g.nodes for o in n.outputs}
        seen: list[str] = []
        for n in g.nodes:
            for i in n.inputs:
                if i and i not in made and i not in seen:
                    seen.append(i)
        g.inputs = seen
    for g in groups:
        g.outputs = [o for n in g.nodes for o in n.outputs
                     if o in runtime and (o in outputs or any(o in h.inputs for h in groups if h is not g))]
    return groups
