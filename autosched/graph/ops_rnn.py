"""Converters of ONNX RNN, GRU and LSTM: every time step unrolled into TE stages
(autosched.te.ops.rnn), so the sequence length must be static; one unrolled chain per
direction (forward, reverse, or both).

``sequence_lens`` is accepted when it is a constant equal to the sequence length for every
batch entry (what exporters write); shorter sequences would need per-entry masking of the
states and are refused with an error naming the lengths."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

from autosched.graph.graph import R_LAYOUT, Node
from autosched.graph.ops import (
    ConvertContext,
    Value,
    fail,
    optional,
    register,
    required,
    shape_of,
    tensor_input,
)
from autosched.te.ops import rnn
from autosched.te.ops.transform import concat, expand_dims, transpose
from autosched.te.tensor import Tensor, compute

NEEDS_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
NEEDS_BETA = {"affine", "scaledtanh", "hardsigmoid"}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
GATES_OF = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _activations(node: Node, directions: int) -> list[list[rnn.Activation]]:
    """Per direction, the cell's activations."""
    return [[rnn.activation(name, a, b) for name, a, b in per]
            for per in acts_attr(node, directions)]


def direction_of(node: Node) -> tuple[int, list[bool]]:
    d = str(node.attrs.get("direction", "forward"))
    table = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
    if d not in table:
        raise fail(node, f"direction must be forward, reverse or bidirectional, got {d!r}")
    return len(table[d]), table[d]


def _check_lengths(node: Node, lens: Value | None, steps: int) -> None:
    if lens is None:
        return
    if not isinstance(lens, np.ndarray):
        raise fail(node, "sequence_lens must be a constant (the steps are unrolled)")
    if (np.asarray(lens) != steps).any():
        raise fail(node, f"sequence_lens {lens.tolist()} differ from the sequence length "
                         f"{steps}; only full-length sequences are supported")


@overload
def _slice0(ctx: ConvertContext, v: Value, d: int) -> Tensor: ...
@overload
def _slice0(ctx: ConvertContext, v: Value | None, d: int) -> Tensor | None: ...
def _slice0(ctx: ConvertContext, v: Value | None, d: int) -> Tensor | None:
    """Direction ``d`` of a (directions, ...) parameter."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return ctx.const(np.asarray(v[d], order="C"))
    return compute(tuple(v.shape[1:]), lambda *i: v[(d, *i)], name="T_rnn_param")


def _stack(states: list[Tensor], axis: int) -> Tensor:
    return concat([expand_dims(s, axis) for s in states], axis)


@register("RNN", "GRU", "LSTM", const_inputs=(4,))
def _recurrent(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    kind = node.op_type.lower()

    def get(k: int) -> Value | None:
        return optional(ins, k)

    layout = int(node.attrs.get("layout", 0))
    x = tensor_input(ctx, node, ins, 0)
    if layout:
        x = transpose(x, (1, 0, 2))          # (B, T, I) -> (T, B, I)
    steps = shape_of(x)[0]
    _check_lengths(node, get(4), steps)
    if int(node.attrs.get("input_forget", 0)):
        raise fail(node, "input_forget=1 (coupled input and forget gates) is not supported")
    directions, reverse = direction_of(node)
    acts = _activations(node, directions)
    clip = node.attrs.get("clip")
    h0, c0 = get(5), get(6) if kind == "lstm" else None
    if layout and h0 is not None:
        h0 = transpose(ctx.const(h0), (1, 0, 2))
    if layout and c0 is not None:
        c0 = transpose(ctx.const(c0), (1, 0, 2))
    w, r = required(node, ins, 1), required(node, ins, 2)
    hidden = int(node.attrs.get("hidden_size", shape_of(r)[-1]))
    ys: list[Tensor] = []
    hs: list[Tensor] = []
    cs: list[Tensor | None] = []
    for d in range(directions):
        cell = rnn.Cell(kind, hidden, acts[d], None if clip is None else float(clip),
                        bool(node.attrs.get("linear_before_reset", 0)))
        states, h, c = rnn.unroll(
            cell, x, _slice0(ctx, w, d), _slice0(ctx, r, d),
            _slice0(ctx, get(3), d), _slice0(ctx, h0, d), _slice0(ctx, c0, d),
            _slice0(ctx, get(7), d) if kind == "lstm" else None, reverse[d])
        ys.append(_stack(states, 0))           # (T, B, H)
        hs.append(h)
        cs.append(c)
    return _outputs(ys, hs, cs, layout)


def _outputs(ys: list[Tensor], hs: list[Tensor], cs: list[Tensor | None], layout: int
             ) -> list[Value]:
    y = _stack(ys, 1)                          # (T, D, B, H)
    h = _stack(hs, 0)                          # (D, B, H)
    cells = [c for c in cs if c is not None]
    c = _stack(cells, 0) if cells else None
    if layout:
        y = transpose(y, (2, 0, 1, 3))         # (B, T, D, H)
        h = transpose(h, (1, 0, 2))
        c = transpose(c, (1, 0, 2)) if c is not None else None
    return [y, h] if c is None else [y, h, c]


# --- one node per time step ------------------------------------------------------------------
#
# The importer expands a recurrent node (importers/control_flow.expand) into plain nodes: per
# direction, the input projection of every step as one MatMul (+ Add of the input bias), then
# per step a Gather of that step's rows and one RecurrentCell node (the recurrent matmul and
# the gates). Every step's cell has the same shapes, so the graph compiler makes them one
# task that is tuned once and reused T times.


@dataclass
class Emit:
    """Nodes under construction, with fresh value names under the node's name."""

    prefix: str
    nodes: list[Node] = field(default_factory=list)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        outs = [f"{self.prefix}/{len(self.nodes)}_{op_type}{k}" for k in range(n_out)]
        self.nodes.append(Node(outs[0], op_type, inputs, outs, attrs))
        return outs

    def const(self, value: np.ndarray) -> str:
        return self.op("Constant", [], value=value)[0]

    def take(self, src: str, index: int | np.ndarray, axis: int = 0) -> str:
        return self.op("Gather", [src, self.const(np.asarray(index, "int64"))], axis=axis)[0]

    def stack(self, names: list[str], shape: tuple[int, ...], axis: int) -> str:
        """Concat of the values (each ``shape``) along a new axis."""
        new = np.array([*shape[:axis], 1, *shape[axis:]], "int64")
        shaped = [self.op("Reshape", [n, self.const(new)])[0] for n in names]
        return self.op("Concat", shaped, axis=axis)[0]


