"""Schedule steps: small frozen records. A schedule is an ordered list of them.

Steps name stages and axes by name (stage names are unique in a schedule, axis names unique in
a stage), so they serialise to JSON, replay on a fresh schedule of the same DAG, and print as the
Python calls that make them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar

from autosched.errors import ScheduleError

STEP_VERSION = 1


def ident(name: str) -> str:
    """A Python identifier for a stage or axis name ("i.outer" -> "i_outer")."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"_{out}"


Namer = Callable[[str, str], str]


@dataclass(frozen=True)
class Step:
    kind: ClassVar[str] = ""
    stage: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return {"kind": self.kind, **d}

    def python(self, n: Namer) -> str:
        """The Python call of this step; ``n(stage, axis)`` names axis variables."""
        raise NotImplementedError

    @property
    def s(self) -> str:
        return f"s[{ident(self.stage)}]"


@dataclass(frozen=True)
class Split(Step):
    kind: ClassVar[str] = "split"
    axis: str
    factor: int | None = None
    nparts: int | None = None

    def outputs(self) -> tuple[str, str]:
        return f"{self.axis}.outer", f"{self.axis}.inner"

    def python(self, n: Namer) -> str:
        arg = f"factor={self.factor}" if self.factor is not None else f"nparts={self.nparts}"
        o, i = self.outputs()
        return f"{n(self.stage, o)}, {n(self.stage, i)} = {self.s}.split({n(self.stage, self.axis)}, {arg})"


# the axis a fuse of no axes makes: a new outermost loop of one iteration (Stage.fuse)
SINGLETON = "singleton"


@dataclass(frozen=True)
class Fuse(Step):
    kind: ClassVar[str] = "fuse"
    axes: tuple[str, ...]

    def output(self) -> str:
        return ".".join(self.axes) + ".fused" if self.axes else SINGLETON

    def python(self, n: Namer) -> str:
        axes = ", ".join(n(self.stage, a) for a in self.axes)
        return f"{n(self.stage, self.output())} = {self.s}.fuse({axes})"


@dataclass(frozen=True)
class Reorder(Step):
    kind: ClassVar[str] = "reorder"
    axes: tuple[str, ...]

    def python(self, n: Namer) -> str:
        return f"{self.s}.reorder({', '.join(n(self.stage, a) for a in self.axes)})"


ANNOTATIONS = ("parallel", "vectorize", "unroll")


@dataclass(frozen=True)
class Annotate(Step):
    kind: ClassVar[str] = "annotate"
    axis: str
    annotation: str

    def python(self, n: Namer) -> str:
        return f"{self.s}.{self.annotation}({n(self.stage, self.axis)})"


@dataclass(frozen=True)
class Bind(Step):
    kind: ClassVar[str] = "bind"
    axis: str
    tag: str

    def python(self, n: Namer) -> str:
        return f'{self.s}.bind({n(self.stage, self.axis)}, te.thread_axis("{self.tag}"))'


@dataclass(frozen=True)
class Pragma(Step):
    kind: ClassVar[str] = "pragma"
    axis: str
    key: str
    value: int | bool | str

    def python(self, n: Namer) -> str:
        return f"{self.s}.pragma({n(self.stage, self.axis)}, {self.key!r}, {self.value!r})"


@dataclass(frozen=True)
class Tensorize(Step):
    """The loop nest from ``axis`` inwards runs as the tensor intrinsic ``intrin``
    (tir/tensor_intrin.py)."""

    kind: ClassVar[str] = "tensorize"
    axis: str
    intrin: str

    def python(self, n: Namer) -> str:
        return f"{self.s}.tensorize({n(self.stage, self.axis)}, {self.intrin!r})"


@dataclass(frozen=True)
class ComputeAt(Step):
    kind: ClassVar[str] = "compute_at"
    target: str
    axis: str

    def python(self, n: Namer) -> str:
        return f"{self.s}.compute_at(s[{ident(self.target)}], {n(self.target, self.axis)})"


@dataclass(frozen=True)
class ComputeInline(Step):
    kind: ClassVar[str] = "compute_inline"

    def python(self, n: Namer) -> str:
        return f"{self.s}.compute_inline()"


@dataclass(frozen=True)
class ComputeRoot(Step):
    kind: ClassVar[str] = "compute_root"

    def python(self, n: Namer) -> str:
        return f"{self.s}.compute_root()"


@dataclass(frozen=True)
class StorageAlign(Step):
    """The stride of ``axis`` (a row of the stage's buffer) becomes the least length at least
    the row's with ``stride % factor == offset``: padding that moves rows onto other
    shared-memory banks."""

    kind: ClassVar[str] = "storage_align"
    axis: str
    factor: int
    offset: int

    def python(self, n: Namer) -> str:
        return f"{self.s}.storage_align({n(self.stage, self.axis)}, {self.factor}, {self.offset})"


@dataclass(frozen=True)
class Pipeline(Step):
    """A shared-memory stage computed at a serial loop keeps ``stages`` buffers and fetches
    ``stages - 1`` iterations ahead: its copy for iteration ``k + stages - 1`` is issued
    before the loop body of iteration ``k`` runs (1: fetched in its own iteration)."""

    kind: ClassVar[str] = "pipeline"
    stages: int

    def python(self, n: Namer) -> str:
        return f"{self.s}.pipeline({self.stages})"


