"""Honest measurement of candidate schedules: build in parallel, run one at a time, check.

Builds happen in a pool of persistent worker processes (lower + compile; a build that hangs
past ``build_timeout`` or crashes is killed, recorded and its worker replaced). Runs happen
afterwards, one candidate at a time, in one more worker process that owns the module (and the
CUDA context on GPUs), so a crash of generated code is recorded as CRASH instead of killing the
tuner, and no build ever overlaps a timed run. Each candidate's output is checked against the
task's default schedule on the same fresh random inputs; timing uses a warm-up, ``number``
calls per repeat (chosen so a repeat lasts ``min_repeat_ms``) and ``repeat`` repeats, flushing
the caches between repeats.

Workers are fresh interpreters (not multiprocessing's fork or spawn: fork is unsafe in a
process with OpenMP / XGBoost threads, spawn re-imports the user's main script), with
the OpenMP wait policy compiled models run with (``llvm.compile.default_wait_policy``:
a short spin unless the user set one) and BLAS threads off. They start isolated (``python -I``), take the
parent's sys.path without its current directory (so a ``traceback.py`` lying where someone runs
``autosched tune`` is never imported), load this very autosched from its directory, and run in
a private empty directory.

A worker that dies by a signal of its own doing (SIGSEGV, SIGBUS, SIGFPE, SIGILL from generated
code, an abort) is the candidate's fault: CRASH. One killed from outside (SIGKILL from the OOM
killer, SIGTERM / SIGINT / SIGHUP / SIGQUIT from someone else) or stopped (SIGSTOP) says nothing
of the candidate: it is retried once in a fresh worker, and if that is cut short too the result
is ``transient`` (recorded as WORKER_KILLED, which a resumed job measures again).

Only expected failures are recorded (autosched errors, timeouts, worker death); in ``strict``
mode (tests) an unexpected exception inside a worker is raised here as UnexpectedWorkerError.

Example::

    with Measurer(parse("llvm"), repeat=3, min_repeat_ms=50) as m:
        results = m.measure(task, [sch1, sch2.steps])
    results[0].error_code, results[0].cost      # ErrorCode.NO_ERROR, seconds (median)
    RecordLog("tuning_logs/mm.jsonl").append(records_from(task, [sch1, sch2], results))
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import pickle
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar, cast

import numpy as np

from autosched.errors import MeasureError
from autosched.schedule.schedule import Schedule
from autosched.schedule.steps import Step
from autosched.search import protocol as P
from autosched.search.error_codes import ErrorCode
from autosched.search.protocol import MeasureOptions
from autosched.search.record import MAX_ERROR_MSG, fingerprint_key, records_from
from autosched.search.task import Task
from autosched.targets.llvm.compile import default_wait_policy
from autosched.targets.target import Target

__all__ = ["ErrorCode", "MeasureOptions", "MeasureResult", "Measurer", "UnexpectedWorkerError",
           "records_from"]

STARTUP_TIMEOUT = 120.0  # seconds for a fresh worker to import autosched and say ready


class UnexpectedWorkerError(Exception):
    """A worker hit an exception autosched does not expect (a bug); raised in strict mode.
    Deliberately not an AutoschedError, so a search loop catching those does not swallow it."""


@dataclass(frozen=True)
class MeasureResult:
    """The outcome of measuring one candidate.

    ``costs`` holds seconds per call, one per repeat (empty on error); ``build_time`` and
    ``run_time`` are the wall seconds of its build and of its run round trip.
    """

    costs: tuple[float, ...]
    error_code: ErrorCode
    error_msg: str = ""
    build_time: float = 0.0
    run_time: float = 0.0
    timestamp: float = 0.0
    ir_hash: str = ""
    transient: bool = False  # cut short from outside (worker killed or stopped), not measured
    emulated: bool = False  # run under an emulator (qemu): checked, but its costs are no timing

    @property
    def ok(self) -> bool:
        return self.error_code is ErrorCode.NO_ERROR and bool(self.costs)

    @property
    def cost(self) -> float:
        """Median seconds per call; inf on error."""
        return statistics.median(self.costs) if self.ok else float("inf")


def failed_result(code: ErrorCode, msg: str, **kw: Any) -> MeasureResult:
    """The result of a candidate that failed with ``code`` (the message cut to what a record
    keeps), stamped now."""
    return MeasureResult((), code, msg[-MAX_ERROR_MSG:] if len(msg) > MAX_ERROR_MSG else msg,
                         timestamp=time.time(), **kw)


# -- worker processes -------------------------------------------------------------------------


class _Died(Exception):
    pass


class _TimedOut(Exception):
    pass


# Signals that kill a worker from outside (the OOM killer's SIGKILL, a user's or a scheduler's
# SIGTERM / SIGINT / SIGHUP / SIGQUIT); generated code raises SIGSEGV, SIGBUS, SIGFPE, SIGILL or
# SIGABRT itself, never these.
OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                             signal.SIGQUIT})

# What an isolated worker runs first (argv: ENTRY AUTOSCHED_DIR PATHS_JSON ARGS...): the
# parent's sys.path in its order but without the current directory, then autosched loaded from
# the parent's package directory (not whichever copy the path finds first), then ENTRY's
# main([argv0, ARGS...]). The parent's __main__ is never imported (a script without a main
# guard would run again).
_BOOT = """\
import importlib, importlib.util, json, sys
entry, root, paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[:] = paths + [p for p in sys.path if p not in paths]
spec = importlib.util.spec_from_file_location(
    "autosched", root + "/__init__.py", submodule_search_locations=[root])
