"""Models for tests and benchmarks, built with onnx.helper (random weights, fixed seed; nothing
is downloaded): ResNet-18, MobileNetV2, a BERT-base encoder layer and a small CNN.

Example::

    from autosched.testing.models import resnet18, save
    proto = resnet18(image=64)                    # ModelProto, input "input" (1, 3, 64, 64)
    path = save("resnet18", image=224)            # build/models/resnet18-224.onnx (cached)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from autosched import settings

OPSET = 17


class Builder:
    """Nodes, initializers and unique names for one model."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, arr: np.ndarray, prefix: str = "w") -> str:
        from onnx import numpy_helper

        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(arr, order="C"), n))
        return n

    def weight(self, shape: tuple[int, ...], fan_in: int, prefix: str = "w") -> str:
        # He-style scale keeps activations O(1) through deep stacks (so 1e-4 tolerances mean
        # something)
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
        return self.const(w, prefix)

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs: Any) -> list[str]:
        from onnx import helper

        name = self.name(op.lower())
        outs = [f"{name}_out{k}" if n_out > 1 else f"{name}_out" for k in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs

    def op(self, op: str, inputs: list[str], **attrs: Any) -> str:
        return self.node(op, inputs, **attrs)[0]

    # -- layers -----------------------------------------------------------------------------

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             bias: bool = False) -> str:
        w = self.weight((cout, cin // groups, k, k), cin // groups * k * k)
        ins = [x, w]
        if bias:
            ins.append(self.const(self.rng.normal(0, 0.1, cout).astype(np.float32), "b"))
        p = k // 2
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[p, p, p, p], group=groups)

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        params = [r.uniform(0.5, 1.5, c), r.normal(0, 0.1, c), r.normal(0, 0.1, c),
                  r.uniform(0.5, 1.5, c)]
        names = [self.const(p.astype(np.float32), "bn") for p in params]
        return self.op("BatchNormalization", [x, *names], epsilon=1e-5)

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                act: str | None = "Relu") -> str:
        y = self.bn(self.conv(x, cin, cout, k, stride, groups), cout)
        if act == "Relu":
            y = self.op("Relu", [y])
        elif act == "Relu6":
            lo = self.const(np.array(0, np.float32), "lo")
            hi = self.const(np.array(6, np.float32), "hi")
            y = self.op("Clip", [y, lo, hi])
        return y

    def gemm(self, x: str, cin: int, cout: int) -> str:
        w = self.weight((cout, cin), cin)
        b = self.const(self.rng.normal(0, 0.1, cout).astype(np.float32), "b")
        return self.op("Gemm", [x, w, b], transB=1)

    def model(self, x: tuple[str, tuple[int, ...]], out: str, name: str) -> Any:
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info(x[0], TensorProto.FLOAT, x[1])],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="autosched.testing.models")
        m.ir_version = 8
        return m


def resnet18(image: int = 224, batch: int = 1, classes: int = 1000, seed: int = 0) -> Any:
    """ResNet-18: conv-bn-relu stem, max pool, 4 stages of 2 basic blocks with residual adds
    (1x1 strided projections where shapes change), global average pool, Gemm."""
    b = Builder(seed)
    x = "input"
    y = b.conv_bn(x, 3, 64, 7, stride=2)
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            h = b.conv_bn(y, cin, cout, 3, stride)
            h = b.conv_bn(h, cout, cout, 3, 1, act=None)
            skip = y if stride == 1 and cin == cout else b.conv_bn(y, cin, cout, 1, stride,
                                                                    act=None)
            y = b.op("Relu", [b.op("Add", [h, skip])])
            cin = cout
    y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)
    y = b.gemm(y, 512, classes)
    return b.model((x, (batch, 3, image, image)), y, "resnet18")


