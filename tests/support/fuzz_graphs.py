"""Random small ONNX graphs for the fuzzing tier (tests/fuzz/test_fuzz.py).

A graph is drawn node by node with hypothesis: each node takes one or two earlier values (or a
fresh constant that broadcasts against them) through an op that autosched supports, with drawn
attributes (axes, perms, pads, strides, keepdims...). Values stay in ranges where float32
results are well conditioned (no division by numbers near zero, no exp of large numbers), so a
mismatch with onnxruntime is a bug, not rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Floor", "Ceil", "Erf", "Softsign",
         "Softplus", "Elu", "Selu", "LeakyRelu", "HardSigmoid", "HardSwish", "Identity",
         "Round", "Sign", "Sin", "Cos"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceSumSquare"]


def _supported(ops: list[str]) -> list[str]:
    from autosched.graph.ops import supported

    return [op for op in ops if supported(op)]


UNARY = _supported(UNARY)


@dataclass
class Builder:
    """A graph under construction: values with their shapes, nodes, initializers."""

    values: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)
    inits: list[Any] = field(default_factory=list)
    seed: int = 0

    def name(self, prefix: str) -> str:
        return f"{prefix}{len(self.nodes)}_{len(self.inits)}"

    def const(self, arr: np.ndarray) -> str:
        from onnx import numpy_helper

        n = self.name("c")
        self.inits.append(numpy_helper.from_array(arr, n))
        return n

    def node(self, op: str, ins: list[str], shape: tuple[int, ...], **attrs: Any) -> str:
        from onnx import helper

        out = self.name("v")
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        self.values.append((out, shape))
        return out


def _rng(b: Builder) -> np.random.Generator:
    b.seed += 1
    return np.random.default_rng(b.seed)


def _unary(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    op = data.draw(st.sampled_from(UNARY), label="unary")
    attrs: dict[str, Any] = {}
    if op in ("LeakyRelu", "Elu"):
        attrs["alpha"] = data.draw(st.floats(0.05, 2.0), label="alpha")
    if op == "HardSigmoid":
        attrs["alpha"] = data.draw(st.floats(0.1, 0.5), label="alpha")
        attrs["beta"] = data.draw(st.floats(0.2, 0.8), label="beta")
    return b.node(op, [x], shape, **attrs)


def _broadcast_shape(data: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: a suffix of it with some dims set to 1."""
    k = data.draw(st.integers(0, len(shape)), label="bcast rank")
    tail = shape[len(shape) - k:]
    return tuple(d if data.draw(st.booleans(), label="keep dim") else 1 for d in tail)