sys.modules["autosched"] = module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
importlib.import_module(entry).main([sys.argv[0], *sys.argv[4:]])
"""


def isolated_argv(entry: str, *args: str) -> list[str]:
    """The command line of a worker process that runs ``entry``'s ``main`` with ``args`` on
    this autosched, importing nothing from the current directory."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this autosched
    cwd = os.path.realpath(os.getcwd())
    # the parent's current directory ("" or its path) is left out: hostile files would lie
    # there; the other entries are where the parent itself imports from
    paths = [p for p in sys.path if p and os.path.isabs(p) and os.path.realpath(p) != cwd]
    return [sys.executable, "-I", "-c", _BOOT, entry, root, json.dumps(paths), *args]


def _worker_argv(fd: int, kind: str) -> list[str]:
    return isolated_argv("autosched.search.measure_worker", str(fd), kind)


class _Worker:
    """One persistent measure_worker process and the socket to it."""

    def __init__(self, kind: str, env: dict[str, str], cwd: str):
        parent, child = socket.socketpair()
        self.log = tempfile.TemporaryFile(prefix="autosched-worker-")
        try:
            self.proc = subprocess.Popen(
                _worker_argv(child.fileno(), kind), pass_fds=(child.fileno(),), env=env,
                cwd=cwd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                close_fds=True,
            )
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.tokens: set[int] = set()  # tasks it has been sent
        self.states: set[int] = set()  # tasks whose inputs / reference it holds
        self.ready = False
        self.killed_by_us = False

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        msg = self.recv(timeout)
        if not isinstance(msg, P.Ready):
            raise MeasureError(f"measure worker sent {msg!r} instead of ready")
        self.ready = True

    def send(self, msg: Any) -> None:
        try:
            self.conn.send(msg)
        except (OSError, EOFError) as exc:
            raise _Died(str(exc)) from None

    def recv(self, timeout: float) -> Any:
        try:
            if not self.conn.poll(max(timeout, 0.0)):
                raise _TimedOut()
            return self.conn.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            raise _Died() from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed_by_us = True
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.conn.close()

    def stopped(self) -> bool:
        """Whether it is stopped (SIGSTOP, a debugger): a timeout then is not the candidate's."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return False
        return state in (b"T", b"t")

    def killed_from_outside(self) -> bool:
        """Whether it died by a signal someone else sent (see OUTSIDE_SIGNALS); call after
        death_report, which waits for the exit status."""
        rc = self.proc.returncode
        return rc is not None and -rc in OUTSIDE_SIGNALS and not self.killed_by_us

    def death_report(self) -> str:
        """How it died (exit status or signal) and the tail of what it wrote."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        rc = self.proc.returncode
        if rc is None:
            how = "was stopped from outside" if self.stopped() else "stopped answering"
        elif rc < 0:
            try:
                how = f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                how = f"was killed by signal {-rc}"
        else:
            how = f"exited with status {rc}"
        self.log.flush()
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace")[-1500:].strip()
        return f"worker pid {self.proc.pid} {how}" + (f"; its output ended:\n{tail}" if tail else "")

    def close(self) -> None:
        with contextlib.suppress(_Died, OSError):
            self.send(P.Stop())
        self.kill()
        self.log.close()


