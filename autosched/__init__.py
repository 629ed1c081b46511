"""autosched: an auto-scheduling tensor compiler (tensor expressions, schedules, LLVM and CUDA).

Example::

    import autosched as aus
    from autosched import te
    s = te.create_schedule(C.op)
    print(aus.lower(s, [A, B, C]))
    graph = aus.from_onnx("model.onnx", shapes={"x": (1, 3, 224, 224)})   # importers.onnx
    model = aus.compile(graph, target="llvm", log="tuning_logs/model-llvm.jsonl")
    deployed = aus.load("build/model")       # what `autosched compile model.onnx -o` wrote
"""

from autosched import te
from autosched.errors import (
    AutoschedError,
    CompileError,
    LowerError,
    MeasureError,
    ModelImportError,
    ScheduleError,
    TEError,
)
from autosched.schedule.schedule import create_schedule as _create_schedule
from autosched.version import __version__ as __version__

te.create_schedule = _create_schedule  # te declares the name; scheduling is the layer above it


def lower(sch, args, name: str = "main"):  # noqa: ANN001, ANN201
    """Lower a schedule to a loop-nest function (printable, runnable by the evaluator)."""
    from autosched.schedule.lower import lower as _lower

    return _lower(sch, args, name=name)


def build(sch, args, target: str = "llvm", name: str = "main"):  # noqa: ANN001, ANN201
    """Compile a schedule for a target ("llvm", "llvm -mtriple=...", "cuda", "ref")."""
    from autosched.driver import build as _build

    return _build(sch, args, target=target, name=name)


def __getattr__(name: str):  # noqa: ANN202
    # the search pulls in xgboost and multiprocessing: import it on first use only
    if name == "Task":
        from autosched.search.task import Task

        return Task
    if name in ("tune", "build_best", "best_schedule", "TuneOptions"):
        from autosched.search import tune as _tune

        return getattr(_tune, name)
    if name in ("compile", "tune_graph", "extract_tasks"):
        from autosched.graph import compiler as _compiler

        return getattr(_compiler, name)
    if name == "load":
        from autosched.graph.loader import load

        return load
    if name == "from_onnx":
        from importers.onnx import from_onnx

        return from_onnx
    raise AttributeError(f"module 'autosched' has no attribute {name!r}")


__all__ = [
    "AutoschedError", "CompileError", "LowerError", "MeasureError", "ModelImportError",
    "ScheduleError", "TEError", "Task", "TuneOptions", "best_schedule", "build", "build_best",
    "load", "lower", "te", "tune",
]
