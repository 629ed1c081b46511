"""The process that builds or runs candidates for Measurer (started isolated by measure.py).

The parent talks to it over a socket (multiprocessing Connection on file descriptor FD), one
message at a time. A worker is persistent: it receives a task once (pickled) and then many
candidates. It dies with the parent (PR_SET_PDEATHSIG) and writes a faulthandler traceback to
its stderr (a file the parent reads when the worker dies).

The messages and their replies are the types of protocol.py.
"""

from __future__ import annotations

import ctypes
import faulthandler
import math
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from autosched.errors import AutoschedError, LowerError, RuntimeError_, ScheduleError
from autosched.search import protocol as P
from autosched.search.device_lock import device_lock
from autosched.search.protocol import MeasureOptions
from autosched.targets import backend as backends
from autosched.targets.arrays import aligned_copy, aligned_empty
from autosched.targets.backend import DeviceMemory, Module
from autosched.targets.status import KernelFailure
from autosched.targets.target import Target
from autosched.te import dtype as dt
from autosched.te.tensor import PlaceholderOp

# Tolerances (rtol, atol relative to the largest reference magnitude) per dtype kind: float32
# reductions reordered by a schedule differ from the default order by a few ulps per term.
TOLERANCES = {"float16": (2e-2, 2e-3), "bfloat16": (5e-2, 1e-2), "float32": (1e-3, 1e-4),
              "float64": (1e-7, 1e-9)}


class _Fail(Exception):
    """An expected failure: the Failed reply (with the error code name for the record)."""

    def __init__(self, code: str, msg: str, **kw: Any):
        super().__init__(msg)
        self.reply = P.Failed(code, msg, **kw)


class _TaskState:
    def __init__(self, task: Any):
        self.task = task
        self.inputs: list[np.ndarray | None] | None = None  # by argument position; None = output
        self.reference: list[np.ndarray] | None = None     # outputs of the default schedule
        self.device_inputs: dict[int, Any] = {}            # on a device: inputs uploaded once
        self.space: Any = None                             # its SearchSpace, made on first use


def random_inputs(task: Any, rng: np.random.Generator) -> list[np.ndarray | None]:
    """Fresh random arrays for the placeholders (never zeros); None for computed arguments."""
    out: list[np.ndarray | None] = []
    for t in task.args:
        if not isinstance(t.op, PlaceholderOp):
            out.append(None)
            continue
        shape, dtype = tuple(int(d) for d in t.shape), np.dtype(t.dtype)
        arr: np.ndarray
        if _floating(dtype):
            arr = rng.uniform(-1.0, 1.0, shape)
        elif dtype.kind == "i":
            arr = rng.integers(-8, 9, shape)
        elif dtype.kind == "u":
            arr = rng.integers(1, 16, shape)
        elif dtype.kind == "b":
            arr = rng.random(shape) < 0.5
        else:
            raise RuntimeError_(f"cannot make random inputs of dtype {dtype} for {t.name}")
        out.append(np.asarray(arr, dtype=dtype, order="C"))
    return out


def default_module(task: Any, built: bytes | None) -> Any:
    """``task``'s default schedule as a module: ``built`` (a build worker's pickled artifact of
    it, shipped with the reference request) when given, else compiled here."""
    if built is not None:
        return pickle.loads(built)
    from autosched.driver import build_func

    return build_func(task.lower(task.schedule()), task.target)


def unwritten_output(t: Any) -> np.ndarray:
    """An array for the computed argument ``t`` filled with NaN (or a sentinel), so that an
    element the kernel does not write cannot pass the check."""
    dtype = np.dtype(t.dtype)
    arr = aligned_empty(tuple(int(d) for d in t.shape), dtype)
    arr[...] = np.nan if _floating(dtype) else (True if dtype.kind == "b" else 77)
    return arr


def _floating(dtype: np.dtype) -> bool:
    """numpy floats, and bfloat16 (an ml_dtypes type numpy files under kind "V")."""
    return dtype.kind in "fc" or dtype.name in dt.STORAGE_TYPES


