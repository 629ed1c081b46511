"""The schedule: per-stage loop structure, built by replaying steps.

``te.create_schedule(C.op)`` gives a Schedule; ``s[C]`` is C's Stage, whose methods (split, fuse,
reorder, ...) keep TVM's names and meanings. Every method records a Step (steps.py) and applies
it here, checking legality with the values at hand; ``Schedule.from_json`` replays the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autosched.errors import ScheduleError
from autosched.schedule import steps as S
from autosched.te import expr as E
from autosched.te.dag import topo_ops
from autosched.te.opcodes import Op
from autosched.te.tensor import ComputeOp, Operation, PlaceholderOp, Tensor
from autosched.te.visit import substitute, tensors_read
from autosched.tir.ir import SCOPES
from autosched.tir.tensor_intrin import TENSOR_INTRINS, dot_mismatch

PRAGMAS = ("auto_unroll_max_step", "unroll_explicit", "wgmma_stages", "wgmma_producer",
           "wgmma_epilogue")
MAX_PIPELINE_STAGES = 4


@dataclass(frozen=True)
class SplitRel:
    parent: E.IterVar
    outer: E.IterVar
    inner: E.IterVar
    factor: int | None
    nparts: int | None


@dataclass(frozen=True)
class FuseRel:
    axes: tuple[E.IterVar, ...]
    fused: E.IterVar


def split_extents(extent: E.Expr, factor: int | None, nparts: int | None
                  ) -> tuple[E.Expr, E.Expr]:
    """(outer, inner) extents of a split of ``extent`` by ``factor`` or into ``nparts``."""
    if factor is not None:
        return _ceildiv(extent, factor), E.const(factor)
    assert nparts is not None, "a split has a factor or a number of parts"
    return E.const(nparts), _ceildiv(extent, nparts)


def _ceildiv(a: E.Expr, b: int) -> E.Expr:
    return E.binary(Op.FLOORDIV, E.binary(Op.ADD, a, b - 1), b)


class Stage:
    """The schedule of one operation: its loop axes, their order, annotations and attachment."""

    def __init__(self, sch: Schedule, name: str, op: PlaceholderOp | ComputeOp):
        self.sch = sch
        self.name = name
        self.op = op
        self.uids = {op.uid}
        self.scope = "global"
        self.align: tuple[int, int] | None = None  # (factor, offset) of its rows' stride
        self.pipeline_stages = 1  # buffers of a shared stage fetched ahead (Stage.pipeline)
        self.read_map: dict[int, str] = {}
        self.attach: tuple = ("root",)
        self.reset()

    def reset(self) -> None:
        op = self.op
        self.root: list[E.IterVar] = list(op.axis + op.reduce_axis) if isinstance(op, ComputeOp) else []
        self.leaf: list[E.IterVar] = list(self.root)
        self.relations: list[SplitRel | FuseRel] = []
        self.annotations: dict[int, str] = {}
        self.bindings: dict[int, str] = {}
        self.pragmas: dict[int, tuple[tuple[str, Any], ...]] = {}
        self.tensorized: dict[int, str] = {}  # axis uid -> tensor intrinsic name

    # -- queries ------------------------------------------------------------------------------
    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    @property
    def compute_op(self) -> ComputeOp:
        """The op of a computed stage (its axes, reduce axes and body)."""
        if not isinstance(self.op, ComputeOp):
            raise ScheduleError(f"{self.name} is a placeholder (an input), not a computed stage")
        return self.op

    @property
    def is_output(self) -> bool:
        return any(t.op.uid in self.uids for t in self.sch.outputs)

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.op, ComputeOp) and bool(self.op.reduce_axis)

    def leaf_named(self, name: str) -> E.IterVar:
        for iv in self.leaf:
            if iv.name == name:
                return iv
        raise ScheduleError(
            f"axis {name} is not a leaf axis of stage {self.name} "
            f"(leaf axes: {', '.join(a.name for a in self.leaf) or 'none'})"
        )

    def position(self, iv: E.IterVar) -> int:
        """Where leaf axis ``iv`` is in the loop order (by its variable: ``list.index`` would
        build and compare an ``==`` node per axis before it)."""
        uid = iv.var.uid
        for pos, x in enumerate(self.leaf):
            if x.var.uid == uid:
                return pos
        raise ScheduleError(f"axis {iv.name} is not a leaf axis of stage {self.name}")

    def _axis(self, axis: E.IterVar | str, what: str) -> E.IterVar:
        if isinstance(axis, str):
            return self.leaf_named(axis)
        if not isinstance(axis, E.IterVar):
            raise ScheduleError(f"{what} on stage {self.name}: {axis!r} is not an axis")
        for iv in self.leaf:
            if iv.var.uid == axis.var.uid:
                return iv
        owner = self.sch.owner_of(axis)
        where = f"it belongs to stage {owner.name}" if owner and owner is not self else (
            "it was split or fused already" if owner else "it is not an axis of this schedule")
        raise ScheduleError(
            f"{what} on stage {self.name}: axis {axis.name} is not a leaf axis of this stage "
            f"({where}; leaf axes: {', '.join(a.name for a in self.leaf)})"
        )

    def _new_axis(self, name: str, extent: E.Expr, kind: str) -> E.IterVar:
        if any(iv.name == name for iv in self.all_axes()):
            raise ScheduleError(f"stage {self.name} already has an axis named {name}")
        return E.IterVar(E.Var(name), E.Range(E.const(0), extent), kind)

    def all_axes(self) -> list[E.IterVar]:
        out = list(self.root)
        for r in self.relations:
            out += [r.outer, r.inner] if isinstance(r, SplitRel) else [r.fused]
        return out

    def _record(self, step: S.Step) -> Any:
        return self.sch.apply(step)

    def check_not_attached(self, iv: E.IterVar, what: str) -> None:
        """Splitting or fusing a loop that other stages are computed at would orphan them."""
        for other in self.sch.stages:
            if other.attach == ("at", self.name, iv.name):
                raise ScheduleError(
                    f"cannot {what} axis {iv.name} of {self.name}: stage {other.name} is computed "
                    f"at it; {what} before compute_at"
                )

    # -- primitives (each records a step) ----------------------------------------------------------
    def split(self, axis: E.IterVar, factor: int | None = None, nparts: int | None = None) -> tuple[E.IterVar, E.IterVar]:
        """Split ``axis`` into (outer, inner): ``factor`` is the inner extent, ``nparts`` the outer."""
        iv = self._axis(axis, "split")
        return self._record(S.Split(self.name, iv.name, _int_or_none(factor), _int_or_none(nparts)))

    def tile(self, x: E.IterVar, y: E.IterVar, x_factor: int, y_factor: int) -> tuple[E.IterVar, ...]:
        """Split x and y and reorder to (x.outer, y.outer, x.inner, y.inner)."""
        xo, xi = self.split(x, factor=x_factor)
        yo, yi = self.split(y, factor=y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *axes: E.IterVar) -> E.IterVar:
        """Fuse adjacent axes (outermost first) into one. With no axes (as TVM's ``fuse()``),
        a new outermost loop of one iteration: a loop to bind or attach at in a stage that
        has no data axis, such as a reduction to a scalar (bound to ``blockIdx.x``, its
        reduce axes can then be spread over the block's threads)."""
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        ivs = [self._axis(a, "fuse") for a in axes]
        return self._record(S.Fuse(self.name, tuple(iv.name for iv in ivs)))

    def reorder(self, *axes: E.IterVar) -> None:
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        ivs = [self._axis(a, "reorder") for a in axes]
        self._record(S.Reorder(self.name, tuple(iv.name for iv in ivs)))

    def vectorize(self, axis: E.IterVar) -> None:
        self._record(S.Annotate(self.name, self._axis(axis, "vectorize").name, "vectorize"))

    def unroll(self, axis: E.IterVar) -> None:
        self._record(S.Annotate(self.name, self._axis(axis, "unroll").name, "unroll"))

    def parallel(self, axis: E.IterVar) -> None:
        self._record(S.Annotate(self.name, self._axis(axis, "parallel").name, "parallel"))

    def bind(self, axis: E.IterVar, thread: E.IterVar | str) -> None:
        tag = thread if isinstance(thread, str) else thread.thread_tag
        if not tag:
            raise ScheduleError(f"bind on stage {self.name}: {thread} is not a te.thread_axis")
        self._record(S.Bind(self.name, self._axis(axis, "bind").name, tag))

    def pragma(self, axis: E.IterVar, key: str, value: int | bool | str = True) -> None:
        self._record(S.Pragma(self.name, self._axis(axis, "pragma").name, key, value))

    def tensorize(self, axis: E.IterVar, intrin: str) -> None:
        """Run the loop nest from ``axis`` inwards as the tensor intrinsic ``intrin``
        (tir/tensor_intrin.py: "wmma_16x16x16_f16", "wmma_store_16x16", ...)."""
        self._record(S.Tensorize(self.name, self._axis(axis, "tensorize").name, intrin))

    def compute_at(self, parent: Stage, axis: E.IterVar) -> None:
        if not isinstance(parent, Stage):
            raise ScheduleError(f"compute_at of {self.name}: target must be a stage (s[T]), got {parent!r}")
        iv = parent._axis(axis, f"compute_at of {self.name}")
        self._record(S.ComputeAt(self.name, parent.name, iv.name))

    def compute_inline(self) -> None:
        self._record(S.ComputeInline(self.name))

    def compute_root(self) -> None:
        self._record(S.ComputeRoot(self.name))

    def storage_align(self, axis: E.IterVar, factor: int, offset: int) -> None:
        """Pad the rows of this stage's buffer: the stride of ``axis`` (the second-to-last
        axis of ``op.axis``) becomes the least length at least the row's that is ``offset``
        modulo ``factor`` (TVM's storage_align)."""
        iv = axis.name if isinstance(axis, E.IterVar) else axis
        self._record(S.StorageAlign(self.name, iv, _int_or_none(factor) or 0,
                                    _int_or_none(offset) or 0))

    def pipeline(self, stages: int) -> None:
        """Software-pipeline this shared-memory stage over the serial loop it is computed at:
        ``stages`` buffers, the copy for iteration ``k + stages - 1`` issued before the body of
        iteration ``k`` (asynchronously where the target can: cp.async on sm_80 and newer), one
        barrier per iteration. ``stages=1`` is the plain fetch in its own iteration.

        Lowering gives the loop a prologue that fetches the first ``stages - 1`` iterations::

            barrier; fetch(0) ... fetch(stages - 2)
            for k in range(K):
                wait for fetch(k); barrier
                if k + stages - 1 < K: fetch(k + stages - 1)   # into buffer (k + stages - 1) % stages
                body(k)                                         # reads buffer k % stages
        """
        self._record(S.Pipeline(self.name, _int_or_none(stages) or 0))

    def set_scope(self, scope: str) -> None:
        """Where this stage's buffer lives: "global", "shared", "local" or "wmma.accumulator"
        (the fragments of a warp, which only tensorized nests touch)."""
        self._record(S.SetScope(self.name, scope))

    def __repr__(self) -> str:
        return f"Stage({self.name}, leaf=[{', '.join(a.name for a in self.leaf)}], attach={self.attach})"


def _int_or_none(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, E.Const):
        v = v.value
    if isinstance(v, bool) or not isinstance(v, int):
        raise ScheduleError(f"split factors must be Python ints, got {v!r}")
    return v


def _derived_kind(ivs: Sequence[E.IterVar]) -> str:
    return "reduce" if any(iv.kind == "reduce" for iv in ivs) else "data"


class Schedule:
    """All stages of a DAG and the steps applied so far."""

    def __init__(self, outputs: Sequence[Tensor]):
        self.outputs: list[Tensor] = list(outputs)
        self.stages: list[Stage] = []
        self.steps: list[S.Step] = []
        used: set[str] = set()
        for op in topo_ops(self.outputs):
            name, n = op.name, 1
            while name in used:
                name, n = f"{op.name}_{n}", n + 1
            used.add(name)
            self.stages.append(Stage(self, name, op))

    # -- lookup -------------------------------------------------------------------------------
    def __getitem__(self, key: Tensor | Operation | str) -> Stage:
        if isinstance(key, str):
            return self.stage(key)
        op = key.op if isinstance(key, Tensor) else key
        for st in self.stages:
            if op.uid in st.uids:
                return st
        raise ScheduleError(f"{getattr(op, 'name', op)} is not an operation of this schedule")

    def stage(self, name: str) -> Stage:
        for st in self.stages:
            if st.name == name:
                return st
        raise ScheduleError(
            f"no stage named {name} (stages: {', '.join(s.name for s in self.stages)})"
        )

    def stage_of_uid(self, uid: int) -> Stage:
        for st in self.stages:
            if uid in st.uids:
                return st
        raise ScheduleError(f"operation #{uid} has no stage in this schedule")

    def owner_of(self, axis: E.IterVar) -> Stage | None:
        for st in self.stages:
            if any(iv.var.uid == axis.var.uid for iv in st.all_axes()):
                return st
        return None

    def reads_of(self, st: Stage) -> list[Stage]:
        """Stages whose outputs ``st`` reads directly (after cache_read redirection)."""
        if not isinstance(st.op, ComputeOp):
            return []
        out: list[Stage] = []
        for t in tensors_read(st.op.body):
            q = self.resolve_read(st, t)
            if q not in out:
                out.append(q)
        return out

    def resolve_read(self, reader: Stage, t: Tensor) -> Stage:
        """The stage ``reader`` reads for ``t``, following chains of caches (a cache_read of a
        cache_read: A -> A.shared -> A.shared.local)."""
        st, seen = self.stage_of_uid(t.op.uid), set()
        while True:
            name = next((reader.read_map[u] for u in st.uids if u in reader.read_map), None)
            if name is None or name in seen or name == reader.name:
                return st
            seen.add(name)
            st = self.stage(name)

    # -- DAG-changing primitives ----------------------------------------------------------
    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Any]) -> Tensor:
        """A copy of ``tensor`` in ``scope`` that ``readers`` read instead of the original."""
        src = self[tensor]
        names = tuple(self._stage_of_any(r).name for r in readers)
        return self.apply(S.CacheRead(src.name, scope, names))

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute ``tensor`` into a ``scope`` buffer first, then copy it out."""
        return self.apply(S.CacheWrite(self[tensor].name, scope))

    def rfactor(self, tensor: Tensor, axis: E.IterVar, factor_axis: int = 0) -> Tensor:
        """Factor the reduction of ``tensor`` over the reduce leaf ``axis`` into a new stage."""
        st = self[tensor]
        return self.apply(S.Rfactor(st.name, st._axis(axis, "rfactor").name, factor_axis))

    def _stage_of_any(self, r: Any) -> Stage:
        if isinstance(r, Stage):
            return r
        return self[r]

    # -- serialisation ---------------------------------------------------------------------------
    def to_json(self) -> str:
        return S.steps_to_json(self.steps)

    @staticmethod
    def from_json(outputs: Sequence[Tensor] | Tensor, text: str | dict) -> Schedule:
        sch = create_schedule(outputs)
        for step in S.steps_from_json(text):
            sch.apply(step)
        return sch

    def to_python(self) -> str:
        """The steps as the Python schedule calls that make them (runnable, given the tensors
        under their stage names and ``s``)."""
        return _PyWriter(self).write()

    def __str__(self) -> str:
        return self.to_python()

    # -- step application ---------------------------------------------------------------------
    def apply(self, step: S.Step) -> Any:
        handler = getattr(self, f"_apply_{step.kind}")
        result = handler(step)
        self.steps.append(step)
        return result

    def _compute_stage(self, name: str, what: str) -> Stage:
        st = self.stage(name)
        if st.is_placeholder:
            raise ScheduleError(f"{what}: {name} is a placeholder (an input), not a computed stage")
        return st

    def _apply_split(self, step: S.Split) -> tuple[E.IterVar, E.IterVar]:
        st = self._compute_stage(step.stage, "split")
        iv = st.leaf_named(step.axis)
        st.check_not_attached(iv, "split")
        if (step.factor is None) == (step.nparts is None):
            raise ScheduleError(f"split of axis {iv.name} of {st.name}: give exactly one of factor= and nparts=")
        value = step.factor if step.factor is not None else step.nparts
        label = "factor" if step.factor is not None else "nparts"
        if value is None or value <= 0:
            raise ScheduleError(f"split {label} {value} for axis {iv.name} of {st.name}: must be a positive int")
        outer_ext, inner_ext = split_extents(iv.dom.extent, step.factor, step.nparts)
        o_name, i_name = step.outputs()
        outer = st._new_axis(o_name, outer_ext, iv.kind)
        inner = st._new_axis(i_name, inner_ext, iv.kind)
        pos = st.position(iv)
        st.leaf[pos:pos + 1] = [outer, inner]
        st.relations.append(SplitRel(iv, outer, inner, step.factor, step.nparts))
        _drop_marks(st, iv)
        return outer, inner

    def _apply_fuse(self, step: S.Fuse) -> E.IterVar:
        st = self._compute_stage(step.stage, "fuse")
        if not step.axes:
            one = st._new_axis(S.SINGLETON, E.const(1), "data")
            st.leaf.insert(0, one)
            st.relations.append(FuseRel((), one))
            return one
        if len(step.axes) < 2:
            raise ScheduleError(f"fuse on {st.name} needs at least two axes, got {list(step.axes)}")
        ivs = [st.leaf_named(a) for a in step.axes]
        for iv in ivs:
            st.check_not_attached(iv, "fuse")
        pos = [st.position(iv) for iv in ivs]
        if pos != list(range(pos[0], pos[0] + len(pos))):
            raise ScheduleError(
                f"fuse on {st.name}: axes {', '.join(step.axes)} are not adjacent in the loop order "
                f"({', '.join(a.name for a in st.leaf)}); reorder them first"
            )
        kinds = {iv.kind for iv in ivs}
        if len(kinds) > 1:
            raise ScheduleError(f"fuse on {st.name}: cannot fuse data and reduce axes ({', '.join(step.axes)})")
        ext: E.Expr = E.const(1)
        for iv in ivs:
            ext = E.binary(Op.MUL, ext, iv.dom.extent)
        fused = st._new_axis(step.output(), ext, ivs[0].kind)
        st.leaf[pos[0]:pos[-1] + 1] = [fused]
        st.relations.append(FuseRel(tuple(ivs), fused))
        for iv in ivs:
            _drop_marks(st, iv)
        return fused

    def _apply_reorder(self, step: S.Reorder) -> None:
        st = self._compute_stage(step.stage, "reorder")
        ivs = [st.leaf_named(a) for a in step.axes]
        if len({iv.var.uid for iv in ivs}) != len(ivs):
            raise ScheduleError(f"reorder on {st.name}: an axis appears twice in {list(step.axes)}")
        slots = sorted(st.position(iv) for iv in ivs)
        for slot, iv in zip(slots, ivs):
            st.leaf[slot] = iv

    def _apply_annotate(self, step: S.Annotate) -> None:
        st = self._compute_stage(step.stage, step.annotation)
        iv = st.leaf_named(step.axis)
        if step.annotation not in S.ANNOTATIONS:
            raise ScheduleError(f"unknown annotation {step.annotation!r} on {st.name}.{iv.name}")
        if iv.kind == "reduce" and step.annotation in ("vectorize", "parallel"):
            raise ScheduleError(
                f"cannot {step.annotation} reduction axis {iv.name} of {st.name}: iterations "
                "would race on the accumulator; use rfactor first"
            )
        if step.annotation == "vectorize" and not isinstance(iv.dom.extent, E.Const):
            raise ScheduleError(
                f"vectorize needs a constant extent; axis {iv.name} of {st.name} has {iv.dom.extent}"
            )
        if iv.var.uid in st.bindings:
            raise ScheduleError(
                f"cannot {step.annotation} axis {iv.name} of {st.name}: it is bound to "
                f"{st.bindings[iv.var.uid]}"
            )
        old = st.annotations.get(iv.var.uid)
        if old and old != step.annotation:
            raise ScheduleError(f"axis {iv.name} of {st.name} is already marked {old}; cannot also {step.annotation}")
        st.annotations[iv.var.uid] = step.annotation

    def _apply_bind(self, step: S.Bind) -> None:
        st = self._compute_stage(step.stage, "bind")
        iv = st.leaf_named(step.axis)
        E_tag = step.tag
        from autosched.te.tensor import thread_axis

        thread_axis(E_tag)  # validates the tag
        if iv.kind == "reduce":
            raise ScheduleError(
                f"cannot bind reduction axis {iv.name} of {st.name} to {E_tag}: cross-thread "
                "reduction is not supported; rfactor the reduction and bind the factored axis"
            )
        for uid, tag in st.bindings.items():
            # "vthread" (no dimension) may bind several axes, one virtual thread loop each, as
            # in TVM; a hardware index belongs to one axis
            if tag == E_tag != "vthread" and uid != iv.var.uid:
                other = next(a.name for a in st.all_axes() if a.var.uid == uid)
                raise ScheduleError(f"{E_tag} is already bound to axis {other} of {st.name}; cannot bind {iv.name} too")
        if iv.var.uid in st.annotations:
            raise ScheduleError(f"cannot bind axis {iv.name} of {st.name}: it is marked {st.annotations[iv.var.uid]}")
        st.bindings[iv.var.uid] = E_tag

    def _apply_pragma(self, step: S.Pragma) -> None:
        st = self._compute_stage(step.stage, "pragma")
        iv = st.leaf_named(step.axis)
        if step.key not in PRAGMAS:
            raise ScheduleError(f"unknown pragma {step.key!r} on {st.name}.{iv.name}; known: {', '.join(PRAGMAS)}")
        if step.key == "wgmma_stages" and (not isinstance(step.value, int) or step.value < 3):
            raise ScheduleError(f"pragma wgmma_stages on {st.name}.{iv.name} needs an int >= 3, got {step.value!r}")
        if step.key == "wgmma_producer" and step.value not in (0, 1):
            raise ScheduleError(f"pragma wgmma_producer on {st.name}.{iv.name} needs 0 or 1, got {step.value!r}")
        if step.key == "wgmma_epilogue" and (not isinstance(step.value, int) or step.value < 1
                                             or step.value % 128):
            raise ScheduleError(f"pragma wgmma_epilogue on {st.name}.{iv.name} needs a thread count of whole warpgroups, got {step.value!r}")
        if step.key == "auto_unroll_max_step" and (not isinstance(step.value, int) or step.value < 0):
            raise ScheduleError(f"pragma auto_unroll_max_step on {st.name}.{iv.name} needs an int >= 0, got {step.value!r}")
        prev = tuple(kv for kv in st.pragmas.get(iv.var.uid, ()) if kv[0] != step.key)
        st.pragmas[iv.var.uid] = prev + ((step.key, step.value),)

    def _apply_tensorize(self, step: S.Tensorize) -> None:
        """The nest from the axis inwards must be the intrinsic's loops: constant extents in
        its shape, no annotations, and for an mma the sum of a product over (data, data,
        reduce) into a wmma.accumulator stage, for a load a copy into its fragments, for a
        store a copy into shared memory; what the nest reads is checked when it is compiled
        (it may read through stages inlined later)."""
        st = self._compute_stage(step.stage, "tensorize")
        iv = st.leaf_named(step.axis)
        where = f"tensorize {step.intrin} at {st.name}.{iv.name}"
        intrin = TENSOR_INTRINS.get(step.intrin)
        if intrin is None:
            raise ScheduleError(f"{where}: unknown tensor intrinsic; known: "
                                f"{', '.join(TENSOR_INTRINS)}")
        nest = st.leaf[st.position(iv):]
        got = [_const_extent(a) for a in nest]
        kinds = (["data", "reduce"] if intrin.kind == "dot"
                 else ["data", "data", "reduce"][:len(intrin.extents) or 3])
        if intrin.kind == "gemm_block":  # a block tile: rows in slabs, up to 256 columns
            m, n = got[:2] if len(got) == 3 else (None, None)
            block = (m is not None and n is not None and m % intrin.m == 0
                     and n % intrin.n == 0 and n <= 256 and got[2] is not None)
            if not block or [a.kind for a in nest] != kinds:
                raise ScheduleError(
                    f"{where}: the nest must be 3 innermost loops (data, data, reduce): a "
                    f"multiple of {intrin.m} rows, {intrin.n} to 256 columns by {intrin.n}, "
                    f"all of K; it is "
                    f"{', '.join(f'{a.name} ({a.kind}, {a.dom.extent})' for a in nest)}")
        elif got != list(intrin.extents) or [a.kind for a in nest] != kinds:
            raise ScheduleError(
                f"{where}: the nest must be {len(kinds)} innermost loops "
                f"({', '.join(kinds)}) of extents {intrin.extents}; it is "
                f"{', '.join(f'{a.name} ({a.kind}, {a.dom.extent})' for a in nest)}")
        marked = [a.name for a in nest if a.var.uid in st.annotations or a.var.uid in st.bindings
                  or a.var.uid in st.tensorized]
        if marked:
            raise ScheduleError(f"{where}: axis {marked[0]} is already annotated or bound")
        op = st.compute_op
        if intrin.kind in ("mma", "gemm_block"):
            body = op.body
            if (st.scope != intrin.scope or not isinstance(body, E.Reduce)
                    or body.combiner.name != "sum" or body.dtype != "float32"
                    or not isinstance(body.source, E.Binary) or body.source.op is not Op.MUL
                    or body.condition is not None or body.init is not None):
                raise ScheduleError(
                    f"{where}: needs a float32 sum of a product without condition or init "
                    f"(C[i, j] += A[i, k] * B[k, j]) in scope {intrin.scope} "
                    f"({st.name} is in scope {st.scope})")
        elif intrin.kind == "dot":
            why = dot_mismatch(op.body, intrin.name)
            if why:
                raise ScheduleError(
                    f"{where}: needs an int32 sum of int32({intrin.in_dtype}) * "
                    f"int32({intrin.b_dtype}) without condition or init; {why}")
        else:
            # a store goes to shared memory (an epilogue reads it) or to the output itself
            into = ("shared", "global") if intrin.kind == "store" else (intrin.scope,)
            if st.is_reduction or st.scope not in into:
                raise ScheduleError(f"{where}: needs a copy (no reduction) into scope "
                                    f"{' or '.join(into)} ({st.name} is in scope {st.scope})")
        st.tensorized[iv.var.uid] = intrin.name

    def _apply_compute_at(self, step: S.ComputeAt) -> None:
        st = self._compute_stage(step.stage, "compute_at")
        target = self._compute_stage(step.target, f"compute_at of {st.name}")
        if target is st:
            raise ScheduleError(f"cannot compute_at stage {st.name} inside itself")
        if st.is_output:
            raise ScheduleError(f"cannot compute_at {st.name}: it is an output of the schedule")
        iv = target.leaf_named(step.axis)
        walk: Stage | None = target
        while walk is not None and walk.attach[0] == "at":
            walk = self.stage(walk.attach[1])
            if walk is st:
                raise ScheduleError(f"compute_at {st.name} to {target.name}.{iv.name} makes a cycle: {target.name} is already inside {st.name}")
        st.attach = ("at", target.name, iv.name)

    def _apply_compute_inline(self, step: S.ComputeInline) -> None:
        st = self._compute_stage(step.stage, "compute_inline")
        if st.is_reduction:
            raise ScheduleError(f"cannot compute_inline {st.name}: it is a reduction")
        if st.is_output:
            raise ScheduleError(f"cannot compute_inline {st.name}: it is an output of the schedule")
        if st.relations or st.annotations or st.bindings:
            raise ScheduleError(f"cannot compute_inline {st.name}: its loops were already scheduled")
        st.attach = ("inline",)

    def _apply_compute_root(self, step: S.ComputeRoot) -> None:
        self._compute_stage(step.stage, "compute_root").attach = ("root",)

    def _apply_storage_align(self, step: S.StorageAlign) -> None:
        st = self._compute_stage(step.stage, "storage_align")
        axes = st.compute_op.axis
        if len(axes) < 2 or axes[-2].name != step.axis:
            raise ScheduleError(
                f"storage_align of {st.name}: pads the stride of the second-to-last axis "
                f"({axes[-2].name if len(axes) > 1 else 'none'}), not of {step.axis}")
        if step.factor < 1 or not 0 <= step.offset < step.factor:
            raise ScheduleError(f"storage_align of {st.name}: needs factor >= 1 and 0 <= offset "
                                f"< factor, got {step.factor}, {step.offset}")
        if st.is_output:
            raise ScheduleError(f"storage_align of {st.name}: an output keeps its tensor's "
                                "layout")
        st.align = (step.factor, step.offset)

    def _apply_pipeline(self, step: S.Pipeline) -> None:
        st = self._compute_stage(step.stage, "pipeline")
        if not 1 <= step.stages <= MAX_PIPELINE_STAGES:
            raise ScheduleError(f"pipeline of {st.name}: stages must be 1 to "
                                f"{MAX_PIPELINE_STAGES}, got {step.stages}")
        if st.scope != "shared" or st.is_reduction:
            raise ScheduleError(f"pipeline of {st.name}: needs a copy (no reduction) into "
                                f"shared memory ({st.name} is in scope {st.scope})")
        st.pipeline_stages = step.stages

    def _apply_set_scope(self, step: S.SetScope) -> None:
        st = self._compute_stage(step.stage, "set_scope")
        self._check_scope(step.scope, f"set_scope of {st.name}")
        if st.is_output:
            raise ScheduleError(f"set_scope of {st.name}: it is an output, so it lives in global memory")
        st.scope = step.scope

    def _check_scope(self, scope: str, what: str) -> None:
        if scope not in SCOPES:
            raise ScheduleError(f"{what}: unknown scope {scope!r}; expected one of {', '.join(SCOPES)}")

    def _apply_cache_read(self, step: S.CacheRead) -> Tensor:
        src = self.stage(step.stage)
        self._check_scope(step.scope, f"cache_read of {src.name}")
        if not step.readers:
            raise ScheduleError(f"cache_read of {src.name} needs at least one reader")
        readers = [self.stage(r) for r in step.readers]
        for r in readers:
            if src not in self.reads_of(r):
                raise ScheduleError(f"cache_read of {src.name}: stage {r.name} does not read {src.name}")
        t = src.op.output()
        axes = _fresh_axes(src.op.shape, t.ndim)
        op = ComputeOp(step.output(), axes, t[tuple(a.var for a in axes)], tag="cache_read")
        new = self._insert(Stage(self, step.output(), op), after=src)
        new.scope = step.scope
        for r in readers:
            for uid in src.uids:
                r.read_map[uid] = new.name
        return op.output()

    def _apply_cache_write(self, step: S.CacheWrite) -> Tensor:
        """As in TVM, the stage of the tensor keeps its op's data axes (``C.op.axis`` schedules
        the copy-out stage) and the cache stage gets fresh axes of the same names (so steps,
        which name axes, replay the same either way); reduce axes stay with the cache."""
        st = self._compute_stage(step.stage, "cache_write")
        self._check_scope(step.scope, f"cache_write of {st.name}")
        if st.relations or st.annotations or st.bindings or st.attach != ("root",):
            raise ScheduleError(f"cache_write of {st.name} must come before other steps on that stage")
        old = st.op
        assert isinstance(old, ComputeOp)
        fresh = tuple(E.IterVar(E.Var(a.name), a.dom, "data") for a in old.axis)
        cached = _with_axes(ComputeOp(step.output(), old.axis, old.body, old.reduce_axis, old.tag,
                                      old.attrs), fresh)
        copy = ComputeOp(old.name, old.axis, cached.output()[tuple(a.var for a in old.axis)],
                         tag=old.tag, attrs=old.attrs)
        new = self._insert(Stage(self, step.output(), cached), before=st)
        new.scope = step.scope
        new.read_map, st.read_map = st.read_map, {}
        st.op = copy
        st.uids.add(copy.uid)
        st.reset()
        return cached.output()

    def _apply_rfactor(self, step: S.Rfactor) -> Tensor:
        from autosched.schedule.rfactor import rfactor_ops

        st = self._compute_stage(step.stage, "rfactor")
        rf_op, new_op = rfactor_ops(st, st.leaf_named(step.axis), step.factor_axis, step.output())
        new_op = _with_axes(new_op, st.compute_op.axis)  # as in TVM: C.op.axis still schedules C
        new = self._insert(Stage(self, step.output(), rf_op), before=st)
        new.read_map, st.read_map = st.read_map, {}
        st.op = new_op
        st.uids.add(new_op.uid)
        st.reset()
        return rf_op.output()

    def _insert(self, stage: Stage, before: Stage | None = None, after: Stage | None = None) -> Stage:
        if any(s.name == stage.name for s in self.stages):
            raise ScheduleError(f"a stage named {stage.name} already exists")
        if before is not None:
            idx = self.stages.index(before)
        else:
            assert after is not None, "a new stage goes before or after another"
            idx = self.stages.index(after) + 1
        self.stages.insert(idx, stage)
        return stage


def _with_axes(op: ComputeOp, axes: tuple[E.IterVar, ...]) -> ComputeOp:
    """``op`` over the data axes ``axes`` instead of its own (its body rewritten to match)."""
    body = substitute(op.body, {a.var: b.var for a, b in zip(op.axis, axes)})
    return replace(op, axis=axes, body=body)


def _fresh_axes(shape: tuple[E.Expr, ...], ndim: int) -> tuple[E.IterVar, ...]:
    names = "ijklmnopqrst"
    return tuple(
        E.IterVar(E.Var(names[d] if d < len(names) else f"i{d}"), E.Range(E.const(0), shape[d]), "data")
        for d in range(ndim)
    )


def _const_extent(iv: E.IterVar) -> int | None:
    return int(iv.dom.extent.value) if isinstance(iv.dom.extent, E.Const) else None


def _drop_marks(st: Stage, iv: E.IterVar) -> None:
    for marks in (st.annotations, st.bindings, st.pragmas, st.tensorized):
        marks.pop(iv.var.uid, None)


class _PyWriter:
    """Names axis variables so that no two (stage, axis) pairs share one; fetches root axes
    (``i, j = s[C].op.axis``) the first time a step needs them."""

    def __init__(self, sch: Schedule):
        self.sch = sch
        self.names: dict[tuple[str, str], str] = {}
        self.taken: dict[str, tuple[str, str]] = {}
        self.lines: list[str] = []

    def name(self, stage: str, axis: str) -> str:
        key = (stage, axis)
        if key in self.names:
            return self.names[key]
        base = S.ident(axis)
        ident = base if base not in self.taken else f"{S.ident(stage)}_{base}"
        self.names[key] = ident
        self.taken[ident] = key
        return ident

    def _fetch_roots(self, state: Schedule, stage: str, axis: str) -> None:
        if (stage, axis) in self.names:
            return
        st = next((x for x in state.stages if x.name == stage), None)
        op = st.op if st is not None else None
        if not isinstance(op, ComputeOp):
            return
        for attr in ("axis", "reduce_axis"):
            axes = getattr(op, attr)
            if any(a.name == axis for a in axes):
                names = ", ".join(self.name(stage, a.name) for a in axes)
                comma = "," if len(axes) == 1 else ""
                self.lines.append(f"{names}{comma} = s[{S.ident(stage)}].op.{attr}")

    def _forget(self, stage: str) -> None:
        for key in [k for k in self.names if k[0] == stage]:
            self.taken.pop(self.names.pop(key), None)

    def write(self) -> str:
        state = Schedule(self.sch.outputs)  # replayed alongside, so root axes are the ones of the time
        for step in self.sch.steps:
            for stage, axis in _axes_used(step):
                self._fetch_roots(state, stage, axis)
            self.lines.append(step.python(self.name))
            state.apply(step)
            if isinstance(step, (S.CacheWrite, S.Rfactor)):
                self._forget(step.stage)
        return "\n".join(self.lines)


def _axes_used(step: S.Step) -> list[tuple[str, str]]:
    if isinstance(step, (S.Split, S.Annotate, S.Bind, S.Pragma, S.Tensorize, S.StorageAlign,
                         S.Rfactor)):
        return [(step.stage, step.axis)]
    if isinstance(step, (S.Fuse, S.Reorder)):
        return [(step.stage, a) for a in step.axes]
    if isinstance(step, S.ComputeAt):
        return [(step.target, step.axis)]
    return []


def create_schedule(ops: Any) -> Schedule:
    """A schedule with every stage at its default: loops in axis order, computed at the root."""
    if not isinstance(ops, (list, tuple)):
        ops = [ops]
    outs = []
    for o in ops:
        if isinstance(o, Tensor):
            outs.append(o)
        elif isinstance(o, Operation):
            outs.append(o.output())
        else:
            raise ScheduleError(f"create_schedule takes operations or tensors, got {o!r}")
    return Schedule(outs)


__all__ = ["Schedule", "Stage", "SplitRel", "FuseRel", "create_schedule"]