@dataclass(frozen=True)
class SetScope(Step):
    kind: ClassVar[str] = "set_scope"
    scope: str

    def python(self, n: Namer) -> str:
        return f'{self.s}.set_scope("{self.scope}")'


@dataclass(frozen=True)
class CacheRead(Step):
    """``stage`` is the tensor being cached; the new stage is ``<stage>.<scope>``."""

    kind: ClassVar[str] = "cache_read"
    scope: str
    readers: tuple[str, ...]

    def output(self) -> str:
        return f"{self.stage}.{self.scope}"

    def python(self, n: Namer) -> str:
        readers = ", ".join(ident(r) for r in self.readers)
        return f'{ident(self.output())} = s.cache_read({ident(self.stage)}, "{self.scope}", [{readers}])'


@dataclass(frozen=True)
class CacheWrite(Step):
    kind: ClassVar[str] = "cache_write"
    scope: str

    def output(self) -> str:
        return f"{self.stage}.{self.scope}"

    def python(self, n: Namer) -> str:
        return f'{ident(self.output())} = s.cache_write({ident(self.stage)}, "{self.scope}")'


@dataclass(frozen=True)
class Rfactor(Step):
    kind: ClassVar[str] = "rfactor"
    axis: str
    factor_axis: int = 0

    def output(self) -> str:
        return f"{self.stage}.rf"

    def python(self, n: Namer) -> str:
        extra = f", factor_axis={self.factor_axis}" if self.factor_axis else ""
        return f"{ident(self.output())} = s.rfactor({ident(self.stage)}, {n(self.stage, self.axis)}{extra})"


STEP_TYPES: dict[str, type[Step]] = {
    cls.kind: cls
    for cls in (Split, Fuse, Reorder, Annotate, Bind, Pragma, Tensorize, ComputeAt,
                ComputeInline, ComputeRoot, SetScope, StorageAlign, Pipeline, CacheRead,
                CacheWrite, Rfactor)
}


MAX_INT = 2**31  # step values are tile sizes, unroll steps, axis counts
_SCALARS: dict[str, type] = {"str": str, "int": int, "bool": bool, "None": type(None)}


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, for errors about values read from outside."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.cache
def _kinds(annotation: str) -> tuple[bool, tuple[type, ...]]:
    """What a step field's annotation allows: (a list of them?, the scalar types), from
    ``int | None`` or ``tuple[str, ...]`` (a tuple is a list in JSON)."""
    many = annotation.startswith("tuple[") and annotation.endswith(", ...]")
    inner = annotation[len("tuple["):-len(", ...]")] if many else annotation
    return many, tuple(_SCALARS[a.strip()] for a in inner.split("|"))


def fits(value: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a JSON value is one of ``kinds`` (exact types: a bool is no int here); ints
    must be non-negative and below MAX_INT."""
    if type(value) is int:
        return int in kinds and 0 <= value < MAX_INT
    return type(value) in kinds


@functools.cache
def _step_schema(kind: str) -> tuple[dict[str, tuple[str, bool, tuple[type, ...]]],
                                     frozenset[str]]:
    """{field: (annotation, what it allows)} and the required fields of a step kind, from its
    dataclass."""
    fs = fields(STEP_TYPES[kind])
    return ({f.name: (str(f.type), *_kinds(str(f.type))) for f in fs},
            frozenset(f.name for f in fs if f.default is MISSING))


def check_step_dict(d: dict[str, Any], error: type[Exception] = ScheduleError) -> None:
    """A step dict (from a log or JSON: data from outside) against its kind's fields and their
    types, values included (ints non-negative and below MAX_INT), without building the step:
    logs hold ~40 steps a record. Raises ``error`` naming the field."""
    kind = d.get("kind")
    if type(kind) is not str or kind not in STEP_TYPES:
        raise error(f"unknown schedule step kind {short_repr(kind)}")
    schema, required = _step_schema(kind)
    for name, value in d.items():
        allowed = schema.get(name)
        if allowed is None:
            if name == "kind":
                continue
            raise error(f"step {kind} has an unknown field {short_repr(name)}")
        annotation, many, kinds = allowed
        if many:
            ok = type(value) is list and all(fits(v, kinds) for v in value)
        elif type(value) is int:  # the common case, inline: logs hold ~40 steps a record
            ok = int in kinds and 0 <= value < MAX_INT
        else:
            ok = type(value) in kinds
        if not ok:
            raise error(f"step {kind} field {name} must be {annotation}, got "
                             f"{short_repr(value)}")
    missing = required - d.keys()
    if missing:
        raise error(f"step {kind} lacks {', '.join(sorted(missing))}")


def step_from_dict(d: dict[str, Any]) -> Step:
    """The step a dict describes (ScheduleError naming the field when it is malformed)."""
    check_step_dict(d)
    kind = d["kind"]
    cls = STEP_TYPES[kind]
    args: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k != "kind"}
    try:
        return cls(**args)
    except TypeError as exc:
        raise ScheduleError(f"malformed {kind} step {d}: {exc}") from None


def steps_to_json(steps: list[Step]) -> str:
    return json.dumps({"version": STEP_VERSION, "steps": [s.to_dict() for s in steps]})


def steps_from_json(text: str | dict) -> list[Step]:
    data = json.loads(text) if isinstance(text, str) else text
    if not isinstance(data, dict) or data.get("version") != STEP_VERSION:
        raise ScheduleError(f"schedule JSON must have version {STEP_VERSION}: {str(data)[:200]}")
    return [step_from_dict(d) for d in data["steps"]]
