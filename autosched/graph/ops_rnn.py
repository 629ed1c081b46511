"""Converters of ONNX RNN, GRU and LSTM: every time step unrolled into TE stages
(autosched.te.ops.rnn), so the sequence length must be static; one unrolled chain per
direction (forward, reverse, or both).

``sequence_lens`` is accepted when it is a constant equal to the sequence length for every
batch entry (what exporters write); shorter sequences would need per-entry masking of the
states and are refused with an error naming the lengths."""

from __future__ import annotations

from typing import Any

import numpy as np

from autosched.graph.graph import Node
from autosched.graph.ops import ConvertContext, Value, fail, register
from autosched.te.ops import rnn
from autosched.te.ops.transform import concat, expand_dims, transpose
from autosched.te.tensor import Tensor, compute

NEEDS_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
NEEDS_BETA = {"affine", "scaledtanh", "hardsigmoid"}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _activations(node: Node, directions: int) -> list[list[rnn.Activation]]:
    """Per direction, the cell's activations; alpha / beta lists are consumed in order by the
    activations that take them."""
    names = [str(a) for a in node.attrs.get("activations", [])] or (
        DEFAULT_ACTS[node.op_type] * directions)
    per = len(DEFAULT_ACTS[node.op_type])
    if len(names) != per * directions:
        raise fail(node, f"{len(names)} activations given, {per * directions} expected "
                         f"({per} per direction)")
    alphas = list(node.attrs.get("activation_alpha", []))
    betas = list(node.attrs.get("activation_beta", []))
    acts: list[rnn.Activation] = []
    for name in names:
        a = alphas.pop(0) if name.lower() in NEEDS_ALPHA and alphas else None
        b = betas.pop(0) if name.lower() in NEEDS_BETA and betas else None
        acts.append(rnn.activation(name, a, b))
    return [acts[d * per:(d + 1) * per] for d in range(directions)]


def _direction(node: Node) -> tuple[int, list[bool]]:
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


def _slice0(ctx: ConvertContext, v: Value | None, d: int) -> Tensor | None:
    """Direction ``d`` of a (directions, ...) parameter."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return ctx.const(np.ascontiguousarray(v[d]))
    return compute(tuple(v.shape[1:]), lambda *i: v[(d, *i)], name="T_rnn_param")


def _stack(states: list[Tensor], axis: int) -> Tensor:
    return concat([expand_dims(s, axis) for s in states], axis)


@register("RNN", "GRU", "LSTM", const_inputs=(4,))
def _recurrent(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    kind = node.op_type.lower()

    def get(k: int) -> Value | None:
        return ins[k] if len(ins) > k else None

    layout = int(node.attrs.get("layout", 0))
    x = ctx.const(ins[0])
    if layout:
        x = transpose(x, (1, 0, 2))          # (B, T, I) -> (T, B, I)
    steps = int(x.shape[0])
    _check_lengths(node, get(4), steps)
    if int(node.attrs.get("input_forget", 0)):
        raise fail(node, "input_forget=1 (coupled input and forget gates) is not supported")
    directions, reverse = _direction(node)
    acts = _activations(node, directions)
    clip = node.attrs.get("clip")
    h0, c0 = get(5), get(6) if kind == "lstm" else None
    if layout and h0 is not None:
        h0 = ctx.const(h0)
        h0 = transpose(h0, (1, 0, 2))
    if layout and c0 is not None:
        c0 = transpose(ctx.const(c0), (1, 0, 2))
    hidden = int(node.attrs.get("hidden_size", int(np.asarray(ins[2].shape)[-1])))
    ys: list[Tensor] = []
    hs: list[Tensor] = []
    cs: list[Tensor] = []
    for d in range(directions):
        cell = rnn.Cell(kind, hidden, acts[d], None if clip is None else float(clip),
                        bool(node.attrs.get("linear_before_reset", 0)))
        states, h, c = rnn.unroll(
            cell, x, _slice0(ctx, ins[1], d), _slice0(ctx, ins[2], d),
            _slice0(ctx, get(3), d), _slice0(ctx, h0, d), _slice0(ctx, c0, d),
            _slice0(ctx, get(7), d) if kind == "lstm" else None, reverse[d])
        ys.append(_stack(states, 0))           # (T, B, H)
        hs.append(h)
        cs.append(c)
    return _outputs(ys, hs, cs, layout)


def _outputs(ys: list[Tensor], hs: list[Tensor], cs: list[Any], layout: int) -> list[Value]:
    y = _stack(ys, 1)                          # (T, D, B, H)
    h = _stack(hs, 0)                          # (D, B, H)
    c = _stack(cs, 0) if cs[0] is not None else None
    if layout:
        y = transpose(y, (2, 0, 1, 3))         # (B, T, D, H)
        h = transpose(h, (1, 0, 2))
        c = transpose(c, (1, 0, 2)) if c is not None else None
    return [y, h] + ([c] if c is not None else [])
