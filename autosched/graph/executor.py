"""Running a compiled graph on the CPU: kernels in order over a static memory plan.

Intermediates share one workspace, at offsets planned from their lifetimes (graph/memory.py);
constants are bound once; ``run`` checks the inputs (names, shapes, dtypes) and returns fresh
output arrays. When the backend can link the kernels in this process (llvm on the host), a run
is one native call into the same glue a deployed library has (graph/deploy.py): the kernels in
order over one workspace, no Python between them; otherwise (and to time kernels one by one, or
to say which node failed) the kernels are called from Python. Runs are thread-safe: each call
borrows an arena (its own planned buffers and native context) from a pool that grows to the
number of calls in flight, so a server can share one model between threads.

Example::

    model = aus.compile(graph, target="llvm")
    (y,) = model.run({"x": x})
    print(model.time({"x": x}) * 1e3, "ms")
    print(model.summary())
"""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import ModelImportError, RuntimeError_
from autosched.graph.graph import Graph, ValueInfo
from autosched.graph.memory import memory_layout, nbytes
from autosched.graph.threads import AdaptiveThreads, adaptive
from autosched.targets.arrays import aligned, aligned_empty
from autosched.targets.status import STATUS_INDEX, KernelFailure, status_message
from autosched.targets.target import Target
from autosched.te import dtype as dt


def view(raw: np.ndarray, info: ValueInfo) -> np.ndarray:
    """The planned bytes ``raw`` as the array of ``info`` (a zero-size value: no bytes)."""
    size = dt.nbytes(info.dtype) * int(np.prod(info.shape, dtype=np.int64))
    return raw[:size].view(info.dtype).reshape(info.shape)


def planned_arrays(graph: Graph, raw: dict[str, Any], aliases: dict[str, str]
                   ) -> dict[str, np.ndarray]:
    """The arrays of the planned values over their bytes ``raw`` (in the workspace), and
    the reshapes that view another value's buffer (``aliases``)."""
    values = graph.values
    storage = {v: view(r, values[v]) for v, r in raw.items()}
    for a, src in aliases.items():
        storage[a] = storage[src].reshape(values[a].shape)
    return storage


def allocate(what: str, size: int, alloc: Callable[[int], Any]) -> Any:
    """``alloc(size)`` for ``what`` (a value, or a model's workspace), an allocation failure as
    one line naming it."""
    try:
        return alloc(size)
    except MemoryError:
        raise RuntimeError_(f"out of memory allocating {size} bytes for {what}") from None


def described(info: ValueInfo) -> str:
    """A value as an allocation failure names it."""
    return f"value {info.name} ({info.dtype}{list(info.shape)})"


def workspace(graph: Graph, offsets: dict[str, int]) -> str:
    """A model's workspace as an allocation failure names it: with its largest value."""
    if not offsets:
        return f"the workspace of model {graph.name}"
    largest = max(offsets, key=lambda v: nbytes(graph.values[v]))
    return (f"the workspace of model {graph.name} (its largest: "
            f"{described(graph.values[largest])})")


def native_arguments(graph: Graph, inputs: dict[str, Any], outputs: Sequence[ValueInfo]
                     ) -> tuple[list[np.ndarray], list[np.ndarray], list[Any]]:
    """The checked inputs (aligned), fresh aligned ``outputs``, and the two C arrays of their
    data pointers (void *[]) a whole-model run takes; the pointers are valid while both lists
    live."""
    ins = [aligned(a) for a in check_inputs(graph, inputs).values()]
    outs = [aligned_empty(v.shape, v.dtype) for v in outputs]
    pointers = [(ctypes.c_void_p * max(len(xs), 1))(*(x.ctypes.data for x in xs))
                for xs in (ins, outs)]
    return ins, outs, pointers


def round_times(calls: Sequence[Callable[[], Any]], repeat: int, min_s: float) -> list[float]:
    """Seconds of each round of ``calls`` after a warm-up round: at least ``repeat`` rounds
    lasting ``min_s`` in all."""
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
    return times


def time_calls(calls: Sequence[Callable[[], Any]], repeat: int, min_s: float,
               stat: str = "median") -> float:
    """Seconds of one round of ``calls`` (``round_times``): the median or, with
    ``stat="min"``, the fastest."""
    times = round_times(calls, repeat, min_s)
    return float(np.min(times) if stat == "min" else np.median(times))


