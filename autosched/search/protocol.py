"""What a Measurer (measure.py) and its worker processes (measure_worker.py) exchange: the
measurement options and one message type per request and reply.

A worker says Ready once, then answers each request with its reply, or with Failed (an expected
failure, recorded with its error code) or Bug (an unexpected exception, raised in strict mode):

    LoadTask(token, task)                    no reply: the pickled task, once per worker
    SetState(token, inputs, reference)       no reply: the inputs and expected outputs
    Build(token, steps, options, hook)       -> Built(ir_hash, build_time, artifact)
    Lower(token, candidates)                 -> LoweredBatch([(ir_hash, features) or None])
    Reference(token, inputs, options, artifact) -> ReferenceOutputs(outputs)
    Run(token, artifact, options, hook)      -> Beat()* then Ran(costs)
    Stop()                                   no reply: the worker exits

Example::

    opts = MeasureOptions(repeat=5, min_repeat_ms=100)
    Measurer(target, opts)
    aus.tune(task, options=TuneOptions(measure=opts))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autosched.errors import MeasureError
from autosched.targets.host import usable_cores


@dataclass(frozen=True)
class MeasureOptions:
    """How candidates are built, run, checked and timed.

    ``number`` None chooses calls per repeat so a repeat lasts ``min_repeat_ms`` (3 x 40 ms by
    default: a robust median for about what MetaSchedule's runner spends per candidate: 3 calls,
    at least 100 ms in one repeat). ``run_timeout`` bounds one call (the check, the warm-up) or
    one repeat; ``reference_timeout`` the default schedule's build and run. ``worker_env`` adds
    to the workers' environment. ``seed`` fixes the random inputs. ``strict`` (tests) raises an
    unexpected exception in a worker instead of recording it. ``node_builds``: the Ray runner
    has each measuring node build the batches it measures, whole, one per node at once (with as
    many build workers as the node has CPUs) instead of building every candidate on the
    tuner's machine (runner_ray.py).
    """

    build_workers: int = field(default_factory=lambda: min(usable_cores(), 8))
    build_timeout: float = 60.0
    run_timeout: float = 10.0
    repeat: int = 3
    number: int | None = None
    min_repeat_ms: float = 40.0
    check: bool = True
    flush_cache: bool = True
    strict: bool = False
    reference_timeout: float = 300.0
    worker_env: Mapping[str, str] = field(default_factory=dict)
    seed: int | None = None
    node_builds: bool = False

    def __post_init__(self) -> None:
        if self.repeat < 1:
            raise MeasureError(f"repeat must be at least 1, got {self.repeat}")
        if self.number is not None and self.number < 1:
            raise MeasureError(f"number must be at least 1 or None (automatic), got "
                               f"{self.number}")
        if self.build_workers < 1:
            raise MeasureError(f"build_workers must be at least 1, got {self.build_workers}")


# -- requests (parent -> worker) ------------------------------------------------------------------


@dataclass(frozen=True)
class LoadTask:
    token: int
    task: bytes  # pickled: the worker unpickles it once


@dataclass(frozen=True)
class SetState:
    token: int
    inputs: list[np.ndarray | None]  # by argument position; None for outputs
    reference: list[np.ndarray] | None


@dataclass(frozen=True)
class Build:
    token: int
    steps: list[dict[str, Any]]
    options: MeasureOptions
    hook: str | None = None  # tests: misbehave while building (measure_worker._hook)


@dataclass(frozen=True)
class Lower:
    token: int
    candidates: list[dict[str, Any]]


@dataclass(frozen=True)
class Reference:
    """Run the default schedule on ``inputs``: ``artifact``, when given, is it built elsewhere
    (a build worker, the tuner's machine), else the worker builds it."""

    token: int
    inputs: list[np.ndarray | None]
    options: MeasureOptions
    artifact: bytes | None = None


@dataclass(frozen=True)
class Run:
    token: int
    artifact: bytes
    options: MeasureOptions
    hook: str | None = None  # tests: misbehave while running


@dataclass(frozen=True)
class Stop:
    pass


# -- replies (worker -> parent) -------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class Built:
    ir_hash: str
    build_time: float
    artifact: bytes


@dataclass(frozen=True)
class LoweredBatch:
    results: list[tuple[str, np.ndarray] | None]


@dataclass(frozen=True)
class ReferenceOutputs:
    outputs: list[np.ndarray]


@dataclass(frozen=True)
class Beat:
    """Still working (each beat restarts the parent's run timeout)."""


@dataclass(frozen=True)
class Ran:
    costs: list[float]


@dataclass(frozen=True)
class Failed:
    code: str  # an ErrorCode name
    msg: str
    ir_hash: str = ""
    build_time: float = 0.0
    restart: bool = False  # the worker exits after this reply (e.g. a poisoned CUDA context)


@dataclass(frozen=True)
class Bug:
    traceback: str


# -- what travels between machines ----------------------------------------------------------------


@dataclass(frozen=True)
class Artifact:
    """A built candidate, ready to run wherever its target is: ``index`` in the batch it was
    built in, the hash of its lowered IR, its build seconds and the pickled module (object
    code, or source and cubin, or loop IR)."""

    index: int
    ir_hash: str
    build_time: float
    artifact: bytes