def acts_attr(node: Node, directions: int) -> list[list[list[Any]]]:
    """Per direction, [name, alpha, beta] of each activation (alpha / beta None: default);
    the alpha / beta lists are consumed in order by the activations that take them."""
    names = [str(a) for a in node.attrs.get("activations", [])] or (
        DEFAULT_ACTS[node.op_type] * directions)
    per = len(DEFAULT_ACTS[node.op_type])
    if len(names) != per * directions:
        raise fail(node, f"{len(names)} activations given, {per * directions} expected "
                         f"({per} per direction)")
    alphas = list(node.attrs.get("activation_alpha", []))
    betas = list(node.attrs.get("activation_beta", []))
    specs = []
    for name in names:
        a = alphas.pop(0) if name.lower() in NEEDS_ALPHA and alphas else None
        b = betas.pop(0) if name.lower() in NEEDS_BETA and betas else None
        specs.append([name, a, b])
    return [specs[d * per:(d + 1) * per] for d in range(directions)]


def expand_recurrent(node: Node, env: Mapping[str, Any]) -> list[Node] | None:
    """RNN / GRU / LSTM as per-step nodes, or None to leave the node to its converter (an
    unsupported configuration, which the converter reports)."""
    def given(k: int) -> str:
        return node.inputs[k] if len(node.inputs) > k else ""

    x_shape = tuple(int(d) for d in env[node.inputs[0]].shape)
    layout = int(node.attrs.get("layout", 0))
    steps, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    lens = env.get(given(4)) if given(4) else None
    if (lens is not None and (not isinstance(lens, np.ndarray) or (lens != steps).any())) or (
            int(node.attrs.get("input_forget", 0))) or str(
            node.attrs.get("direction", "forward")) not in ("forward", "reverse",
                                                            "bidirectional"):
        return None
    directions, reverse = direction_of(node)
    hidden = int(node.attrs.get("hidden_size", int(env[node.inputs[2]].shape[-1])))
    dtype = str(env[node.inputs[0]].dtype)
    e = Emit(node.name)
    x = e.op("Transpose", [node.inputs[0]], perm=[1, 0, 2])[0] if layout else node.inputs[0]
    states = [given(5), given(6) if node.op_type == "LSTM" else ""]
    if layout:
        states = [e.op("Transpose", [s], perm=[1, 0, 2])[0] if s else "" for s in states]
    acts = acts_attr(node, directions)
    ys, hs, cs = [], [], []
    for d in range(directions):
        y, h, c = _direction_nodes(e, node, x, d, reverse[d], steps, batch, hidden, dtype,
                                   states, acts[d])
        ys.append(y)
        hs.append(h)
        cs.append(c)
    outs = [e.stack(ys, (steps, batch, hidden), 1), e.stack(hs, (batch, hidden), 0)]
    if node.op_type == "LSTM":
        outs.append(e.stack(cs, (batch, hidden), 0))
    if layout:
        outs = [e.op("Transpose", [outs[0]], perm=[2, 0, 1, 3])[0]] + [
            e.op("Transpose", [o], perm=[1, 0, 2])[0] for o in outs[1:]]
    e.nodes += [Node(f"{node.name}/out{k}", "Identity", [o], [t])
                for k, (o, t) in enumerate(zip(outs, node.outputs)) if t]
    return e.nodes


