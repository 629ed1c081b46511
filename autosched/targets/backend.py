"""One interface for every target: a Backend per kind, the Module it builds, and the registry.

A backend turns a lowered PrimFunc into a Module for its kind of target and answers every
question the layers above ask about those targets: how its options parse, what a tuning record's
fingerprint holds, which candidates cannot run, where arguments live while they are measured.
Nothing outside ``autosched/targets/`` asks which kind a target is; it asks the target's backend
(``target.backend``) or the target's attributes (``target.device`` is "cpu" or "gpu": which
schedules suit it).

The built-in backends (llvm, cuda, ref) register themselves when their package is imported,
which ``get`` does on first use. A new backend is one class and one ``register`` call.

Example::

    from autosched.targets import backend
    from autosched.targets.target import parse

    mod = parse("llvm").backend.build(func, parse("llvm"))   # func: a lowered PrimFunc
    mod(a, b, c)                                              # outputs written in place
    mod.time(a, b, c, number=10, repeat=3).median             # seconds per call

    class Mine(RefBackend):                                   # any Backend subclass
        kind = "mine"
    backend.register(Mine())
    aus.build(s, [A, B, C], target="mine")
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from autosched.errors import CompileError
from autosched.targets.host import llc_bytes, usable_core_ids

if TYPE_CHECKING:
    from autosched.targets.target import Target
    from autosched.tir.ir import PrimFunc


@dataclass(frozen=True)
class Timing:
    """Seconds per call, one sample per repeat (each the mean of ``number`` calls)."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    def __str__(self) -> str:
        return (f"median {self.median * 1e3:.4f} ms, mean {self.mean * 1e3:.4f} ms "
                f"({len(self.samples)})")


def time_repeats(run: Callable[[int], float], *, number: int, repeat: int, warmup: int,
                 min_repeat_ms: float) -> Timing:
    """The one timing loop of every Module: ``run(n)`` makes n calls and returns their seconds.
    After ``warmup`` calls, ``number`` grows (with ``min_repeat_ms``) until one repeat lasts that
    long; then ``repeat`` repeats of ``number`` calls each."""
    if warmup > 0:
        run(warmup)
    number = max(1, number)
    while min_repeat_ms > 0:
        elapsed_ms = run(number) * 1e3
        if elapsed_ms >= min_repeat_ms:
            break
        grow = min_repeat_ms / max(elapsed_ms, 1e-3)
        number = max(number * 2, int(number * grow * 1.1) + 1)
    return Timing(tuple(run(number) / number for _ in range(max(1, repeat))))


def wall_clock(call: Callable[[], Any]) -> Callable[[int], float]:
    """``run(n)`` for time_repeats: n calls of ``call`` timed on the host clock."""

    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        return time.perf_counter() - t0

    return run


@runtime_checkable
class Module(Protocol):
    """A compiled function: runs on arrays (outputs written in place) and times itself.

    Modules of backends whose ``exports`` is true also have ``export_library(path)``."""

    target: Target

    def __call__(self, *args: Any) -> None: ...

    def bind(self, *args: Any) -> Callable[[], None]:
        """A call with no arguments running the function on ``args`` (checked once, here)."""
        ...

    def time(self, *args: Any, number: int = 1, repeat: int = 3, warmup: int = 1,
             min_repeat_ms: float = 0.0) -> Timing:
        """Seconds per call: ``repeat`` samples of ``number`` calls after ``warmup`` calls."""
        ...

    def get_source(self) -> str: ...


class WallClockModule:
    """``bind`` and ``time`` for a Module whose calls are timed on the host clock (a subclass
    defines ``__call__``)."""

    def __call__(self, *args: Any) -> None:
        raise NotImplementedError

    def bind(self, *args: Any) -> Callable[[], None]:
        return lambda: self(*args)

    def time(self, *args: Any, number: int = 1, repeat: int = 3, warmup: int = 1,
             min_repeat_ms: float = 0.0) -> Timing:
        return time_repeats(wall_clock(self.bind(*args)), number=number, repeat=repeat,
                            warmup=warmup, min_repeat_ms=min_repeat_ms)


@dataclass(frozen=True)
class TargetKeys:
    """How closely a tuning record's target matches another, from the most exact to the
    loosest: records of an equal ``exact`` or ``key`` apply (``--strict-target``: only
    ``exact``); of an equal ``isa`` apply when the workload has no record of the key; of an
    equal ``family`` seed the search.

    Example (llvm)::

        exact   llvm/x86_64-unknown-linux-gnu/znver4/f3a9c01d2/t2   triple, CPU, all features
        key     llvm/x86_64-linux/v512/avx,avx2,...,fma,sse4.2/t2  what changes the code
        isa     llvm/x86_64-linux/v512/avx,avx2,...,fma,sse4.2     the key less its threads
        family  llvm/x86_64-linux                                  related targets
    """

    exact: str
    key: str
    isa: str
    family: str


