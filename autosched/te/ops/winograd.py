"""Winograd convolution F(m x m, 3 x 3) for stride-1 3x3 convolutions (Lavin & Gray, 2016):
each m x m output tile costs alpha^2 = (m + 2)^2 multiplies per input channel instead of
9 m^2 (4x fewer at m = 4), paid for by two cheap transforms.

    y = A^T [ (G g G^T) . (B^T d B) ] A     per tile d (alpha x alpha) and kernel g (3 x 3)

Three steps, each its own kernel in a model (``graph.passes.winograd_convs`` splits a Conv
into them), so each is tuned by the ordinary sketch rules:

* ``winograd_input(data, bt, m, padding)``: V (alpha^2, C, P), the transformed input tiles,
  P = N * TH * TW tiles; two stages (rows, then columns), each a small reduction with the
  constant B^T as an input tensor.
* a batched matmul M = U @ V with the transformed weights U = ``winograd_weight`` (alpha^2,
  K, C), computed once ahead of time from a constant kernel.
* ``winograd_output(M, at, m, shape)``: (N, K, OH, OW), two stages (rows, then columns) with
  the constant A^T; the fused consumer adds bias, activation and residual.

The matrices come from ``winograd_matrices(m)`` (interpolation points 0, 1, -1, 2, -2, ...),
derived here and checked against direct correlation.

Example::

    import numpy as np
    from autosched import te
    from autosched.te import ops
    at, _, bt = ops.winograd_matrices(4)
    x = te.placeholder((1, 16, 14, 14), name="x")
    v = ops.winograd_input(x, te.placeholder(bt.shape, name="bt"), 4, padding=1)  # (36, 16, 16)
    u = te.placeholder((36, 32, 16), name="u")        # winograd_weight(w, 4) of w (32, 16, 3, 3)
    y = ops.winograd_output(ops.batch_matmul(u, v), te.placeholder(at.shape, name="at"), 4,
                            (1, 32, 14, 14))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autosched.errors import TEError
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.ops import args
from autosched.te.ops.transform import pad
from autosched.te.tensor import Tensor, compute, reduce_axis

KERNEL = 3
POINTS = (0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0)


def winograd_matrices(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T (m, alpha), G (alpha, 3), B^T (alpha, alpha)) of F(m, 3), float64.

    A^T evaluates the product polynomial at the points (plus the point at infinity), G
    interpolates the kernel there (Lagrange weights); B^T is then the unique matrix that makes
    A^T [(G g) . (B^T d)] the correlation of d with g, solved for exactly (a linear system)."""
    alpha = m + KERNEL - 1
    if m < 2 or alpha - 1 > len(POINTS):
        raise TEError(f"winograd: tile size m must be 2..{len(POINTS) - KERNEL + 2}, got {m}")
    pts = np.array(POINTS[: alpha - 1])
    at = np.zeros((m, alpha))
    for i in range(m):
        at[i, :-1] = pts**i
    at[m - 1, -1] = 1.0
    g = np.zeros((alpha, KERNEL))
    for j, p in enumerate(pts):
        g[j] = p ** np.arange(KERNEL) / np.prod([p - q for q in pts if q != p])
    g[-1, -1] = 1.0
    # sum_j at[i, j] g[j, k] bt[j, l] == [l == i + k] for every i, k: one system per column l
    rows = np.array([at[i] * g[:, k] for i in range(m) for k in range(KERNEL)])
    bt = np.zeros((alpha, alpha))
    for col in range(alpha):
        rhs = np.array([float(col == i + k) for i in range(m) for k in range(KERNEL)])
        bt[:, col] = np.linalg.lstsq(rows, rhs, rcond=None)[0]
        if not np.allclose(rows @ bt[:, col], rhs, atol=1e-9):
            raise TEError(f"winograd: no exact B^T for m={m} (column {col})")
    return at, g, np.round(bt, 9)


def winograd_weight(w: np.ndarray, m: int) -> np.ndarray:
    """U = G w G^T of a kernel (K, C, 3, 3), laid out (alpha^2, K, C) for the batched matmul."""
    if w.ndim != 4 or w.shape[2:] != (KERNEL, KERNEL):
        raise TEError(f"winograd_weight: kernel must be (K, C, 3, 3), got {w.shape}")
    _, g, _ = winograd_matrices(m)
    u = np.einsum("ei,kcij,nj->enkc", g, w.astype(np.float64), g)
    alpha = m + KERNEL - 1
    return np.asarray(u.reshape(alpha * alpha, w.shape[0], w.shape[1]), dtype=w.dtype, order="C")