def _direction_nodes(e: Emit, node: Node, x: str, d: int, reverse: bool, steps: int,
                     batch: int, hidden: int, dtype: str, states: list[str],
                     acts: list[list[Any]]) -> tuple[str, str, str]:
    """The steps of direction ``d``: its stacked hidden states (T, B, H), last h and c."""
    gh = GATES_OF[node.op_type] * hidden

    def param(k: int) -> str:
        return e.take(node.inputs[k], d) if len(node.inputs) > k and node.inputs[k] else ""

    w, r, bias, peep = param(1), param(2), param(3), param(7) if node.op_type == "LSTM" else ""
    xw = e.op("MatMul", [x, e.op("Transpose", [w], perm=[1, 0])[0]])[0]
    r_bias = ""
    if bias:
        xw = e.op("Add", [xw, e.take(bias, np.arange(gh))])[0]
        r_bias = e.take(bias, np.arange(gh, 2 * gh))
    zero = e.const(np.zeros((batch, hidden), dtype))
    h = e.take(states[0], d) if states[0] else zero
    c = (e.take(states[1], d) if states[1] else zero) if node.op_type == "LSTM" else ""
    attrs = dict(kind=node.op_type.lower(), hidden_size=hidden, acts=acts,
                 clip=node.attrs.get("clip"),
                 linear_before_reset=int(node.attrs.get("linear_before_reset", 0)))
    hs: list[str] = []
    for t in (reversed(range(steps)) if reverse else range(steps)):
        outs = e.op("RecurrentCell", [e.take(xw, t), h, c, r, r_bias, peep],
                    2 if node.op_type == "LSTM" else 1, **attrs)
        h, c = outs[0], (outs[1] if len(outs) > 1 else "")
        hs.append(h)
    ordered = hs[::-1] if reverse else hs
    return e.stack(ordered, (batch, hidden), 0), h, c


@register("RecurrentCell")
def _recurrent_cell(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    """One step of an expanded RNN / GRU / LSTM (inputs: the step's x W^T + Wb, h, c, R, Rb,
    P; attributes as expand_recurrent writes them). Without R, the first input holds h R^T
    too (a quantized LSTM computes it with an integer matmul). Attribute R_LAYOUT: how R is
    stored, "kn" transposed or "panels" transposed in column panels (rnn.R_LAYOUTS,
    passes.pack_gemm_weights)."""
    a = node.attrs
    acts = [rnn.activation(name, alpha, beta) for name, alpha, beta in a["acts"]]
    cell = rnn.Cell(str(a["kind"]), int(a["hidden_size"]), acts,
                    None if a.get("clip") is None else float(a["clip"]),
                    bool(a.get("linear_before_reset", 0)))

    def opt(k: int) -> Tensor | None:
        v = optional(ins, k)
        return None if v is None else ctx.const(v)

    h, c = rnn.step(cell, tensor_input(ctx, node, ins, 0), tensor_input(ctx, node, ins, 1),
                    opt(2), opt(3), opt(4), opt(5), r_layout=str(a.get(R_LAYOUT, "nk")))
    return [h] if c is None else [h, c]