class DeviceMemory(Protocol):
    """Where a backend's arguments live when they are not host arrays (a GPU's memory)."""

    def to_device(self, arr: np.ndarray) -> Any: ...

    def to_host(self, arg: Any) -> np.ndarray: ...

    def flush_caches(self, nbytes: int) -> None:
        """Evict a kernel's data from the device caches (between timed repeats)."""
        ...

    def is_device_error(self, exc: Exception) -> bool:
        """Whether ``exc`` came from the device (its context may be unusable afterwards)."""
        ...


class Backend:
    """What autosched needs from one kind of target. Subclasses set ``kind`` and implement
    ``target`` and ``build``; the other methods have the defaults of a host-memory CPU target."""

    kind: ClassVar[str]
    exports: ClassVar[bool] = False  # modules have export_library(path)

    def target(self, options: tuple[tuple[str, str], ...]) -> Target:
        """The Target for ``options`` (the -key=value pairs after the kind), defaults filled."""
        raise NotImplementedError

    def build(self, func: PrimFunc, target: Target) -> Module:
        raise NotImplementedError

    def fingerprint(self, target: Target) -> dict[str, Any]:
        """What code measured on ``target`` depended on (stored in every tuning record)."""
        return {"kind": self.kind, "target": str(target)}

    def fingerprint_key(self, fp: dict[str, Any]) -> str:
        """What changes the generated code (and so which schedule is fastest), as a short key:
        records of the same key apply to each other's targets."""
        return self.target_keys(fp).key

    def target_keys(self, fp: dict[str, Any]) -> TargetKeys:
        """The keys records are matched by, from the whole target to its family."""
        return TargetKeys(exact=self.kind, key=self.kind, isa=self.kind, family=self.kind)

    def unfit(self, func: PrimFunc, target: Target) -> str | None:
        """Why a lowered candidate cannot run on ``target`` (the search drops it), or None."""
        return None

    def preload(self) -> None:
        """Import what builds and runs need (a measurement worker calls it before it says
        ready, so the first candidate's build time is not the import time)."""

    def device_memory(self, target: Target) -> DeviceMemory | None:
        """The device memory arguments live in; None when modules run on host arrays."""
        return None

    def runs_here(self, target: Target) -> bool:
        """Whether the target's modules run on this machine's own hardware (so timing them
        here times the target): not a cross target, an emulation or an evaluator."""
        return False

    def flush_bytes(self, target: Target) -> int:
        """How many bytes to touch between timed repeats to flush the caches."""
        return 2 * llc_bytes()

    def device_names(self, target: Target) -> tuple[str, ...]:
        """The hardware the target's modules run on here, as names that are the same in every
        process of this machine: a timed measurement holds all of them (device_lock). On a
        CPU, the cores this process may run on."""
        return cpu_names()


def cpu_names() -> tuple[str, ...]:
    """This process's CPU cores as device names (``cpu0``, ``cpu5``): the cores its affinity
    allows, so processes pinned to disjoint cores (simulated cluster nodes, jobs placed on
    purpose) time side by side while an unpinned one takes turns with each."""
    return tuple(f"cpu{c}" for c in usable_core_ids())


# -- the registry -------------------------------------------------------------------------------

# the built-in backends, imported (and so registered) on first use: llvmlite, NVRTC and the
# evaluator load only for the targets a program uses
_BUILTIN = {"llvm": "autosched.targets.llvm", "cuda": "autosched.targets.cuda",
            "ref": "autosched.targets.ref"}
_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make ``backend`` the one for targets of its kind (replacing any earlier one)."""
    _REGISTRY[backend.kind] = backend
    return backend


def get(kind: str) -> Backend:
    """The backend registered for ``kind`` (CompileError naming the known kinds if none)."""
    if kind not in _REGISTRY and kind in _BUILTIN:
        importlib.import_module(_BUILTIN[kind])
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise CompileError(f"unknown target kind {kind!r}; expected one of {kinds()}") from None


def kinds() -> tuple[str, ...]:
    """Every kind a target may name: the built-in ones and those registered since."""
    return tuple(dict.fromkeys([*_BUILTIN, *_REGISTRY]))
