"""aus.build (driver): lower a schedule and hand the loop IR to the target's backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autosched.targets.backend import Module
from autosched.targets.target import Target, parse
from autosched.tir.ir import PrimFunc


def build_func(func: PrimFunc, target: Target) -> Module:
    """Compile an already-lowered function for ``target``; returns a callable module."""
    return target.backend.build(func, target)


def build(sch: Any, args: Sequence[Any], target: str | Target = "llvm", name: str = "main"
          ) -> Module:
    """Lower ``sch`` with ``args`` as the parameter list and compile it for ``target``."""
    from autosched.schedule.lower import lower

    tgt = parse(target)
    return build_func(lower(sch, args, name=name), tgt)
