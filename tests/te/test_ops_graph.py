"""Operators chained into a small network, built as one function: stages must compose."""

from __future__ import annotations

import numpy as np

from autosched import te
from autosched.te import ops
from tests.support.helpers import check, run_te
from tests.te.test_ops_conv import conv_nchw_ref
from tests.te.test_ops_pool import pool_ref


def test_small_cnn(target: str) -> None:
    rng = np.random.default_rng()
    x = te.placeholder((1, 3, 9, 8), name="x")
    w = te.placeholder((4, 3, 3, 3), name="w")
    bn = [te.placeholder((4,), name=n) for n in ("gamma", "beta", "mean", "var")]
    fc = te.placeholder((5, 4 * 5 * 4), name="fc")
    fb = te.placeholder((5,), name="fb")
    y = ops.conv2d_nchw(x, w, stride=1, padding=1)
    y = ops.relu(ops.batch_norm_inference(y, *bn, eps=1e-5))
    y = ops.max_pool2d(y, 2, strides=2, padding=(1, 0, 0, 0))
    logits = ops.dense(ops.flatten(y), fc, fb)
    prob = ops.softmax(logits)

    a = rng.standard_normal((1, 3, 9, 8)).astype("float32")
    wv = rng.standard_normal((4, 3, 3, 3)).astype("float32") * 0.3
    g, b, m = (rng.standard_normal(4).astype("float32") for _ in range(3))
    v = rng.uniform(0.5, 2, 4).astype("float32")
    fcv = rng.standard_normal((5, 80)).astype("float32") * 0.1
    fbv = rng.standard_normal(5).astype("float32")
    got_logits, got_prob = run_te([logits, prob], {x: a, w: wv, **dict(zip(bn, [g, b, m, v])),
                                                   fc: fcv, fb: fbv}, target)

    r = conv_nchw_ref(a, wv, 1, 1, 1, 1)
    view = (1, 4, 1, 1)
    r = (r - m.reshape(view)) / np.sqrt(v.reshape(view) + 1e-5) * g.reshape(view) + b.reshape(view)
    r = pool_ref(np.maximum(r, 0), "max", 2, 2, (1, 0, 0, 0), 1, False, False)
    want_logits = r.reshape(1, -1) @ fcv.T.astype(np.float64) + fbv
    e = np.exp(want_logits - want_logits.max())
    check(got_logits, want_logits, atol=1e-4)
    check(got_prob, e / e.sum(), atol=1e-5)


def test_transformer_block_pieces(target: str) -> None:
    rng = np.random.default_rng()
    s, d = 5, 8
    x = te.placeholder((1, s, d), name="x")
    wq = te.placeholder((d, d), name="wq")
    g, b = te.placeholder((d,), name="g"), te.placeholder((d,), name="b")
    h = ops.layer_norm(x, g, b, axis=-1)
    q = ops.matmul(h, wq)
    scores = ops.batch_matmul(q, q, transpose_b=True)
    attn = ops.softmax(ops.multiply(scores, 1.0 / np.sqrt(d)), axis=-1)
    out = ops.add(x, ops.gelu(ops.batch_matmul(attn, q)))

    a = rng.standard_normal((1, s, d)).astype("float32")
    wv = rng.standard_normal((d, d)).astype("float32") * 0.3
    gv, bv = rng.standard_normal(d).astype("float32"), rng.standard_normal(d).astype("float32")
    (got,) = run_te(out, {x: a, wq: wv, g: gv, b: bv}, target)

    a64 = a.astype(np.float64)
    hn = (a64 - a64.mean(-1, keepdims=True)) / np.sqrt(a64.var(-1, keepdims=True) + 1e-5) * gv + bv
    qn = hn @ wv
    sc = qn @ np.swapaxes(qn, 1, 2) / np.sqrt(d)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    z = p @ qn
    from math import erf

    gelu = 0.5 * z * (1 + np.vectorize(erf)(z / np.sqrt(2)))
    check(got, a64 + gelu, atol=1e-4)
