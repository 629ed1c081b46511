"""The graph compiler: graph passes, fused groups become tasks, tasks get their best schedules
(or defaults), and the compiled model runs them in order over a static memory plan.

Example::

    import autosched as aus
    from importers import from_onnx
    graph = from_onnx("model.onnx", shapes={"x": (1, 3, 224, 224)})
    aus.tune_graph(graph, target="llvm", trials=2000, log="tuning_logs/model-llvm.jsonl")
    model = aus.compile(graph, target="llvm", log="tuning_logs/model-llvm.jsonl")
    outputs = model.run({"x": x})          # list of numpy arrays, in graph output order
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autosched.errors import ModelImportError
from autosched.graph import fold  # noqa: F401  registers the converters of unfolded nodes
from autosched.graph.fuse import Group, fuse
from autosched.graph.graph import IMPLICIT, Graph
from autosched.graph.precision import apply_precision, storage_dtype
from autosched.search.task import Task
from autosched.settings import Setting
from autosched.targets.target import Target, parse
from autosched.te import dtype as dt
from autosched.te.dtype import DEFAULT_PRECISION
from autosched.te.expr import cast
from autosched.te.tensor import PlaceholderOp, Tensor, compute, placeholder


def _attr_like(a: np.ndarray) -> bool:
    """Constants a converter reads as values at build time (shapes, axes, pads, scalar limits);
    the rest (weights) are runtime arguments."""
    return a.dtype.kind in "iub" or a.size <= 1


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out if out and not out[0].isdigit() else f"v_{out}"


@dataclass
class GroupTask:
    """A group's task and how its arguments bind: ``args[k]`` names the graph value (or the
    entry of ``constants``, for arrays a converter derived) passed as ``task.args[k]``."""

    group: Group
    task: Task
    args: list[str]
    constants: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Kernel:
    group: Group
    task: Task
    args: list[str]            # graph values (or model constants) in task.args order
    module: Any = None

    @property
    def n_inputs(self) -> int:
        return len(self.task.args) - len(self.task.outputs)


# Ops that only move elements: under a half precision they read and write the stored dtype
# (im2col patches stay half, the form a tensor-core matmul's half operand reads)
MOVES_DATA = frozenset({"Im2Col"})


def group_task(graph: Graph, group: Group, target: Target,
               precision: str = DEFAULT_PRECISION) -> GroupTask:
    """The TE computation of a group, as a Task whose args are the group's runtime inputs
    (weights included, in the order the DAG reads them) and then its outputs. Under a half
    precision (graph/precision.py) converters see float32 only: half inputs are cast up where
    they are read, and outputs cast to the dtype the graph stores them in."""
    from autosched.graph.ops import ConvertContext, const_inputs, convert

    opset = graph.opset or 17
    must_const = {n.inputs[k] for n in group.nodes for k in const_inputs(n.op_type, opset)
                  if k < len(n.inputs)}
    # a node of constants left to run (too large to fold) reads them as kernel arguments:
    # given arrays, its converter would fold it again
    as_args = {i for n in group.nodes if all(i in graph.constants for i in n.inputs if i)
               for i in n.inputs if i} - must_const
    ctx = ConvertContext(opset=opset)
    values: dict[str, Any] = {}
    name_of: dict[int, str] = {}   # id(placeholder tensor op) -> value name
    for k, name in enumerate(group.inputs):
        const = graph.constants.get(name)
        if const is not None and name not in as_args and (_attr_like(const)
                                                          or name in must_const):
            values[name] = const
            ctx.names[id(const)] = f"c{k}"   # canonical: identical groups name stages alike
            continue
        info = graph.values[name]
        # canonical names: steps name stages by tensor name (cache_read of "in0" is "in0.shared")
        ph = placeholder(info.shape, info.dtype, name=f"in{k}")
        values[name] = ph
        name_of[ph.op.uid] = name
    widen = _Widen(storage_dtype(precision) != "float32")
    # MOVES_DATA ops take half values as they are (bfloat16, only a storage type, is widened)
    moves_half = storage_dtype(precision) not in dt.STORAGE_TYPES
    for node in group.nodes:
        moves = node.op_type in MOVES_DATA or bool(node.attrs.get(IMPLICIT))
        ins = [(values.get(i) if moves and moves_half else widen(i, values.get(i))) if i
               else None for i in node.inputs]
        outs = convert(node, ins, ctx)
        for o, t in zip(node.outputs, outs):
            if moves and widen.active and o and isinstance(t, Tensor) \
                    and t.dtype != graph.values[o].dtype:  # stored half, read in the kernel
                t = compute(t.shape, lambda *i, s=t, d=graph.values[o].dtype: cast(d, s[i]),
                            name=f"{t.name}_{graph.values[o].dtype}")
            if o:
                values[o] = t
    derived: dict[str, np.ndarray] = {}
    by_id = {id(a): n for n, a in graph.constants.items()}
    for ph, arr in ctx.constants.items():
        src = by_id.get(id(arr))
        if src is None:  # an array the converter computed (say beta * C): a model constant,
            src = derived_name(arr)  # one per content, so groups that derive it alike share it
            derived[src] = arr
        name_of[ph.op.uid] = src
    outs_t: list[Tensor] = []
    for o in group.outputs:
        t = values[o]
        if isinstance(t, np.ndarray):
            raise ModelImportError(f"value {o} of group {group.name} folded to a constant; "
                                   "run autosched.graph.passes.optimize first")
        if isinstance(t.op, PlaceholderOp):  # an output that is an input: copy it
            t = compute(t.shape, lambda *i, s=t: s[i], name=f"copy_{_ident(o)}")
        stored = graph.values[o].dtype
        if t.dtype != stored and widen.active:  # rounded once, where the kernel writes it
            t = compute(t.shape, lambda *i, s=t, d=stored: cast(d, s[i]),
                        name=f"store_{_ident(o)}")
        outs_t.append(t)
    from autosched.te.dag import ComputeDAG

    phs = ComputeDAG(outs_t).placeholders
    args = list(phs) + outs_t
    task = Task(lambda: args, target=target, name=group.name, precision=precision)
    names = [name_of[p.op.uid] for p in phs] + list(group.outputs)
    return GroupTask(group, task, names, {k: v for k, v in derived.items() if k in names})


def derived_name(arr: np.ndarray) -> str:
    """The model constant name of an array a converter computed, from its content: the steps
    of a recurrent layer derive the same array from their shared weight, once each."""
    h = hashlib.blake2b(f"{arr.dtype}{arr.shape}".encode(), digest_size=12)
    h.update(np.asarray(arr, order="C").tobytes())
    return f"derived:{h.hexdigest()}"


class _Widen:
    """Half tensors as float32 (one cast stage per value, which schedules inline into its
    readers) when ``active``; every value as it is otherwise."""

    def __init__(self, active: bool):
        self.active = active
        self.done: dict[str, Any] = {}

    def __call__(self, name: str, value: Any) -> Any:
        if not (self.active and isinstance(value, Tensor) and value.dtype in dt.HALF_TYPES):
            return value
        if name not in self.done:
            self.done[name] = compute(value.shape, lambda *i, s=value: cast("float32", s[i]),
                                      name=f"{value.name}_f32")
        return self.done[name]


def runtime_values(graph: Graph) -> set[str]:
    """Values computed at run time: the inputs and every node output that is no constant
    (after folding, nodes of constants left in the graph are those too large to fold)."""
    out = {v.name for v in graph.inputs}
    for n in graph.nodes:
        out.update(o for o in n.outputs if o and o not in graph.constants)
    return out


def prepare(graph: Graph, target: Target | None = None,
            precision: str = DEFAULT_PRECISION) -> Graph:
    """The graph after the passes (constant folding, batch-norm folding, dead nodes; for a CPU
    target, stride-1 3x3 convolutions split into Winograd steps, the other conv weights
    packed output channels last and Gemm / MatMul weights as column panels; for a GPU target
    in tf32 / fp16 / bf16, convolutions as matmuls of im2col patches); last, the storage of
    ``precision`` (graph/precision.py)."""
    from autosched.graph.passes import (
        dot4_products,
        gemm_convs,
        optimize,
        pack_conv_weights,
        pack_gemm_weights,
        split_matmuls,
        winograd_convs,
    )
    from autosched.targets.llvm.cpu_features import dot_intrin

    g = optimize(graph)
    if target is not None and target.device != "gpu":
        lanes = max(target.vector_bits // 32, 1)
        g = pack_gemm_weights(pack_conv_weights(winograd_convs(g)), lanes)
        dot = dot_intrin(target)
        if dot:
            g = dot4_products(g, dot)
    elif target is not None and precision != DEFAULT_PRECISION:
        splits = _max_splits()
        g = gemm_convs(g, implicit=_implicit_patches(),  # tensor cores multiply matmuls
                       batch_columns=_batch_columns(), max_splits=splits)
        # the slices of K read in place where values are stored as they are computed on
        g = split_matmuls(g, splits, in_place=storage_dtype(precision) not in dt.STORAGE_TYPES)
    return apply_precision(g, precision)


def _one_of(setting: Setting, first: str, second: str) -> bool:
    """Whether ``setting`` is ``second`` (it must be one of the two)."""
    how = setting.value()
    if how not in (first, second):
        raise ValueError(f"{setting.name}={how!r}: expected {first} or {second}")
    return how == second


def _implicit_patches() -> bool:
    """AUTOSCHED_CONV_GEMM: whether GPU convolutions gather their patches inside the matmul."""
    from autosched import settings

    return _one_of(settings.CONV_GEMM, "explicit", "implicit")


def _batch_columns() -> bool:
    """AUTOSCHED_CONV_COLUMNS: whether GPU convolutions of a batch are one GEMM over it."""
    from autosched import settings

    return _one_of(settings.CONV_COLUMNS, "image", "batch")


def _max_splits() -> int:
    """AUTOSCHED_K_SPLIT: the most slices of K a GPU GEMM sums apart."""
    from autosched import settings

    how = settings.K_SPLIT.value()
    if not how.isdigit() or int(how) < 1 or int(how) & (int(how) - 1):
        raise ValueError(f"{settings.K_SPLIT.name}={how!r}: expected a power of two")
    return int(how)


def plan(graph: Graph) -> list[Group]:
    return fuse(graph, runtime_values(graph))


def kernel_groups(graph: Graph) -> tuple[list[tuple[int, Group]], dict[str, str]]:
    """The fused groups of an optimized graph that need a kernel (numbered in plan order), and
    the reshapes that run as views instead: {reshaped value: value whose buffer it views}."""
    aliases: dict[str, str] = {}
    written: set[str] = set()
    out = []
    for k, grp in enumerate(plan(graph)):
        src = _view_of(graph, grp, written, aliases)
        if src is not None:
            aliases[grp.outputs[0]] = src
            continue
        written.update(grp.outputs)
        out.append((k, grp))
    return out, aliases


def group_tasks(graph: Graph, target: Target, precision: str = DEFAULT_PRECISION
                ) -> list[GroupTask]:
    """One GroupTask per kernel of the optimized graph, in execution order."""
    g = prepare(graph, target, precision)
    return [group_task(g, grp, target, precision) for _, grp in kernel_groups(g)[0]]


def extract_tasks(graph: Graph, target: str | Target = "llvm",
                  precision: str = DEFAULT_PRECISION) -> tuple[list[Task], list[int]]:
    """Distinct tasks of the graph (de-duplicated by workload key) and how often each occurs.

    Example::

        tasks, weights = extract_tasks(graph, "llvm")   # ResNet-18: repeated blocks count twice
        tasks, _ = extract_tasks(graph, "cuda", precision="fp16")   # keys end in "-fp16"
    """
    tasks: dict[str, Task] = {}
    counts: dict[str, int] = {}
    for gt in group_tasks(graph, parse(target), precision):
        key = gt.task.workload_key
        tasks.setdefault(key, gt.task)
        counts[key] = counts.get(key, 0) + 1
    return list(tasks.values()), [counts[k] for k in tasks]


def tune_graph(graph: Graph, target: str | Target = "llvm", trials: int | None = 1000,
               log: str | os.PathLike | None = None, precision: str = DEFAULT_PRECISION,
               choose: bool = True, **kwargs: Any) -> dict[str, float]:
    """Tune every task of ``graph`` under ``precision`` (te.dtype.PRECISIONS), trials shared
    by the task scheduler (weighted by how often each task occurs). Returns the best seconds
    per task name (each measured alone). Then, with ``choose`` and a model that runs here,
    each task's schedule is chosen by timing the best few in the model (graph/choose.py):
    compiled with the log, the model is never slower than untuned, as measured.

    Example::

        aus.tune_graph(graph, "llvm", trials=500, log="tuning_logs/model.jsonl")
        aus.tune_graph(graph, "cuda", trials=500, log="tuning_logs/model.jsonl", precision="fp16")
    """
    from autosched.graph.choose import choose_after_tuning, describe_choices
    from autosched.search.tune import default_log, tune

    tasks, weights = extract_tasks(graph, target, precision)
    log = log if log is not None else default_log(tasks)
    best = tune(tasks, trials=trials, log=log, weights=weights, **kwargs)
    if choose:
        choices = choose_after_tuning(graph, tasks, log, precision,
                                      kwargs.get("runner", kwargs.get("measurer")))
        if choices and getattr(kwargs.get("options"), "verbose", False):
            print(describe_choices(choices), flush=True)
    return best


SCHEDULES = ("auto", "default", "model")


def resolve_schedule(schedule: str | None, target: Target) -> str:
    """``default`` or ``model``: what a task without a record gets. ``None`` reads
    ``AUTOSCHED_SCHEDULE`` (default ``auto``); ``auto`` is whichever measured better on the
    target's kind of device with no log. GPUs: the cost model's picks (H100, ResNet-18
    1.27 ms against 3.8 untuned, MobileNetV2 0.55 against 1.02). CPUs: the untuned defaults
    (znver4: the picks won on ResNet-18, MobileNetV2, nudenet and silero_vad and lost on
    orientation by 1.6x, magika, ppocr_cls and ddddocr_ocr; and searching costs 10 to 150 s
    that the defaults do not)."""
    from autosched import settings

    schedule = schedule or settings.SCHEDULE.value()
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}; expected one of {SCHEDULES}")
    if schedule == "auto":
        return "model" if target.device == "gpu" else "default"
    return schedule


def _schedule_for(task: Task, records: Any, tgt: Target, strict: bool = False,
                  schedule: str = "default", model: dict[str, Any] | None = None
                  ) -> tuple[Any, bool]:
    """(schedule, whether a record chose it): the best record, else the default schedule or
    the cost model's pick (``schedule="model"``; ``model``: the picks by workload key, made
    beforehand for every task at once)."""
    from autosched.search.space import SearchSpace

    if records is not None:
        best = records.best(task.workload_key, tgt, strict=strict)
        if best:
            try:
                return task.schedule(best[0].schedule_steps()), True
            except Exception as exc:  # noqa: BLE001  a record from an older sketch version
                warnings.warn(f"record for {task.name} does not replay ({exc}); using the "
                              f"{schedule} schedule", stacklevel=3)
    if schedule == "model":
        picked = (model or {}).get(task.workload_key)
        if picked is None:  # not picked beforehand (its record did not replay)
            from autosched.search.tune import model_schedule

            picked = model_schedule(task)
        return picked, False
    return SearchSpace(task).default_schedule(), False


@dataclass
class CompiledKernels:
    """A compiled model without an executor (``compile(..., executor=False)``): its optimized
    graph, kernels in call order, constants and reshape views; all that ``export`` needs, and
    nothing that runs them (a CUDA model's kernels without pycuda or a GPU)."""

    graph: Graph
    kernels: list[Kernel]
    target: Target
    constants: dict[str, np.ndarray]
    aliases: dict[str, str]


def compile(graph: Graph, target: str | Target = "llvm",  # noqa: A001
            log: str | os.PathLike | None = None, strict_target: bool = False,
            executor: bool = True, schedule: str | None = None,
            precision: str = DEFAULT_PRECISION) -> Any:
    """Compile a graph: each fused group with its best record in ``log``; a group without one
    gets the untuned default schedule (``schedule="default"``) or the one the pretrained cost
    model ranks best, chosen without timing anything (``schedule="model"``; the picks are
    cached, so a second compile does not search again); ``"auto"`` (the default, unless
    ``AUTOSCHED_SCHEDULE`` says otherwise) takes the picks on GPUs and the defaults on CPUs
    (resolve_schedule); a warning lists those tasks when a log was given. Records of targets with the same key apply;
    ``strict_target``: only those of the very same fingerprint. Returns a CompiledModel
    (modules on host arrays) or a CudaModel (a GPU's memory) with
    ``run({name: array}) -> [arrays]``; with ``executor`` false, the CompiledKernels that
    ``export`` writes as a library, made without running anything (a CUDA model needs NVRTC
    only: no pycuda, no GPU). ``precision`` (te.dtype.PRECISIONS: "fp32", "tf32", "fp16",
    "bf16") says how the model computes: fp16 / bf16 store activations and weights in half
    with float32 arithmetic (graph/precision.py); tf32 differs from fp32 only in tensor-core
    multiplies, so on the SIMT code paths it computes as fp32, bit for bit. Only records tuned
    in the same precision apply. Inputs and outputs stay float32 in every precision.

    Example::

        model = aus.compile(graph, target="llvm")      # CPU: default schedules
        model = aus.compile(graph, target="llvm", schedule="model")   # zero measurements
        model = aus.compile(graph, target="cuda", precision="fp16")
        (y,) = model.run({"x": x})
        export(aus.compile(graph, "cuda -arch=sm_90", executor=False), "build/net")
    """
    from autosched.graph.executor import CompiledModel
    from autosched.search.record import RecordLog

    tgt = parse(target)
    schedule = resolve_schedule(schedule, tgt)
    precision = dt.precision(precision).name
    g = prepare(graph, tgt, precision)
    kernels: list[Kernel] = []
    built: dict[str, Any] = {}
    records = RecordLog(log) if log is not None and os.path.exists(log) else None
    untuned: list[str] = []
    constants = dict(g.constants)
    groups, aliases = kernel_groups(g)   # reshapes of a kernel's output: views of its buffer
    group_tasks = [group_task(g, grp, tgt, precision) for _, grp in groups]
    chosen = None  # schedule="model": the model's pick of every task no record has
    if schedule == "model":
        from autosched.search.tune import model_schedules

        todo: dict[str, Task] = {}  # the first task of each workload: the one built below
        for gt in group_tasks:
            key = gt.task.workload_key
            if key not in todo and (records is None or not records.best(
                    key, tgt, strict=strict_target)):
                todo[key] = gt.task
        chosen = dict(zip(todo, model_schedules(list(todo.values()))))
    for (_, grp), gt in zip(groups, group_tasks):
        constants.update(gt.constants)
        key = gt.task.workload_key
        if key not in built:
            sch, tuned = _schedule_for(gt.task, records, tgt, strict_target, schedule, chosen)
            if not tuned:
                untuned.append(gt.task.name)
            built[key] = gt.task.build(sch)
        kernels.append(Kernel(grp, gt.task, gt.args, built[key]))
    if untuned and log is not None:
        warnings.warn(f"no tuning record in {log} for {len(untuned)} task(s): "
                      f"{', '.join(untuned)}; they use {schedule} schedules", stacklevel=2)
    if not executor:
        return CompiledKernels(g, kernels, tgt, constants, aliases)
    if tgt.backend.device_memory(tgt) is not None:  # intermediates stay on the device
        from autosched.graph.executor_cuda import CudaModel

        return CudaModel(g, kernels, tgt, constants, aliases)
    return CompiledModel(g, kernels, tgt, constants, aliases)


VIEW_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def _view_of(graph: Graph, group: Group, written: set[str], aliases: dict[str, str]
             ) -> str | None:
    """The value whose buffer ``group`` reads unchanged (row-major data, a new shape), when the
    group is only reshapes of one value that an earlier kernel wrote; else None."""
    if not group.nodes or any(n.op_type not in VIEW_OPS for n in group.nodes):
        return None
    runtime = [i for i in group.inputs if i not in graph.constants]
    if len(runtime) != 1 or len(group.outputs) != 1:
        return None
    src = aliases.get(runtime[0], runtime[0])
    if src not in written:
        return None
    a, b = graph.values[group.outputs[0]], graph.values[src]
    if a.dtype != b.dtype or int(np.prod(a.shape)) != int(np.prod(b.shape)):
        return None
    return src


def tasks_table(graph: Graph, target: Target) -> Sequence[str]:
    tasks, weights = extract_tasks(graph, target)
    return [f"{t.name} x{w}: {t.flop_count / 1e6:.1f} MFLOP, key {t.workload_key}"
            for t, w in zip(tasks, weights)]