def compare(name: str, got: np.ndarray, want: np.ndarray, precision: str = "fp32"
            ) -> str | None:
    """None when ``got`` matches ``want`` within the tolerance of its dtype and of the task's
    ``precision`` (the looser of the two), else what differs."""
    if got.shape != want.shape:
        return f"output {name} has shape {got.shape}, the reference {want.shape}"
    if not _floating(want.dtype):
        bad = got != want
        if not bad.any():
            return None
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"output {name}: {int(bad.sum())} of {want.size} elements differ; first at "
                f"{first}: got {got[first]}, expected {want[first]}")
    rtol, atol = TOLERANCES.get(str(want.dtype), TOLERANCES["float32"])
    if precision != dt.DEFAULT_PRECISION:  # fp32: each dtype's own bound (float64's tight one)
        p = dt.precision(precision)
        rtol, atol = max(rtol, p.rtol), max(atol, p.atol)
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    scale = float(np.abs(w[finite]).max()) if finite.any() else 1.0
    err = np.abs(g - w)
    # NaN / inf where the reference has them must be matched exactly
    special_bad = ~finite & ~((np.isnan(w) & np.isnan(g)) | (w == g))
    bad = (finite & ~(err <= rtol * np.abs(w) + atol * max(scale, 1.0))) | special_bad
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    max_err = float(np.nanmax(np.where(finite, err, 0.0))) if finite.any() else math.nan
    nans = int(np.isnan(g[finite]).sum())
    return (f"output {name}: {int(bad.sum())} of {want.size} elements differ beyond rtol={rtol} "
            f"atol={atol}*{max(scale, 1.0):.3g}; max abs error {max_err:.4g}"
            + (f" ({nans} NaN where the reference is finite: unwritten?)" if nans else "")
            + f"; first at {first}: got {got[first]}, expected {want[first]}")


def _segfault() -> None:
    ctypes.string_at(0)


# Test hooks that play someone else killing or stopping the worker (the OOM killer, a user).
_OUTSIDE = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigstop": signal.SIGSTOP}


def _hook(name: str | None, stage: str) -> None:
    """Test-only misbehaviour at ``stage`` ("build" or "run"), asked for by
    Measurer.measure(test_hooks=...) as "<stage>_<kind>"."""
    name = name or ""
    if not name.startswith(f"{stage}_"):
        return
    kind = name[len(stage) + 1:].removesuffix("_once")
    if kind == "hang":
        time.sleep(3600)
    elif kind == "segfault":
        _segfault()
    elif kind == "exit":
        os._exit(3)
    elif kind == "raise":
        raise ValueError(f"test hook {name}: an unexpected error")
    elif kind in _OUTSIDE:
        os.kill(os.getpid(), _OUTSIDE[kind])
        time.sleep(3600)  # a stopped worker never gets here before the parent's timeout


# -- the server --------------------------------------------------------------------------------