def mobilenet_v2(image: int = 224, batch: int = 1, classes: int = 1000, width: float = 1.0,
                 seed: int = 0) -> Any:
    """MobileNetV2: inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project, relu6 as
    Clip, residual add when the stride is 1 and channels match)."""
    b = Builder(seed)

    def ch(c: int) -> int:
        return max(8, int(c * width + 4) // 8 * 8)

    x = "input"
    cin = ch(32)
    y = b.conv_bn(x, 3, cin, 3, stride=2, act="Relu6")
    # (expansion t, channels c, repeats n, first stride s)
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        cout = ch(c)
        for k in range(n):
            stride = s if k == 0 else 1
            hidden = cin * t
            h = y if t == 1 else b.conv_bn(y, cin, hidden, 1, act="Relu6")
            h = b.conv_bn(h, hidden, hidden, 3, stride, groups=hidden, act="Relu6")
            h = b.conv_bn(h, hidden, cout, 1, act=None)
            y = b.op("Add", [h, y]) if stride == 1 and cin == cout else h
            cin = cout
    last = ch(1280) if width > 1.0 else 1280
    y = b.conv_bn(y, cin, last, 1, act="Relu6")
    y = b.op("GlobalAveragePool", [y])
    y = b.op("Flatten", [y], axis=1)
    y = b.gemm(y, last, classes)
    return b.model((x, (batch, 3, image, image)), y, "mobilenet_v2")


def bert_layer(seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072,
               batch: int = 1, seed: int = 0) -> Any:
    """One BERT-base encoder layer: Q/K/V MatMul + Add, Reshape / Transpose into heads, scaled
    QK^T, Softmax, context, output projection, residual + LayerNormalization, FFN with Gelu in
    its Erf form, residual + LayerNormalization."""
    b = Builder(seed)
    d = hidden // heads
    x = "input"

    def linear(v: str, cin: int, cout: int) -> str:
        w = b.weight((cin, cout), cin)
        bias = b.const(b.rng.normal(0, 0.02, cout).astype(np.float32), "b")
        return b.op("Add", [b.op("MatMul", [v, w]), bias])

    def shape(*dims: int) -> str:
        return b.const(np.array(dims, np.int64), "shape")

    def heads_of(v: str) -> str:  # (B, S, H) -> (B, heads, S, d)
        r = b.op("Reshape", [v, shape(batch, seq, heads, d)])
        return b.op("Transpose", [r], perm=[0, 2, 1, 3])

    def layer_norm(v: str) -> str:
        g = b.const(b.rng.uniform(0.5, 1.5, hidden).astype(np.float32), "ln")
        beta = b.const(b.rng.normal(0, 0.1, hidden).astype(np.float32), "ln")
        return b.op("LayerNormalization", [v, g, beta], axis=-1, epsilon=1e-12)

    q = heads_of(linear(x, hidden, hidden))
    k = heads_of(linear(x, hidden, hidden))
    v = heads_of(linear(x, hidden, hidden))
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("Div", [b.op("MatMul", [q, kt]),
                          b.const(np.array(np.sqrt(d), np.float32), "scale")])
    probs = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, shape(batch, seq, hidden)])
    h = layer_norm(b.op("Add", [linear(ctx, hidden, hidden), x]))
    f = linear(h, hidden, ffn)
    # Gelu, Erf form: 0.5 * f * (1 + erf(f / sqrt(2)))
    e = b.op("Erf", [b.op("Div", [f, b.const(np.array(np.sqrt(2), np.float32), "c")])])
    g = b.op("Mul", [b.op("Mul", [f, b.op("Add", [e, b.const(np.array(1, np.float32), "c")])]),
                     b.const(np.array(0.5, np.float32), "c")])
    out = layer_norm(b.op("Add", [linear(g, ffn, hidden), h]))
    return b.model((x, (batch, seq, hidden)), out, "bert_layer")


def small_cnn(image: int = 32, batch: int = 1, classes: int = 10, seed: int = 0) -> Any:
    """The demo's small CNN (autosched.demo.small_cnn): conv-relu x2, max pool,
    conv-bn-relu, global pool, Gemm."""
    from autosched.demo import small_cnn as build

    return build(image=image, batch=batch, classes=classes, seed=seed)


MODELS: dict[str, Callable[..., Any]] = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2, "bert_layer": bert_layer,
          "small_cnn": small_cnn}


def save(name: str, cache: str | os.PathLike | None = None, **kwargs: Any) -> Path:
    """Build model ``name`` with ``kwargs`` and save it under the cache dir (reused when
    present); returns the path."""
    import onnx

    tag = "-".join(f"{v}" for _, v in sorted(kwargs.items()))
    path = Path(cache or settings.MODEL_CACHE.value()) / (f"{name}-{tag}.onnx" if tag else f"{name}.onnx")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        proto = MODELS[name](**kwargs)
        tmp = path.with_suffix(".tmp")
        onnx.save(proto, os.fspath(tmp))
        os.replace(tmp, path)
    return path


def ort_run(model: Any, inputs: dict[str, np.ndarray], threads: int | None = None
            ) -> list[np.ndarray]:
    """Outputs of onnxruntime (CPU) on ``inputs``; ``model`` is a path or ModelProto."""
    sess = ort_session(model, threads)
    return sess.run(None, inputs)


def ort_session(model: Any, threads: int | None = None) -> Any:
    """An onnxruntime CPU session of ``model`` (a path or ModelProto). A ModelProto built by an
    onnx newer than the installed onnxruntime (helper.make_model stamps onnx's own IR version)
    is given the IR version its opsets need, which every onnxruntime of those opsets reads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    if isinstance(model, (str, os.PathLike)):
        return ort.InferenceSession(os.fspath(model), opts, providers=["CPUExecutionProvider"])
    try:
        return ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001  onnxruntime's own Fail type
        if "Unsupported model IR version" not in str(exc):
            raise
        from onnx import helper

        older = type(model)()
        older.CopyFrom(model)
        older.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
        return ort.InferenceSession(older.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
