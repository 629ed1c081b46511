"""Running a compiled graph on the GPU: every intermediate stays on the device.

Device buffers come from the same static memory plan as on the CPU (graph/memory.py); constants
are copied to the device once, when the model is built; a run copies the inputs in, launches
every kernel back to back (no synchronisation between them) and copies the outputs out. Needs
pycuda (imported on first use: ``import autosched`` works without it).

Calls from several threads are serialised by a lock: the device buffers are one set, and the
GPU runs one model's kernels at a time anyway. Each call makes the model's CUDA context current
on its thread (a context is current only on the thread that pushed it).

Tasks whose kernels check something at run time (a Gather index) each get a status word of one
device array, cleared before the launches of a run and read with the outputs; a failure raises
one line naming the task and the node, as on the CPU. Models without checks read nothing.

The launches of a run are recorded once, at the first run, as a CUDA graph
(targets/cuda/graphs.py; the device buffers never move, so the graph stays bound to them) and
replayed with one driver call on every run after it: pycuda's per-launch Python and driver
overhead is paid once. Where recording fails (a driver before CUDA 11.4), runs launch each
kernel as before, and ``graph_failure`` says why. ``time(..., graphs=False)`` times the
launches one by one, for comparison.

Example::

    model = aus.compile(graph, target="cuda")
    (y,) = model.run({"x": x})                 # numpy in, numpy out
    print(model.time({"x": x}) * 1e3, "ms")    # CUDA events around the kernels only
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from autosched.errors import RuntimeError_
from autosched.graph.executor import allocate, check_inputs, described, kernel_failure, workspace
from autosched.graph.graph import Graph
from autosched.graph.memory import memory_layout, nbytes
from autosched.targets.cuda import graphs
from autosched.targets.cuda.dtypes import host_bits
from autosched.targets.cuda.runtime import Launch, StatusWords
from autosched.targets.target import Target


class CudaModel:
    """Kernels over device buffers. ``run`` takes {input name: numpy array} and returns the
    outputs (numpy) in graph output order."""

    def __init__(self, graph: Graph, kernels: list[Any], target: Target,
                 constants: dict[str, np.ndarray], aliases: dict[str, str] | None = None):
        from autosched.targets.cuda import runtime as rt

        self.drv = drv = rt.driver()
        self._context = rt.context()
        self._lock = threading.Lock()
        self.graph = graph
        self.kernels = kernels
        self.target = target
        self.constants = constants
        steps = [(k.args[: k.n_inputs], k.args[k.n_inputs:]) for k in kernels]
        self.aliases = dict(aliases or {})
        offsets, self.peak_bytes = memory_layout(graph, steps, self.aliases)
        self._workspace = allocate(workspace(graph, offsets), max(self.peak_bytes, 1),
                                   self._mem_alloc)
        base = int(self._workspace)  # kept alive by self._workspace
        self.storage = {v: base + at for v, at in offsets.items()}  # device addresses
        self.device: dict[str, Any] = dict(self.storage)
        for a, src in self.aliases.items():  # a reshape reads the same bytes
            self.device[a] = self.storage[src]
        for v in graph.inputs:
            self.device[v.name] = allocate(described(v), nbytes(v), self._mem_alloc)
        used = {a for k in kernels for a in k.args}
        self.constant_bytes = 0
        for name, arr in constants.items():
            if name in used and name not in self.device:
                host = np.asarray(arr, order="C")
                buf = drv.mem_alloc(max(host.nbytes, 1))
                drv.memcpy_htod(buf, host_bits(host))
                self.device[name] = buf
                self.constant_bytes += host.nbytes
        # a status word for each task whose kernels check, in this order
        self._checked = [k for k in kernels if k.module.checks]
        status = StatusWords(len(self._checked)) if self._checked else None
        self._status = status
        words = {id(k): status.address(n) for n, k in enumerate(self._checked)} if status else {}
        # launches prepared once, each with the name of its task
        self._keep: list[Any] = []
        per_kernel = self._bind([k.module for k in kernels], words, self._keep)
        self._launches = [(launch, k.task.name)
                          for k, calls in zip(kernels, per_kernel) for launch in calls]
        self._graph: graphs.Graph | None = None  # recorded at the first run
        self.graph_failure: str | None = None  # why runs launch one by one

    def _bind(self, modules: Sequence[Any], words: dict[int, int], keep: list[Any]
              ) -> list[list[Launch]]:
        """The launches of each kernel by ``modules`` (its own, or other modules of the same
        tasks, in kernel order) bound to the device buffers and status words; what they need
        alive goes to ``keep``."""
        if len(modules) != len(self.kernels):
            raise ValueError(f"{len(modules)} modules for {len(self.kernels)} kernels")
        out = []
        for k, m in zip(self.kernels, modules):
            launches = m.launches(*(self.device[a] for a in k.args), status=words.get(id(k)))
            keep.append(launches.keep)
            out.append(list(launches.calls))
        return out

    def kernel_seconds(self, inputs: dict[str, Any], repeat: int = 20,
                       modules: Sequence[Any] | None = None) -> np.ndarray:
        """Median seconds of each kernel in execution order, timed in place while the whole
        model runs ``repeat`` times after a warm-up run, by CUDA events between the kernels.
        The run with its events is recorded as one CUDA graph, so the times are the GPU's
        alone, without the gaps of launching from Python (as a model's replayed run); where
        recording fails, the kernels launch one by one. ``modules``: other modules of the same
        tasks in kernel order (other schedules), to time them in this model."""
        return self._timed(inputs, repeat, modules, each=True)

    def run_seconds(self, inputs: dict[str, Any], repeat: int = 20,
                    modules: Sequence[Any] | None = None) -> float:
        """Median seconds of the whole run, ``repeat`` replays after a warm-up, with events
        only before the first kernel and after the last: the kernels back to back as a
        replayed run launches them (events between them add time of their own and keep each
        kernel from starting before the last one's event). ``modules`` as for
        kernel_seconds."""
        return float(self._timed(inputs, repeat, modules, each=False)[0])

    def _timed(self, inputs: dict[str, Any], repeat: int, modules: Sequence[Any] | None,
               each: bool) -> np.ndarray:
        """Median seconds of each kernel (``each``), or of the whole run as one entry."""
        with self._exclusive():
            self._copy_in(inputs)
            mods = [k.module for k in self.kernels] if modules is None else list(modules)
            status = StatusWords(len(mods)) if any(m.checks for m in mods) else None
            words = ({id(k): status.address(n) for n, k in enumerate(self.kernels)}
                     if status is not None else {})
            keep: list[Any] = []
            per_kernel = self._bind(mods, words, keep)
            if not each:  # one span: every launch of the run
                per_kernel = [[launch for calls in per_kernel for launch in calls]]
            if status is not None:
                status.clear()
            runs = None
            if self.graph_failure is None:
                try:
                    runs = self._timed_graph(per_kernel, repeat)
                except (RuntimeError_, self.drv.Error):
                    runs = None
            if runs is None:
                runs = self._timed_launches(per_kernel, repeat)
            if status is not None:
                _raise_reported(self.kernels, status)
            return np.median(np.array(runs), axis=0)

    def _timed_graph(self, per_kernel: list[list[Launch]], repeat: int) -> list[list[float]]:
        """Seconds per span of ``repeat`` replays (after one) of a recording of the launches
        with an event node after each span (a kernel's launches, or the whole run's)."""
        api = getattr(self.drv, "graphs", None) or graphs.graph_driver()
        events = [api.create_event() for _ in range(len(per_kernel) + 1)]
        try:
            def enqueue(stream: Any) -> None:
                api.record_event(events[0], stream.handle)
                for calls, event in zip(per_kernel, events[1:]):
                    for launch in calls:
                        launch.enqueue(stream)
                    api.record_event(event, stream.handle)

            graph = graphs.record(self.drv, enqueue, api)
            try:
                runs = []
                for r in range(repeat + 1):
                    graph.launch()
                    api.synchronize_event(events[-1])
                    if r:
                        runs.append([api.elapsed(a, b) for a, b in zip(events, events[1:])])
                return runs
            finally:
                graph.close()
        finally:
            for event in events:
                api.destroy_event(event)

    def _timed_launches(self, per_kernel: list[list[Launch]], repeat: int
                        ) -> list[list[float]]:
        """Seconds per span (as _timed_graph) of ``repeat`` runs (after one), each kernel
        launched from here: a kernel shorter than its launch also counts the gap before the
        next."""
        events = [self.drv.Event() for _ in range(len(per_kernel) + 1)]
        runs = []
        for r in range(repeat + 1):
            events[0].record()
            for calls, event in zip(per_kernel, events[1:]):
                for launch in calls:
                    launch()
                event.record()
            events[-1].synchronize()
            if r:
                runs.append([a.time_till(b) / 1e3 for a, b in zip(events, events[1:])])
        return runs

    def _clear_status(self) -> None:
        if self._status is not None:
            self._status.clear()

    def _check_status(self) -> None:
        """Raise for the first task whose kernels reported a failure, naming its node."""
        if self._status is not None:
            _raise_reported(self._checked, self._status)

    def _launch(self, sync_each: bool = False) -> None:
        drv = self.drv
        for launch, task in self._launches:
            try:
                launch()
                if sync_each:
                    drv.Context.synchronize()
            except drv.Error as exc:
                raise RuntimeError_(f"task {task}: kernel {launch.name} (grid {launch.grid}, "
                                    f"block {launch.block}) failed: {exc}") from exc

    def _run_kernels(self, graph: bool = True) -> None:
        """The launches of one run on the legacy default stream: the recorded graph (recorded
        at the first call), or, with ``graph`` false or where recording failed, each launch."""
        if graph and self.graph_failure is None and self._graph is None:
            try:  # a stand-in driver brings its own graph functions
                self._graph = graphs.record(self.drv, self._enqueue,
                                            getattr(self.drv, "graphs", None))
            except (RuntimeError_, self.drv.Error) as exc:
                self.graph_failure = str(exc)
        if graph and self._graph is not None:
            self._graph.launch()
        else:
            self._launch()

    def _enqueue(self, stream: Any) -> None:
        for launch, _ in self._launches:
            launch.enqueue(stream)

    def __del__(self) -> None:
        graph = getattr(self, "_graph", None)
        if graph is not None:
            try:
                with self._exclusive():
                    graph.close()
            except Exception:  # noqa: BLE001  the context or the interpreter is going away
                pass

    def _mem_alloc(self, n: int) -> Any:
        """Device memory; the driver's out-of-memory error as Python's, which ``allocate``
        turns into a line naming the value."""
        try:
            return self.drv.mem_alloc(n)
        except getattr(self.drv, "MemoryError", MemoryError) as exc:
            raise MemoryError(str(exc)) from None

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """The device buffers to this call alone, with the model's context current."""
        with self._lock:
            if self._context is None:  # a stand-in driver without contexts
                yield
                return
            self._context.push()
            try:
                yield
            finally:
                self.drv.Context.pop()

    def _copy_in(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        host = check_inputs(self.graph, inputs)
        for name, a in host.items():
            self.drv.memcpy_htod(self.device[name], a)
        return host

    def run(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        with self._exclusive():
            return self._run(inputs)

    def _run(self, inputs: dict[str, Any]) -> list[np.ndarray]:
        host = self._copy_in(inputs)
        drv = self.drv
        self._clear_status()
        self._run_kernels()
        try:
            drv.Context.synchronize()
        except drv.Error:  # find the kernel that faulted
            self._launch(sync_each=True)
            raise
        self._check_status()
        outs = []
        for o in self.graph.outputs:
            info = self.graph.values[o]
            if o in host:
                outs.append(host[o].copy())
            elif o in self.constants and o not in self.device:
                outs.append(np.array(self.constants[o]))
            else:
                a = np.empty(info.shape, info.dtype)
                drv.memcpy_dtoh(a, self.device[o])
                outs.append(a)
        return outs

    def time(self, inputs: dict[str, Any], repeat: int = 20, warmup: int = 3,
             graphs: bool = True) -> float:
        """Median seconds of the kernels of one run (CUDA events; inputs copied in once):
        the graph replayed, or with ``graphs`` false each kernel launched."""
        with self._exclusive():
            return self._time(inputs, repeat, warmup, graphs)

    def _time(self, inputs: dict[str, Any], repeat: int, warmup: int, graph: bool) -> float:
        self._copy_in(inputs)
        drv = self.drv
        self._clear_status()
        for _ in range(warmup):
            self._run_kernels(graph)
        drv.Context.synchronize()
        start, end = drv.Event(), drv.Event()
        samples = []
        for _ in range(repeat):
            start.record()
            self._run_kernels(graph)
            end.record()
            end.synchronize()
            samples.append(start.time_till(end) / 1e3)
        self._check_status()
        return statistics.median(samples)

    def summary(self) -> str:
        replay = (f"launched one by one ({self.graph_failure})" if self.graph_failure else
                  "replayed as one CUDA graph" if self._graph else
                  "to be recorded as one CUDA graph at the first run")
        return (f"{len(self.kernels)} tasks, {len(self._launches)} CUDA kernels {replay}, "
                f"{self.peak_bytes / 1e6:.1f} MB intermediates and "
                f"{self.constant_bytes / 1e6:.1f} MB constants on the device")


def _raise_reported(kernels: Sequence[Any], status: StatusWords) -> None:
    """Raise for the first of ``kernels`` (word n of ``status`` is kernel n's) whose
    launches reported a failure, naming its node."""
    for kernel, word in zip(kernels, status.read()):
        if word:
            raise kernel_failure(kernel, int(word))
