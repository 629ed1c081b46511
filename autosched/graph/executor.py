"""Running a compiled graph on the CPU: kernels in order over a static memory plan.

Intermediates share byte buffers once their last reader has run (``memory_plan``); constants
are bound once; ``run`` checks the inputs (names, shapes, dtypes) and returns fresh output
arrays.

Example::

    model = aus.compile(graph, target="llvm")
    (y,) = model.run({"x": x})
    print(model.time({"x": x}) * 1e3, "ms")
    print(model.summary())
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autosched.errors import ModelImportError
from autosched.graph.graph import Graph, ValueInfo
from autosched.targets.target import Target
from autosched.te import dtype as dt


def nbytes(info: ValueInfo) -> int:
    return max(int(np.prod(info.shape, dtype=np.int64)) * dt.nbytes(info.dtype), 1)


def memory_plan(graph: Graph, steps: Sequence[tuple[Sequence[str], Sequence[str]]],
                alloc: Callable[[int], Any], aliases: dict[str, str] | None = None
                ) -> tuple[dict[str, Any], int]:
    """Buffers for the values each step writes, reused (same byte size) once the last step
    reading them has run. ``steps`` are (values read, values written); graph outputs are never
    reused. ``aliases`` maps a value to the written value whose buffer it views (a reshape):
    reading it keeps that buffer alive. Returns {written value: raw buffer} and the bytes
    allocated."""
    aliases = aliases or {}
    last_use: dict[str, int] = {}
    for k, (reads, writes) in enumerate(steps):
        for v in list(reads) + list(writes):
            last_use[aliases.get(v, v)] = k
    for o in graph.outputs:
        last_use[aliases.get(o, o)] = len(steps)
    free: dict[int, list[Any]] = {}
    raw_of: dict[str, Any] = {}
    storage: dict[str, Any] = {}
    total = 0
    for k, (reads, writes) in enumerate(steps):
        for v in writes:
            size = nbytes(graph.values[v])
            pool = free.get(size)
            if pool:
                raw = pool.pop()
            else:
                raw = alloc(size)
                total += size
            raw_of[v] = (raw, size)
            storage[v] = raw
        for v in {aliases.get(v, v) for v in list(reads) + list(writes)}:
            if last_use.get(v) == k and v in raw_of:
                raw, size = raw_of.pop(v)
                free.setdefault(size, []).append(raw)
    return storage, total


def check_inputs(graph: Graph, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """The inputs as contiguous arrays, after checking names, shapes and dtypes."""
    names = [i.name for i in graph.inputs]
    unknown = sorted(set(inputs) - set(names))
    if unknown:
        raise ModelImportError(f"unknown inputs {unknown}; the model takes "
                               + ", ".join(str(v) for v in graph.inputs))
    out: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.name not in inputs:
            raise ModelImportError(f"missing input {v.name} ({v.dtype}{list(v.shape)}); the "
                                   f"model takes {names}")
        a = np.ascontiguousarray(inputs[v.name])
        if tuple(a.shape) != tuple(v.shape) or str(a.dtype) != v.dtype:
            raise ModelImportError(f"input {v.name} must be {v.dtype}{list(v.shape)}, got "
                                   f"{a.dtype}{list(a.shape)}")
        out[v.name] = a
    return out


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for every graph input (floats in [-1, 1), ints in [0, 10), bools)."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        if v.dtype.startswith("float"):
            out[v.name] = rng.uniform(-1, 1, v.shape).astype(v.dtype)
        elif v.dtype == "bool":
            out[v.name] = rng.random(v.shape) < 0.5
        else:
            out[v.name] = rng.integers(0, 10, v.shape).astype(v.dtype)
    return out


def _bind(module: Any, args: list[np.ndarray]) -> Callable[[], None]:
    """``module`` called on ``args`` with no per-call argument checks where it can bind."""
    bind = getattr(module, "bind", None)
    return bind(*args) if bind is not None else (lambda: module(*args))


class CompiledModel:
    """Kernels in order over a static memory plan, on numpy arrays. ``run`` takes
    {input name: array} and returns the outputs in graph output order."""

    def __init__(self, graph: Graph, kernels: list[Any], target: Target,
                 constants: dict[str, np.ndarray] | None = None,
                 aliases: dict[str, str] | None = None):
        self.graph = graph
        self.kernels = kernels
        self.target = target
        self.aliases = dict(aliases or {})  # reshapes: views of a kernel's output, no kernel
        self.constants = {k: np.ascontiguousarray(v)
                          for k, v in (constants if constants is not None
                                       else graph.constants).items()}
        steps = [(k.args[: k.n_inputs], k.args[k.n_inputs:]) for k in kernels]
        raw, self.peak_bytes = memory_plan(graph, steps, lambda n: np.empty(n, np.uint8),
                                           self.aliases)
        self.storage = {v: r[: nbytes(graph.values[v])].view(graph.values[v].dtype)
                        .reshape(graph.values[v].shape) for v, r in raw.items()}
        for a, src in self.aliases.items():
            self.storage[a] = self.storage[src].reshape(graph.values[a].shape)
        self._bound: list[Callable[[], None] | None] | None = None

    def _values(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        vals = dict(self.constants)
        vals.update(check_inputs(self.graph, inputs))
        vals.update(self.storage)
        return vals

    def _calls(self, inputs: dict[str, Any]) -> list[Callable[[], None]]:
        """Every kernel bound to these inputs and the planned buffers, in execution order."""
        vals = self._values(inputs)
        return [_bind(k.module, [vals[v] for v in k.args]) for k in self.kernels]

    def run(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        vals = self._values(inputs)
        if self._bound is None:  # kernels on planned buffers and constants only: bound once
            inputs_ = {v.name for v in self.graph.inputs}
            self._bound = [_bind(k.module, [vals[v] for v in k.args])
                           if not inputs_.intersection(k.args) else None for k in self.kernels]
        for kern, call in zip(self.kernels, self._bound):
            if call is not None:
                call()
            else:
                kern.module(*(vals[v] for v in kern.args))
        return [np.array(vals[o]) for o in self.graph.outputs]

    def time(self, inputs: dict[str, Any], repeat: int = 10, min_s: float = 0.5,
             stat: str = "median") -> float:
        """Seconds of one run (after a warm-up), inputs bound once: the median (or, with
        ``stat="min"``, the fastest) of at least ``repeat`` runs lasting ``min_s`` in all."""
        calls = self._calls(inputs)

        def once() -> None:
            for call in calls:
                call()

        once()
        times: list[float] = []
        deadline = time.perf_counter() + min_s
        while len(times) < repeat or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
        return float(np.min(times) if stat == "min" else np.median(times))

    def kernel_times(self, inputs: dict[str, Any], repeat: int = 20) -> list[tuple[str, float]]:
        """(task name, median seconds) per kernel in execution order, each timed in place
        while the whole model runs ``repeat`` times (after a warm-up): caches and DRAM traffic
        as in a real run, so the times add up to about ``time()``."""
        calls = self._calls(inputs)
        for call in calls:
            call()
        runs = []
        for _ in range(repeat):
            stamps = [time.perf_counter()]
            for call in calls:
                call()
                stamps.append(time.perf_counter())
            runs.append(np.diff(stamps))
        med = np.median(np.array(runs), axis=0)
        return [(k.task.name, float(t)) for k, t in zip(self.kernels, med)]

    def summary(self) -> str:
        lines = [f"{len(self.kernels)} kernels, {len(self.aliases)} reshapes as views, "
                 f"{self.peak_bytes / 1e6:.1f} MB intermediate memory"]
        for k in self.kernels:
            lines.append(f"  {k.task.name}: {', '.join(k.args)}")
        return "\n".join(lines)