class Server:
    def __init__(self, conn: Connection):
        self.conn = conn
        self.tasks: dict[int, _TaskState] = {}
        self._flush: np.ndarray | None = None
        self._memories: dict[Target, DeviceMemory | None] = {}

    def serve(self) -> None:
        self.conn.send(P.Ready(os.getpid()))
        handlers: dict[type, Callable[[Any], Any]] = {
            P.Lower: self._lower, P.Build: self._build, P.Reference: self._reference,
            P.Run: self._run}
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return
            if isinstance(msg, P.Stop):
                return
            if isinstance(msg, P.LoadTask):
                self.tasks[msg.token] = _TaskState(pickle.loads(msg.task))
                continue
            if isinstance(msg, P.SetState):
                st = self.tasks[msg.token]
                st.inputs, st.reference, st.device_inputs = msg.inputs, msg.reference, {}
                continue
            try:
                reply = handlers[type(msg)](msg)
            except _Fail as f:
                reply = f.reply
            except Exception:
                tb = traceback.format_exc()
                strict = not isinstance(msg, P.Lower) and msg.options.strict
                reply = P.Bug(tb) if strict else P.Failed("UNKNOWN", tb)
            self.conn.send(reply)
            if isinstance(reply, P.Failed) and reply.restart:
                return  # e.g. a CUDA context poisoned by a faulting kernel: start afresh

    # -- lower (for the search: the cost model's features of many candidates) --------------
    def _lower(self, msg: P.Lower) -> P.LoweredBatch:
        from autosched.cost_model.features import extract_features
        from autosched.search.space import Candidate, SearchSpace

        st = self.tasks[msg.token]
        if st.space is None:
            st.space = SearchSpace(st.task)
        out: list[tuple[str, np.ndarray] | None] = []
        for d in msg.candidates:
            c = Candidate.from_dict(d)
            low = st.space.lower(c) if st.space.knows(c) else None
            out.append(None if low is None else
                       (low.ir_hash, extract_features(low.func, st.task.target)))
        return P.LoweredBatch(out)

    # -- build ----------------------------------------------------------------------------
    def _build(self, msg: P.Build) -> P.Built:
        from autosched.driver import build_func
        from autosched.schedule.steps import step_from_dict
        from autosched.search.record import ir_hash

        task = self.tasks[msg.token].task
        t0 = time.perf_counter()
        try:
            steps = [step_from_dict(d) for d in msg.steps]
            sch = task.schedule(steps)
            func = task.lower(sch)
        except (ScheduleError, LowerError, AutoschedError) as exc:
            raise _Fail("LOWER_ERROR", f"{type(exc).__name__}: {exc}") from None
        h = ir_hash(func)
        try:
            _hook(msg.hook, "build")
            mod = build_func(func, task.target)
            # a module pickles as what the run worker needs to load it: object code (re-JIT,
            # ~1 ms), source + cubin, or the loop IR (the evaluator renders it again)
            artifact = pickle.dumps(mod)
        except AutoschedError as exc:
            raise _Fail("COMPILE_ERROR", f"{type(exc).__name__}: {exc}", ir_hash=h,
                        build_time=time.perf_counter() - t0) from None
        return P.Built(h, time.perf_counter() - t0, artifact)

    # -- reference --------------------------------------------------------------------------
    def _reference(self, msg: P.Reference) -> P.ReferenceOutputs:
        st = self.tasks[msg.token]
        st.inputs, st.reference, st.device_inputs = msg.inputs, None, {}
        task = st.task
        try:
            mod = default_module(task, msg.artifact)
            args = self._args(st)
            mod(*args)
        except AutoschedError as exc:
            raise _Fail("RUNTIME_ERROR", f"the default schedule of {task.name} failed: "
                        f"{type(exc).__name__}: {exc}") from None
        st.reference = [self._host(st, a) for a, x in zip(args, msg.inputs) if x is None]
        return P.ReferenceOutputs(st.reference)

    # -- run --------------------------------------------------------------------------------
    def _run(self, msg: P.Run) -> P.Ran:
        st = self.tasks[msg.token]
        memory = self._memory(st.task.target)
        opts = msg.options
        try:
            mod = pickle.loads(msg.artifact)
        except AutoschedError as exc:
            raise _Fail("COMPILE_ERROR", f"loading the built module: {exc}") from None
        try:
            args = self._args(st)
            _hook(msg.hook, "run")
            if opts.check and st.reference is not None:
                mod(*args)
                self._check(st, args, corrupt=msg.hook == "corrupt")
                self.conn.send(P.Beat())
            costs = self._time(mod, args, opts, st.task.target)
        except RuntimeError_ as exc:
            # a device context may be poisoned by a faulting kernel: start afresh, unless the
            # kernel itself reported the failure through its status word (the context is fine)
            restart = memory is not None and not isinstance(exc, KernelFailure)
            raise _Fail("RUNTIME_ERROR", str(exc), restart=restart) from None
        except _Fail:
            raise
        except Exception as exc:
            if memory is not None and memory.is_device_error(exc):
                raise _Fail("RUNTIME_ERROR", f"device: {exc}", restart=True) from None
            raise
        return P.Ran(costs)

    def _check(self, st: _TaskState, args: list, corrupt: bool) -> None:
        assert st.inputs is not None and st.reference is not None
        outs = [(a, t) for a, t, x in zip(args, st.task.args, st.inputs) if x is None]
        for (arr, t), want in zip(outs, st.reference):
            got = self._host(st, arr)
            if corrupt:
                got = got.copy()
                got.flat[got.size // 2] += 1 if got.dtype.kind != "b" else True
            problem = compare(t.name, got, want, st.task.precision)
            if problem:
                raise _Fail("WRONG_ANSWER", problem)

    def _time(self, mod: Module, args: list, opts: MeasureOptions, target: Target
              ) -> list[float]:
        """The candidate's seconds per call, ``opts.repeat`` times, while no other process
        of this machine times anything on the same device (waiting meanwhile sends beats, so
        the tuner's run timeout counts the timing alone)."""
        memory, flush_bytes = self._memory(target), target.backend.flush_bytes(target)
        number = opts.number
        with device_lock(target, waiting=lambda: self.conn.send(P.Beat())):
            first = mod.time(*args, number=1, repeat=1, warmup=1).median
            self.conn.send(P.Beat())
            if number is None:
                min_s = opts.min_repeat_ms * 1e-3
                number = 1 if first <= 0 else min(10**6, max(1, math.ceil(min_s / first)))
            costs = []
            for _ in range(opts.repeat):
                if opts.flush_cache:
                    self._flush_caches(memory, flush_bytes)
                costs.append(mod.time(*args, number=number, repeat=1, warmup=0).median)
                self.conn.send(P.Beat())
        return costs

    def _flush_caches(self, memory: DeviceMemory | None, nbytes: int) -> None:
        if memory is not None:
            memory.flush_caches(nbytes)
            return
        if self._flush is None or self._flush.nbytes != nbytes:
            self._flush = np.ones(nbytes // 8, dtype=np.int64)
        # read and write every line: evicts the kernel's data from every cache level
        np.add(self._flush, 1, out=self._flush)

    def _memory(self, target: Target) -> DeviceMemory | None:
        """Where the target's arguments live (None: host arrays), one per target."""
        if target not in self._memories:
            self._memories[target] = target.backend.device_memory(target)
        return self._memories[target]

    # -- arguments ---------------------------------------------------------------------------
    def _args(self, st: _TaskState) -> list:
        """Fresh argument arrays: copies of the inputs (a bad kernel may scribble on them) and
        outputs filled with NaN (or a sentinel), so an unwritten element cannot pass. On a
        device, the inputs are uploaded once per task."""
        assert st.inputs is not None
        memory = self._memory(st.task.target)
        args: list[Any] = []
        for n, (t, x) in enumerate(zip(st.task.args, st.inputs)):
            if x is not None and memory is not None:
                if n not in st.device_inputs:
                    st.device_inputs[n] = memory.to_device(x)
                args.append(st.device_inputs[n])
                continue
            if x is None:
                arr = unwritten_output(t)
            else:
                arr = aligned_copy(x)
            args.append(arr if memory is None else memory.to_device(arr))
        return args

    def _host(self, st: _TaskState, arr: Any) -> np.ndarray:
        memory = self._memory(st.task.target)
        return arr if memory is None else memory.to_host(arr)



def die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: no orphan spinning in a hung kernel
    except (OSError, AttributeError):
        pass


def _preload(kind: str) -> None:
    """Import what builds and runs need before saying ready, so the first candidate's build
    time is not the import time."""
    import autosched.driver  # noqa: F401
    import autosched.schedule.lower  # noqa: F401
    import autosched.search.record  # noqa: F401

    backends.get(kind).preload()


def main(argv: list[str]) -> None:
    fd, kind = int(argv[1]), argv[2] if len(argv) > 2 else "llvm"
    die_with_parent()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    conn = Connection(fd)
    _preload(kind)
    Server(conn).serve()


if __name__ == "__main__":
    main(sys.argv)
