"""Operator fusion: group a graph's nodes into kernels.

Each group is one task. A group starts at an anchor (a node that is not elementwise in one of
its inputs: convolutions, matmuls, pooling, reductions, layout changes) and absorbs the
elementwise and broadcast nodes that follow it, as long as the value it extends has no other
reader and is not a graph output: conv + bias + activation + residual add become one kernel.
A value read several times still extends when its readers converge in one elementwise node
(Gelu written with Erf: the matmul, its bias and the whole Gelu are one kernel).
Injective nodes (reshapes, transposes, slices, pads, concats, gathers) join a group made only of
injective and elementwise nodes, so chains of layout changes become one copy kernel; they never
join a group holding a reduction (its output would be re-read out of order, defeating the
reduction's schedule), but for the nodes passes mark IMPLICIT (gemm_convs' im2col patches,
split_matmuls' slices of K): a chain of them joins the matmul that reads it, which then
gathers them, or reads them in place, as it copies its tiles.
A group holds at most MAX_GROUP_NODES nodes: inlined, a group is one expression as deep as its
chain, and lowering, simplification and code generation walk expressions recursively.

Example::

    groups = fuse(graph, runtime_values(graph))
    [g.name for g in groups]     # ['conv_relu', 'conv_add_relu', 'maxpool', ...]
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autosched.graph.graph import IMPLICIT, Graph, Node

# Outputs are elementwise in an input of the same shape (other inputs broadcast into it).
ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Relu", "LeakyRelu",
    "PRelu", "Elu", "Selu", "Sigmoid", "Tanh", "Erf", "Gelu", "HardSigmoid", "HardSwish",
    "Softplus", "Softsign", "Clip", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Floor",
    "Ceil", "Round", "Sign", "Sin", "Cos", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "Not", "And", "Or", "Xor", "Cast", "CastLike", "Identity", "Dropout",
    "BatchNormalization", "QuantizeLinear", "DequantizeLinear", "Trilu", "IfSelect",
}

# Each output element reads a fixed set of input elements, no reduction.
INJECTIVE = {
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Expand", "Tile", "Pad",
    "Concat", "Gather", "Split", "DepthToSpace", "SpaceToDepth", "Resize", "GatherND", "OneHot",
    "Im2Col",
}

# Nodes per group: a chain of 800 elementwise nodes made one 800-stage kernel whose lowering
# recursed past Python's limit; 32 keeps every real fusion (conv + bias + activation +
# residual, a decomposed Gelu or LayerNorm) whole.
MAX_GROUP_NODES = 32


@dataclass
class Group:
    """Nodes computed by one kernel; ``outputs`` are the values read outside it."""

    nodes: list[Node]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "_".join(n.op_type.lower() for n in self.nodes)[:60]

    @property
    def injective(self) -> bool:
        """Whether every node is elementwise or injective (no reduction, no anchor)."""
        return all(n.op_type in ELEMENTWISE or n.op_type in INJECTIVE for n in self.nodes)


def _can_extend(graph: Graph, value: str, group: Group | None, readers: dict[str, int],
                outputs: set[str], diamonds: set[str]) -> bool:
    return (group is not None and len(group.nodes) < MAX_GROUP_NODES and value not in outputs
            and value in graph.values and (readers.get(value, 0) == 1 or value in diamonds))


def _converging(graph: Graph, value: str, readers_of: dict[str, list[Node]],
                order: dict[int, int], outputs: set[str], limit: int = 16) -> bool:
    """Whether the readers of ``value`` form an elementwise region of its shape that ends in a
    single node (a diamond such as Gelu's Erf form, x * (1 + erf(x / sqrt 2)) / 2): then the
    whole region can join ``value``'s group without writing ``value`` out.

    A topological sweep: the frontier holds the region's values that still have readers
    outside it; the earliest is expanded (all its readers must be elementwise nodes of the same
    shape) until one value is left: the region's only exit."""
    shape = graph.values[value].shape
    producer_pos = {value: -1}
    frontier = {value}
    region: set[int] = set()
    while True:
        if region and len(frontier) == 1:
            return True
        if len(region) >= limit:
            return False
        v = min(frontier, key=lambda x: producer_pos[x])
        rs = readers_of.get(v, [])
        if v in outputs or not rs:
            return False
        frontier.discard(v)
        for r in rs:
            if id(r) in region:
                continue
            outs = [o for o in r.outputs if o]
            if (r.op_type not in ELEMENTWISE or len(outs) != 1
                    or graph.values[outs[0]].shape != shape):
                return False
            region.add(id(r))
            producer_pos[outs[0]] = order[id(r)]
            frontier.add(outs[0])


def _implicit_chain(node: Node, groups: list[Group], readers: dict[str, int],
                    outputs: set[str]) -> Group | None:
    """The last group made, when it is a chain of nodes marked IMPLICIT (an Im2Col of
    passes.gemm_convs; the Reshape and Transpose of passes.split_matmuls) whose value only
    ``node`` reads: the group ``node`` joins (an implicit node extending the chain, or the
    matmul reading it, which then reads those values as it copies its tiles)."""
    last = groups[-1] if groups else None
    if last is None or not last.nodes or not all(n.attrs.get(IMPLICIT) for n in last.nodes):
        return None
    value = last.nodes[-1].outputs[0] if last.nodes[-1].outputs else ""
    if value not in node.inputs or readers.get(value, 0) != 1 or value in outputs:
        return None
    return last


def fuse(graph: Graph, runtime: set[str]) -> list[Group]:
    """Groups in execution order. ``runtime`` are the values computed at run time (not
    constants); constant-only nodes never reach here (passes.fold_constants folded them)."""
    readers: dict[str, int] = {}
    for n in graph.nodes:
        for i in set(n.inputs):
            readers[i] = readers.get(i, 0) + 1
    outputs = set(graph.outputs)
    readers_of: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for i in dict.fromkeys(n.inputs):
            readers_of.setdefault(i, []).append(n)
    order = {id(n): k for k, n in enumerate(graph.nodes)}
    # values read several times that may still be extended: their readers converge
    diamonds = {v for v, rs in readers_of.items()
                if len(rs) > 1 and v in graph.values and v in runtime
                and _converging(graph, v, readers_of, order, outputs)}
    groups: list[Group] = []
    owner: dict[str, Group] = {}
    index: dict[int, int] = {}   # id(group) -> creation order
    for node in graph.nodes:
        if not any(o in runtime for o in node.outputs if o):
            continue
        target = None
        outs = [o for o in node.outputs if o]
        # implicit patches start a group of their own, which their matmul joins next
        if len(outs) == 1 and (node.op_type in ELEMENTWISE or node.op_type in INJECTIVE) \
                and not node.attrs.get(IMPLICIT):
            shape = graph.values[outs[0]].shape
            for i in node.inputs:
                g = owner.get(i)
                if not _can_extend(graph, i, g, readers, outputs, diamonds):
                    continue
                # creation order stays an execution order: no other input may come from a
                # group created later (that group could read this one: a cycle)
                if any(index[id(owner[j])] > index[id(g)] for j in node.inputs if j in owner):
                    continue
                if node.op_type in ELEMENTWISE and graph.values[i].shape == shape:
                    target = g
                    break
                if g is not None and g.injective:
                    target = g
                    break
        if node.attrs.get(IMPLICIT) or (target is None and node.op_type not in ELEMENTWISE
                                        and node.op_type not in INJECTIVE):
            target = _implicit_chain(node, groups, readers, outputs)
        if target is None:
            target = Group([])
            index[id(target)] = len(groups)
            groups.append(target)
        target.nodes.append(node)
        for o in outs:
            owner[o] = target
    for g in groups:
        made = {o for n in g.nodes for o in n.outputs}
        seen: list[str] = []
        for n in g.nodes:
            for i in n.inputs:
                if i and i not in made and i not in seen:
                    seen.append(i)
        g.inputs = seen
    read_by: dict[str, set[int]] = {}
    for k, g in enumerate(groups):
        for i in g.inputs:
            read_by.setdefault(i, set()).add(k)
    for k, g in enumerate(groups):
        g.outputs = [o for n in g.nodes for o in n.outputs
                     if o in runtime and (o in outputs or read_by.get(o, set()) - {k})]
    return groups
