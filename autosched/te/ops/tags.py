"""Operator tags: the hint an operator leaves on its ComputeOp for the auto-scheduler.

A tag is one or more comma-separated words; the first says how the stage reads its inputs:

* ``elemwise``   out[i] = f(in1[i], in2[i], ...) over identical shapes
* ``broadcast``  like elemwise, but some inputs are broadcast along some axes
* ``injective``  each output element reads a few input elements at computed indices
                 (transpose, reshape, pad, concat, slice, take, resize ...)
* ``reduce``     a reduction over one or more axes (sum, max, the statistics of a norm)
* a complex op name: ``conv2d_nchw``, ``conv2d_nhwc``, ``depthwise_conv2d_nchw``,
  ``conv2d_transpose_nchw``, ``dense``, ``matmul``, ``batch_matmul``, ``pool_max``, ``pool_avg``

Later words refine the first (``injective,pad`` is a padding stage, which a schedule usually
inlines into its consumer).
"""

from __future__ import annotations

ELEMWISE = "elemwise"
BROADCAST = "broadcast"
INJECTIVE = "injective"
REDUCE = "reduce"
PAD = "injective,pad"

_INJECTIVE_KINDS = (ELEMWISE, BROADCAST, INJECTIVE)


def kind(tag: str) -> str:
    """The first word of a tag: ``kind("injective,pad") == "injective"``."""
    return tag.split(",", 1)[0]


def is_injective(tag: str) -> bool:
    """True for elemwise, broadcast and injective stages: safe to inline into a consumer."""
    return kind(tag) in _INJECTIVE_KINDS


def is_elemwise(tag: str) -> bool:
    return kind(tag) == ELEMWISE


def is_broadcast(tag: str) -> bool:
    return kind(tag) in (ELEMWISE, BROADCAST)