_LIVE: weakref.WeakSet[Measurer] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for m in list(_LIVE):
        m.close()


# -- the measurer -----------------------------------------------------------------------------


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _locked(method: _Method) -> _Method:
    """One thread at a time in a Measurer's workers (a tuner may lower candidates in them
    while another thread builds: runner.Runner's ``overlaps``); the method keeps its
    signature for the type checker."""
    @functools.wraps(method)
    def locked(self: Measurer, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return cast(_Method, locked)


class Measurer:
    """Builds candidates in a process pool, runs them one by one in a worker process, checks
    them against the default schedule and times them.

    Example::

        m = Measurer(parse("llvm"), MeasureOptions(build_workers=2, min_repeat_ms=100))
        m = Measurer(parse("llvm"), build_workers=2, min_repeat_ms=100)   # the same
        results = m.measure(task, schedules)     # list[MeasureResult], same order
        built, failed = m.build(task, schedules) # the two halves of measure, for a runner
        results = m.run_artifacts(task, built)   # that runs the artifacts on another machine
        m.close()                                # or use it as a context manager

    ``target`` (optional) pins the target: measuring a task for another target raises.
    ``options`` (protocol.MeasureOptions), with any of its fields overridden by keyword, say how
    candidates are built, run, checked and timed. The workers' environment adds ``worker_env``
    to OPENBLAS_NUM_THREADS=1 and the OpenMP wait policy compiled models run with.
    """

    def __init__(self, target: Target | None = None, options: MeasureOptions | None = None,
                 **overrides: Any):
        self.target = target
        self.options = replace(options or MeasureOptions(), **overrides)
        self.rng = np.random.default_rng(self.options.seed)
        self._env = _worker_env(self.options.worker_env)
        self._builders: list[_Worker | None] = [None] * self.options.build_workers
        self._runner: _Worker | None = None
        self._target: Target | None = None  # of the tasks the workers were started for
        self._tokens: dict[int, tuple[Task, int, bytes]] = {}
        self._home: str | None = None  # the workers' private current directory
        self._states: dict[int, tuple[list, list | None]] = {}
        # each task's default schedule as built in the build workers, for its reference: the
        # run worker then runs it instead of compiling it (one compile fewer on its one core)
        self._defaults: dict[int, bytes] = {}
        self.worker_starts = 0  # how many worker processes were started (respawns included)
        self._lock = threading.RLock()
        _LIVE.add(self)

    # -- public --------------------------------------------------------------------------
    @_locked
    def measure(self, task: Task, candidates: Sequence[Schedule | Sequence[Step]], *,
                test_hooks: Mapping[int, str] | None = None) -> list[MeasureResult]:
        """Measure each candidate (a Schedule of ``task`` or a list of its steps); results in
        the same order. Failures come back as results with an error code, never raised.

        ``test_hooks`` (tests only) maps a candidate index to a misbehaviour inside the worker:
        build_hang, build_segfault, build_raise, run_hang, run_segfault, run_exit, run_raise,
        corrupt (perturbs the output before the check), and kills from outside: build_sigkill,
        run_sigkill, run_sigterm, run_sigstop (``_once`` added: on the first attempt only).
        """
        if not candidates:
            return []
        hooks = dict(test_hooks or {})
        self._set_target(self._check_target(task))
        if self._runner is None:
            self._runner = self._start()  # its imports overlap the builds; it says ready later
        built, results = self.build(task, candidates, test_hooks=hooks)
        if built:
            for b, res in zip(built, self.run_artifacts(task, built, test_hooks=hooks)):
                results[b.index] = res
        done = [r for r in results if r is not None]
        assert len(done) == len(results), "every candidate is built and run, or failed"
        return done

    @_locked
    def build(self, task: Task, candidates: Sequence[Schedule | Sequence[Step]], *,
              test_hooks: Mapping[int, str] | None = None,
              on_built: Callable[[P.Artifact], None] | None = None
              ) -> tuple[list[P.Artifact], list[MeasureResult | None]]:
        """Build each candidate in the build workers: the artifacts of those that built (what a
        run worker, here or on another machine, needs to run them), and one result per
        candidate, set for those that failed to build (None for the built ones).
        ``on_built(artifact)`` is called as each one is built (to ship it while others
        build). The first batch of a checked task builds its default schedule too, first
        (``default_artifact``: what its reference runs)."""
        self._set_target(self._check_target(task))
        step_lists = [[s.to_dict() for s in (c.steps if isinstance(c, Schedule) else c)]
                      for c in candidates]
        results: list[MeasureResult | None] = [None] * len(candidates)
        if not candidates:
            return [], results
        token = self._token(task)
        hooks = dict(test_hooks or {})
        extra = int(self.options.check and token not in self._defaults
                    and token not in self._states)
        if extra:  # the default first, at index 0 of the workers' batch
            step_lists, hooks = [[], *step_lists], {i + 1: h for i, h in hooks.items()}
        shifted: list[MeasureResult | None] = [None] * (len(step_lists))

        def built_one(b: P.Artifact) -> None:
            if extra and b.index == 0:
                self._defaults[token] = b.artifact
            elif on_built is not None:
                on_built(replace(b, index=b.index - extra))

        with _quiet_parent_threads():
            built = self._build_all(token, step_lists, hooks, shifted, built_one)
        results[:] = shifted[extra:]
        return [replace(b, index=b.index - extra) for b in built if b.index >= extra], results

    def default_artifact(self, task: Task) -> bytes | None:
        """``task``'s default schedule as built here (``build``), if it was."""
        return self._defaults.get(self._token(task))

    @_locked
    def run_artifacts(self, task: Task, artifacts: Sequence[P.Artifact], *,
                      test_hooks: Mapping[int, str] | None = None,
                      reference: bytes | None = None) -> list[MeasureResult]:
        """Run built candidates of ``task`` one at a time in the run worker, each checked
        against the default schedule on this machine's random inputs and timed; results in
        the order of ``artifacts`` (``test_hooks`` is keyed by ``Artifact.index``).
        ``reference``: the default schedule built elsewhere (another machine's
        ``default_artifact``), run for the reference instead of compiled here."""
        self._set_target(self._check_target(task))
        if reference is not None:
            self._defaults.setdefault(self._token(task), reference)
        if not artifacts:
            return []
        with _quiet_parent_threads():
            return self._run_all(task, self._token(task), artifacts, dict(test_hooks or {}))

    @_locked
    def lower_candidates(self, task: Task, candidates: Sequence[Any]) -> dict[int, Any]:
        """Search candidates (``space.Candidate``) of ``task`` lowered in the build workers, in
        one chunk per worker: {index: (ir_hash, features) or None when illegal}. A chunk whose
        worker fails or takes over ``build_timeout`` is left out (the caller lowers it)."""
        if not candidates:
            return {}
        self._set_target(task.target)
        token = self._token(task)
        dicts = [c.as_dict() for c in candidates]
        slots = range(min(self.options.build_workers, len(dicts)))
        chunks = {slot: list(range(slot, len(dicts), len(slots))) for slot in slots}
        for slot in slots:
            self._builder(slot)
        out: dict[int, Any] = {}
        sent: list[int] = []
        for slot in slots:
            w = self._builder(slot)
            try:
                self._prepare(w, token)
                w.send(P.Lower(token, [dicts[i] for i in chunks[slot]]))
                sent.append(slot)
            except (_Died, _TimedOut):
                self._drop_builder(slot)
        deadline = time.monotonic() + self.options.build_timeout
        for slot in sent:
            w = self._live_builder(slot)
            try:
                msg = w.recv(max(0.0, deadline - time.monotonic()))
            except (_Died, _TimedOut):
                self._drop_builder(slot)
                continue
            if isinstance(msg, P.LoweredBatch):
                out.update(zip(chunks[slot], msg.results))
        return out

    @_locked
    def close(self) -> None:
        """Stop every worker process."""
        for w in [*self._builders, self._runner]:
            if w is not None:
                w.close()
        self._builders = [None] * self.options.build_workers
        self._runner = None
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- tasks -----------------------------------------------------------------------------
    def _token(self, task: Task) -> int:
        entry = self._tokens.get(id(task))
        if entry is None or entry[0] is not task:
            entry = (task, len(self._tokens) + 1, pickle.dumps(task))
            self._tokens[id(task)] = entry
        return entry[1]

    def _task_bytes(self, token: int) -> bytes:
        for _task, tok, data in self._tokens.values():
            if tok == token:
                return data
        raise KeyError(token)

    def _check_target(self, task: Task) -> Target:
        if self.target is not None and fingerprint_key(self.target) != fingerprint_key(
                task.target):
            raise MeasureError(f"this Measurer is for {self.target} "
                               f"({fingerprint_key(self.target)}); task {task.name} is for "
                               f"{task.target} ({fingerprint_key(task.target)})")
        return task.target

    def _set_target(self, target: Target) -> None:
        # workers preload one backend; a Measurer used for another backend starts fresh ones
        if self._target is not None and self._target.backend is not target.backend:
            self.close()
        self._target = target

    def _start(self) -> _Worker:
        assert self._target is not None
        if self._home is None:  # the workers' current directory: private and empty
            self._home = tempfile.mkdtemp(prefix="autosched-measure-")
        self.worker_starts += 1
        return _Worker(self._target.kind, self._env, self._home)

    def _prepare(self, w: _Worker, token: int) -> None:
        """Wait until ``w`` is ready and holds the task of ``token``."""
        w.wait_ready(STARTUP_TIMEOUT)
        if token not in w.tokens:
            w.send(P.LoadTask(token, self._task_bytes(token)))
            w.tokens.add(token)

    def _bug(self, where: str, tb: str) -> None:
        raise UnexpectedWorkerError(f"unexpected error in the measure worker while {where}:\n{tb}")

    def _result_of_error(self, msg: P.Failed, **kw: Any) -> MeasureResult:
        return failed_result(ErrorCode.parse(msg.code), msg.msg, ir_hash=msg.ir_hash or kw.pop(
            "ir_hash", ""), build_time=msg.build_time or kw.pop("build_time", 0.0), **kw)

    # -- building ---------------------------------------------------------------------------
    def _builder(self, slot: int) -> _Worker:
        w = self._builders[slot]
        if w is None or not w.alive():
            if w is not None:
                w.kill()
            w = self._builders[slot] = self._start()
        return w

    def _live_builder(self, slot: int) -> _Worker:
        w = self._builders[slot]
        assert w is not None
        return w

    def _drop_builder(self, slot: int) -> None:
        w = self._builders[slot]
        if w is not None:
            w.kill()
        self._builders[slot] = None

    def _build_all(self, token: int, step_lists: list[list[dict]], hooks: dict[int, str],
                   results: list[MeasureResult | None],
                   on_built: Callable[[P.Artifact], None] | None = None) -> list[P.Artifact]:
        queue = deque(range(len(step_lists)))
        busy: dict[int, tuple[int, float]] = {}  # slot -> (candidate, deadline)
        built: list[P.Artifact] = []
        retried: set[int] = set()  # candidates whose build was cut short from outside once
        restarted = False  # a worker killed from outside while starting is replaced once
        slots = range(min(self.options.build_workers, len(step_lists)))
        for slot in slots:  # start missing workers together: their imports overlap
            self._builder(slot)
        while queue or busy:
            for slot in slots:
                if slot in busy or not queue:
                    continue
                w = self._builder(slot)
                try:
                    self._prepare(w, token)
                    idx = queue[0]
                    w.send(P.Build(token, step_lists[idx], self.options,
                                 _hook(hooks, idx, idx in retried)))
                    queue.popleft()
                except (_Died, _TimedOut):
                    report = w.death_report()
                    if restarted or not _cut_from_outside(w):
                        raise MeasureError(f"a build worker failed to start: {report}") from None
                    restarted = True
                    self._drop_builder(slot)
                    continue
                busy[slot] = (idx, time.monotonic() + self.options.build_timeout)
            if not busy:
                continue
            now = time.monotonic()
            next_deadline = min(d for _, d in busy.values())
            # a busy slot has a live builder
            by_conn = {self._builders[s].conn: s for s in busy}  # type: ignore[union-attr]
            ready = wait(list(by_conn), timeout=max(0.0, next_deadline - now))
            for conn in ready:
                slot = by_conn[conn]
                idx, _ = busy.pop(slot)
                w = self._live_builder(slot)
                try:
                    msg = w.recv(0.0)
                except (_Died, _TimedOut):
                    report = w.death_report()
                    outside = w.killed_from_outside()
                    self._drop_builder(slot)
                    if outside and idx not in retried:
                        retried.add(idx)
                        queue.appendleft(idx)  # once more, in a fresh worker
                    else:
                        results[idx] = failed_result(ErrorCode.CRASH, _died_msg("the build " + report,
                                                                         outside),
                                              transient=outside)
                    continue
                if isinstance(msg, P.Built):
                    built.append(P.Artifact(idx, msg.ir_hash, msg.build_time, msg.artifact))
                    if on_built is not None:
                        on_built(built[-1])
                elif isinstance(msg, P.Bug):
                    self._bug(f"building candidate {idx}", msg.traceback)
                else:
                    results[idx] = self._result_of_error(msg)
            now = time.monotonic()
            for slot, (idx, deadline) in list(busy.items()):
                if now >= deadline:
                    busy.pop(slot)
                    w = self._live_builder(slot)
                    stopped, pid = w.stopped(), w.proc.pid
                    self._drop_builder(slot)
                    if stopped and idx not in retried:
                        retried.add(idx)
                        queue.appendleft(idx)
                    elif stopped:
                        results[idx] = failed_result(ErrorCode.CRASH, _died_msg(
                            f"the build worker pid {pid} was stopped from outside", True),
                            transient=True, build_time=self.options.build_timeout)
                    else:
                        results[idx] = failed_result(ErrorCode.COMPILE_TIMEOUT,
                                              f"building took over "
                                              f"{self.options.build_timeout:g} s; worker killed",
                                              build_time=self.options.build_timeout)
        built.sort(key=lambda b: b.index)
        return built

    # -- running ----------------------------------------------------------------------------
    def _drop_runner(self) -> None:
        if self._runner is not None:
            self._runner.kill()
        self._runner = None

    def _run_worker(self, task: Task, token: int, retry: bool = True) -> _Worker:
        """The run worker, started if needed, holding the task and its inputs / reference
        (replaced once when it is killed from outside while preparing)."""
        w = self._runner
        if w is None or not w.alive():
            if w is not None:
                w.kill()
            w = self._runner = self._start()
        try:
            self._prepare(w, token)
            if token not in w.states:
                if token not in self._states:
                    self._states[token] = self._reference(task, token, w)
                else:
                    inputs, ref = self._states[token]
                    w.send(P.SetState(token, inputs, ref))
                w.states.add(token)
        except (_Died, _TimedOut):
            report = w.death_report()
            outside = _cut_from_outside(w)
            self._drop_runner()
            if outside and retry:
                return self._run_worker(task, token, retry=False)
            raise MeasureError(f"cannot measure {task.name}: the run worker failed while "
                               f"preparing its inputs and reference: {report}") from None
        return w

    def _reference(self, task: Task, token: int, w: _Worker) -> tuple[list, list | None]:
        from autosched.search.measure_worker import random_inputs

        inputs = random_inputs(task, self.rng)
        if not self.options.check:
            w.send(P.SetState(token, inputs, None))
            return inputs, None
        w.send(P.Reference(token, inputs, self.options, self._defaults.get(token)))
        msg = w.recv(self.options.reference_timeout)
        if isinstance(msg, P.Bug):
            self._bug(f"running the default schedule of {task.name}", msg.traceback)
        if isinstance(msg, P.Failed):
            raise MeasureError(f"cannot check candidates of {task.name}: {msg.msg}")
        return inputs, msg.outputs

    def _run_all(self, task: Task, token: int, built: Sequence[P.Artifact],
                 hooks: dict[int, str]) -> list[MeasureResult]:
        results = []
        for b in built:
            res = self._run_one(task, token, b, _hook(hooks, b.index, False))
            if res.transient:  # cut short from outside: once more, in a fresh worker
                res = self._run_one(task, token, b, _hook(hooks, b.index, True))
            results.append(res)
        return results

    def _run_one(self, task: Task, token: int, b: P.Artifact, hook: str | None) -> MeasureResult:
        w = self._run_worker(task, token)
        t0 = time.perf_counter()
        kw = {"ir_hash": b.ir_hash, "build_time": b.build_time}
        try:
            w.send(P.Run(token, b.artifact, self.options, hook))
            while True:
                msg = w.recv(self.options.run_timeout)
                if not isinstance(msg, P.Beat):
                    break
        except _TimedOut:
            stopped, pid = w.stopped(), w.proc.pid
            self._drop_runner()
            run_time = time.perf_counter() - t0
            if stopped:
                return failed_result(ErrorCode.CRASH, _died_msg(
                    f"the run worker pid {pid} was stopped from outside", True),
                    transient=True, run_time=run_time, **kw)
            return failed_result(ErrorCode.RUN_TIMEOUT, f"one call or repeat took over "
                          f"{self.options.run_timeout:g} s; worker killed", run_time=run_time,
                          **kw)
        except _Died:
            report = w.death_report()
            outside = w.killed_from_outside()
            self._drop_runner()
            return failed_result(ErrorCode.CRASH, _died_msg("the run " + report, outside),
                          transient=outside, run_time=time.perf_counter() - t0, **kw)
        run_time = time.perf_counter() - t0
        if isinstance(msg, P.Ran):
            return MeasureResult(tuple(msg.costs), ErrorCode.NO_ERROR, "", b.build_time,
                                 run_time, time.time(), b.ir_hash)
        if isinstance(msg, P.Bug):
            self._bug(f"running candidate {b.index}", msg.traceback)
        if msg.restart:  # the worker exits (e.g. a poisoned CUDA context)
            self._drop_runner()
        return self._result_of_error(msg, run_time=run_time, **kw)


def _hook(hooks: Mapping[int, str], index: int, retry: bool) -> str | None:
    """The test hook of candidate ``index``; one named ``*_once`` misbehaves on the first
    attempt only."""
    hook = hooks.get(index)
    return None if retry and hook is not None and hook.endswith("_once") else hook


def _cut_from_outside(w: _Worker) -> bool:
    return w.killed_from_outside() or w.stopped()


def _died_msg(report: str, outside: bool) -> str:
    if not outside:
        return report
    return (f"{report}; cut short from outside, not by the candidate, so it is not counted as "
            "measured (a resumed job measures it again)")


def _worker_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    # workers run in a private directory: a relative cache directory must keep meaning ours
    if env.get("AUTOSCHED_CACHE_DIR"):
        env["AUTOSCHED_CACHE_DIR"] = os.path.abspath(env["AUTOSCHED_CACHE_DIR"])
    env["OPENBLAS_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"  # numpy must not spin in workers
    env.update(extra or {})
    default_wait_policy(env)  # the policy compiled models run with
    return env


@contextlib.contextmanager
def _quiet_parent_threads() -> Iterator[None]:
    """Limit XGBoost's threads in the tuner while measuring: its OpenMP pool would compete
    with the timed kernel for cores."""
    xgb = sys.modules.get("xgboost")
    if xgb is None or not hasattr(xgb, "config_context"):
        yield
        return
    with xgb.config_context(nthread=1):
        yield
