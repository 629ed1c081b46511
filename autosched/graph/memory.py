"""Static memory planning: every intermediate value of a compiled graph at a byte offset in one
workspace, values whose lifetimes overlap never sharing a byte.

A value lives from the step that writes it to the last step that reads it (a reshape that views
it keeps it alive; graph outputs live to the end). Placing the values is interval packing in
two dimensions (time and bytes): values are placed largest first, each at the tightest gap
among the placed values whose lifetimes overlap its own (the lowest such gap on ties), or
past them all. Placed largest first, small values fill the holes big ones leave, and the
workspace stays close to the lower bound, the most bytes live at any one step (``live_peak``),
where pools of equal-sized buffers needed up to five times that on networks whose stages change
shape. A smaller workspace is memory an edge device keeps, and on a CPU it is what decides
whether a model's activations stay in the last-level cache between the kernel that writes
them and the one that reads them.

Example::

    offsets, size = memory_layout(graph, steps)   # steps: (values read, values written)
    arena = aligned_empty((size,), np.uint8)
    x = arena[offsets["x"]:][:nbytes(graph.values["x"])]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autosched.errors import ModelImportError
from autosched.graph.graph import Graph, ValueInfo
from autosched.te import dtype as dt

MAX_BYTES = 2**62  # more than any machine has; beyond it sizes would overflow int64 arithmetic
ALIGN = 256  # every planned value starts on this boundary (a GPU allocation's; 4 cache lines)

Steps = Sequence[tuple[Sequence[str], Sequence[str]]]


def nbytes(info: ValueInfo) -> int:
    """The bytes of a value (at least 1), checked: a count that overflows is an error naming
    the value, not a wrapped number."""
    n = dt.nbytes(info.dtype)
    for d in info.shape:
        n *= int(d)
    if min(info.shape, default=0) < 0:
        raise ModelImportError(f"value {info.name} ({info.dtype}{list(info.shape)}) has a "
                               "negative dim")
    if n > MAX_BYTES:
        raise ModelImportError(f"value {info.name} ({info.dtype}{list(info.shape)}) would need "
                               f"{n} bytes, more than int64 sizes can address")
    return max(n, 1)


def lifetimes(graph: Graph, steps: Steps, aliases: dict[str, str] | None = None
              ) -> dict[str, tuple[int, int]]:
    """{value a step writes: (the step writing it, the last step reading it)}, in the order
    they are written; a read of a reshape (``aliases``: view -> viewed value) reads the value
    it views, and graph outputs live past the last step."""
    aliases = aliases or {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, (reads, writes) in enumerate(steps):
        for v in writes:
            first.setdefault(v, k)
        for v in [*reads, *writes]:
            last[aliases.get(v, v)] = k
    for o in graph.outputs:
        last[aliases.get(o, o)] = len(steps)
    return {v: (k, last[v]) for v, k in first.items()}


def live_peak(graph: Graph, steps: Steps, aliases: dict[str, str] | None = None) -> int:
    """The most bytes of planned values live at one step: no plan can use fewer."""
    spans = lifetimes(graph, steps, aliases)
    live = np.zeros(len(steps) + 2, dtype=np.int64)
    for v, (a, b) in spans.items():
        n = nbytes(graph.values[v])
        live[a] += n
        live[b + 1] -= n
    return int(np.cumsum(live).max(initial=0))


def memory_layout(graph: Graph, steps: Steps, aliases: dict[str, str] | None = None,
                  align: int = ALIGN) -> tuple[dict[str, int], int]:
    """{value a step writes: its byte offset in the workspace (a multiple of ``align``)} and
    the workspace's size in bytes."""
    spans = lifetimes(graph, steps, aliases)
    size = {v: -(-nbytes(graph.values[v]) // align) * align for v in spans}
    order = sorted(spans, key=lambda v: (-size[v], spans[v][0]))
    n = len(order)
    start, end = np.zeros(n, np.int64), np.zeros(n, np.int64)  # bytes of the placed, in order
    born, dies = np.zeros(n, np.int64), np.zeros(n, np.int64)
    offsets: dict[str, int] = {}
    for i, v in enumerate(order):
        a, b = spans[v]
        overlap = (born[:i] <= b) & (dies[:i] >= a)
        at = _gap(start[:i][overlap], end[:i][overlap], size[v])
        offsets[v] = at
        start[i], end[i], born[i], dies[i] = at, at + size[v], a, b
    return offsets, int(end.max(initial=0))


def _gap(starts: np.ndarray, ends: np.ndarray, size: int) -> int:
    """The offset of the tightest free gap of at least ``size`` bytes between the byte ranges
    [starts, ends) (the lowest on ties), or the end of them all."""
    if not len(starts):
        return 0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    free_from = np.concatenate(([0], np.maximum.accumulate(e)[:-1]))
    gaps = s - free_from
    fits = np.flatnonzero(gaps >= size)
    if not len(fits):
        return int(e.max())
    best = fits[np.argmin(gaps[fits])]  # argmin: the first (lowest) of equal gaps
    return int(free_from[best])
