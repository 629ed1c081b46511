"""The Ray runner: build here, measure on the cluster's nodes that advertise the target.

The tuner's machine builds each batch in its build workers (measure.py) and ships the built
artifacts (pickled modules: object code, or source and cubin) to measurement actors. An actor
is placed on a node that advertises the task's target as a custom resource
(``runner.resource_name``: ``autosched:llvm-x86_64-v512``, ``autosched:cuda-sm_90``), one actor
per unit of the resource, and measures one candidate at a time with the run worker of a local
Measurer: checked against the default schedule on that node, then timed. A node that runs a
cross-compiled target only under an emulator (an x86 machine standing in for an aarch64 board
through qemu-user) runs its candidates with emulated.EmulatedMeasurer, and their results say
``emulated``. Several actors of one target measure in parallel; when an actor or its node dies
(Ray reports RayActorError), only its in-flight candidate is lost, and it is queued again for
another actor. With ``MeasureOptions.node_builds`` each node builds what it measures, and
a batch goes whole to one actor: the tuner keeps one batch in flight per actor (``lanes``), so
the nodes measure different batches at once and no node waits for another's last candidate or
repeats another's setup of a task. Ray does the transport, placement and failure detection:
there is no RPC here.

Join a node (docs/REMOTE.md has the board setup)::

    python -m autosched.search.runner_ray resources --target llvm       # prints the ray start line
    ray start --address=HEAD:6379 --resources='{"autosched:llvm-x86_64-v512": 1}'

and tune from any machine of the cluster, or through Ray Client::

    autosched tune model.onnx --target llvm --runner ray://HEAD:10001 --log resnet18.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import RayActorError

from autosched.errors import AutoschedError, MeasureError
from autosched.schedule.schedule import Schedule
from autosched.search import protocol as P
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import STARTUP_TIMEOUT, Measurer, MeasureResult, failed_result
from autosched.search.protocol import MeasureOptions
from autosched.search.runner import needs_emulation, resource_name
from autosched.search.task import Task
from autosched.targets.target import Target, parse
from autosched.version import __version__

ATTEMPTS = 3  # a candidate whose actor dies this many times is recorded as cut short


class MeasureActor:
    """Measures built candidates on its node, one at a time (a Ray actor: ``RemoteActor``)."""

    def __init__(self, options: MeasureOptions):
        self.options = options
        self._measurers: dict[str, Any] = {}
        self._tasks: dict[tuple[str, str], Task] = {}

    def hello(self) -> tuple[str, str]:
        """Which node and process this actor is (for logs and tests), and its autosched
        version (artifacts are pickled modules: both sides must run the same autosched)."""
        node = ray.get_runtime_context().get_node_id()
        return f"{socket.gethostname()} node {node} pid {os.getpid()}", __version__

    def run(self, task: Task, artifact: P.Artifact, reference: bytes | None = None
            ) -> MeasureResult:
        """Measure one built candidate; ``reference``: the task's default schedule as built
        by the tuner (Measurer.default_artifact), run for its reference outputs on the first
        candidate of the task here instead of compiled on this node."""
        # the first copy of a task stays: the Measurer keeps its inputs and reference by task
        task = self._tasks.setdefault((task.workload_key, str(task.target)), task)
        return self._measurer(task.target).run_artifacts(task, [artifact],
                                                         reference=reference)[0]

    def measure(self, task: Task, candidates: list[Any]) -> list[MeasureResult]:
        """Build candidates (lists of steps) here, in as many build workers as this node has
        CPUs, then measure them one at a time (MeasureOptions.node_builds)."""
        task = self._tasks.setdefault((task.workload_key, str(task.target)), task)
        return self._measurer(task.target, builds=True).measure(task, candidates)

    def close(self) -> None:
        for m in self._measurers.values():
            m.close()
        self._measurers.clear()

    def _measurer(self, target: Target, builds: bool = False) -> Any:
        key = f"{target} builds" if builds else str(target)
        if key not in self._measurers:
            opts = replace(self.options, build_workers=_node_cpus() if builds else 1)
            if needs_emulation(target):
                from autosched.search.emulated import EmulatedMeasurer

                self._measurers[key] = EmulatedMeasurer(target, opts)
            else:
                self._measurers[key] = Measurer(None, opts)
        return self._measurers[key]


def _node_cpus() -> int:
    """The CPUs the node this runs on advertises to Ray (at least 1)."""
    node = ray.get_runtime_context().get_node_id()
    for n in ray.nodes():
        if n.get("NodeID") == node:
            return max(int(n.get("Resources", {}).get("CPU", 1)), 1)
    return 1


RemoteActor: Any = ray.remote(MeasureActor)


class _Pool:
    """The actors of one resource: those that answered, and those still starting."""

    def __init__(self, resource: str, options: MeasureOptions):
        self.resource = resource
        self.options = options
        self.live: dict[Any, str] = {}           # actor -> where it runs
        self.starting: dict[Any, Any] = {}       # ready ref -> actor
        self.stale: set[str] = set()             # nodes that run another autosched version
        self.death = ""                          # why the last actor died while starting
        # the batches measured at once (one per tuner thread) share the actors: one call in
        # flight per actor, handed out and given back under ``lock``
        self.busy: set[Any] = set()
        self.lock = threading.RLock()
        self.freed = threading.Condition(self.lock)

    def top_up(self) -> None:
        """Start an actor for each unit of the resource the cluster has beyond ours."""
        units = int(ray.cluster_resources().get(self.resource, 0))
        for _ in range(units - len(self.live) - len(self.starting) - len(self.stale)):
            actor = RemoteActor.options(
                num_cpus=0, resources={self.resource: 1}, max_restarts=0,
                max_task_retries=0).remote(self.options)
            self.starting[actor.hello.remote()] = actor

    def admit(self, timeout: float) -> None:
        """Move the actors that have started into ``live``, waiting up to ``timeout`` s."""
        if not self.starting:
            return
        ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting),
                            timeout=timeout)
        for ref in ready:
            actor = self.starting.pop(ref)
            try:
                where, version = ray.get(ref)
            except RayActorError as exc:  # died while starting (its node went away, ...)
                self.death = str(exc).strip().splitlines()[-1][:300] if str(exc) else repr(exc)
                continue
            if version != __version__:
                self.stale.add(where)
                ray.kill(actor)
                continue
            self.live[actor] = where

    def idle(self) -> list[Any]:
        """The live actors with no call in flight (call with ``lock`` held)."""
        return [a for a in self.live if a not in self.busy]

    def release(self, actor: Any) -> None:
        with self.lock:
            self.busy.discard(actor)
            self.freed.notify_all()

    def wait_idle(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for an actor to be given back (none may be idle now)."""
        with self.lock:
            if self.live and not self.idle():
                self.freed.wait(timeout)

    def drop(self, actor: Any) -> None:
        with self.lock:
            self.live.pop(actor, None)
            self.busy.discard(actor)
            self.freed.notify_all()
        try:
            ray.kill(actor)
        except (RayActorError, ValueError):
            pass

    def close(self) -> None:
        for actor in [*self.live, *self.starting.values()]:
            self.drop(actor)
        self.starting.clear()


