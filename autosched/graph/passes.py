"""Graph passes run before fusion: constant folding, batch-norm folding into convolutions,
Identity / Dropout removal and dead-node elimination; for CPU targets, stride-1 3x3
convolutions split into Winograd steps and the other conv weights packed output channels last;
for GPU targets with tensor-core precisions, convolutions as matmuls of im2col patches.

Each pass returns a new Graph (the input is left as it was).

Example::

    from autosched.graph.passes import optimize
    g = optimize(graph)          # every pass, in order
    print(g.op_counts())         # no BatchNormalization after a Conv
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from autosched.graph.evaluate import run_node
from autosched.graph.fold import FOLD_LIMIT_BYTES, folded_bytes, runtime_node
from autosched.graph.graph import (
    B_PANELS,
    DOT4,
    FP32_OUTPUT,
    IMPLICIT,
    KERNEL_LAYOUT,
    R_LAYOUT,
    Graph,
    Node,
    ValueInfo,
)
from autosched.tir.tensor_intrin import DOT_16X4, TENSOR_INTRINS


def _copy(g: Graph) -> Graph:
    return Graph(inputs=list(g.inputs), outputs=list(g.outputs),
                 nodes=[copy.copy(n) for n in g.nodes], constants=dict(g.constants),
                 values=dict(g.values), name=g.name, opset=g.opset)


def _readers(g: Graph) -> dict[str, list[Node]]:
    out: dict[str, list[Node]] = {}
    for n in g.nodes:
        for i in dict.fromkeys(n.inputs):
            if i:
                out.setdefault(i, []).append(n)
    return out


# Inputs per node of the ops that split_wide_nodes turns into trees: a converter builds one
# expression as deep as its inputs are many, and expression visitors recurse.
MAX_FAN_IN = 16
_ASSOCIATIVE = {"Sum", "Max", "Min", "Concat", "Mean"}


def split_wide_nodes(nodes: list[Node], names: set[str]) -> list[Node]:
    """Sum, Max, Min, Concat and Mean nodes with more than MAX_FAN_IN inputs as trees of such
    nodes (same attributes; new values named after the output, avoiding ``names``): a Sum of
    1000 inputs is 63 Sums of 16 under 4 Sums under one; a Mean is a tree of Sums divided by
    the count. Importers run it before converting."""
    out: list[Node] = []
    taken = set(names)
    for n in nodes:
        if n.op_type not in _ASSOCIATIVE or len(n.inputs) <= MAX_FAN_IN or "" in n.inputs:
            out.append(n)
            continue
        op = "Sum" if n.op_type == "Mean" else n.op_type
        level, ins = 0, list(n.inputs)
        while len(ins) > MAX_FAN_IN:
            parts = []
            for k in range(0, len(ins), MAX_FAN_IN):
                part = f"{n.name}.tree{level}_{k // MAX_FAN_IN}"
                parts.append(_fresh(f"{n.outputs[0]}.tree{level}_{k // MAX_FAN_IN}", taken))
                out.append(Node(part, op, ins[k:k + MAX_FAN_IN], [parts[-1]], dict(n.attrs)))
            level, ins = level + 1, parts
        if n.op_type != "Mean":
            out.append(Node(n.name, op, ins, list(n.outputs), dict(n.attrs)))
            continue
        total, count, typed = (_fresh(f"{n.outputs[0]}.{s}", taken)
                               for s in ("sum", "count", "count_typed"))
        out += [Node(f"{n.name}.sum", "Sum", ins, [total]),
                Node(f"{n.name}.count", "Constant", [], [count],
                     {"value": np.array(len(n.inputs), np.float64)}),
                Node(f"{n.name}.count_typed", "CastLike", [count, n.inputs[0]], [typed]),
                Node(n.name, "Div", [total, typed], list(n.outputs))]
    return out


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 0
    while out in taken:
        k += 1
        out = f"{name}.{k}"
    taken.add(out)
    return out


def fold_constants(graph: Graph) -> Graph:
    """Replace every node whose inputs are all constants by its outputs' values (the importer
    folds what its converters return as numpy; this folds the rest, e.g. a Conv of constants,
    by running it once on the reference backend), unless they would take more than
    FOLD_LIMIT_BYTES: then a kernel computes them at run time."""
    g = _copy(graph)
    kept = []
    for node in g.nodes:
        ins = [i for i in node.inputs if i]
        if not ins or not all(i in g.constants for i in ins):
            kept.append(node)
            continue
        values = [g.constants[i] if i else None for i in node.inputs]
        size = folded_bytes(node, values, g.opset or 17)
        if size is not None and size > FOLD_LIMIT_BYTES:
            kept.append(runtime_node(node, values))  # a kernel computes it at run time
            continue
        outs = run_node(node, values, [True] * len(values), g.opset or 17, target="ref")
        for name, arr in zip(node.outputs, outs):
            if name:
                g.constants[name] = arr
                g.values[name] = ValueInfo(name, tuple(arr.shape), str(arr.dtype))
    g.nodes = kept
    return g


def fold_batch_norm(graph: Graph) -> Graph:
    """Conv (constant weight and bias) followed by BatchNormalization (constant parameters)
    becomes one Conv with scaled weights and a shifted bias, when the BatchNormalization is the
    conv output's only reader and that output is no graph output."""
    g = _copy(graph)
    readers = _readers(g)
    producer = {o: n for n in g.nodes for o in n.outputs}
    dropped: set[int] = set()
    for bn in g.nodes:
        if bn.op_type != "BatchNormalization" or bn.attrs.get("training_mode", 0):
            continue
        if len([o for o in bn.outputs if o]) != 1 or len(bn.inputs) < 5:
            continue
        x = bn.inputs[0]
        conv = producer.get(x)
        if (conv is None or conv.op_type != "Conv" or x in g.outputs
                or len(readers.get(x, [])) != 1 or not all(p in g.constants for p in bn.inputs[1:5])
                or conv.inputs[1] not in g.constants
                or (len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in g.constants)):
            continue
        gamma, beta, mean, var = (g.constants[p].astype(np.float64) for p in bn.inputs[1:5])
        w = g.constants[conv.inputs[1]]
        if w.dtype.kind != "f" or gamma.ndim != 1 or gamma.shape[0] != w.shape[0]:
            continue
        scale = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        bias = (g.constants[conv.inputs[2]].astype(np.float64)
                if len(conv.inputs) > 2 and conv.inputs[2] else np.zeros(w.shape[0]))
        new_w = (w.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
        new_b = ((bias - mean) * scale + beta).astype(w.dtype)
        wn, bnm = f"{conv.name}.bn_weight", f"{conv.name}.bn_bias"
        g.constants[wn], g.constants[bnm] = new_w, new_b
        g.values[wn] = ValueInfo(wn, new_w.shape, str(new_w.dtype))
        g.values[bnm] = ValueInfo(bnm, new_b.shape, str(new_b.dtype))
        conv.inputs = [conv.inputs[0], wn, bnm]
        conv.outputs = [bn.outputs[0]]
        g.values[bn.outputs[0]] = ValueInfo(bn.outputs[0], g.values[x].shape, g.values[x].dtype)
        dropped.add(id(bn))
    g.nodes = [n for n in g.nodes if id(n) not in dropped]
    return eliminate_dead(g)


def remove_identities(graph: Graph) -> Graph:
    """Identity and (inference) Dropout nodes read through: their readers read the source. One
    whose output is a graph output stays (it becomes a copy kernel)."""
    g = _copy(graph)
    alias: dict[str, str] = {}
    kept = []
    for n in g.nodes:
        n.inputs = [alias.get(i, i) for i in n.inputs]
        outs = [o for o in n.outputs if o]
        passthrough = n.op_type == "Identity" or (
            n.op_type == "Dropout" and len(outs) == 1 and len(n.inputs) < 3)
        if passthrough and outs[0] not in g.outputs and n.inputs and n.inputs[0]:
            alias[outs[0]] = n.inputs[0]
            continue
        kept.append(n)
    g.nodes = kept
    return g


def eliminate_dead(graph: Graph) -> Graph:
    """Drop nodes no graph output depends on, and constants nothing reads."""
    g = _copy(graph)
    live = set(g.outputs)
    kept: list[Node] = []
    for n in reversed(g.nodes):
        if any(o in live for o in n.outputs if o):
            kept.append(n)
            live.update(i for i in n.inputs if i)
    g.nodes = kept[::-1]
    g.constants = {k: v for k, v in g.constants.items() if k in live}
    return g


def optimize(graph: Graph) -> Graph:
    """Every pass: constant folding, Identity removal, batch-norm folding, dead nodes."""
    return eliminate_dead(fold_batch_norm(remove_identities(fold_constants(graph))))


# Output columns from which a stride-1 1x1 convolution keeps OIHW (its rows the vector): a
# row shorter than an AVX-512 vector of floats sums channels-last. Tuned 40 trials each on
# znver4 (benchmarks/cpu_conv_layout.py), OIHW against channels-last, conv + ReLU at 14 x 14:
# 256 -> 256 0.205 / 0.119 ms, 128 -> 256 0.100 / 0.064, 64 -> 384 0.089 / 0.053, 384 -> 64
# 0.077 / 0.046; at 28 x 28 about even (128 -> 128 0.130 / 0.125, 64 -> 128 0.066 / 0.073)
PACK_1X1_BELOW_COLUMNS = 16
# Input channels and output pixels from which a stride-1 kernel larger than 1x1 sums
# channels-last over any rows: tuned 60-80 trials each on znver4, channels-last against
# OIHW, conv + ReLU: 64 -> 32 at 900 x 161 26.6 against 54.1 ms, at 900 x 160 38.1 / 45.5;
# 32 -> 32 at 900 x 161 12.5 / 24.3; at 112 x 112 (12,544 pixels) 64 -> 32 ties (2.28 /
# 2.31) and 16 -> 32 keeps OIHW ahead (0.53 / 0.63).
PACK_LARGE_CHANNELS = 32
PACK_LARGE_PIXELS = 1 << 16


def packing_pays(node: Node, w: np.ndarray, out_shape: tuple[int, ...] | None) -> bool:
    """Channels-last sums pay where a row is a poor vector: strided convolutions (the row
    reads are gathers), 1x1 kernels over few input channels, and 1x1 kernels over short rows
    (under PACK_1X1_BELOW_COLUMNS columns: a row of 14 fills under one AVX-512 vector).
    A stride-1 kernel larger than 1x1 over few input channels (a spectrogram's first conv)
    keeps OIHW over long rows: channels-last, its few sums per output went through a
    transposed store (untuned on znver4, OIHW against channels-last, conv + ReLU: 1 -> 32
    channels at 900 x 120 0.35 against 0.69 ms; 3 -> 16 at 224 x 224 0.21 against 0.34;
    8 -> 32 at 112 x 112 0.27 against 0.32).
    A 1x1 convolution over longer rows keeps OIHW: its sums and stores run along the
    contiguous row, where channels-last sums are stored transposed, one lane at a time (a
    MobileNetV2 expansion, 24 -> 144 channels at 56 x 56, took 0.54 ms channels-last
    against 0.21 ms). Measured with the untuned defaults of benchmarks/cpu_conv_layout.py;
    stride-1 convolutions with larger kernels keep OIHW unless their rows are as short (a
    1-d convolution over a (C, L, 1) map has rows of one column: magika's 5 x 1 conv, 256 ->
    512 channels over 508 rows, took 16.4 ms OIHW), or unless they sum at least
    PACK_LARGE_CHANNELS input channels over PACK_LARGE_PIXELS output pixels (a spectrogram's
    inner convolutions: see the measurements above PACK_LARGE_CHANNELS)."""
    strides = [int(v) for v in node.attrs.get("strides", [1, 1])]
    one_by_one = tuple(w.shape[2:]) == (1, 1)
    if max(strides) > 1 or (w.shape[1] < 16 and one_by_one):
        return True
    rows, columns = out_shape[2:] if out_shape is not None and len(out_shape) == 4 else (None, None)
    if not isinstance(columns, int):  # rows of unknown length: 1x1 kernels pack, larger not
        return one_by_one
    if (not one_by_one and w.shape[1] >= PACK_LARGE_CHANNELS and isinstance(rows, int)
            and rows * columns >= PACK_LARGE_PIXELS):
        return True
    return columns < PACK_1X1_BELOW_COLUMNS


def pack_conv_weights(graph: Graph) -> Graph:
    """Each 2-d, ungrouped Conv with a constant weight where packing_pays reads it transposed
    once to (C, KH, KW, O) (attribute KERNEL_LAYOUT "IHWO"), so its sums run channels-last
    with the output channels as the contiguous vector axis. Run after fold_batch_norm, which
    scales OIHW weights."""
    g = _copy(graph)
    packed: dict[str, str] = {}
    for n in g.nodes:
        if (n.op_type != "Conv" or int(n.attrs.get("group", 1)) != 1 or KERNEL_LAYOUT in n.attrs
                or len(n.inputs) < 2 or n.inputs[1] not in g.constants):
            continue
        w = g.constants[n.inputs[1]]
        out = g.values.get(n.outputs[0]) if n.outputs else None
        if w.ndim != 4 or not packing_pays(n, w, out.shape if out is not None else None):
            continue
        name = packed.get(n.inputs[1])
        if name is None:
            name = packed[n.inputs[1]] = f"{n.inputs[1]}.ihwo"
            arr = np.asarray(w.transpose(1, 2, 3, 0), order="C")
            g.constants[name] = arr
            g.values[name] = ValueInfo(name, arr.shape, str(arr.dtype))
        n.inputs = [n.inputs[0], name, *n.inputs[2:]]
        n.attrs = {**n.attrs, KERNEL_LAYOUT: "IHWO"}
    return eliminate_dead(g)


def panel_columns(n: int, lanes: int) -> int | None:
    """The panel width P a constant B with ``n`` columns is packed in for vectors of
    ``lanes``: the widest of 4, 2 and 1 vectors (4 is the widest register tile of the CPU
    tile rule) whose zero padding, up to a multiple of P, adds at most an eighth (ddddocr's
    8,210 columns: 64, padded to 8,256; MobileNetV2's 1,000: 64, padded to 1,024); None for
    fewer than ``lanes`` columns."""
    for p in (4 * lanes, 2 * lanes, lanes):
        if n >= lanes and -(-n // p) * p - n <= n // 8:
            return p
    return None


def zero_padded_columns(b: np.ndarray, columns: int) -> np.ndarray:
    """A (K, N) matrix with ``columns`` >= N columns, zero past column N."""
    k, n = b.shape
    if columns == n:
        return b
    padded = np.zeros((k, columns), b.dtype)
    padded[:, :n] = b
    return padded


def as_panels(b: np.ndarray, p: int) -> np.ndarray:
    """A (K, N) matrix as column panels (ceil(N / p), K, p), zero past column N."""
    k, n = b.shape
    count = -(-n // p)
    padded = zero_padded_columns(b, count * p)
    return np.asarray(padded.reshape(k, count, p).transpose(1, 0, 2), order="C")


# the ops dot4_products packs: positions of the weight and of its zero point
DOT4_INPUTS = {"MatMulInteger": (1, 3), "ConvInteger": (1, 3), "QLinearMatMul": (3, 5),
               "QLinearConv": (3, 5)}


def dot4_products(graph: Graph, dot: str = DOT_16X4) -> Graph:
    """Each MatMulInteger / QLinearMatMul of a uint8 A by a constant 8-bit B (K a multiple of
    4, its columns in panels of whole vectors of the intrinsic's lanes) and each ConvInteger /
    QLinearConv of a uint8 x by a constant weight (one group, dilation 1), with a constant or
    no weight zero point, carries DOT4 = ``dot``: its converter stores the weight packed for
    that 8-bit dot product (tir/tensor_intrin.py: x86's vpdpbusd, aarch64's usdot / udot;
    4 products a lane where int32 vectors hold one; quant.matmul_dot4, quant.conv2d_dot4).
    For CPU targets with one (compiler.prepare)."""
    from autosched.graph.ops_quant import packs_conv_dot4, packs_dot4  # the converters' rules

    g = _copy(graph)
    for n in g.nodes:
        at = DOT4_INPUTS.get(n.op_type)
        if at is None or len(n.inputs) <= at[1]:
            continue
        a, b = n.inputs[0], n.inputs[at[0]]
        b_zero = n.inputs[at[1]] if len(n.inputs) > at[1] and n.inputs[at[1]] else None
        if not (a in g.values and g.values[a].dtype == "uint8" and b in g.constants
                and (b_zero is None or b_zero in g.constants)):
            continue
        shape = tuple(g.values[a].shape)
        if not all(isinstance(d, int) and d > 0 for d in shape):  # a symbolic dim: unpacked
            continue
        if (packs_dot4(g.constants[b], shape, TENSOR_INTRINS[dot].n) if "MatMul" in n.op_type
                else packs_conv_dot4(n, g.constants[b], shape)):
            n.attrs = {**n.attrs, DOT4: dot}
    return g


def pack_gemm_weights(graph: Graph, lanes: int | None = None) -> Graph:
    """Each Gemm whose B is a constant read transposed (transB=1: an (N, K) weight, as
    torch's Linear exports it) reads it stored (K, N) instead, so the N axis that the CPU
    tile vectorizes is contiguous (a row of B^T is a gather across the lanes). So does each
    RecurrentCell's constant R (G*H, H): an LSTM step's h R^T is such a product (ddddocr's
    2048 x 512 R took 2.3 ms a step read (N, K), gathers across the lanes), and with
    ``lanes`` its R^T is stored as column panels too (R_LAYOUT "panels").

    With ``lanes`` (the CPU's vector length in floats), a constant 2-d B of a Gemm or of a
    MatMul whose A is at least 2-d is stored as column panels instead (as_panels, width
    panel_columns; node attribute B_PANELS, its columns): each step of k reads P contiguous
    columns where a (K, N) row moves N * 4 bytes on, and the register tiles cover the last
    panel whole (ddddocr's 20 x 1024 x 8210 Gemm, untuned: 10-column tiles over (K, N) 3.90
    ms, 64-column tiles over panels 1.93 ms, onnxruntime 2.11 ms; panels were never slower on
    eleven shapes: benchmarks/cpu_gemm.py --weights-only, --layouts)."""
    g = _copy(graph)
    packed: dict[tuple[str, bool, int | None], str] = {}

    def stored(value: str, transpose: bool, width: int | None) -> str:
        """Constant ``value`` (transposed first with ``transpose``) in panels of ``width``
        columns, or as a plain matrix."""
        name = packed.get((value, transpose, width))
        if name is None:
            arr = g.constants[value].T if transpose else g.constants[value]
            arr = as_panels(arr, width) if width else np.asarray(arr, order="C")
            name = value + ".kn" * transpose + (f".panels{width}" if width else "")
            packed[(value, transpose, width)] = name
            g.constants[name] = arr
            g.values[name] = ValueInfo(name, arr.shape, str(arr.dtype))
        return name

    def constant_matrix(n: Node, k: int) -> bool:
        return len(n.inputs) > k and n.inputs[k] in g.constants and g.constants[
            n.inputs[k]].ndim == 2

    for n in g.nodes:
        if n.op_type == "RecurrentCell" and R_LAYOUT not in n.attrs and constant_matrix(n, 3):
            gates = g.constants[n.inputs[3]].shape[0]
            width = panel_columns(gates, lanes) if lanes else None
            n.inputs = [*n.inputs[:3], stored(n.inputs[3], True, width), *n.inputs[4:]]
            n.attrs = {**n.attrs, R_LAYOUT: "panels" if width else "kn"}
        if n.op_type not in ("Gemm", "MatMul") or B_PANELS in n.attrs or not constant_matrix(
                n, 1):
            continue
        transpose = n.op_type == "Gemm" and bool(int(n.attrs.get("transB", 0)))
        columns = g.constants[n.inputs[1]].shape[0 if transpose else 1]
        a = g.values.get(n.inputs[0])
        width = panel_columns(columns, lanes) if lanes and a and len(a.shape) >= 2 else None
        if transpose or width:
            n.inputs = [n.inputs[0], stored(n.inputs[1], transpose, width), *n.inputs[2:]]
            n.attrs = {**n.attrs, **({"transB": 0} if transpose else {}),
                       **({B_PANELS: columns} if width else {})}
    return eliminate_dead(g)


# Output rows / columns from which a convolution takes F(4x4, 3x3), and F(2x2, 3x3).
WINOGRAD_TILES = ((14, 4), (7, 2))
# Measured on an AVX-512 CPU (2 cores, 64 trials per convolution, direct / Winograd tuned):
# 16 channels lose (16 -> 16 at 56 x 56: 0.71x; 16 -> 32 at 32 x 32: 0.53x), and since the
# direct convolutions' defaults and rules improved, so do 32 (znver4, conv + ReLU, 60 trials
# each, Winograd / direct ms: 32 -> 32 at 56 x 56 0.470 / 0.319, at 120 x 120 2.237 / 1.560,
# at 225 x 30 1.350 / 1.000, at 40 x 40 0.143 / 0.137; 32 -> 64 at 80 x 80 1.429 / 1.061),
# while 48 and 64 win (48 -> 48 at 56 x 56 0.425 / 0.644; 64 -> 64 0.875 / 1.051). 64 win out
# of the caches too (64 -> 64 at 112 x 112, 7.2 MB of tiles: 1.11x). The transforms move
# alpha^2 / m^2 of each input and output through memory once more; their cost per channel is
# repaid by the multiplies saved per pair of channels, C K / (C + K) of them per channel.
# Far beyond the caches too, since the transforms compute their rows inside their tiles
# (search/sketch.py, HOSTED_MIN_BYTES): 64 -> 64 at 900 x 161 (85 MB of tiles, a spectrogram
# of dnsmos_sig_bak_ovr), untuned, 45.3 ms with Winograd against 71.7 direct (143 against 72
# when each transform wrote its rows out first); 128 -> 64 there 81.2 against 130.4.
WINOGRAD_MIN_CHANNELS = 48
WINOGRAD_CACHED_BYTES = 4 << 20   # the larger side's transformed tiles: in the caches
WINOGRAD_UNCACHED_PAIRS = 32      # C K / (C + K) from which tiles out of the caches pay


def winograd_tile(node: Node, w: np.ndarray, out_shape: tuple[int, ...]) -> int | None:
    """The Winograd tile size m for a Conv node (None: keep it direct). Stride-1, dilation-1,
    ungrouped float32 3x3 convolutions with at least 48 input and output channels: F(4x4,
    3x3) (a quarter of the multiplies) from 14 x 14 outputs, F(2x2, 3x3) (4 / 9 of them) at
    7 x 7, where F(4x4)'s 4 tiles would read weights 4 times the size of F(2x2)'s per use;
    with fewer than 64 channels a side, only while the transformed tiles fit the caches
    (WINOGRAD_CACHED_BYTES; see the measurements above)."""
    ones = [1, 1]
    if (w.ndim != 4 or tuple(w.shape[2:]) != (3, 3) or w.dtype != np.float32
            or int(node.attrs.get("group", 1)) != 1
            or [int(v) for v in node.attrs.get("strides", ones)] != ones
            or [int(v) for v in node.attrs.get("dilations", ones)] != ones
            or min(w.shape[:2]) < WINOGRAD_MIN_CHANNELS or len(out_shape) != 4):
        return None
    m = next((m for size, m in WINOGRAD_TILES if min(out_shape[2:]) >= size), None)
    if m is None:
        return None
    from autosched.te.ops.winograd import _tiles

    k, c = (int(d) for d in w.shape[:2])
    tiles = int(out_shape[0]) * _tiles(int(out_shape[2]), m) * _tiles(int(out_shape[3]), m)
    tile_bytes = (m + 2) ** 2 * max(c, k) * tiles * w.dtype.itemsize
    if tile_bytes > WINOGRAD_CACHED_BYTES and c * k < WINOGRAD_UNCACHED_PAIRS * (c + k):
        return None
    return m


def winograd_convs(graph: Graph) -> Graph:
    """Each Conv that winograd_tile takes becomes three nodes (autosched.te.ops.winograd):
    WinogradInput (the input tiles times B^T, B), MatMul of the transformed weights
    (alpha^2, K, C), computed here once, with those tiles, and WinogradOutput (times A^T, A,
    plus the bias), which keeps the Conv's name and output so activation and residual still
    fuse into it. Run after fold_batch_norm, before pack_conv_weights."""
    from autosched.graph.ops_nn import _pads
    from autosched.te.ops.winograd import winograd_matrices, winograd_weight

    g = _copy(graph)
    nodes: list[Node] = []
    for n in g.nodes:
        out = n.outputs[0] if n.outputs else ""
        w = g.constants.get(n.inputs[1]) if n.op_type == "Conv" and len(n.inputs) > 1 else None
        m = (winograd_tile(n, w, g.values[out].shape)
             if w is not None and KERNEL_LAYOUT not in n.attrs and out in g.values else None)
        if w is None or m is None:
            nodes.append(n)
            continue
        x = n.inputs[0]
        begins, ends = _pads(n, list(g.values[x].shape[2:]), [3, 3], [1, 1], [1, 1])
        at, _, bt = winograd_matrices(m)
        names = {"u": f"{n.inputs[1]}.winograd{m}", "at": f"winograd{m}.at",
                 "bt": f"winograd{m}.bt"}
        for key, arr in (("u", winograd_weight(w, m)), ("at", at.astype(w.dtype)),
                         ("bt", bt.astype(w.dtype))):
            if names[key] not in g.constants:
                g.constants[names[key]] = arr
                g.values[names[key]] = ValueInfo(names[key], arr.shape, str(arr.dtype))
        alpha2, k, c = g.constants[names["u"]].shape
        nb, _, oh, ow = g.values[out].shape
        tiles = nb * -(-oh // m) * -(-ow // m)
        v, prod = f"{out}.winograd_tiles", f"{out}.winograd_product"
        g.values[v] = ValueInfo(v, (alpha2, c, tiles), str(w.dtype))
        g.values[prod] = ValueInfo(prod, (alpha2, k, tiles), str(w.dtype))
        bias = [n.inputs[2]] if len(n.inputs) > 2 and n.inputs[2] else []
        nodes += [
            Node(f"{n.name}.winograd_input", "WinogradInput", [x, names["bt"]], [v],
                 {"m": m, "pads": [*begins, *ends]}),
            Node(f"{n.name}.winograd_matmul", "MatMul", [names["u"], v], [prod]),
            Node(n.name, "WinogradOutput", [prod, names["at"], *bias], [out],
                 {"m": m, "shape": [nb, k, oh, ow]}),
        ]
    g.nodes = nodes
    return eliminate_dead(g)


# Elementwise ops that gemm_convs computes on the matmul's (N, O, OH * OW) values before
# reshaping them back to (N, O, OH, OW), so they fuse into the matmul's kernel
SINKABLE = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Softplus", "Clip", "Add", "Sub", "Mul", "Div", "Max", "Min",
})


def gemm_conv_shape(g: Graph, n: Node) -> tuple[int, int, int] | None:
    """(O, C * KH * KW, OH * OW), the matmul an ungrouped 2-d Conv with a constant kernel is,
    or None for the convolutions gemm_convs leaves direct (grouped, packed, 1-d / 3-d, a
    runtime kernel or bias, fewer than 8 output channels or products per output)."""
    w = g.constants.get(n.inputs[1]) if n.op_type == "Conv" and len(n.inputs) > 1 else None
    out = g.values.get(n.outputs[0]) if n.outputs else None
    bias = n.inputs[2] if len(n.inputs) > 2 else ""
    if (w is None or w.ndim != 4 or out is None or len(out.shape) != 4
            or int(n.attrs.get("group", 1)) != 1 or KERNEL_LAYOUT in n.attrs
            or (bias and bias not in g.constants)):
        return None
    o, k = w.shape[0], int(np.prod(w.shape[1:]))
    return (o, k, out.shape[2] * out.shape[3]) if min(o, k) >= 8 else None


def _value_maker(g: Graph) -> Callable[..., str]:
    """``new_value(base, shape, dtype, array=None)``: a fresh value name of ``g`` (a constant
    when ``array`` is given), its ValueInfo recorded."""
    taken = set(g.values) | set(g.constants) | {n.name for n in g.nodes}

    def new_value(base: str, shape: tuple[int, ...], dtype: str,
                  array: np.ndarray | None = None) -> str:
        name = _fresh(base, taken)
        if array is not None:
            g.constants[name] = array
        g.values[name] = ValueInfo(name, shape, dtype)
        return name

    return new_value


def _reshape(new_value: Callable[..., str], name: str, src: str, shape: tuple[int, ...],
             dtype: str, out: str | None = None, attrs: dict[str, Any] | None = None
             ) -> tuple[Node, str]:
    """A Reshape node ``name`` of ``src`` to ``shape`` (its shape a new constant), into
    ``out`` (a graph value already) or a new value named after ``src``; the node and its
    output."""
    out = out or new_value(f"{src}.as_{'x'.join(map(str, shape))}", shape, dtype)
    dims = new_value(f"{out}.shape", (len(shape),), "int64", np.array(shape, np.int64))
    return Node(name, "Reshape", [src, dims], [out], dict(attrs or {})), out


# Splitting a GPU GEMM along K (k_splits: convolutions, MatMuls by constant weights): the
# 64 x 64 output tiles times the splits to reach, the most splits, and the fewest products
# each split sums
SPLIT_K_TILES = 1024
MAX_K_SPLITS = 8
MIN_SPLIT_DEPTH = 256


def k_splits(rows: int, k: int, cols: int, max_splits: int = MAX_K_SPLITS) -> int:
    """How many slices of K a GPU (rows, k) x (k, cols) GEMM sums separately: a
    power of two up to ``max_splits`` while its 64 x 64 output tiles times the splits stay under
    SPLIT_K_TILES and each split still sums MIN_SPLIT_DEPTH products (K a multiple of 32 per
    split). Few output tiles over a deep K (ResNet-18's last stage: 8 x 1 tiles at batch 1,
    K = 4,608) leave most of a GPU idle while a block walks K alone; the slices' partial sums
    (float32) are added by a kernel of their own."""
    tiles = -(-rows // 64) * -(-cols // 64)
    s = 1
    while (s < max_splits and tiles * s < SPLIT_K_TILES and k % (64 * s) == 0
           and k // (2 * s) >= MIN_SPLIT_DEPTH):
        s *= 2
    return s


def _sum_of_slices(g: Graph, name: str, partial: str, out: str, keepdims: bool,
                   new_value: Callable[..., str]) -> Node:
    """The ReduceSum of ``partial``'s leading axis (the slices of K) into ``out``, spelled for
    the graph's opset: its axes are an input from opset 13, an attribute before (as the
    converters' registry says)."""
    from autosched.graph.ops import const_inputs

    if const_inputs("ReduceSum", g.opset or 17):
        axes = new_value(f"{out}.axes", (1,), "int64", np.array([0], np.int64))
        return Node(name, "ReduceSum", [partial, axes], [out], {"keepdims": int(keepdims)})
    return Node(name, "ReduceSum", [partial], [out], {"axes": [0], "keepdims": int(keepdims)})


def gemm_convs(graph: Graph, implicit: bool = False, batch_columns: bool = True,
               max_splits: int = MAX_K_SPLITS) -> Graph:
    """Each Conv that gemm_conv_shape takes becomes a matmul, the form tensor cores multiply:
    Im2Col (the patches as columns, te.ops.im2col; a 1x1 stride-1 unpadded kernel reads its
    input as the columns, reshaped), MatMul of the kernel as an (O, C * KH * KW) matrix with
    them, (N, O, OH * OW), plus the bias, then Reshape to (N, O, OH, OW) under the Conv's
    output name. The elementwise nodes that follow it alone (activation, residual add; their
    other inputs reshaped alike, scalars and per-channel constants kept) move before the
    Reshape, so they still fuse into the matmul's kernel. With ``implicit``, the Im2Col nodes
    carry the IMPLICIT attribute: fusion puts each into its matmul's kernel, whose operand
    copy then gathers the patches from the input (no patch buffer).

    With a batch of more than one image (and ``batch_columns``), the columns of a
    convolution with patches to gather, or of one reading such a GEMM's output, run over the
    batch: Im2Col gives (C * KH * KW, N * OH * OW), the matmul is one GEMM (O, N * OH * OW)
    that reads each weight once for the batch (per image, 7 x 7 outputs filled 49 of a tile's
    64 columns and re-read the weights 32 times at batch 32), and its output becomes
    (N, O, OH, OW) through a transpose. A later convolution, or a residual input of a later
    epilogue, that reads such an output reads the GEMM's (O, N * OH * OW) value itself (its
    Im2Col in the CNHW layout; a 1x1 stride-1 unpadded kernel takes it as its columns), so
    the transpose runs only for other readers (pooling, the graph's outputs).

    Where few output tiles cover a deep K (k_splits; up to ``max_splits``), the GEMM sums
    slices of K apart, (S, O, K / S) x (S, K / S, columns) into float32 partial sums, and a
    ReduceSum adds them, the bias and the moved elementwise nodes fused after it. For GPU
    targets in precisions with tensor-core multiplies (compiler.prepare); run after
    fold_batch_norm."""
    from autosched.graph.ops_nn import _pads

    g = _copy(graph)
    readers = _readers(g)
    outputs = set(g.outputs)
    new_value = _value_maker(g)
    moved: dict[int, list[Node]] = {}  # position in g.nodes -> the nodes that replace it
    gone: set[int] = set()
    index = {id(n): i for i, n in enumerate(g.nodes)}

    # the (N, O, OH, OW) outputs made here in the batch form: {output: its (O, N * OH * OW)}
    cnhw: dict[str, str] = {}
    # residual inputs transposed into the batch form: {(O, N * OH * OW) view: input}; those
    # whose convolution comes later in the graph read its GEMM's output instead (below)
    transposed: dict[str, str] = {}
    for n in g.nodes:
        dims = gemm_conv_shape(g, n)
        if dims is None:
            continue
        o, k, p = dims
        x, out = n.inputs[0], n.outputs[0]
        w = g.constants[n.inputs[1]]
        nb, c, h, wd = g.values[x].shape
        shape4 = g.values[out].shape
        kh, kw = (int(d) for d in w.shape[2:])
        strides = [int(v) for v in n.attrs.get("strides", [1, 1])]
        dil = [int(v) for v in n.attrs.get("dilations", [1, 1])]
        begins, ends = _pads(n, [h, wd], [kh, kw], strides, dil)
        geometry = {"kernel_shape": [kh, kw], "strides": strides, "dilations": dil,
                    "pads": [*begins, *ends], IMPLICIT: int(implicit)}
        pointwise = (kh, kw) == (1, 1) and strides == [1, 1] and not any(begins + ends)
        # a pointwise kernel over an (N, C, H, W) input reads it as its columns per image; in
        # the batch form they would be a transposed copy (MobileNetV2's depthwise outputs)
        batch = batch_columns and nb > 1 and (x in cnhw or not pointwise)
        cols_shape = (k, nb * p) if batch else (nb, k, p)
        nodes: list[Node] = []
        if batch and pointwise and x in cnhw:
            cols = cnhw[x]  # the earlier GEMM's output is these columns
        elif batch:
            cols = new_value(f"{out}.columns", cols_shape, g.values[x].dtype)
            src, layout = x, "NCHW"
            if x in cnhw:  # the earlier GEMM's output viewed as (C, N, H, W)
                view, src = _reshape(new_value, f"{n.name}.cnhw", cnhw[x], (c, nb, h, wd),
                                     g.values[x].dtype)
                nodes.append(view)
                layout = "CNHW"
            nodes.append(Node(f"{n.name}.im2col", "Im2Col", [src], [cols],
                              {**geometry, "layout": layout, "batch_columns": 1}))
        elif pointwise:
            view, cols = _reshape(new_value, f"{n.name}.columns", x, cols_shape,
                                  g.values[x].dtype)
            nodes.append(view)
        else:
            cols = new_value(f"{out}.columns", cols_shape, g.values[x].dtype)
            nodes.append(Node(f"{n.name}.im2col", "Im2Col", [x], [cols], geometry))
        dtype = g.values[out].dtype
        flat = (o, nb * p) if batch else (nb, o, p)
        cur = new_value(f"{out}.gemm", flat, dtype)
        splits = 1 if implicit or not (batch or nb == 1) else k_splits(o, k, nb * p, max_splits)
        if splits == 1:
            mat = new_value(f"{n.inputs[1]}.matrix", (o, k), str(w.dtype), w.reshape(o, k))
            nodes.append(Node(f"{n.name}.gemm", "MatMul", [mat, cols], [cur]))
        else:  # partial sums over slices of K, then their sum
            part = k // splits
            mats = new_value(f"{n.inputs[1]}.slices", (splits, o, part), str(w.dtype),
                             np.asarray(w.reshape(o, splits, part).transpose(1, 0, 2),
                                        order="C"))
            view, sliced = _reshape(new_value, f"{n.name}.slices", cols,
                                    (splits, part, nb * p), g.values[x].dtype)
            partial = new_value(f"{out}.partial", (splits, o, nb * p), dtype)
            nodes += [view,
                      Node(f"{n.name}.gemm", "MatMul", [mats, sliced], [partial],
                           {FP32_OUTPUT: 1}),
                      _sum_of_slices(g, f"{n.name}.gemm_sum", partial, cur, not batch,
                                     new_value)]
        if len(n.inputs) > 2 and n.inputs[2]:
            b = g.constants[n.inputs[2]]
            col = new_value(f"{n.inputs[2]}.column", (o, 1), str(b.dtype), b.reshape(o, 1))
            biased = new_value(f"{out}.gemm_bias", flat, dtype)
            nodes.append(Node(f"{n.name}.gemm_bias", "Add", [cur, col], [biased]))
            cur = biased
        value, last = out, index[id(n)]
        views: list[Node] = []  # first in the bundle: a view read inside a kernel would pull
        # the reader into the view's (injective) group instead of the matmul's
        while value not in outputs and len(readers.get(value, [])) == 1:
            r = readers[value][0]
            if index[id(r)] in gone:  # moved already, by the convolution of another input
                break
            ins = _sunk_inputs(g, r, value, cur, shape4, new_value, views,
                               cnhw if batch else None, transposed)
            if ins is None:
                break
            sunk = new_value(f"{r.outputs[0]}.gemm", flat, g.values[r.outputs[0]].dtype)
            nodes.append(Node(f"{r.name}.gemm", r.op_type, ins, [sunk], dict(r.attrs)))
            gone.add(index[id(r)])
            value, cur, last = r.outputs[0], sunk, index[id(r)]
        if batch:
            nodes += _swap_leading(cur, (o, nb, p), shape4, g.values[cur].dtype, new_value,
                                   f"{n.name}.gemm", out=value)[0]
            cnhw[value] = cur
        else:
            nodes.append(_reshape(new_value, f"{n.name}.gemm_reshape", cur, shape4,
                                  g.values[cur].dtype, out=value)[0])
        gone.add(index[id(n)])
        moved[last] = views + nodes
    g.nodes = [m for i, node in enumerate(g.nodes)
               for m in moved.get(i, [] if i in gone else [node])]
    direct = {view: cnhw[i] for view, i in transposed.items() if i in cnhw}
    for node in g.nodes:
        node.inputs = [direct.get(i, i) for i in node.inputs]
    return eliminate_dead(g)


def split_matmuls(graph: Graph, max_splits: int = MAX_K_SPLITS, in_place: bool = False
                  ) -> Graph:
    """Each MatMul of a runtime (..., M, K) by a constant (K, N) whose output tiles are few
    over a deep K (k_splits: a BERT layer's projections at batch 1 are 2 x 12 tiles of 64 x
    64) sums slices of K apart: its input read as (S, ..., M, K / S) (a reshape and a
    transpose; with ``in_place``, where half values are stored as they are computed on,
    marked IMPLICIT: the product reads x's rows in place, no kernel copies them), the batched
    product with the weight's (S, 1.., K / S, N) slices into float32 partial sums (S, ..., M,
    N), and a ReduceSum over S under the MatMul's output name, so the bias,
    activation and residual that followed the MatMul fuse into the sum's kernel. For GPU
    targets in precisions with tensor-core multiplies (compiler.prepare), where
    gemm_convs splits convolutions the same way."""
    g = _copy(graph)
    new_value = _value_maker(g)
    input_names = {v.name for v in g.inputs}
    nodes: list[Node] = []
    for n in g.nodes:
        w = g.constants.get(n.inputs[1]) if n.op_type == "MatMul" else None
        a = g.values.get(n.inputs[0]) if w is not None else None
        out = g.values.get(n.outputs[0]) if a is not None else None
        if (w is None or a is None or out is None or w.ndim != 2 or len(a.shape) < 2
                or n.inputs[0] in g.constants or out.dtype != "float32"):
            nodes.append(n)
            continue
        *lead, m, k = (int(d) for d in a.shape)
        rows, cols = int(np.prod(lead, dtype=np.int64)) * m, int(w.shape[1])
        s = k_splits(rows, k, cols, max_splits)
        if s == 1:
            nodes.append(n)
            continue
        part = k // s
        x, y = n.inputs[0], n.outputs[0]
        # (..., M, K) read as (S, ..., M, K / S): a reshape splitting K and a transpose moving
        # the slices first, both keeping K's elements last; with ``in_place`` marked IMPLICIT
        # (fusion joins them to the partial product, which reads x's rows in place) unless x
        # is the graph's input (stored float32, which half tiles do not read as half)
        dims = (*lead, m)
        split_value = new_value(f"{x}.k_split", (*dims, s, part), a.dtype)
        shape_value = new_value(f"{x}.k_split.shape", (len(dims) + 2,), "int64",
                                np.array([*dims, s, part], np.int64))
        sliced = new_value(f"{x}.k_slices", (s, *dims, part), a.dtype)
        implicit = {IMPLICIT: 1} if in_place and x not in input_names else {}
        perm = [len(dims), *range(len(dims)), len(dims) + 1]
        mats = new_value(f"{n.inputs[1]}.k_slices", (s, *[1] * len(lead), part, cols),
                         str(w.dtype), w.reshape(s, *[1] * len(lead), part, cols))
        partial = new_value(f"{y}.partial", (s, *dims, cols), "float32")
        nodes += [Node(f"{n.name}.k_split", "Reshape", [x, shape_value], [split_value],
                       dict(implicit)),
                  Node(f"{n.name}.k_slices", "Transpose", [split_value], [sliced],
                       {"perm": perm, **implicit}),
                  Node(f"{n.name}.partial", "MatMul", [sliced, mats], [partial],
                       {FP32_OUTPUT: 1}),
                  _sum_of_slices(g, f"{n.name}.sum", partial, y, False, new_value)]
    g.nodes = nodes
    return g


def _sunk_inputs(g: Graph, r: Node, value: str, cur: str, shape4: tuple[int, ...],
                 new_value: Any, views: list[Node], cnhw: dict[str, str] | None = None,
                 transposed: dict[str, str] | None = None) -> list[str] | None:
    """The inputs of the elementwise node ``r`` computed on (N, O, OH * OW) values (with
    ``cnhw``, the batch form's (O, N * OH * OW)): ``value`` (the 4-d one) read as ``cur``,
    other inputs of its shape reshaped (Reshape nodes appended to ``views``; in the batch form
    the earlier GEMM output ``cnhw`` names, else transposed, each such view recorded in
    ``transposed``), scalars as they are, constants per channel as (O, 1) columns; None when
    ``r`` cannot move (another op, another shape, another broadcast)."""
    if (r.op_type not in SINKABLE or len(r.outputs) != 1
            or g.values.get(r.outputs[0]) is None or g.values[r.outputs[0]].shape != shape4):
        return None
    nb, o, oh, ow = shape4
    ins: list[str] = []
    for i in r.inputs:
        info = g.values.get(i) if i else None
        arr = g.constants.get(i) if i else None
        if i == value:
            ins.append(cur)
        elif not i or (arr is not None and arr.size == 1):
            ins.append(i)
        elif info is not None and info.shape == shape4 and cnhw is not None:
            view = cnhw.get(i)
            if view is None:
                made, view = _swap_leading(i, (nb, o, oh * ow), (o, nb * oh * ow), info.dtype,
                                           new_value, f"{r.name}.gemm_view")
                views += made
                if transposed is not None:
                    transposed[view] = i
            ins.append(view)
        elif info is not None and info.shape == shape4:
            reshaped, flat = _reshape(new_value, f"{r.name}.gemm_view", i, (nb, o, oh * ow),
                                      info.dtype)
            views.append(reshaped)
            ins.append(flat)
        elif arr is not None and arr.ndim <= 4 and arr.size == o and (
                (1,) * (4 - arr.ndim) + arr.shape)[1:] == (o, 1, 1):
            ins.append(new_value(f"{i}.column", (o, 1), str(arr.dtype), arr.reshape(o, 1)))
        else:
            return None
    return ins


def _swap_leading(src: str, shape3: tuple[int, int, int], shape: tuple[int, ...], dtype: str,
                  new_value: Any, name: str, out: str | None = None) -> tuple[list[Node], str]:
    """The nodes that read ``src`` as ``shape3``, swap its two leading axes and give the
    result as ``shape`` (in ``out``, a graph value already, or a new value), and that value:
    (N, O, P) to the batch form's (O, N * P) and back."""
    a, b, p = shape3
    split_node, split = _reshape(new_value, f"{name}.split", src, shape3, dtype)
    swapped = new_value(f"{src}.swapped", (b, a, p), dtype)
    last, out = _reshape(new_value, f"{name}.reshape", swapped, shape, dtype, out=out)
    return [split_node,
            Node(f"{name}.transpose", "Transpose", [split], [swapped], {"perm": [1, 0, 2]}),
            last], out
