"""Where candidates are measured: one interface, three runners.

A runner takes a batch of candidates of one task and gives back one MeasureResult each, in
order; the tuner appends the records to its log. ``local`` is the Measurer (measure.py): build
workers and one run worker on this machine, no dependency. ``ray`` (runner_ray.py, the
``autosched[cluster]`` extra) builds here and measures on the nodes of a Ray cluster that
advertise the task's target as a custom resource (``resource_name``), several in parallel.
``qemu`` (emulated.py) builds here and runs a cross-compiled CPU target's candidates here under
qemu-user: checked for correctness on the target's instruction set, never timed as the target.

Example::

    runner = make_runner("ray://head:10001", parse("llvm -mcpu=znver4"))
    results = runner.measure(task, schedules)     # list[MeasureResult], same order
    runner.close()
    aus.tune(task, trials=200, log="mm.jsonl", runner="ray")   # the tuner does the same
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from autosched.errors import MeasureError
from autosched.search.measure import MeasureResult
from autosched.search.protocol import MeasureOptions
from autosched.search.task import Task
from autosched.targets.target import Target

RUNNER_FORMS = ("local, qemu (a cross target under qemu-user here, correctness only), ray (a "
                "local Ray cluster, or the one RAY_ADDRESS names) or ray://HOST:PORT")


@runtime_checkable
class Runner(Protocol):
    """What the tuner needs of a runner (a runner may also have Measurer's
    ``lower_candidates``, which the search then uses to lower candidates in its workers).
    A runner whose attribute ``overlaps`` is true measures elsewhere (other machines, other
    processes' cores): the tuner calls its ``measure`` from a thread of its own and searches
    the next batch meanwhile, so ``measure`` and ``lower_candidates`` may run at once. Such a
    runner may also say, with ``lanes(target) -> int``, how many batches it measures at once
    (one per node): the tuner then calls ``measure`` from that many threads at once."""

    def measure(self, task: Task, candidates: Sequence[Any]) -> list[MeasureResult]:
        """One result per candidate (a Schedule or a list of steps), in order; failures are
        results with an error code, never raised."""
        ...

    def close(self) -> None:
        """Stop what the runner started (worker processes, actors)."""
        ...


def check_runner(text: str) -> str:
    """``text`` if it names a runner, else MeasureError saying the accepted forms."""
    if text in ("local", "qemu", "ray") or (text.startswith("ray://") and text != "ray://"):
        return text
    raise MeasureError(f"unknown runner {text!r}: use {RUNNER_FORMS}")


def make_runner(spec: str | None, target: Target | None = None,
                options: MeasureOptions | None = None, **overrides: Any) -> Runner:
    """The runner ``spec`` names (None: local). ``options`` and ``overrides`` (fields of
    MeasureOptions) say how candidates are built, run, checked and timed."""
    spec = check_runner(spec or "local")
    if spec == "qemu":
        from autosched.search.emulated import EmulatedMeasurer

        if target is None or not needs_emulation(target):
            raise MeasureError(f"runner qemu runs a CPU target of another architecture (llvm "
                               f"-mtriple=...) under qemu-user, not {target}: use runner local")
        return EmulatedMeasurer(target, options, **overrides)
    if spec == "local":
        from autosched.search.measure import Measurer

        if target is not None and needs_emulation(target):
            raise MeasureError(
                f"runner local cannot run {target} on this machine: use runner qemu to check "
                "candidates under qemu-user here (correctness only), or ray with a node of "
                "that architecture to time them there (docs/REMOTE.md)")
        return Measurer(target, options, **overrides)
    try:
        from autosched.search.runner_ray import RayRunner
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise MeasureError(f"runner {spec} needs Ray: pip install 'autosched[cluster]'") from None
    return RayRunner(target, options, address=None if spec == "ray" else spec, **overrides)


def resource_name(target: Target) -> str:
    """The Ray custom resource a node advertises when it can measure ``target``: what the
    generated code depends on (kind, architecture, vector width or GPU arch), not the
    machine's name.

    Example::

        resource_name(parse("llvm -mtriple=aarch64-linux-gnu"))   # "autosched:llvm-aarch64-v128"
        resource_name(parse("cuda -arch=sm_90"))                  # "autosched:cuda-sm_90"
    """
    parts = [target.kind]
    if target.triple:
        parts.append(target.triple.split("-")[0])
    if target.arch:
        parts.append(target.arch)
    elif target.device == "cpu":
        parts.append(f"v{target.vector_bits}")
    return "autosched:" + "-".join(parts)


def needs_emulation(target: Target) -> bool:
    """Whether this machine runs ``target``'s code only under an emulator: a CPU target
    cross-compiled for another architecture."""
    return bool(target.triple) and not target.is_host