class RayRunner:
    """Builds candidates here and measures them on the Ray cluster's nodes that advertise
    their target (see the module's docstring).

    Example::

        with RayRunner(parse("llvm"), address="ray://head:10001") as r:
            results = r.measure(task, schedules)      # list[MeasureResult], same order
        r.measured_on       # Counter: candidates measured per actor ("host node ID pid N")
        r.busy_s            # {actor: seconds it had a call in flight}

    ``address`` None connects to the cluster on this machine or the one RAY_ADDRESS names,
    else starts a local one whose node advertises ``target``. ``on_dispatch(n, where)`` (tests)
    is called after the n-th candidate is handed to the actor at ``where``.
    """

    overlaps = True  # the nodes measure while the tuner searches the next batch (runner.Runner)

    def __init__(self, target: Target | None = None, options: MeasureOptions | None = None,
                 address: str | None = None, *, start_timeout: float = STARTUP_TIMEOUT,
                 on_dispatch: Callable[[int, str], None] | None = None, **overrides: Any):
        self.target = target
        self.options = replace(options or MeasureOptions(), **overrides)
        self.start_timeout = start_timeout
        self.on_dispatch = on_dispatch
        self._own_ray = _connect(address, target)  # a Ray this runner started, it stops
        self._builder = Measurer(target, self.options)
        self._pools: dict[str, _Pool] = {}
        self._lock = threading.RLock()  # the tuner's measuring threads share the pools
        self.dispatched = 0
        self.requeued = 0  # candidates queued again after their actor died
        self.measured_on: Counter[str] = Counter()
        # seconds each actor had a call in flight
        self.busy_s: defaultdict[str, float] = defaultdict(float)

    def measure(self, task: Task, candidates: Sequence[Any]) -> list[MeasureResult]:
        """Build here (or on the nodes: MeasureOptions.node_builds), measure on the cluster;
        one result per candidate, in order."""
        if not candidates:
            return []
        batch = self._batch(task)
        results: list[MeasureResult | None]
        if self.options.node_builds:  # the whole batch to one actor, built there
            batch.building = False
            steps = [list(c.steps) if isinstance(c, Schedule) else list(c) for c in candidates]
            batch.queue.append((tuple(range(len(steps))), steps))
            results = [None] * len(steps)
        else:
            # each candidate goes to an actor as soon as it is built, while the others build
            _, results = self._builder.build(task, candidates, on_built=batch.add)
            batch.building = False
        for index, res in batch.finish().items():
            results[index] = res
        done = [r for r in results if r is not None]
        assert len(done) == len(results), "every candidate is built and run, or failed"
        return done

    def lanes(self, target: Target) -> int:
        """How many batches of ``target`` to measure at once (runner.Runner): with node builds
        one per live actor, each batch whole on one node; else 1, its candidates spread over
        the actors as they are built here."""
        if not self.options.node_builds:
            return 1
        with self._lock:
            return max(len(self._pool(target).live), 1)

    def lower_candidates(self, task: Task, candidates: Sequence[Any]) -> dict[int, Any]:
        """Candidates lowered in the local build workers (Measurer.lower_candidates)."""
        return self._builder.lower_candidates(task, candidates)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        self._builder.close()
        if self._own_ray and ray.is_initialized():
            ray.shutdown()
            self._own_ray = False

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatch ---------------------------------------------------------------------------
    def _pool(self, target: Target) -> _Pool:
        resource = resource_name(target)
        pool = self._pools.get(resource)
        if pool is None:
            pool = self._pools[resource] = _Pool(resource, self.options)
        pool.top_up()
        pool.admit(0.0)
        if not pool.live:
            pool.admit(self.start_timeout)
        if not pool.live:
            why = (f"; these run another autosched than {__version__}: "
                   f"{', '.join(sorted(pool.stale))}" if pool.stale else "")
            why += f"; the last actor to start died: {pool.death}" if pool.death else ""
            raise MeasureError(
                f"no node of the Ray cluster measures {target}: none advertises {resource} or "
                f"its actors did not start in {self.start_timeout:g} s; join one with ray start "
                f"--resources='{{\"{resource}\": 1}}'{why}")
        return pool

    def _batch(self, task: Task) -> _Batch:
        with self._lock:
            return _Batch(self, task, self._pool(task.target))


