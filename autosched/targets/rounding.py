"""Float32 results to onnxruntime's bit, for every backend: its sigmoid and tanh, and where a
multiply-add may fuse.

A dynamically quantized model rounds activations to uint8 after every layer, so one ulp of
difference from onnxruntime flips a rounding and the flips cascade through the layers that
follow. Two things decide those ulps:

- onnxruntime computes float32 sigmoid and tanh on the CPU (MLAS, with Eigen's coefficients)
  as rational functions: x clamped to ``[-bound, bound]``, then ``v p(v^2) / q(v^2)`` with p
  and q evaluated by Horner's rule in fused multiply-adds, plus an offset (1/2 for the sigmoid,
  whose p / q approximates sigmoid(v) - 1/2) and, for the sigmoid, a floor of 0 on the result.
  Its x86-64 kernel (FMA3, also taken on AVX-512 CPUs) has no ceiling: 20 inputs in [17.48, 18)
  give 1 + 2^-23; its portable kernel (other CPUs) clamps to 1 there. We match x86-64's.
  ``RATIONAL`` holds them
  (coefficients already rounded to float32, the values every backend emits); absolute errors
  stay under 2e-7 (sigmoid) and 4e-7 (tanh). ``rational32`` computes them in Python.
- onnxruntime rounds the result of every op: its GEMM and convolution kernels fuse the
  update ``acc + a*b`` into an FMA, its elementwise ops cannot fuse across ops. So a backend
  fuses a*b+c only in a reduction's update (``accumulated``), never in an elementwise chain (an
  LSTM cell's f*c + i*g).

Example::

    r = RATIONAL["tanh"]
    r.bound, r.p[0]            # 9.0, the coefficient of the highest power of v^2 in p
    rational32("sigmoid", 0.3) == float(onnxruntime's Sigmoid of float32 0.3)
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from autosched.te import expr as E
from autosched.te.expr import structural_equal
from autosched.te.opcodes import Op
from autosched.tir import ir
from autosched.tir.visit import loads

_F32 = struct.Struct("<f")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")


def _to_f32(x: float) -> float:
    """``x`` (a finite value in float32's range, or inf / NaN) rounded to float32."""
    return x if not math.isfinite(x) else _F32.unpack(_F32.pack(x))[0]


@dataclass(frozen=True)
class Rational:
    """y = v p(v^2) / q(v^2) + offset with v = x clamped to [-bound, bound] (NaN passes), p
    and q by Horner's rule from the highest power, then y = max(y, floor) when ``floor`` is
    given (NaN passes)."""

    bound: float
    p: tuple[float, ...]
    q: tuple[float, ...]
    offset: float = 0.0
    floor: float | None = None


def _f32s(*coefs: float) -> tuple[float, ...]:
    return tuple(_to_f32(c) for c in coefs)


RATIONAL = {
    "sigmoid": Rational(18.0,
                        _f32s(4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
                              8.51377133304701e-03, 2.48287947061529e-01),
                        _f32s(6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
                              1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01),
                        offset=0.5, floor=0.0),
    "tanh": Rational(9.0,
                     _f32s(-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                           5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                           4.89352455891786e-03),
                     _f32s(1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                           4.89352518554385e-03)),
}


def fma32(a: float, b: float, c: float) -> float:
    """a*b + c rounded once to float32, for float32 values a, b, c.

    a*b is exact in float64; the sum is rounded to odd (float64's nearest, moved one ulp toward
    the exact sum when it was inexact and its last bit is even), which float32's rounding then
    rounds as the exact sum would: 53 bits are more than 24 + 2."""
    p = a * b
    s = p + c
    if math.isfinite(s):
        bb = s - p
        err = (p - (s - bb)) + (c - bb)  # s + err == p + c exactly (Knuth's two-sum)
        if err and not _U64.unpack(_F64.pack(s))[0] & 1:
            s = math.nextafter(s, math.inf if err > 0 else -math.inf)
    return _to_f32(s)


def rational32(name: str, x: float) -> float:
    """The float32 ``name`` ("sigmoid" or "tanh") of ``x`` as onnxruntime computes it."""
    r = RATIONAL[name]
    v = _to_f32(min(max(x, -r.bound), r.bound)) if x == x else x

    def poly(coefs: tuple[float, ...], v2: float) -> float:
        acc = coefs[0]
        for k in coefs[1:]:
            acc = fma32(acc, v2, k)
        return acc

    v2 = _to_f32(v * v)
    y = _to_f32(_to_f32(poly(r.p, v2) * v) / poly(r.q, v2))
    if r.offset:
        y = _to_f32(y + r.offset)
    if r.floor is not None and y < r.floor:
        y = r.floor
    return y


# The combiners of a reduction's update acc = acc op f.
_COMBINERS = (Op.ADD, Op.MUL, Op.MIN, Op.MAX)


def accumulated(s: ir.Store) -> E.Expr | None:
    """``f`` when ``s`` is ``acc[i] = acc[i] op f`` (op a reduction's combiner) and ``f`` does
    not read ``acc``; else None."""
    v = s.value
    if not (isinstance(v, E.Binary) and v.op in _COMBINERS):
        return None

    def is_acc(x: E.Expr) -> bool:
        return (isinstance(x, ir.Load) and x.buffer.uid == s.buffer.uid
                and structural_equal(x.indices, s.indices))

    rest = v.b if is_acc(v.a) else v.a if is_acc(v.b) else None
    if rest is None or any(ld.buffer == s.buffer for ld in loads(rest)):
        return None
    return rest


def fused_update(s: ir.Store) -> bool:
    """Whether ``s`` is ``acc[i] = acc[i] + x * y`` in float32 or float64: the one multiply-add
    onnxruntime's GEMM and convolution kernels fuse."""
    rest = accumulated(s)
    return (rest is not None and isinstance(s.value, E.Binary) and s.value.op is Op.ADD
            and isinstance(rest, E.Binary) and rest.op is Op.MUL
            and s.buffer.dtype in ("float32", "float64"))
