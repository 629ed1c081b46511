"""Operators outside the ai.onnx domain that the importer knows: onnxruntime's contrib ops.

A node is recognised by its domain and op type together: ``op_type_of`` names a known contrib
node ``<domain>.<op type>`` (``com.microsoft.DynamicQuantizeLSTM``), so no default-domain op
can pass for it, and refuses any other domain with one line naming the node, its op type and
its domain. Each contrib op is expanded at import into default-domain nodes (``expand``).

``com.microsoft DynamicQuantizeLSTM`` (version 1) is an LSTM whose W (D, I, 4H) and R
(D, H, 4H) are int8 or uint8, with scales and zero points per direction, of shape (D,) or
per output column (D, 4H); onnxruntime reads one zero point per direction (the first: it
requires the others to equal it). It is expanded as onnxruntime computes it:

- X, all steps at once, is quantized like DynamicQuantizeLinear (uint8, one scale and zero
  point for the whole tensor); ``MatMulInteger`` with W accumulates in int32, and the
  accumulator times (x_scale * w_scale) in float32 is the input projection of every step;
- each step quantizes the hidden state the same way (one scale over the batch; an all-zero
  state has scale 1), multiplies it with R in int32 and adds the rescaled product to the
  step's projection;
- the gates take that sum plus Wb + Rb (RecurrentCell without R).

onnxruntime splits the batch into one chunk per thread for the hidden state's quantization
when the batch is over 4 (or 2 to 4 with H <= 256); the expansion follows the single-chunk
computation, which is onnxruntime's for batch 1 or a single thread. Each step rounds the
hidden state to uint8, so an ulp of difference can flip a rounding and grow from step to step:
on llvm the results are onnxruntime's to the bit (its sigmoid and tanh, and no fused
multiply-add outside reductions: autosched/targets/llvm).

Example::

    from importers.contrib import op_type_of
    op_type_of(node_proto, "model.onnx")    # 'Conv', or 'com.microsoft.DynamicQuantizeLSTM'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from autosched.errors import ModelImportError
from autosched.graph.graph import Node
from autosched.graph.ops_rnn import Emit, acts_attr, direction_of

DEFAULT_DOMAINS = ("", "ai.onnx")
DQLSTM = "com.microsoft.DynamicQuantizeLSTM"
# domain -> op type -> the op set versions whose semantics the expansion follows
KNOWN: dict[str, dict[str, tuple[int, ...]]] = {"com.microsoft": {"DynamicQuantizeLSTM": (1,)}}


def qualified(domain: str, op_type: str) -> str:
    return f"{domain}.{op_type}"


def known(domain: str, op_type: str) -> bool:
    return op_type in KNOWN.get(domain, {})


def check_domain(node: Any, versions: Mapping[str, int] | None, where: str) -> None:
    """A node of a domain other than ai.onnx must be a known contrib op at a known version
    (``versions``: the model's domain versions; None in a subgraph, whose model was checked)."""
    if node.domain in DEFAULT_DOMAINS:
        return
    version = None if versions is None else versions.get(node.domain)
    if known(node.domain, node.op_type) and (
            versions is None or version in KNOWN[node.domain][node.op_type]):
        return
    ops = ", ".join(f"{d} {o} (version {', '.join(map(str, vs))})"
                    for d, table in KNOWN.items() for o, vs in table.items())
    raise ModelImportError(
        f"{where}: node {node.name!r} ({node.op_type}) is in operator set domain "
        f"{node.domain!r} (version {'?' if version is None else version}); only the default "
        f"ai.onnx domain is supported, and of others only {ops}")


def op_type_of(node: Any, where: str) -> str:
    """The op type the importer gives a NodeProto: qualified by its domain outside ai.onnx;
    a default-domain op type that spells a qualified contrib op is refused."""
    if node.domain not in DEFAULT_DOMAINS:
        check_domain(node, None, where)
        return qualified(node.domain, node.op_type)
    if node.op_type in EXPANSIONS:
        raise ModelImportError(f"{where}: node {node.name!r} has op type {node.op_type!r} in "
                               "the default ai.onnx domain, which has no such op")
    return str(node.op_type)


def expands(op_type: str) -> bool:
    """Whether the importer expands ``op_type`` (a qualified contrib op) into plain nodes."""
    return op_type in EXPANSIONS


def expand(node: Node, env: Mapping[str, Any]) -> list[Node]:
    return EXPANSIONS[node.op_type](node, env)


def _fail(node: Node, text: str) -> ModelImportError:
    return ModelImportError(f"node {node.name!r} ({node.op_type}): {text}")


def _per_direction_zero_point(node: Node, env: Mapping[str, Any], k: int, what: str) -> None:
    """onnxruntime uses the first zero point of each direction: the others must equal it."""
    zp = env.get(node.inputs[k])
    if isinstance(zp, np.ndarray) and zp.ndim == 2 and (zp != zp[:, :1]).any():
        raise _fail(node, f"{what} differ within a direction ({zp.tolist()}); onnxruntime "
                          "needs one zero point per direction")


def _expand_dqlstm(node: Node, env: Mapping[str, Any]) -> list[Node]:
    def given(k: int) -> str:
        return node.inputs[k] if len(node.inputs) > k else ""

    for k, what in ((1, "W"), (2, "R"), (8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"),
                    (11, "R_zero_point")):
        if not given(k):
            raise _fail(node, f"input {k} ({what}) is required")
    lstm = Node(node.name, "LSTM", node.inputs, node.outputs, node.attrs)
    steps, batch, _ = (int(d) for d in env[given(0)].shape)
    lens = env.get(given(4)) if given(4) else None
    if lens is not None and (not isinstance(lens, np.ndarray) or (lens != steps).any()):
        raise _fail(node, f"sequence_lens must be a constant equal to the sequence length "
                          f"{steps}")
    if int(node.attrs.get("input_forget", 0)):
        raise _fail(node, "input_forget=1 (coupled input and forget gates) is not supported")
    _per_direction_zero_point(node, env, 9, "W zero points")
    _per_direction_zero_point(node, env, 11, "R zero points")
    directions, reverse = direction_of(lstm)
    hidden = int(node.attrs.get("hidden_size", int(env[given(2)].shape[1])))
    e = Emit(node.name)
    x = e.op("DynamicQuantizeLinear", [given(0)], 3)
    acts = acts_attr(lstm, directions)
    ys, hs, cs = [], [], []
    for d in range(directions):
        y, h, c = _dqlstm_direction(e, node, env, x, d, reverse[d], steps, batch, hidden,
                                    acts[d])
        ys.append(y)
        hs.append(h)
        cs.append(c)
    outs = [e.stack(ys, (steps, batch, hidden), 1), e.stack(hs, (batch, hidden), 0),
            e.stack(cs, (batch, hidden), 0)]
    e.nodes += [Node(f"{node.name}/out{k}", "Identity", [o], [t])
                for k, (o, t) in enumerate(zip(outs, node.outputs)) if t]
    return e.nodes


def _dqlstm_direction(e: Emit, node: Node, env: Mapping[str, Any], x: list[str], d: int,
                      reverse: bool, steps: int, batch: int, hidden: int,
                      acts: list[list[Any]]) -> tuple[str, str, str]:
    """The steps of direction ``d``: its stacked hidden states (T, B, H), last h and c."""
    def given(k: int) -> str:
        return node.inputs[k] if len(node.inputs) > k else ""

    def zero_point(k: int) -> str:
        """Direction d's zero point, a scalar (the first of its row when per column)."""
        shape = tuple(env[given(k)].shape)
        flat = e.op("Reshape", [given(k), e.const(np.array([-1], "int64"))])[0]
        return e.take(flat, d * (shape[1] if len(shape) == 2 else 1))

    def rescaled(acc: str, scale: str, k_scale: int) -> str:
        """The int32 accumulator times (activation scale * weight scale) in float32."""
        mult = e.op("Mul", [scale, e.take(given(k_scale), d)])[0]
        return e.op("Mul", [e.op("Cast", [acc], to=1)[0], mult])[0]

    xq, xs, xz = x
    acc = e.op("MatMulInteger", [xq, e.take(given(1), d), xz, zero_point(9)])[0]
    xw = rescaled(acc, xs, 8)
    r, r_zero = e.take(given(2), d), zero_point(11)
    gh = 4 * hidden
    bias = ""
    if given(3):
        b = e.take(given(3), d)
        bias = e.op("Add", [e.take(b, np.arange(gh)), e.take(b, np.arange(gh, 2 * gh))])[0]
    zero = e.const(np.zeros((batch, hidden), "float32"))
    h = e.take(given(5), d) if given(5) else zero
    c = e.take(given(6), d) if given(6) else zero
    peep = e.take(given(7), d) if given(7) else ""
    attrs = dict(kind="lstm", hidden_size=hidden, acts=acts, clip=node.attrs.get("clip"),
                 linear_before_reset=0)
    out: list[str] = []
    for t in (reversed(range(steps)) if reverse else range(steps)):
        hq, hs, hz = e.op("DynamicQuantizeLinear", [h], 3)
        rec = rescaled(e.op("MatMulInteger", [hq, r, hz, r_zero])[0], hs, 10)
        pre = e.op("Add", [e.take(xw, t), rec])[0]
        h, c = e.op("RecurrentCell", [pre, h, c, "", bias, peep], 2, **attrs)
        out.append(h)
    ordered = out[::-1] if reverse else out
    return e.stack(ordered, (batch, hidden), 0), h, c


EXPANSIONS: dict[str, Callable[[Node, Mapping[str, Any]], list[Node]]] = {
    DQLSTM: _expand_dqlstm}
