"""Recurrent layers (ONNX RNN, GRU, LSTM) unrolled over a static number of time steps.

The input projection of every step is one matmul stage (``T_rnn_xw``: (T, B, G*H)); each
step then adds one recurrent matmul (``T_rnn_rec``, the hidden state times R^T) and one
elementwise cell stage per state (``T_rnn_h``, and ``T_rnn_c`` for an LSTM) that applies the
gates. Steps have the same shapes, so the stages of every step compute alike. Gate layouts
follow ONNX: LSTM i, o, f, c (peepholes i, o, f); GRU z, r, h; RNN one gate.

Example::

    from autosched import te
    from autosched.te.ops import rnn
    x = te.placeholder((5, 2, 3), name="x")            # (T, B, I)
    w = te.placeholder((16, 3), name="w")              # (4H, I), H = 4
    r = te.placeholder((16, 4), name="r")              # (4H, H)
    cell = rnn.Cell("lstm", hidden=4)
    hs, h, c = rnn.unroll(cell, x, w, r)               # 5 states (2, 4); the last h and c
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autosched.errors import TEError
from autosched.te import intrin as I
from autosched.te import reduce as R
from autosched.te.expr import Expr
from autosched.te.ops import args
from autosched.te.ops.tags import ELEMWISE, REDUCE
from autosched.te.tensor import Tensor, compute, reduce_axis

Activation = Callable[[Expr], Expr]
GATES = {"rnn": 1, "gru": 3, "lstm": 4}


def activation(name: str, alpha: float | None = None, beta: float | None = None) -> Activation:
    """An ONNX recurrent activation by name (alpha / beta as ONNX's defaults when None)."""
    key = name.lower()
    table: dict[str, Callable[[float | None, float | None], Activation]] = {
        "sigmoid": lambda a, b: I.sigmoid,
        "tanh": lambda a, b: I.tanh,
        "relu": lambda a, b: lambda v: I.max(v, 0.0),
        "affine": lambda a, b: lambda v: v * _or(a, 1.0) + _or(b, 0.0),
        "leakyrelu": lambda a, b: lambda v: I.if_then_else(v >= 0.0, v, v * _or(a, 0.01)),
        "thresholdedrelu": lambda a, b: lambda v: I.if_then_else(v > _or(a, 1.0), v, 0.0),
        "scaledtanh": lambda a, b: lambda v: I.tanh(v * _or(b, 1.0)) * _or(a, 1.0),
        "hardsigmoid": lambda a, b: lambda v: I.max(I.min(v * _or(a, 0.2) + _or(b, 0.5), 1.0),
                                                    0.0),
        "elu": lambda a, b: lambda v: I.if_then_else(v >= 0.0, v, (I.exp(v) - 1.0) * _or(a, 1.0)),
        "softsign": lambda a, b: lambda v: v / (I.abs(v) + 1.0),
        "softplus": lambda a, b: lambda v: I.log(I.exp(v) + 1.0),
    }
    if key not in table:
        raise TEError(f"rnn: activation {name!r} is not one of {sorted(table)}")
    return table[key](alpha, beta)


def _or(v: float | None, default: float) -> float:
    return default if v is None else v


@dataclass(frozen=True)
class Cell:
    """What one step computes: ``kind`` (rnn, gru, lstm), the hidden size, the activations
    (f, g, h as ONNX names them: gates, candidate, output), the pre-activation clip, and the
    GRU's ``linear_before_reset``."""

    kind: str
    hidden: int
    acts: Sequence[Activation] = field(default_factory=tuple)
    clip: float | None = None
    linear_before_reset: bool = False

    def __post_init__(self) -> None:
        if self.kind not in GATES:
            raise TEError(f"rnn: cell kind must be one of {sorted(GATES)}, got {self.kind!r}")
        if not self.acts:
            default = {"rnn": ["tanh"], "gru": ["sigmoid", "tanh"],
                       "lstm": ["sigmoid", "tanh", "tanh"]}[self.kind]
            object.__setattr__(self, "acts", tuple(activation(a) for a in default))

    @property
    def gates(self) -> int:
        return GATES[self.kind]

    def pre(self, v: Expr) -> Expr:
        """A gate's pre-activation, clipped when asked."""
        return v if self.clip is None else I.min(I.max(v, -self.clip), self.clip)


# How R is stored: as ONNX gives it, (G*H, H); transposed, (H, G*H) ("kn": a CPU reads the
# gate columns contiguously); or transposed in column panels of P, (ceil(G*H / P), H, P)
# ("panels": each step of k reads P contiguous columns, where a (H, G*H) row moves G*H * 4
# bytes on and a parallel chunk of columns strides across pages; graph.passes.as_panels).
R_LAYOUTS = ("nk", "kn", "panels")


def _r_t(w: Tensor, layout: str) -> Callable[[Expr, Expr], Expr]:
    """Element (k, j) of R^T, (H, G*H), read from ``w`` stored as ``layout`` (R_LAYOUTS)."""
    if layout == "panels":
        p = args.static_shape(w, "rnn")[2]
        return lambda k, j: w[j // p, k, j % p]
    if layout == "kn":
        return lambda k, j: w[k, j]
    return lambda k, j: w[j, k]


def _matmul_t(a: Tensor, w: Tensor, name: str, layout: str, n: int) -> Tensor:
    """a (..., K) times w (N, K) transposed: (..., ``n``), w stored as ``layout``
    (R_LAYOUTS; padded panels may hold more than ``n`` columns)."""
    k = reduce_axis((0, args.static_shape(a, "rnn")[-1]), name="k")
    at = _r_t(w, layout)
    # the CPU tile rule keeps its vectors inside a panel
    attrs = {"panel": args.static_shape(w, "rnn")[2]} if layout == "panels" else {}
    return compute((*a.shape[:-1], n),
                   lambda *i: R.sum(a[(*i[:-1], k.var)] * at(k.var, i[-1]), axis=k),
                   name=name, tag=REDUCE, attrs=attrs)


Column = Callable[[Expr], Expr]        # a bias: column of G*H -> value
Projection = Callable[[Expr, Expr], Expr]   # the step's x W^T: (batch, column) -> value


@dataclass(frozen=True)
class Weights:
    """One direction's recurrent parameters: R stored as ``r_layout`` (R_LAYOUTS), the input
    and recurrent biases as functions of the column (or None), and the peepholes (3H: i, o, f)
    or None."""

    r: Tensor | None
    w_bias: Column | None = None
    r_bias: Column | None = None
    peep: Tensor | None = None
    r_layout: str = "nk"

    def bias(self, col: Expr, with_rec: bool = True) -> Expr | float:
        v: Expr | float = 0.0
        if self.w_bias is not None:
            v = self.w_bias(col)
        if with_rec and self.r_bias is not None:
            v = v + self.r_bias(col)
        return v


def _step(cell: Cell, p: Weights, xw: Projection, h: Tensor, c: Tensor | None
          ) -> tuple[Tensor, Tensor | None]:
    """The states after one step whose input projection is ``xw`` (which holds the recurrent
    product too when ``p.r`` is None)."""
    hn = cell.hidden
    rec = None if p.r is None else _matmul_t(h, p.r, "T_rnn_rec", p.r_layout,
                                             cell.gates * hn)

    def gate(g: int, b: Expr, j: Expr, with_rec: bool = True) -> Expr:
        """xw + (h R^T) + Wb + Rb of gate ``g`` at (b, j), unclipped."""
        col = g * hn + j
        v = xw(b, col)
        if with_rec and rec is not None:
            v = v + rec[b, col]
        return v + p.bias(col, with_rec)

    if cell.kind == "rnn":
        f = cell.acts[0]
        return compute(h.shape, lambda b, j: f(cell.pre(gate(0, b, j))), name="T_rnn_h",
                       tag=ELEMWISE), None
    if cell.kind == "gru":
        assert rec is not None   # step() refuses a GRU without R
        return _gru_h(cell, p, h, gate, rec), None
    return _lstm_states(cell, p, h, c, gate)


def _gru_h(cell: Cell, p: Weights, h: Tensor, gate: Callable[..., Expr], rec: Tensor
           ) -> Tensor:
    assert p.r is not None   # step() refuses a GRU without R
    f, g = cell.acts[0], cell.acts[1]
    hn = cell.hidden
    if not cell.linear_before_reset:
        # the candidate multiplies r into h before the matmul: one more recurrent stage
        rh = compute(h.shape, lambda b, j: f(cell.pre(gate(1, b, j))) * h[b, j],
                     name="T_rnn_rh", tag=ELEMWISE)
        rows, layout = _rows(p.r, 2 * hn, hn, p.r_layout)
        rec_h = _matmul_t(rh, rows, "T_rnn_rec_h", layout, hn)

    def body(b: Expr, j: Expr) -> Expr:
        z = f(cell.pre(gate(0, b, j)))
        r = f(cell.pre(gate(1, b, j)))
        rb = p.r_bias(2 * hn + j) if p.r_bias is not None else 0.0
        if cell.linear_before_reset:
            cand = gate(2, b, j, with_rec=False) + r * (rec[b, 2 * hn + j] + rb)
        else:
            cand = gate(2, b, j, with_rec=False) + rec_h[b, j] + rb
        return (1.0 - z) * g(cell.pre(cand)) + z * h[b, j]

    return compute(h.shape, body, name="T_rnn_h", tag=ELEMWISE)


def _rows(w: Tensor, start: int, n: int, layout: str = "nk") -> tuple[Tensor, str]:
    """Rows ``start`` .. ``start + n`` of R stored as ``layout``, and how they are stored
    (the columns of R^T, (K, n), when R is stored transposed or in panels)."""
    if layout == "nk":
        return compute((n, w.shape[1]), lambda i, k: w[i + start, k], name="T_rnn_rows",
                       tag=ELEMWISE), "nk"
    at = _r_t(w, layout)
    return compute((w.shape[1 if layout == "panels" else 0], n),
                   lambda k, i: at(k, i + start), name="T_rnn_rows", tag=ELEMWISE), "kn"


def _lstm_states(cell: Cell, p: Weights, h: Tensor, c: Tensor | None,
                 gate: Callable[..., Expr]) -> tuple[Tensor, Tensor]:
    f, g, hact = cell.acts[0], cell.acts[1], cell.acts[2]
    hn = cell.hidden
    assert c is not None

    def peep(k: int, j: Expr, state: Expr) -> Expr | float:
        return 0.0 if p.peep is None else p.peep[k * hn + j] * state

    def new_c(b: Expr, j: Expr) -> Expr:
        i_g = f(cell.pre(gate(0, b, j) + peep(0, j, c[b, j])))
        f_g = f(cell.pre(gate(2, b, j) + peep(2, j, c[b, j])))
        return f_g * c[b, j] + i_g * g(cell.pre(gate(3, b, j)))

    cn = compute(h.shape, new_c, name="T_rnn_c", tag=ELEMWISE)

    def new_h(b: Expr, j: Expr) -> Expr:
        o_g = f(cell.pre(gate(1, b, j) + peep(1, j, cn[b, j])))
        return o_g * hact(cn[b, j])

    return compute(h.shape, new_h, name="T_rnn_h", tag=ELEMWISE), cn


def unroll(cell: Cell, x: Tensor, w: Tensor, r: Tensor, bias: Tensor | None = None,
           h0: Tensor | None = None, c0: Tensor | None = None, peep: Tensor | None = None,
           reverse: bool = False) -> tuple[list[Tensor], Tensor, Tensor | None]:
    """Run one direction over x (T, B, I): the hidden state of every step (in time order),
    the last hidden state and (LSTM) the last cell state."""
    args.tensor(x, "rnn")
    args.ndim_is(x, 3, "rnn", "input")
    steps, batch, _ = args.static_shape(x, "rnn")
    hn, gates = cell.hidden, cell.gates
    if args.static_shape(w, "rnn") != (gates * hn, x.shape[2]) or args.static_shape(
            r, "rnn") != (gates * hn, hn):
        raise TEError(f"rnn: W {w.shape} and R {r.shape} must be ({gates * hn}, "
                      f"{x.shape[2]}) and ({gates * hn}, {hn}) for a {cell.kind} of hidden "
                      f"size {hn}")
    gh = gates * hn
    xw = _matmul_t(x, w, "T_rnn_xw", "nk", gh)
    p = Weights(r, None if bias is None else (lambda col: bias[col]),
                None if bias is None else (lambda col: bias[gh + col]), peep)
    zero = compute((batch, hn), lambda b, j: I.cast(x.dtype, 0), name="T_rnn_zero")
    h = h0 if h0 is not None else zero
    c = (c0 if c0 is not None else zero) if cell.kind == "lstm" else None
    out: list[Tensor] = []
    for t in (reversed(range(steps)) if reverse else range(steps)):
        h, c = _step(cell, p, _at_step(xw, t), h, c)
        out.append(h)
    return (out[::-1] if reverse else out), h, c


def _at_step(xw: Tensor, t: int) -> Projection:
    """Step ``t`` of the (T, B, G*H) input projection."""
    return lambda b, col: xw[t, b, col]


def _r_fits(shape: tuple[int, ...], cell: Cell, layout: str) -> bool:
    """Whether R of ``shape`` stored as ``layout`` holds a (G*H, H) matrix of ``cell``."""
    n, k = cell.gates * cell.hidden, cell.hidden
    if layout == "panels":
        return len(shape) == 3 and shape[1] == k and shape[2] > 0 and (
            shape[0] == -(-n // shape[2]))
    return shape == ((k, n) if layout == "kn" else (n, k))


def step(cell: Cell, xw: Tensor, h: Tensor, c: Tensor | None, r: Tensor | None,
         r_bias: Tensor | None = None, peep: Tensor | None = None, r_layout: str = "nk"
         ) -> tuple[Tensor, Tensor | None]:
    """One time step as its own computation: ``xw`` (B, G*H) is the step's input projection
    with the input bias added; returns the new hidden state and (LSTM) cell state. Without R
    (an RNN or LSTM whose recurrent product is computed elsewhere, e.g. quantized), ``xw``
    holds x W^T + h R^T already. ``r_layout``: how R is stored (R_LAYOUTS)."""
    args.tensor(xw, "rnn")
    if r is None and cell.kind == "gru":
        raise TEError("rnn: a GRU step needs R (its candidate gate multiplies r into h R^T)")
    if r_layout not in R_LAYOUTS:
        raise TEError(f"rnn: R layout {r_layout!r} is none of {', '.join(R_LAYOUTS)}")
    r_shape = None if r is None else args.static_shape(r, "rnn")
    if args.static_shape(xw, "rnn") != (h.shape[0], cell.gates * cell.hidden) or (
            r_shape is not None and not _r_fits(r_shape, cell, r_layout)):
        raise TEError(f"rnn: step input {xw.shape}, state {h.shape} and R {r_shape} "
                      f"({r_layout}) do not fit a {cell.kind} of hidden size {cell.hidden}")
    p = Weights(r, None, None if r_bias is None else (lambda col: r_bias[col]), peep, r_layout)
    return _step(cell, p, lambda b, col: xw[b, col], h, c)
