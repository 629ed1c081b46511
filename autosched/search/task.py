"""A tuning task: one computation on one target."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from autosched.errors import ScheduleError
from autosched.schedule.schedule import Schedule, create_schedule
from autosched.schedule.steps import Step
from autosched.targets.target import Target, parse
from autosched.te import dtype as dt
from autosched.te.dag import ComputeDAG
from autosched.te.ops.args import static_shape
from autosched.te.tensor import PlaceholderOp, Tensor
from autosched.tir.ir import PrimFunc


class Task:
    """What to tune: the output tensors (or a function building them) and the target.

    Example::

        task = aus.Task(C, target="llvm")                 # args: placeholders, then outputs
        task = aus.Task(matmul, args=(1024, 1024, 1024))  # matmul(M, N, K) -> [A, B, C]

    ``workload_key`` hashes the computation only (not names, not the target); records are looked
    up by (workload_key, target fingerprint). ``precision`` (te.dtype.PRECISIONS) sets the
    tolerance candidates are checked with and, when not fp32, ends the key (``<hash>-fp16``):
    a record of one precision never applies to another, and logs written before precisions
    existed are fp32.
    """

    def __init__(
        self,
        compute: Tensor | Sequence[Tensor] | Callable[..., Sequence[Tensor]],
        args: Sequence[Any] | None = None,
        target: str | Target = "llvm",
        name: str | None = None,
        precision: str = dt.DEFAULT_PRECISION,
    ):
        if callable(compute) and not isinstance(compute, Tensor):
            tensors = list(compute(*(args or ())))
            self.args: list[Tensor] = tensors
            outputs = [t for t in tensors if not isinstance(t.op, PlaceholderOp)]
            default_name = getattr(compute, "__name__", "task")
        else:
            outputs = [compute] if isinstance(compute, Tensor) else list(compute)
            dag = ComputeDAG(outputs)
            self.args = list(args) if args is not None else dag.placeholders + outputs
            default_name = "_".join(t.name for t in outputs)
        if not outputs:
            raise ScheduleError("a Task needs at least one computed output tensor")
        self.outputs: list[Tensor] = outputs
        self.dag = ComputeDAG(outputs)
        self.target: Target = parse(target)
        self.name = name or default_name
        self.precision = dt.precision(precision).name
        self.workload_key = precision_key(self.dag.workload_key, self.precision)
        self.flop_count = self.dag.flop_count()

    def with_precision(self, precision: str) -> Task:
        """This task under another precision (the same computation, another key)."""
        out = copy.copy(self)
        out.precision = dt.precision(precision).name
        out.workload_key = precision_key(self.dag.workload_key, out.precision)
        return out

    def schedule(self, steps: Sequence[Step] = ()) -> Schedule:
        """A fresh schedule with ``steps`` replayed on it."""
        sch = create_schedule([t.op for t in self.outputs])
        for step in steps:
            sch.apply(step)
        return sch

    def lower(self, sch: Schedule) -> PrimFunc:
        from autosched.schedule.lower import lower

        return lower(sch, self.args, name=_c_name(self.name))

    def build(self, sch: Schedule) -> Any:
        from autosched.driver import build_func

        return build_func(self.lower(sch), self.target)

    def shapes(self) -> list[tuple[list[int], str]]:
        """(shape, dtype) of every argument, in order."""
        return [(list(static_shape(t, f"task {self.name}")), t.dtype) for t in self.args]

    def __repr__(self) -> str:
        return f"Task({self.name}, {self.target}, key={self.workload_key})"


def precision_key(key: str, precision: str) -> str:
    """The workload key of a computation of structural hash ``key`` under ``precision``."""
    return key if precision == dt.DEFAULT_PRECISION else f"{key}-{precision}"


def _c_name(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out if out and not out[0].isdigit() else f"k_{out}"