def call_times(calls: Sequence[Callable[[], Any]], repeat: int) -> np.ndarray:
    """Median seconds of each of ``calls``, timed in place while all of them run in order
    ``repeat`` times after a warm-up round."""
    for call in calls:
        call()
    runs = []
    for _ in range(repeat):
        stamps = [time.perf_counter()]
        for call in calls:
            call()
            stamps.append(time.perf_counter())
        runs.append(np.diff(stamps))
    return np.median(np.array(runs), axis=0)


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
        a = np.asarray(inputs[v.name], order="C")  # ascontiguousarray makes 0-d arrays 1-d
        if tuple(a.shape) != tuple(v.shape) or str(a.dtype) != v.dtype:
            raise ModelImportError(f"input {v.name} must be {v.dtype}{list(v.shape)}, got "
                                   f"{a.dtype}{list(a.shape)}")
        out[v.name] = a
    return out


def _index_limits(graph: Graph) -> dict[str, int]:
    """For graph inputs that a Gather / GatherElements reads as indices: the axis length."""
    limits: dict[str, int] = {}
    for node in graph.nodes:
        if node.op_type in ("Gather", "GatherElements") and len(node.inputs) > 1:
            data = graph.values.get(node.inputs[0])
            if data is not None and data.shape:
                n = int(data.shape[int(node.attrs.get("axis", 0))])
                limits[node.inputs[1]] = min(limits.get(node.inputs[1], n), n)
    return limits


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for every graph input (floats in [-1, 1), ints in [0, 10) and within the
    axis they index for Gather indices, bools)."""
    rng = np.random.default_rng(seed)
    limits = _index_limits(graph)
    out = {}
    for v in graph.inputs:
        if v.dtype.startswith("float"):
            out[v.name] = rng.uniform(-1, 1, v.shape).astype(v.dtype)
        elif v.dtype == "bool":
            out[v.name] = rng.random(v.shape) < 0.5
        else:
            top = max(min(10, limits.get(v.name, 10)), 1)
            out[v.name] = rng.integers(0, top, v.shape).astype(v.dtype)
    return out


@dataclass
class _Arena:
    """One set of planned buffers and the kernels bound to them (those that read no input),
    and a context of the native entry point (its workspace) with its thread count."""

    storage: dict[str, np.ndarray]
    bound: list[Callable[[], None] | None] | None = None
    context: int = 0
    threads: int = 0
    adapt: AdaptiveThreads | None = None  # the thread count of each run (threads.py)


# the ops whose indices a kernel checks (STATUS_INDEX names them, not the whole group)
INDEXING_OPS = ("Gather", "GatherElements", "GatherND")


def kernel_failure(kernel: Any, status: int) -> RuntimeError_:
    """The one-line error of a kernel that reported ``status``: the task and the nodes it
    comes from, then what the status bits mean."""
    nodes = kernel.group.nodes
    if status == STATUS_INDEX:
        nodes = [n for n in nodes if n.op_type in INDEXING_OPS] or nodes
    names = [n.name or n.op_type for n in nodes]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return RuntimeError_(f"task {kernel.task.name}, node {', '.join(names[:3])}{more}: "
                         f"{status_message(status)}")


class CompiledModel:
    """Kernels in order over a static memory plan, on numpy arrays. ``run`` takes
    {input name: array} and returns the outputs in graph output order; it may be called from
    several threads at once."""

    def __init__(self, graph: Graph, kernels: list[Any], target: Target,
                 constants: dict[str, np.ndarray] | None = None,
                 aliases: dict[str, str] | None = None):
        self.graph = graph
        self.kernels = kernels
        self.target = target
        self.aliases = dict(aliases or {})  # reshapes: views of a kernel's output, no kernel
        self.constants = {k: aligned(np.asarray(v, order="C"))
                          for k, v in (constants if constants is not None
                                       else graph.constants).items()}
        self._steps = [(k.args[: k.n_inputs], k.args[k.n_inputs:]) for k in kernels]
        self._inputs = {v.name for v in graph.inputs}
        self._lock = threading.Lock()
        first = self._new_arena()
        self.storage = first.storage  # the first arena's buffers (what summary describes)
        self._free = [first]
        self.num_threads: int | None = None  # None: the target's cores
        self._linked: list[Any] = []  # [the native entry point, or None], linked on first use

    @property
    def _entry(self) -> Any:
        """The whole model as one native call, or None when the backend cannot link it here."""
        with self._lock:
            if not self._linked:
                from autosched.graph.deploy import library_name, library_spec

                jit = getattr(self.target.backend, "jit_library", None)
                self._linked.append(None if jit is None else jit(
                    library_spec(self, library_name(self.graph.name), embed=False)))
            return self._linked[0]

    def _new_arena(self) -> _Arena:
        offsets, self.peak_bytes = memory_layout(self.graph, self._steps, self.aliases)
        work = allocate(workspace(self.graph, offsets), self.peak_bytes,
                        lambda n: aligned_empty((n,), "uint8"))
        raw = {v: work[at:] for v, at in offsets.items()}
        return _Arena(planned_arrays(self.graph, raw, self.aliases))

    @contextmanager
    def _arena(self) -> Iterator[_Arena]:
        """An arena no other call is using, for the duration of one call."""
        with self._lock:
            arena = self._free.pop() if self._free else None
        if arena is None:
            arena = self._new_arena()
        try:
            yield arena
        finally:
            with self._lock:
                self._free.append(arena)

    def _values(self, inputs: dict[str, Any], arena: _Arena) -> dict[str, np.ndarray]:
        vals = dict(self.constants)
        vals.update(check_inputs(self.graph, inputs))
        vals.update(arena.storage)
        return vals

    def run(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        entry = self._entry
        if entry is None:
            return self._run_kernels(inputs)
        _, outs, pointers = self._native_arguments(inputs)
        with self._arena() as arena:
            status = self._native_call(arena, entry, pointers)()
        if status:
            self._run_kernels(inputs)  # raises, naming the node that failed
            raise RuntimeError_(entry.message(status).decode())
        return outs

    def _native_arguments(self, inputs: dict[str, Any]
                          ) -> tuple[list[np.ndarray], list[np.ndarray], list[Any]]:
        values = self.graph.values
        return native_arguments(self.graph, inputs, [values[o] for o in self.graph.outputs])

    def _native_call(self, arena: _Arena, entry: Any, pointers: list[Any]
                     ) -> Callable[[], int]:
        """One run of the native entry on the arena's context (its status): on the count
        ``set_threads`` fixed, else on the count the arena's AdaptiveThreads picks each time."""
        context, run = self._context(arena), entry.run
        adapt = arena.adapt
        if adapt is None:
            return lambda: run(context, *pointers)
        set_threads, clock = entry.set_threads, time.perf_counter

        def call() -> int:
            n = adapt.next()
            if n != arena.threads:
                set_threads(context, n)
                arena.threads = n
            t0 = clock()
            status = run(context, *pointers)
            adapt.observe(clock() - t0)
            return status

        return call

    def _context(self, arena: _Arena) -> int:
        """The arena's native context, created on first use, with the model's thread count
        (and the arena's AdaptiveThreads when no count is fixed)."""
        threads = self.num_threads or self.target.num_cores
        if self.num_threads is None and threads > 1 and adaptive():
            if arena.adapt is None or arena.adapt.threads != threads:
                arena.adapt = AdaptiveThreads(threads)
        else:
            arena.adapt = None
        if not arena.context:
            entry = self._entry
            arena.context = entry.context(threads)
            weakref.finalize(arena, entry.destroy, arena.context)
        elif arena.threads != threads:
            self._entry.set_threads(arena.context, threads)
        arena.threads = threads
        return arena.context

    def _run_kernels(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        with self._arena() as arena:
            vals = self._values(inputs, arena)
            if arena.bound is None:  # kernels on planned buffers and constants only: bound once
                arena.bound = [k.module.bind(*(vals[v] for v in k.args))
                               if not self._inputs.intersection(k.args) else None
                               for k in self.kernels]
            for kern, call in zip(self.kernels, arena.bound):
                try:
                    if call is not None:
                        call()
                    else:
                        kern.module(*(vals[v] for v in kern.args))
                except KernelFailure as exc:  # say which node
                    raise kernel_failure(kern, exc.status) from None
            return [np.array(vals[o]) for o in self.graph.outputs]

    def time(self, inputs: dict[str, Any], repeat: int = 10, min_s: float = 0.5,
             stat: str = "median") -> float:
        """Seconds of one run (after a warm-up), inputs bound once: the median (or, with
        ``stat="min"``, the fastest) of at least ``repeat`` runs lasting ``min_s`` in all."""
        with self.bound_call(inputs) as call:
            return time_calls([call], repeat, min_s, stat)

    @contextmanager
    def bound_call(self, inputs: dict[str, Any]) -> Iterator[Callable[[], None]]:
        """One whole run of the model on ``inputs`` (bound once, outputs discarded) as a
        call, while the block runs: what ``time`` times, for timing loops of one's own (two
        models' runs interleaved, e.g.)."""
        if self._entry is None:
            with self.bound(inputs) as calls:
                def run_all() -> None:
                    for c in calls:
                        c()

                yield run_all
            return
        with self._arena() as arena:
            entry = self._entry
            _, _, pointers = bound = self._native_arguments(inputs)
            run, message = self._native_call(arena, entry, pointers), entry.message

            def call() -> None:
                status = run()
                if status:
                    raise RuntimeError_(message(status).decode())

            yield call
            del bound  # the arrays the pointers point to lived until here

    def set_threads(self, n: int | None) -> None:
        """Run the kernels' parallel loops on ``n`` threads (None: the target's cores, as
        ``llvm -num-cores=N`` says, or one while one runs faster: graph/threads.py); the
        tuned schedules stay those of the target's count."""
        self.num_threads = n
        for k in self.kernels:
            if hasattr(k.module, "num_threads"):
                k.module.num_threads = n

    def kernel_times(self, inputs: dict[str, Any], repeat: int = 20) -> list[tuple[str, float]]:
        """(task name, median seconds) per kernel in execution order, each timed in place
        while the whole model runs ``repeat`` times (after a warm-up): caches and DRAM traffic
        as in a real run, so the times add up to about ``time()``."""
        med = self.kernel_seconds(inputs, repeat)
        return [(k.task.name, float(t)) for k, t in zip(self.kernels, med)]

    def kernel_seconds(self, inputs: dict[str, Any], repeat: int = 20,
                       modules: Sequence[Any] | None = None) -> np.ndarray:
        """Median seconds of each kernel in execution order, timed in place while the whole
        model runs ``repeat`` times after a warm-up run. ``modules``: other modules of the
        same tasks in kernel order (other schedules), to time them in this model."""
        with self.bound(inputs, modules) as calls:
            return call_times(calls, repeat)

    def run_seconds(self, inputs: dict[str, Any], repeat: int = 20,
                    modules: Sequence[Any] | None = None) -> float:
        """Seconds of the whole run, ``repeat`` runs after a warm-up (``modules`` as for
        kernel_seconds): on a CPU the kernels' in-place times add up to it."""
        return float(np.sum(self.kernel_seconds(inputs, repeat, modules)))

    @contextmanager
    def bound(self, inputs: dict[str, Any], modules: Sequence[Any] | None = None
              ) -> Iterator[list[Callable[[], None]]]:
        """Every kernel bound to ``inputs`` and an arena's buffers, in execution order, while
        the block runs. ``modules``: other modules for the same kernels in the same order
        (other schedules of their tasks), to time them in this model."""
        mods = [k.module for k in self.kernels] if modules is None else list(modules)
        if len(mods) != len(self.kernels):
            raise ValueError(f"{len(mods)} modules for {len(self.kernels)} kernels")
        with self._arena() as arena:
            vals = self._values(inputs, arena)
            yield [m.bind(*(vals[v] for v in k.args)) for k, m in zip(self.kernels, mods)]

    def summary(self) -> str:
        lines = [f"{len(self.kernels)} kernels, {len(self.aliases)} reshapes as views, "
                 f"{self.peak_bytes / 1e6:.1f} MB intermediate memory"]
        for k in self.kernels:
            lines.append(f"  {k.task.name}: {', '.join(k.args)}")
        return "\n".join(lines)
