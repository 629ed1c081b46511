"""ONNX If and Loop, expanded into plain nodes while importing.

autosched compiles static graphs, so control flow must resolve at import time: an If whose
condition folds to a constant becomes the nodes of the branch it takes (else see below), and a
Loop whose trip count and condition fold to constants is unrolled, one iteration at a time
(the body's condition output is only known once the iteration's nodes have been converted, so
each step emits one iteration plus a continuation Loop node that the importer meets next).

Values defined inside a branch or body get a fresh suffix per expansion, so unrolled
iterations and repeated branches never clash; names a subgraph reads from enclosing scopes
are mapped through ``Subgraph.outer`` (the renames of the scopes around it).

An If whose condition is known only at run time computes both branches and selects each
output by the condition (IfSelect): branches have no side effects, and a static graph needs
their outputs to agree in shape and dtype, which the selection checks.

The importer calls ``expand(node, env)`` before converting each node: it returns the nodes
to convert instead, or None when the node is not control flow it expands.

Example::

    queue = list(nodes)
    while queue:
        node = queue.pop(0)
        inlined = expand(node, env)
        if inlined is not None:
            queue[:0] = inlined
            continue
        ...   # convert node as usual
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autosched.errors import ModelImportError
from autosched.graph.graph import Node
from importers import contrib

# an unbounded Loop (no trip count) must stop through its condition within this many steps
MAX_UNROLL = 4096
_fresh = itertools.count()


@dataclass(frozen=True)
class Subgraph:
    """A GraphProto attribute with the renames of the scopes around it: free names read
    inside the graph are looked up in ``outer`` first."""

    proto: Any
    outer: Mapping[str, str] = field(default_factory=dict)


def _subgraph(v: Any) -> Subgraph:
    return v if isinstance(v, Subgraph) else Subgraph(v)


def _attribute(a: Any) -> Any:
    from onnx import AttributeProto

    from importers.onnx import attribute

    return Subgraph(a.g) if a.type == AttributeProto.GRAPH else attribute(a)


def _rename_attr(v: Any, rename: Mapping[str, str]) -> Any:
    """A nested subgraph sees the enclosing renames through its ``outer`` map."""
    if isinstance(v, Subgraph) or type(v).__name__ == "GraphProto":
        sub = _subgraph(v)
        return Subgraph(sub.proto, {**rename, **{k: rename.get(n, n)
                                                 for k, n in sub.outer.items()}})
    return v


def inline(sub: Subgraph, bind: Mapping[str, str], where: str) -> tuple[list[Node], list[str]]:
    """The nodes of ``sub`` with every value it defines renamed afresh (its inputs bound by
    ``bind``, its initializers as Constant nodes), and the names of its outputs."""
    from onnx import numpy_helper

    g = sub.proto
    tag = f"__{where}{next(_fresh)}"
    rename: dict[str, str] = dict(sub.outer)
    rename.update(bind)
    nodes: list[Node] = []
    for init in g.initializer:
        rename[init.name] = init.name + tag
        nodes.append(Node(f"{init.name}{tag}", "Constant", [], [rename[init.name]],
                          {"value": numpy_helper.to_array(init)}))
    for n in g.node:
        for o in n.output:
            if o:
                rename[o] = o + tag
    for k, n in enumerate(g.node):
        attrs = {a.name: _rename_attr(_attribute(a), rename) for a in n.attribute}
        nodes.append(Node(f"{n.name or n.op_type + str(k)}{tag}", contrib.op_type_of(n, where),
                          [rename.get(i, i) if i else "" for i in n.input],
                          [rename.get(o, o) if o else "" for o in n.output], attrs))
    return nodes, [rename.get(o.name, o.name) for o in g.output]


def _const(env: Mapping[str, Any], node: Node, pos: int) -> np.ndarray | None:
    """Input ``pos`` when given and folded to a constant; None when absent."""
    if pos >= len(node.inputs) or not node.inputs[pos]:
        return None
    v = env.get(node.inputs[pos])
    return v if isinstance(v, np.ndarray) else _NOT_CONST


_NOT_CONST: Any = object()


def expand(node: Node, env: Mapping[str, Any]) -> list[Node] | None:
    """The nodes replacing ``node`` (an If or a Loop step whose controls are constants, a
    recurrent layer as per-step cells), or None to convert ``node`` as it is."""
    if node.op_type == "If":
        return _expand_if(node, env)
    if node.op_type == "Loop":
        return _expand_loop(node, env)
    if contrib.expands(node.op_type):
        return contrib.expand(node, env)
    if node.op_type in ("RNN", "GRU", "LSTM"):
        # not control flow, but expanded alike: one node per time step (one tuned cell task)
        from autosched.graph.ops_rnn import expand_recurrent

        return expand_recurrent(node, env)
    return None


def _identities(node: Node, sources: list[str], targets: list[str]) -> list[Node]:
    return [Node(f"{node.name}/out{k}", "Identity", [s], [t])
            for k, (s, t) in enumerate(zip(sources, targets)) if t]


def _expand_if(node: Node, env: Mapping[str, Any]) -> list[Node] | None:
    cond = _const(env, node, 0)
    if cond is _NOT_CONST:
        return _select_branches(node)
    if cond is None:
        return None
    if cond.size != 1:
        raise ModelImportError(f"node {node.name!r} (If): the condition must hold one value, "
                               f"got shape {cond.shape}")
    branch = _subgraph(node.attrs["then_branch" if bool(cond.reshape(())) else "else_branch"])
    nodes, outs = inline(branch, {}, "if")
    if len(outs) != len(node.outputs):
        raise ModelImportError(f"node {node.name!r} (If): the branch taken has {len(outs)} "
                               f"outputs, the node {len(node.outputs)}")
    return nodes + _identities(node, outs, node.outputs)


def _select_branches(node: Node) -> list[Node]:
    """An If whose condition is known only at run time: both branches computed (branches
    have no side effects) and each output chosen by the condition (IfSelect, graph/
    ops_control.py, which requires the two branches' outputs to agree in shape and dtype, as
    a static graph needs)."""
    then_nodes, then_outs = inline(_subgraph(node.attrs["then_branch"]), {}, "if")
    else_nodes, else_outs = inline(_subgraph(node.attrs["else_branch"]), {}, "if")
    if not len(then_outs) == len(else_outs) == len(node.outputs):
        raise ModelImportError(f"node {node.name!r} (If): the branches have {len(then_outs)} "
                               f"and {len(else_outs)} outputs, the node {len(node.outputs)}")
    return then_nodes + else_nodes + [
        Node(f"{node.name}/select{k}", "IfSelect", [node.inputs[0], t, e], [o])
        for k, (t, e, o) in enumerate(zip(then_outs, else_outs, node.outputs)) if o]


def _expand_loop(node: Node, env: Mapping[str, Any]) -> list[Node] | None:
    trips, cond = _const(env, node, 0), _const(env, node, 1)
    if trips is _NOT_CONST or cond is _NOT_CONST:
        return None
    k = int(node.attrs.get("_iteration", 0))
    body = _subgraph(node.attrs["body"])
    carried = node.inputs[2:]
    n_scan = len(body.proto.output) - 1 - len(carried)
    scans: list[list[str]] = node.attrs.get("_scans") or [[] for _ in range(n_scan)]
    if trips is None and k >= MAX_UNROLL:
        raise ModelImportError(f"node {node.name!r} (Loop): no trip count and the condition "
                               f"still holds after {MAX_UNROLL} iterations")
    if (trips is not None and k >= int(trips.reshape(()))) or (
            cond is not None and not bool(cond.reshape(()))):
        return _finish(node, env, carried, scans)
    return _iteration(node, body, k, carried, scans)


def _iteration(node: Node, body: Subgraph, k: int, carried: list[str],
               scans: list[list[str]]) -> list[Node]:
    """Iteration ``k`` of the body, then the Loop node that continues after it."""
    g = body.proto
    ins = [vi.name for vi in g.input]
    tag = f"{node.name}/it{k}"
    pre = [Node(f"{tag}/i", "Constant", [], [f"{tag}/i"], {"value": np.array(k, "int64")})]
    bind = {ins[0]: f"{tag}/i"}
    if node.inputs[1:2] and node.inputs[1]:
        bind[ins[1]] = node.inputs[1]
    else:
        pre.append(Node(f"{tag}/c", "Constant", [], [f"{tag}/c"], {"value": np.array(True)}))
        bind[ins[1]] = f"{tag}/c"
    bind.update(zip(ins[2:], carried))
    nodes, outs = inline(body, bind, "loop")
    n = len(carried)
    more = [s + [o] for s, o in zip(scans, outs[1 + n:])]
    attrs = {**node.attrs, "_iteration": k + 1, "_scans": more}
    cont = Node(node.name, "Loop", [node.inputs[0] if node.inputs else "", outs[0],
                                    *outs[1:1 + n]], node.outputs, attrs)
    return pre + nodes + [cont]


def _finish(node: Node, env: Mapping[str, Any], carried: list[str], scans: list[list[str]]
            ) -> list[Node]:
    """The final carried values, and each scan output stacked along a new first axis."""
    n = len(carried)
    nodes = _identities(node, carried, node.outputs[:n])
    for j, (names, target) in enumerate(zip(scans, node.outputs[n:])):
        if not target:
            continue
        if not names:
            raise ModelImportError(f"node {node.name!r} (Loop): ran no iteration, so scan "
                                   f"output {target!r} has no static shape")
        shape = np.array([1, *env_shape(env, names[0])], "int64")
        tag = f"{node.name}/scan{j}"
        nodes.append(Node(f"{tag}/shape", "Constant", [], [f"{tag}/shape"], {"value": shape}))
        rows = [f"{tag}/row{i}" for i in range(len(names))]
        nodes += [Node(r, "Reshape", [s, f"{tag}/shape"], [r]) for s, r in zip(names, rows)]
        nodes.append(Node(f"{tag}/concat", "Concat", rows, [target], {"axis": 0}))
    return nodes


def env_shape(env: Mapping[str, Any], name: str) -> tuple[int, ...]:
    return tuple(int(d) for d in env[name].shape)
