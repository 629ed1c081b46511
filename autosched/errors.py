"""One exception type per layer. Messages carry the values that broke the rule."""

from __future__ import annotations


class AutoschedError(Exception):
    """Base of every error autosched raises on purpose."""


class TEError(AutoschedError, TypeError):
    """A tensor expression is malformed: wrong index count, mixed dtypes, bad shapes."""


class ScheduleError(AutoschedError):
    """A schedule step is illegal for the stage and axes it names."""


class LowerError(AutoschedError):
    """Lowering a schedule to loop IR failed; the message names the pass."""


class CompileError(AutoschedError):
    """A backend could not compile generated code; the message carries the compiler log."""


class RuntimeError_(AutoschedError, RuntimeError):
    """A built module was called with arguments it cannot take, or failed while running."""


class MeasureError(AutoschedError):
    """A measurement could not be taken."""


class ModelImportError(AutoschedError):
    """A model file could not be imported; the message names the node and op type."""
