"""The graph compiler: fused groups become tasks; tasks get their best schedules (or defaults);
the compiled model runs them in order over a static memory plan.

Example::

    from importers import onnx as onnx_importer
    graph = onnx_importer.from_onnx("model.onnx", shapes={"x": (1, 3, 224, 224)})
    aus.tune_graph(graph, target="llvm", trials=2000, log="tuning_logs/model-llvm.jsonl")
    model = aus.compile(graph, target="llvm", log="tuning_logs/model-llvm.jsonl")
    outputs = model.run({"x": x})
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import ModelImportError
from autosched.graph.fuse import Group, fuse
from autosched.graph.graph import Graph
from autosched.search.task import Task
from autosched.targets.target import Target, parse
from autosched.te import dtype as dt
from autosched.te.tensor import Tensor, compute, placeholder


def _attr_like(a: np.ndarray) -> bool:
    """Constants a converter reads as values at build time (shapes, axes, pads, scalar limits);
    the rest (weights) are runtime arguments."""
    return a.dtype.kind in "iub" or a.size <= 1


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out if out and not out[0].isdigit() else f"v_{out}"


@dataclass
class Kernel:
    group: Group
    task: Task
    args: list[str]            # graph values in task.args order: inputs, then outputs
    module: Any = None


def group_task(graph: Graph, group: Group, target: Target) -> tuple[Task, list[str]]:
    """The TE computation of a group, as a Task whose args are the group's runtime inputs
    (weights included) and outputs."""
    from autosched.graph.ops import convert_node

    values: dict[str, Any] = {}
    params: list[tuple[str, Tensor]] = []
    for name in group.inputs:
        const = graph.constants.get(name)
        if const is not None and _attr_like(const):
            values[name] = const
            continue
        info = graph.values[name]
        # canonical names: groups with the same workload key share records, and steps name
        # stages by tensor name (cache_read of an input is "in0.shared")
        ph = placeholder(info.shape, info.dtype, name=f"in{len(params)}")
        values[name] = ph
        params.append((name, ph))
    for node in group.nodes:
        ins = [values.get(i) if i else None for i in node.inputs]
        outs = convert_node(node, ins, graph)
        for o, t in zip(node.outputs, outs):
            values[o] = t
    outs_t: list[Tensor] = []
    for o in group.outputs:
        t = values[o]
        if isinstance(t, np.ndarray):
            raise ModelImportError(f"value {o} of group {group.name} folded to a constant at run time")
        if any(t is p for _, p in params):  # an output that is an input: copy it
            src = t
            t = compute(src.shape, lambda *i, s=src: s[i], name=f"copy_{_ident(o)}")
        outs_t.append(t)
    args = [p for _, p in params] + outs_t
    task = Task(lambda: args, target=target, name=group.name)
    return task, [n for n, _ in params] + list(group.outputs)


def runtime_values(graph: Graph) -> set[str]:
    out = {v.name for v in graph.inputs}
    for n in graph.nodes:
        if any(i in out for i in n.inputs if i):
            out.update(n.outputs)
    return out


def plan(graph: Graph) -> list[Group]:
    return fuse(graph, runtime_values(graph))


def extract_tasks(graph: Graph, target: str | Target = "llvm") -> tuple[list[Task], list[int]]:
    """Distinct tasks of the graph (de-duplicated by workload key) and how often each occurs."""
    tgt = parse(target)
    tasks: dict[str, Task] = {}
    counts: dict[str, int] = {}
    for g in plan(graph):
        task, _ = group_task(graph, g, tgt)
        key = task.workload_key
        tasks.setdefault(key, task)
        counts[key] = counts.get(key, 0) + 1
    return list(tasks.values()), [counts[k] for k in tasks]


def tune_graph(graph: Graph, target: str | Target = "llvm", trials: int = 1000,
               log: str | os.PathLike | None = None, **kwargs: Any) -> dict[str, float]:
    """Tune every task of ``graph``, trials shared by the task scheduler (weighted by how often
    each task occurs)."""
    from autosched.search.tune import tune

    tasks, weights = extract_tasks(graph, target)
    return tune(tasks, trials=trials, log=log, weights=weights, **kwargs)


class CompiledModel:
    """Kernels in order over a static memory plan. ``run`` takes {input name: array}."""

    def __init__(self, graph: Graph, kernels: list[Kernel], target: Target):
        self.graph = graph
        self.kernels = kernels
        self.target = target
        self._plan_memory()

    def _plan_memory(self) -> None:
        """Intermediate values share byte buffers once their last reader has run."""
        last_use: dict[str, int] = {}
        for k, kern in enumerate(self.kernels):
            for v in kern.args:
                last_use[v] = k
        for o in self.graph.outputs:
            last_use[o] = len(self.kernels)
        free: dict[int, list[np.ndarray]] = {}
        raw_of: dict[str, np.ndarray] = {}
        self.storage: dict[str, np.ndarray] = {}
        self.peak_bytes = 0
        for k, kern in enumerate(self.kernels):
            n_in = len(kern.task.args) - len(kern.task.outputs)
            for v in kern.args[n_in:]:
                info = self.graph.values[v]
                nbytes = max(int(np.prod(info.shape, dtype=np.int64)) * dt.nbytes(info.dtype), 1)
                pool = free.get(nbytes)
                if pool:
                    raw = pool.pop()
                else:
                    raw = np.empty(nbytes, np.uint8)
                    self.peak_bytes += nbytes
                raw_of[v] = raw
                self.storage[v] = raw[: nbytes].view(info.dtype).reshape(info.shape)
            for v in set(kern.args):
                if last_use.get(v) == k and v in raw_of:
                    raw = raw_of.pop(v)
                    free.setdefault(raw.size, []).append(raw)

    def _bind(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vals: dict[str, np.ndarray] = {}
        for v in self.graph.inputs:
            if v.name not in inputs:
                raise ModelImportError(f"missing input {v.name} ({v.dtype}{list(v.shape)}); "
                                       f"the model takes {[i.name for i in self.graph.inputs]}")
            a = np.ascontiguousarray(inputs[v.name])
            if tuple(a.shape) != tuple(v.shape) or str(a.dtype) != v.dtype:
                raise ModelImportError(f"input {v.name} must be {v.dtype}{list(v.shape)}, got "
                                       f"{a.dtype}{list(a.shape)}")
            vals[v.name] = a
        unknown = set(inputs) - {v.name for v in self.graph.inputs}
        if unknown:
            raise ModelImportError(f"unknown inputs {sorted(unknown)}")
        for name, a in self.graph.constants.items():
            vals[name] = np.ascontiguousarray(a)
        vals.update(self.storage)
        return vals

    def run(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        vals = self._bind(inputs)
        for kern in self.kernels:
            kern.module(*(vals[v] for v in kern.args))
        return [np.array(vals[o]) for o in self.graph.outputs]

    def time(self, inputs: dict[str, np.ndarray], repeat: int = 10, min_s: float = 0.5) -> float:
        """Median seconds of one run (after a warm-up)."""
        self.run(inputs)
        times = []
        deadline = time.perf_counter() + min_s
        while len(times) < repeat or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            self.run(inputs)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def summary(self) -> str:
        lines = [f"{len(self.kernels)} kernels, {self.peak_bytes / 1e6:.1f} MB intermediate memory"]
        for k in self.kernels:
            lines.append(f"  {k.task.name}: {', '.join(k.args)}")
        return "\n".join(lines)


def compile(graph: Graph, target: str | Target = "llvm", log: str | os.PathLike | None = None) -> CompiledModel:  # noqa: A001
    """Compile a graph: each fused group with its best record in ``log`` (the untuned default
    schedule when there is none, with a warning listing those tasks)."""
    from autosched.search.record import RecordLog
    from autosched.search.space import SearchSpace

    tgt = parse(target)
    kernels: list[Kernel] = []
    built: dict[str, Any] = {}
    records = RecordLog(log) if log is not None else None
    untuned: list[str] = []
    for g in plan(graph):
        task, args = group_task(graph, g, tgt)
        key = task.workload_key
        if key not in built:
            sch = None
            if records is not None:
                best = records.best(key, tgt)
                if best:
                    try:
                        sch = task.schedule(best[0].schedule_steps())
                    except Exception as exc:  # a record from another version of the sketches
                        warnings.warn(f"record for {task.name} does not replay ({exc}); "
                                      "using the default schedule", stacklevel=2)
            if sch is None:
                untuned.append(task.name)
                sch = SearchSpace(task).default_schedule()
            built[key] = task.build(sch)
        kernels.append(Kernel(g, task, args, built[key]))
    if untuned and log is not None:
        warnings.warn(f"no tuning record in {log} for {len(untuned)} task(s): {', '.join(untuned)}; "
                      "they use default schedules", stacklevel=2)
    return CompiledModel(graph, kernels, tgt)


def tasks_table(graph: Graph, target: str | Target = "llvm") -> Sequence[str]:
    tasks, weights = extract_tasks(graph, target)
    return [f"{t.name} x{w}: {t.flop_count / 1e6:.1f} MFLOP, key {t.workload_key}" for t, w in zip(tasks, weights)]
