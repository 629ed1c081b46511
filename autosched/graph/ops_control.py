"""Converters of ops whose result is not a static-shape tensor computation: If, Loop and
NonMaxSuppression.

If and Loop never reach a converter when their controls fold to constants: the importer
expands them into plain nodes first (importers/control_flow.py); an If with a run-time
condition becomes both branches and an IfSelect per output. A Loop that reaches its converter
depends on run-time data, which a static graph cannot express; the error says so, naming
the node.

NonMaxSuppression's output length depends on the scores, so it is computed at import time
from constant boxes and scores (a detector whose boxes are computed at run time is refused
by the importer: its inputs must be constants)."""

from __future__ import annotations

import numpy as np

from autosched.graph.graph import Node
from autosched.graph.ops import (
    ConvertContext,
    Value,
    fail,
    optional,
    register,
    required,
    shape_of,
)
from autosched.te import ops


@register("If")
def _if(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    raise fail(node, "If reaches no converter: the importer inlines the branch its constant "
                     "condition takes, or both branches and an IfSelect per output")


@register("IfSelect")
def _if_select(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    """One output of an If with a run-time condition (importers/control_flow.py): the then
    branch's value where the condition holds, else the else branch's."""
    cond, then, other = (required(node, ins, k) for k in range(3))
    a, b = ctx.const(then), ctx.const(other)
    if shape_of(a) != shape_of(b) or a.dtype != b.dtype:
        raise fail(node, f"the branches give {a.dtype}{list(shape_of(a))} and "
                         f"{b.dtype}{list(shape_of(b))}: with the condition known only at run "
                         "time, both must agree in shape and dtype")
    c = ctx.const(cond)
    if int(np.prod(shape_of(c))) != 1 or c.dtype != "bool":
        raise fail(node, f"the condition must be one bool, got {c.dtype}{list(shape_of(c))}")
    return [ops.where(ops.reshape(c, ()), a, b)]


@register("Loop", const_inputs=(0, 1))
def _loop(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    raise fail(node, "only a Loop whose trip count and condition fold to constants at import "
                     "is supported (it is unrolled)")


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of one (y1, x1, y2, x2) box with each of ``others``."""
    lo = np.maximum(box[:2], others[:, :2])
    hi = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(others[:, 2:] - others[:, :2], axis=1)
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _corners(boxes: np.ndarray, center: bool) -> np.ndarray:
    """(y1, x1, y2, x2) with y1 <= y2, x1 <= x2, from corner or center boxes."""
    if center:
        xc, yc, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    y = np.sort(boxes[..., [0, 2]], axis=-1)
    x = np.sort(boxes[..., [1, 3]], axis=-1)
    return np.stack([y[..., 0], x[..., 0], y[..., 1], x[..., 1]], axis=-1)


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, max_per_class: int,
                        iou_threshold: float, score_threshold: float | None,
                        center: bool = False) -> np.ndarray:
    """ONNX NonMaxSuppression: (selected, 3) int64 rows (batch, class, box), greedily by
    descending score per batch and class (a stable sort: equal scores keep box order)."""
    corners = _corners(boxes.astype("float64"), center)
    rows: list[tuple[int, int, int]] = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c].astype("float64")
            cand = np.argsort(-s, kind="stable")
            if score_threshold is not None:
                cand = cand[s[cand] > score_threshold]
            kept: list[int] = []
            for i in cand:
                if len(kept) >= max_per_class:
                    break
                if not kept or (_iou(corners[b, i], corners[b, kept]) <= iou_threshold).all():
                    kept.append(int(i))
            rows += [(b, c, i) for i in kept]
    return np.array(rows, dtype="int64").reshape(-1, 3)


@register("NonMaxSuppression", const_inputs=(0, 1, 2, 3, 4))
def _nms(node: Node, ins: list[Value | None], ctx: ConvertContext) -> list[Value]:
    boxes, scores = (np.asarray(required(node, ins, pos)) for pos in (0, 1))
    if boxes.ndim != 3 or scores.ndim != 3 or boxes.shape[-1] != 4 or (
            boxes.shape[:2] != (scores.shape[0], scores.shape[2])):
        raise fail(node, f"boxes {boxes.shape} must be (B, N, 4) and scores {scores.shape} "
                         "(B, C, N)")

    def scalar(pos: int, default: float | None) -> float | None:
        v = optional(ins, pos)
        return default if v is None else float(np.asarray(v).reshape(-1)[0])

    max_per_class = int(scalar(2, 0) or 0)
    return [non_max_suppression(boxes, scores, max_per_class, float(scalar(3, 0.0) or 0.0),
                                scalar(4, None), bool(node.attrs.get("center_point_box", 0)))]