# what an actor is handed: (the candidates' indices in the batch, one built candidate or the
# steps of the whole batch, which it builds itself)
_Unit = tuple[tuple[int, ...], Any]


class _Batch:
    """One batch on its way through the actors: candidates are added as they are built and
    handed to idle actors (or, with node builds, the whole batch to one actor); the unit of
    an actor that dies is queued again."""

    def __init__(self, runner: RayRunner, task: Task, pool: _Pool):
        self.runner, self.task, self.pool = runner, task, pool
        self.task_ref = ray.put(task)
        self.queue: deque[_Unit] = deque()
        self.out: dict[int, MeasureResult] = {}  # by index in the batch
        self.attempts: Counter[tuple[int, ...]] = Counter()
        # ref -> (actor, unit, when it was handed out, when it is due)
        self.inflight: dict[Any, tuple[Any, _Unit, float, float]] = {}
        self.error: Exception | None = None
        # the task's default schedule, built first in the tuner's build workers the first time
        # (Measurer.build), goes with each candidate, so that no node compiles it for its
        # reference; the first candidates wait for it while the batch builds
        self.building = True
        self.reference: Any = None  # its ObjectRef, put once
        opts = runner.options
        self.limit = STARTUP_TIMEOUT + opts.reference_timeout + opts.run_timeout * (opts.repeat + 3)

    def add(self, b: P.Artifact) -> None:
        """Queue a built candidate, hand out what idle actors can take, collect what is done.
        Called from inside the build loop, so an error (an actor's MeasureError, say) waits
        for ``finish``: raised here, it would leave the build workers' replies unread."""
        self.queue.append(((b.index,), b))
        if self.error is None:
            try:
                self.pump(0.0)
            except Exception as exc:  # re-raised by finish, after the builds
                self.error = exc

    def finish(self) -> dict[int, MeasureResult]:
        """Wait until every queued candidate has its result."""
        if self.error is not None:
            raise self.error
        while self.queue or self.inflight:
            if not self.pool.live and not self.inflight:
                # every actor died: start others where the resource is left (or raise)
                with self.runner._lock:
                    self.pool = self.runner._pool(self.task.target)
            self.pump(None)
        return self.out

    def pump(self, timeout: float | None) -> None:
        """Dispatch to idle actors, then collect finished candidates, waiting up to
        ``timeout`` s for one (None: until one finishes or is overdue)."""
        self._dispatch()
        if not self.inflight:
            if self.queue and timeout is None:  # every actor measures another batch
                self.pool.wait_idle(1.0)
            return
        if timeout is None:
            soonest = min(due for *_, due in self.inflight.values())
            timeout = max(0.0, soonest - time.monotonic())
        ready, _ = ray.wait(list(self.inflight), num_returns=1, timeout=timeout)
        for ref in ready:
            actor, unit, sent, _ = self.inflight.pop(ref)
            busy = time.monotonic() - sent
            try:
                got = ray.get(ref)
                for i, res in zip(unit[0], [got] if isinstance(unit[1], P.Artifact) else got):
                    self.out[i] = res
                with self.pool.lock:
                    where = self.pool.live.get(actor, "?")
                    self.runner.measured_on[where] += len(unit[0])
                    self.runner.busy_s[where] += busy
                self.pool.release(actor)
            except RayActorError as exc:  # the actor or its node died: requeue its candidates
                self.pool.drop(actor)
                self._retry(unit, f"the measuring actor died ({exc})")
        now = time.monotonic()
        for ref, (actor, unit, _, due) in list(self.inflight.items()):
            if now >= due:  # a node that stopped answering without dying
                self.inflight.pop(ref)
                self.pool.drop(actor)
                self._retry(unit, f"no answer in {self.limit:g} s")
        if ready and (self.queue or self.inflight):
            with self.runner._lock:
                self.pool.top_up()
                self.pool.admit(0.0)
        self._dispatch()

    def _dispatch(self) -> None:
        if self.reference is None:
            built = self.runner._builder.default_artifact(self.task)
            if built is not None:
                self.reference = ray.put(built)
            elif self.building and self.runner.options.check:
                return  # it is being built with the batch: hold the candidates until it is
        with self.pool.lock:
            self._hand_out()

    def _hand_out(self) -> None:
        """Queued units to idle actors (with the pool's lock held)."""
        for actor in self.pool.idle():
            if not self.queue:
                return
            self.pool.busy.add(actor)
            unit = self.queue.popleft()
            index, payload = unit
            if isinstance(payload, P.Artifact):
                ref = actor.run.remote(self.task_ref, payload, self.reference)
                due = self.limit
            else:  # the batch's steps, which the node builds itself
                ref = actor.measure.remote(self.task_ref, payload)
                due = self.limit + len(index) * (self.limit + self.runner.options.build_timeout)
            sent = time.monotonic()
            self.inflight[ref] = (actor, unit, sent, sent + due)
            r = self.runner
            r.dispatched += len(index)
            if r.on_dispatch is not None:
                r.on_dispatch(r.dispatched, self.pool.live[actor])

    def _retry(self, unit: _Unit, why: str) -> None:
        index = unit[0]
        self.attempts[index] += 1
        if self.attempts[index] < ATTEMPTS:
            self.runner.requeued += len(index)
            self.queue.appendleft(unit)
            return
        for i in index:
            self.out[i] = failed_result(
                ErrorCode.CRASH, f"{why}, {ATTEMPTS} times; cut short from outside, not by the "
                "candidate (a resumed job measures it again)", transient=True)