def _binary(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    op = data.draw(st.sampled_from([*BINARY, "Div", "Pow"]), label="binary")
    same = [n for n, s in b.values if s == shape]
    if op not in ("Div", "Pow") and len(same) > 1 and data.draw(st.booleans(), label="two vals"):
        other = data.draw(st.sampled_from(same), label="other")
    else:
        c_shape = _broadcast_shape(data, shape)
        rng = _rng(b)
        if op == "Div":  # away from zero
            arr = rng.uniform(0.5, 2.0, c_shape) * rng.choice([-1, 1], c_shape)
        elif op == "Pow":  # small integer exponents: defined for negative bases
            arr = rng.integers(0, 4, c_shape).astype(np.float64)
        else:
            arr = rng.uniform(-1.5, 1.5, c_shape)
        other = b.const(arr.astype(np.float32))
    ins = [other, x] if op not in ("Div", "Pow") and data.draw(st.booleans(), label="swap") \
        else [x, other]
    return b.node(op, ins, shape)


def _reduce(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:

    op = data.draw(st.sampled_from(REDUCE), label="reduce")
    r = len(shape)
    axes = sorted(data.draw(st.sets(st.integers(0, r - 1), min_size=1, max_size=r),
                            label="axes"))
    keep = data.draw(st.booleans(), label="keepdims")
    out = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
    if op == "ReduceSum":  # opset 13+: axes as an input
        return b.node(op, [x, _int64(b, axes)], out, keepdims=int(keep))
    return b.node(op, [x], out, axes=axes, keepdims=int(keep))


def _transpose(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    perm = data.draw(st.permutations(range(len(shape))), label="perm")
    return b.node("Transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))


def _softmax(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    op = data.draw(st.sampled_from(["Softmax", "LogSoftmax"]), label="softmax")
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    return b.node(op, [x], shape, axis=axis)


def _matmul(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    n = data.draw(st.integers(1, 9), label="N")
    w = _rng(b).uniform(-1, 1, (shape[-1], n)).astype(np.float32)
    return b.node("MatMul", [x, b.const(w)], (*shape[:-1], n))


def _reshape(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:

    k = data.draw(st.integers(0, len(shape)), label="flatten at")
    out = (int(np.prod(shape[:k], dtype=np.int64)), int(np.prod(shape[k:], dtype=np.int64)))
    if data.draw(st.booleans(), label="flatten op"):
        return b.node("Flatten", [x], out, axis=k)
    spec = [out[0], -1] if data.draw(st.booleans(), label="minus one") else list(out)
    return b.node("Reshape", [x, _int64(b, spec)], out)


def _slice(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:

    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    d = shape[axis]
    step = data.draw(st.sampled_from([1, 1, 2, -1]), label="step")
    if step > 0:
        start = data.draw(st.integers(0, d - 1), label="start")
        end = data.draw(st.integers(start + 1, d + 2), label="end")
        length = len(range(start, min(end, d), step))
    else:
        start = data.draw(st.integers(0, d - 1), label="start")
        end = -d - 1  # to the front
        length = start + 1
    out = tuple(length if i == axis else s for i, s in enumerate(shape))
    return b.node("Slice", [x, *(_int64(b, [v]) for v in (start, end, axis, step))], out)


def _concat(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    c_shape = tuple(data.draw(st.integers(1, 4), label="cat len") if i == axis else s
                    for i, s in enumerate(shape))
    c = b.const(_rng(b).uniform(-1, 1, c_shape).astype(np.float32))
    ins = [x, c] if data.draw(st.booleans(), label="order") else [c, x]
    out = tuple(s + c_shape[axis] if i == axis else s for i, s in enumerate(shape))
    return b.node("Concat", ins, out, axis=axis)


def _clip(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    lo = data.draw(st.floats(-1.0, 0.5), label="lo")
    hi = lo + data.draw(st.floats(0.0, 1.5), label="width")
    return b.node("Clip", [x, b.const(np.float32(lo)), b.const(np.float32(hi))], shape)


def _conv(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    n, c, h, w = shape
    k = data.draw(st.integers(1, 3), label="kernel")
    stride = data.draw(st.integers(1, 2), label="stride")
    pad = data.draw(st.integers(0, k - 1), label="pad")
    groups = data.draw(st.sampled_from([g for g in (1, c) if c % g == 0]), label="groups")
    cout = groups * data.draw(st.integers(1, 3), label="out per group")
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    if oh < 1 or ow < 1:
        return x
    rng = _rng(b)
    wt = b.const(rng.uniform(-1, 1, (cout, c // groups, k, k)).astype(np.float32))
    bias = b.const(rng.uniform(-1, 1, (cout,)).astype(np.float32))
    return b.node("Conv", [x, wt, bias], (n, cout, oh, ow), kernel_shape=[k, k],
                  strides=[stride, stride], pads=[pad] * 4, group=groups)


def _pool(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    n, c, h, w = shape
    op = data.draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool",
                                    "GlobalMaxPool"]), label="pool")
    if op.startswith("Global"):
        return b.node(op, [x], (n, c, 1, 1))
    k = data.draw(st.integers(1, min(3, h, w)), label="kernel")
    stride = data.draw(st.integers(1, 2), label="stride")
    pad = data.draw(st.integers(0, k // 2), label="pad")
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    attrs: dict[str, Any] = {"kernel_shape": [k, k], "strides": [stride, stride],
                             "pads": [pad] * 4}
    if op == "AveragePool":
        attrs["count_include_pad"] = int(data.draw(st.booleans(), label="count pad"))
    return b.node(op, [x], (n, c, oh, ow), **attrs)


def _norm(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    rng = _rng(b)
    if len(shape) == 4 and data.draw(st.booleans(), label="batchnorm"):
        c = shape[1]
        params = [rng.uniform(0.5, 1.5, c), rng.uniform(-0.5, 0.5, c), rng.uniform(-0.5, 0.5, c),
                  rng.uniform(0.5, 1.5, c)]
        return b.node("BatchNormalization", [x, *(b.const(p.astype(np.float32)) for p in params)],
                      shape, epsilon=1e-5)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="ln axis")
    norm_shape = shape[axis:]
    scale = b.const(rng.uniform(0.5, 1.5, norm_shape).astype(np.float32))
    bias = b.const(rng.uniform(-0.5, 0.5, norm_shape).astype(np.float32))
    return b.node("LayerNormalization", [x, scale, bias], shape, axis=axis, epsilon=1e-5)


def _int64(b: Builder, vals: list[int]) -> str:
    from onnx import TensorProto, helper

    n = b.name("i")
    b.inits.append(helper.make_tensor(n, TensorProto.INT64, [len(vals)], vals))
    return n


def _gather(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:

    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    d = shape[axis]
    k = data.draw(st.integers(1, 4), label="indices")
    idx = [data.draw(st.integers(-d, d - 1), label="index") for _ in range(k)]  # negatives wrap
    out = (*shape[:axis], k, *shape[axis + 1:])
    return b.node("Gather", [x, _int64(b, idx)], out, axis=axis)


def _where(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    from onnx import helper

    op = data.draw(st.sampled_from(["Greater", "Less", "GreaterOrEqual", "LessOrEqual"]),
                   label="compare")
    t = b.const(np.float32(data.draw(st.floats(-1, 1), label="threshold")))
    cond = b.name("cond")
    b.nodes.append(helper.make_node(op, [x, t], [cond], name=cond))
    other = b.const(_rng(b).uniform(-1, 1, _broadcast_shape(data, shape)).astype(np.float32))
    return b.node("Where", [cond, x, other], shape)


def _expand_tile(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    reps = [data.draw(st.integers(1, 3), label="rep") for _ in shape]
    if data.draw(st.booleans(), label="tile"):
        return b.node("Tile", [x, _int64(b, reps)], tuple(s * r for s, r in zip(shape, reps)))
    # Expand: size-1 dims grow, a leading dim may be added
    target = [r if s == 1 else s for s, r in zip(shape, reps)]
    lead = data.draw(st.integers(0, 1), label="lead")
    target = [2] * lead + target
    return b.node("Expand", [x, _int64(b, target)], tuple(target))


def _pad(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    r = len(shape)
    pads = [data.draw(st.integers(0, 2), label="pad") for _ in range(2 * r)]
    mode = data.draw(st.sampled_from(["constant", "edge", "reflect"]), label="mode")
    if mode == "reflect" and any(p >= s for p, s in zip(pads, shape + shape)):
        mode = "constant"
    out = tuple(s + pads[i] + pads[i + r] for i, s in enumerate(shape))
    ins = [x, _int64(b, pads)]
    if mode == "constant":
        ins.append(b.const(np.float32(data.draw(st.floats(-1, 1), label="value"))))
    return b.node("Pad", ins, out, mode=mode)


def _split(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    from onnx import helper

    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    d = shape[axis]
    if d < 2:
        return x
    first = data.draw(st.integers(1, d - 1), label="first")
    outs = [b.name("part"), b.name("part") + "b"]
    b.nodes.append(helper.make_node("Split", [x, _int64(b, [first, d - first])], outs,
                                    name=outs[0], axis=axis))
    for n, length in zip(outs, (first, d - first)):
        b.values.append((n, tuple(length if i == axis else s for i, s in enumerate(shape))))
    return outs[-1]


def _unsqueeze(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    if 1 in shape and data.draw(st.booleans(), label="squeeze"):
        axes = [i for i, s in enumerate(shape) if s == 1]
        return b.node("Squeeze", [x, _int64(b, axes)], tuple(s for s in shape if s != 1))
    axis = data.draw(st.integers(0, len(shape)), label="axis")
    return b.node("Unsqueeze", [x, _int64(b, [axis])], (*shape[:axis], 1, *shape[axis:]))


def _positive(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    """Sqrt / Log / Exp / Reciprocal on values made safe for them first."""
    op = data.draw(st.sampled_from(["Sqrt", "Log", "Exp", "Reciprocal"]), label="positive op")
    inner = "Tanh" if op == "Exp" else "Abs"
    y = b.node(inner, [x], shape)
    if op in ("Log", "Reciprocal"):
        y = b.node("Add", [y, b.const(np.float32(0.5))], shape)
    return b.node(op, [y], shape)


def _gemm(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    if len(shape) != 2:
        return _matmul(data, b, x, shape)
    m, k = shape
    n = data.draw(st.integers(1, 9), label="N")
    trans_b = int(data.draw(st.booleans(), label="transB"))
    rng = _rng(b)
    w = rng.uniform(-1, 1, (n, k) if trans_b else (k, n)).astype(np.float32)
    c = rng.uniform(-1, 1, _broadcast_shape(data, (m, n))).astype(np.float32)
    return b.node("Gemm", [x, b.const(w), b.const(c)], (m, n), transB=trans_b,
                  alpha=data.draw(st.sampled_from([1.0, 0.5]), label="alpha"),
                  beta=data.draw(st.sampled_from([1.0, 2.0]), label="beta"))


def _resize(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    n, c, h, w = shape
    mode = data.draw(st.sampled_from(["nearest", "linear"]), label="mode")
    scale = data.draw(st.sampled_from([2.0, 3.0, 0.5]), label="scale")
    oh, ow = int(np.floor(h * scale)), int(np.floor(w * scale))
    if oh < 1 or ow < 1:
        return x
    attrs: dict[str, Any] = {"mode": mode}
    if mode == "nearest":
        attrs["coordinate_transformation_mode"] = data.draw(
            st.sampled_from(["asymmetric", "half_pixel"]), label="ctm")
        attrs["nearest_mode"] = data.draw(
            st.sampled_from(["floor", "round_prefer_floor", "round_prefer_ceil"]), label="nm")
    else:
        attrs["coordinate_transformation_mode"] = data.draw(
            st.sampled_from(["half_pixel", "align_corners", "asymmetric"]), label="ctm")
    scales = b.const(np.array([1, 1, scale, scale], np.float32))
    return b.node("Resize", [x, "", scales], (n, c, oh, ow), **attrs)


def _conv_transpose(data: Any, b: Builder, x: str, shape: tuple[int, ...]) -> str:
    n, c, h, w = shape
    k = data.draw(st.integers(1, 3), label="kernel")
    stride = data.draw(st.integers(1, 2), label="stride")
    cout = data.draw(st.integers(1, 4), label="cout")
    wt = b.const(_rng(b).uniform(-1, 1, (c, cout, k, k)).astype(np.float32))
    oh, ow = (h - 1) * stride + k, (w - 1) * stride + k
    return b.node("ConvTranspose", [x, wt], (n, cout, oh, ow), kernel_shape=[k, k],
                  strides=[stride, stride])


ANY_RANK = [_gather, _where, _expand_tile, _pad, _split, _unsqueeze, _positive, _gemm,
            _unary, _binary, _reduce, _transpose, _softmax, _matmul, _reshape, _slice, _concat,
            _clip, _norm]
RANK4 = [_conv, _pool, _resize, _conv_transpose]


@st.composite
def graphs(draw: Any, max_nodes: int = 5) -> tuple[Any, np.ndarray]:
    """(ModelProto, input array): one float32 input of rank 1-4, 1 to ``max_nodes`` nodes; the
    last value and, sometimes, one earlier value are outputs."""
    from onnx import TensorProto, helper

    rank = draw(st.integers(1, 4), label="rank")
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank), label="shape"))
    b = Builder(values=[("x", shape)], seed=draw(st.integers(0, 2**31), label="seed"))

    class _Data:  # the op builders draw through this, as they would through st.data()
        @staticmethod
        def draw(strategy: Any, label: str | None = None) -> Any:
            return draw(strategy, label=label)

    d = _Data()
    for _ in range(draw(st.integers(1, max_nodes), label="nodes")):
        ranked = [v for v in b.values if v[1]]  # a full reduction leaves a 0-d value
        name, shp = draw(st.sampled_from(ranked), label="input value")
        builders = ANY_RANK + (RANK4 if len(shp) == 4 else [])
        build = draw(st.sampled_from(builders), label="op")
        build(d, b, name, shp)
    outs = [b.values[-1]]
    if len(b.values) > 2 and draw(st.booleans(), label="second output"):
        extra = draw(st.sampled_from(b.values[1:-1]), label="output 2")
        if extra[0] != outs[0][0]:
            outs.append(extra)
    graph = helper.make_graph(
        b.nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n, _ in outs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.random.default_rng(b.seed).uniform(-2, 2, shape).astype(np.float32)
    return model, x