def _tiles(size: int, m: int) -> int:
    return -(-size // m)


def winograd_input(data: Tensor, bt: Tensor, m: int, padding: Any = 1) -> Tensor:
    """V[e * alpha + n, c, p] = sum_{i, j} bt[e, i] bt[n, j] pad(data)[b, c, ty m + i, tx m + j]
    for data (N, C, H, W) and tile p = (b, ty, tx); the stride-1 3x3 convolution's output is
    (H + pad_h - 2) x (W + pad_w - 2), cut into TH x TW tiles of m x m. Stages
    ``winograd_rows`` (alpha, N, C, TH, Wp) and ``winograd_input`` (alpha^2, C, P)."""
    op = "winograd_input"
    args.tensor(data, op, "data")
    args.ndim_is(data, 4, op, "data (N, C, H, W)")
    alpha = m + KERNEL - 1
    if args.static_shape(bt, op) != (alpha, alpha):
        raise TEError(f"{op}: bt must be ({alpha}, {alpha}) for m={m}, got {bt.shape}")
    n, c, h, w = args.static_shape(data, op)
    pads = args.padding2d(padding, op)
    oh, ow = h + pads[0] + pads[2] - KERNEL + 1, w + pads[1] + pads[3] - KERNEL + 1
    if min(oh, ow) < 1:
        raise TEError(f"{op}: data {data.shape} with padding {pads} is smaller than the kernel")
    th, tw = _tiles(oh, m), _tiles(ow, m)
    hp, wp = th * m + KERNEL - 1, tw * m + KERNEL - 1
    padded = pad(data, (0, 0, pads[0], pads[1]), (0, 0, hp - h - pads[0], wp - w - pads[1]),
                 name="winograd_pad")
    ri = reduce_axis((0, alpha), "ri")
    rows = compute((alpha, n, c, th, wp),
                   lambda e, b, ch, ty, xx: R.sum(bt[e, ri] * padded[b, ch, ty * m + ri, xx],
                                                  axis=[ri]),
                   name="winograd_rows", tag="winograd")
    rj = reduce_axis((0, alpha), "rj")
    per_image = th * tw

    def body(t: Any, ch: Any, p: Any) -> Any:
        e, nu = I.floordiv(t, alpha), I.floormod(t, alpha)
        b, q = I.floordiv(p, per_image), I.floormod(p, per_image)
        ty, tx = I.floordiv(q, tw), I.floormod(q, tw)
        return R.sum(bt[nu, rj] * rows[e, b, ch, ty, tx * m + rj], axis=[rj])

    return compute((alpha * alpha, c, n * per_image), body, name="winograd_input",
                   tag="winograd", attrs={"m": m, "out_hw": (oh, ow)})


def winograd_output(prod: Tensor, at: Tensor, m: int, shape: tuple[int, int, int, int]) -> Tensor:
    """Y[b, k, y, x] = sum_{e, n} at[y % m, e] at[x % m, n] prod[e * alpha + n, k, p(b, y, x)]
    for the batched product (alpha^2, K, P) of ``winograd_input``'s tiles; ``shape`` is the
    convolution's output (N, K, OH, OW). Stages ``winograd_out_rows`` (m, alpha, K, P) and
    ``winograd_output``."""
    op = "winograd_output"
    args.tensor(prod, op, "prod")
    args.ndim_is(prod, 3, op, "prod (alpha^2, K, P)")
    alpha = m + KERNEL - 1
    n, k, oh, ow = (int(d) for d in shape)
    th, tw = _tiles(oh, m), _tiles(ow, m)
    want = (alpha * alpha, k, n * th * tw)
    if args.static_shape(prod, op) != want:
        raise TEError(f"{op}: prod must be {want} for output {shape} and m={m}, "
                      f"got {prod.shape}")
    if args.static_shape(at, op) != (m, alpha):
        raise TEError(f"{op}: at must be ({m}, {alpha}) for m={m}, got {at.shape}")
    re = reduce_axis((0, alpha), "re")
    rows = compute((m, alpha, k, n * th * tw),
                   lambda a, nu, f, p: R.sum(at[a, re] * prod[re * alpha + nu, f, p], axis=[re]),
                   name="winograd_out_rows", tag="winograd")
    rn = reduce_axis((0, alpha), "rn")

    def body(b: Any, f: Any, y: Any, x: Any) -> Any:
        p = b * (th * tw) + I.floordiv(y, m) * tw + I.floordiv(x, m)
        return R.sum(at[I.floormod(x, m), rn] * rows[I.floormod(y, m), rn, f, p], axis=[rn])

    return compute((n, k, oh, ow), body, name="winograd_output", tag="winograd",
                   attrs={"m": m})