def _connect(address: str | None, target: Target | None) -> bool:
    """Connect to Ray unless this process already is; whether this call did."""
    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if address is not None:
        ray.init(address=address, **quiet)
        return True
    try:
        ray.init(address="auto", **quiet)
    except ConnectionError:  # no cluster to join: a local one, this machine its only node
        resources = {resource_name(target): 1.0} if target is not None else {}
        ray.init(resources=resources, **quiet)
    return True


def _ray_start_line(targets: Sequence[str], slots: int, address: str) -> str:
    resources = {resource_name(parse(t)): slots for t in targets}
    return (f"ray start --address={address} "
            f"--resources='{json.dumps(resources, separators=(',', ':'))}'")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autosched.search.runner_ray resources --target T [--target T2] [--slots N]``:
    print the custom resources a node that measures these targets advertises, as the ray
    start line that joins it to a cluster."""
    p = argparse.ArgumentParser(prog="python -m autosched.search.runner_ray")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resources", help="the ray start line of a node that measures TARGET")
    r.add_argument("--target", action="append", required=True,
                   help='a target string, e.g. "llvm" or "cuda -arch=sm_90" (repeatable)')
    r.add_argument("--slots", type=int, default=1,
                   help="candidates measured at once on the node (1: timings do not share "
                        "the machine)")
    r.add_argument("--address", default="HEAD:6379", help="the head node's address")
    args = p.parse_args(argv)
    try:
        print(_ray_start_line(args.target, args.slots, args.address))
    except AutoschedError as exc:  # a bad target string: one line naming it
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
