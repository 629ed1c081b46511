"""Render a lowered PrimFunc as Python source for the reference evaluator.

Each buffer becomes a flat memoryview (row-major; the renderer flattens indices itself), each
loop a ``for`` over ``range``, each expression a Python expression over ints, floats and bools
(helpers from ``pyruntime`` supply C / IEEE semantics where Python's differ).

GPU kernels: the outermost ``thread`` loop (not a vthread) starts a kernel. Inside it every
thread of every block runs the whole body; a thread loop is not a loop but
``if hw_index < extent: var = hw_index + min``, and the launch size of a tag is the largest
extent of its loops in the kernel. A kernel without barriers runs its threads one after another
as nested loops. A kernel with barriers renders its body as a generator that yields at each
barrier, and ``pyruntime.run_block`` steps the threads of a block in lockstep. Shared buffers
are made once per block (also when allocated around the kernel), local ones per thread.

With ``check_races``, loads and stores of the shared and global buffers a kernel writes go
through ``pyruntime.race_load`` / ``race_store``, which record per element who accessed it since
the last barrier. With ``check_bounds``, every index the renderer cannot prove in bounds (from
constant loop ranges, ``min <= v < min + extent`` of enclosing loops, and the conditions of
enclosing ifs and selects) is checked and reported by ``pyruntime.oob``.
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np

from autosched.errors import CompileError
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op, OpKind
from autosched.te.visit import post_order
from autosched.tir import ir
from autosched.tir.evaluate import const_int
from autosched.tir.visit import loads, walk

_HW = {tag: f"_{tag[0]}{tag[-1]}" for tag in ir.THREAD_TAGS}  # "blockIdx.x" -> "_bx"
_LAUNCH = {tag: f"_n{_HW[tag]}" for tag in ir.THREAD_TAGS}  # "blockIdx.x" -> "_n_bx"

# Integer dtypes whose arithmetic wraps after every operation. int32 / int64 intermediates stay
# exact Python ints (index arithmetic never overflows in practice) and wrap where stored or cast.
_NARROW = ("int8", "int16", "uint8", "uint16", "uint32", "uint64")
# Python's blocks-per-function limit is 20 (loops and try); deeper nests move into a closure.
_MAX_BLOCKS = 17

# Ops whose Python operator computes them exactly on both ints and floats.
_PY_INFIX = (Op.ADD, Op.SUB, Op.MUL)


@dataclass(frozen=True)
class Rendered:
    """Python source for ``func``: ``entry(*buffer views, *shape var values)``."""

    source: str
    entry: str
    shape_vars: tuple[E.Var, ...]
    stored: frozenset[int]  # uids of parameter buffers the function writes


def is_vthread(s: ir.For) -> bool:
    return s.kind == "thread" and s.thread_tag.startswith("vthread")


def is_gpu_thread(s: ir.Stmt) -> TypeGuard[ir.For]:
    return isinstance(s, ir.For) and s.kind == "thread" and not is_vthread(s)






@dataclass(frozen=True)
class KernelInfo:
    """What a GPU kernel of a function launches: sizes per tag where they are constants, and
    the bytes of shared memory per block where its allocations have constant shapes."""

    name: str
    launch: dict[str, int | None]  # tag -> launch size (None when symbolic)
    shared_bytes: int | None

    @property
    def threads_per_block(self) -> int | None:
        sizes = [self.launch.get(t, 1) for t in ir.THREAD_TAGS[3:]]
        known = [n for n in sizes if n is not None]
        return math.prod(known) if len(known) == len(sizes) else None


def _outermost_thread_loops(
    s: ir.Stmt, around: tuple[ir.Buffer, ...] = ()
) -> Iterator[tuple[ir.For, tuple[ir.Buffer, ...]]]:
    """Kernel roots with the shared buffers allocated around them."""
    if is_gpu_thread(s):
        yield s, around
        return
    if isinstance(s, ir.Seq):
        for c in s.stmts:
            yield from _outermost_thread_loops(c, around)
    elif isinstance(s, ir.Allocate) and s.buffer.scope == "shared":
        yield from _outermost_thread_loops(s.body, around + (s.buffer,))
    elif isinstance(s, (ir.For, ir.Allocate, ir.LetStmt)):
        yield from _outermost_thread_loops(s.body, around)
    elif isinstance(s, ir.IfThenElse):
        yield from _outermost_thread_loops(s.then_body, around)
        if s.else_body is not None:
            yield from _outermost_thread_loops(s.else_body, around)


def kernels(func: ir.PrimFunc) -> list[KernelInfo]:
    """The GPU kernels of ``func`` in launch order, named as the evaluator names them."""
    out = []
    for n, (root, around) in enumerate(_outermost_thread_loops(func.body)):
        launch: dict[str, int | None] = {}
        for loop in walk(root):
            if is_gpu_thread(loop):
                ext = const_int(loop.extent)
                tag = loop.thread_tag
                prev = launch.get(tag, 0)
                launch[tag] = None if ext is None or prev is None else max(prev, ext)
        shared: int | None = 0
        inside = [a.buffer for a in walk(root) if isinstance(a, ir.Allocate)]
        for b in list(around) + inside:
            if b.scope == "shared":
                size = b.num_elements
                shared = None if shared is None or size is None else shared + size * b.itemsize
        out.append(KernelInfo(f"{func.name}_kernel{n}", launch, shared))
    return out


@dataclass
class _Kernel:
    name: str
    generator: bool  # threads run as generators stepped in lockstep (the kernel has barriers)
    launch: dict[str, str]  # tag -> launch size (a literal or the name of a local)
    const_launch: dict[str, int]  # tag -> launch size where every extent is a constant
    tracked: frozenset[int]  # buffers whose accesses the race checker records
    barriers: int = 0

    def dims(self) -> str:
        """The launch sizes (gx, gy, gz, tx, ty, tz) as a Python tuple expression."""
        return "(" + ", ".join(self.launch.get(t, "1") for t in ir.THREAD_TAGS) + ")"

    def linear(self, tags: tuple[str, ...]) -> str:
        """The linear index (x fastest) of the hardware ids of ``tags``."""
        text = "0"
        for tag in reversed(tags):
            text = f"({text} * {self.launch.get(tag, '1')} + {_HW[tag]})"
        return text


class _Renderer:
    def __init__(self, func: ir.PrimFunc, check_bounds: bool, check_races: bool) -> None:
        self.func = func
        self.check_bounds = check_bounds
        self.check_races = check_races
        self.trackers: dict[int, str] = {}  # uid of a race-tracked buffer -> its tracker
        self.pending_shared: dict[int, ir.Buffer] = {}  # shared, allocated around the kernel
        self.lines: list[str] = []
        self.indent = 1
        self.blocks = 0  # loop / try blocks enclosing the current line in its Python function
        self.taken: set[str] = set()
        self.vars: dict[int, str] = {}  # uid of a bound Var -> its Python name
        self.ranges: dict[int, tuple[int, int]] = {}  # uid -> inclusive bounds, when known
        # ("lt" | "le", a, b): a < b (a <= b) holds where the current line runs (loop ranges,
        # enclosing if and select conditions); lets bounds checks be dropped where they hold.
        self.facts: list[tuple[Op, E.Expr, E.Expr]] = []
        self.bufs: dict[int, str] = {}  # uid of a buffer in scope -> its Python name
        self.tmp_count = 0
        self.nest_count = 0
        self.kernel_count = 0
        self.kernel: _Kernel | None = None

    # -- names ---------------------------------------------------------------------------------

    def name(self, base: str) -> str:
        """A fresh Python identifier like ``base`` that cannot clash with helpers or builtins."""
        text = re.sub(r"\W", "_", base) or "v"
        if text[0].isdigit() or text[0] == "_":
            text = "v" + text
        if keyword.iskeyword(text) or hasattr(builtins, text):
            text += "_"
        candidate, n = text, 1
        while candidate in self.taken:
            candidate = f"{text}_{n}"
            n += 1
        self.taken.add(candidate)
        return candidate

    def tmp(self) -> str:
        self.tmp_count += 1
        return f"_t{self.tmp_count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    # -- the function --------------------------------------------------------------------------

    def render(self) -> Rendered:
        f = self.func
        entry = self.name(f.name)
        args: list[str] = []
        for buf in f.params:
            args.append(self.bind_buffer(buf))
        shape_vars: list[E.Var] = []
        for buf in f.params:
            for d in buf.shape:
                if isinstance(d, E.Var) and d.uid not in self.vars:
                    shape_vars.append(d)
                    args.append(self.bind_var(d))
        for buf in f.params:
            for d in buf.shape:
                missing = [v for v in post_order(d) if isinstance(v, E.Var) and v.uid not in self.vars]
                if missing:
                    raise CompileError(
                        f"{f.name}: the shape of parameter {buf.name} uses {missing[0].name}, "
                        "which no parameter has as a whole dimension, so it cannot be inferred"
                    )
        self.lines.append(f"def {entry}({', '.join(args)}):")
        before = len(self.lines)
        self.stmt(f.body)
        if len(self.lines) == before:
            self.emit("pass")
        header = f"# {f.name}: rendered by autosched.targets.ref.pyrender for the reference evaluator"
        stored = frozenset(
            s.buffer.uid for s in walk(f.body) if isinstance(s, ir.Store)
        ) & frozenset(b.uid for b in f.params)
        return Rendered("\n".join([header, *self.lines]) + "\n", entry, tuple(shape_vars), stored)

    def bind_buffer(self, buf: ir.Buffer) -> str:
        if buf.uid in self.bufs:
            raise CompileError(f"{self.func.name}: buffer {buf.name} is bound twice")
        self.bufs[buf.uid] = py = self.name(buf.name)
        return py

    def bind_var(self, v: E.Var, bounds: tuple[int, int] | None = None) -> str:
        if v.uid in self.vars:
            raise CompileError(
                f"{self.func.name}: variable {v.name} is bound again inside its own scope"
            )
        self.vars[v.uid] = py = self.name(v.name)
        if bounds is not None:
            self.ranges[v.uid] = bounds
        return py

    def unbind_var(self, v: E.Var) -> None:
        del self.vars[v.uid]
        self.ranges.pop(v.uid, None)

    # -- statements ----------------------------------------------------------------------------

    def stmt(self, s: ir.Stmt) -> None:
        method = getattr(self, "_s_" + type(s).__name__, None)
        if method is None:
            raise CompileError(f"the reference evaluator cannot run a {type(s).__name__} statement")
        method(s)

    def body(self, s: ir.Stmt) -> None:
        self.indent += 1
        before = len(self.lines)
        self.stmt(s)
        if len(self.lines) == before:
            self.emit("pass")
        self.indent -= 1

    def _s_Seq(self, s: ir.Seq) -> None:
        for c in s.stmts:
            self.stmt(c)

    def _s_Store(self, s: ir.Store) -> None:
        view = self.buffer(s.buffer)
        value = self.store_value(self.expr(s.value), s.value.dtype, s.buffer)
        flat = self.flat_index(s.buffer, s.indices, "store")
        trk = self.trackers.get(s.buffer.uid)
        if trk is None:
            self.emit(f"{view}[{flat}] = {value}")
            return
        if s.buffer.dtype == "float32":
            value = f"_f32({value})"  # compare with what is stored, as float32
        self.emit(f"_tstore({trk}, {view}, {flat}, {value}, _me, _ep[0])")

    def _s_IfThenElse(self, s: ir.IfThenElse) -> None:
        self.emit(f"if {self.expr(s.cond)}:")
        saved = len(self.facts)
        self.facts.extend(_conjuncts(s.cond))
        self.body(s.then_body)
        del self.facts[saved:]
        if s.else_body is not None:
            self.emit("else:")
            self.body(s.else_body)

    def _s_LetStmt(self, s: ir.LetStmt) -> None:
        value = self.expr(s.value)
        py = self.bind_var(s.var, self.interval(s.value))
        self.emit(f"{py} = {value}")
        self.stmt(s.body)
        self.unbind_var(s.var)

    def _s_Allocate(self, s: ir.Allocate) -> None:
        buf = s.buffer
        size = " * ".join(self.expr(d) for d in buf.shape) or "1"
        py = self.bind_buffer(buf)
        if self.kernel is None and buf.scope == "shared" and any(map(is_gpu_thread, walk(s.body))):
            # Shared memory allocated around a kernel still belongs to each block: every block
            # of the kernels inside makes its own (see shared_per_block).
            self.emit(f"# {py}: shared, one per block of the kernels below")
            self.pending_shared[buf.uid] = buf
            self.stmt(s.body)
            del self.pending_shared[buf.uid]
            del self.bufs[buf.uid]
            return
        if self.kernel is not None and buf.scope in ("shared", "global"):
            # One shared buffer per block (global: per launch), made when a thread first gets here.
            table = "_sh" if buf.scope == "shared" else "_kg"
            self.emit(f"{py} = _alloc_once({table}, {buf.uid}, {buf.dtype!r}, {size})  # {buf.scope}")
            if buf.uid in self.kernel.tracked:
                self.make_tracker(buf, table)
        else:
            self.emit(f"{py} = _alloc({buf.dtype!r}, {size})  # {buf.scope}")
        self.stmt(s.body)
        del self.bufs[buf.uid]
        self.trackers.pop(buf.uid, None)

    def make_tracker(self, buf: ir.Buffer, table: str) -> None:
        k = self.kernel
        assert k is not None
        self.trackers[buf.uid] = trk = self.name(buf.name + "_races")
        shape = "(" + "".join(f"{self.expr(d)}, " for d in buf.shape) + ")"
        self.emit(
            f"{trk} = _track({table}, {buf.uid}, {buf.name!r}, {shape}, {buf.scope!r}, "
            f"{k.name!r}, {k.dims()})"
        )

    def _s_Barrier(self, s: ir.Barrier) -> None:
        if self.kernel is None:
            raise CompileError(f"{self.func.name}: a barrier outside any GPU kernel")
        assert self.kernel.generator
        self.emit(f"yield {self.kernel.barriers}  # barrier #{self.kernel.barriers} ({s.scope})")
        self.kernel.barriers += 1

    def _s_For(self, s: ir.For) -> None:
        if s.kind not in ir.FOR_KINDS:
            raise CompileError(f"{self.func.name}: loop {s.var.name} has unknown kind {s.kind!r}")
        if is_gpu_thread(s):
            if s.thread_tag not in ir.THREAD_TAGS:
                raise CompileError(
                    f"{self.func.name}: loop {s.var.name} is bound to unknown thread tag "
                    f"{s.thread_tag!r}; expected one of {', '.join(ir.THREAD_TAGS)} or vthread"
                )
            if self.kernel is None and self.blocks > _MAX_BLOCKS - 7:
                self.nested(s)  # the launch adds up to 7 blocks (6 loops and a try)
            elif self.kernel is None:
                self.launch_kernel(s)
            else:
                self.thread_guard(s)
            return
        if self.blocks >= _MAX_BLOCKS:
            self.nested(s)
            return
        lo, ext = self.expr(s.min), self.expr(s.extent)
        lo_c, ext_c = const_int(s.min), const_int(s.extent)
        if lo_c == 0:
            rng = f"range({ext})"
        elif lo_c is not None and ext_c is not None:
            rng = f"range({lo_c}, {lo_c + ext_c})"
        else:
            t = self.tmp()
            rng = f"range(({t} := {lo}), {t} + {ext})"
        bounds = self.loop_bounds(s)
        py = self.bind_var(s.var, bounds)
        notes = [s.kind] if s.kind != "serial" else []
        notes += [s.thread_tag] if s.thread_tag else []
        notes += [f"{k}={v}" for k, v in s.annotations]
        self.emit(f"for {py} in {rng}:" + (f"  # {', '.join(notes)}" if notes else ""))
        self.blocks += 1
        saved = self.push_range_facts(s)
        self.body(s.body)
        del self.facts[saved:]
        self.blocks -= 1
        self.unbind_var(s.var)

    def push_range_facts(self, s: ir.For) -> int:
        saved = len(self.facts)
        if _pure_int(s.min) and _pure_int(s.extent):
            hi = s.extent if const_int(s.min) == 0 else E.binary(Op.ADD, s.min, s.extent)
            self.facts += [(Op.LE, s.min, s.var), (Op.LT, s.var, hi)]
        return saved

    def loop_bounds(self, s: ir.For) -> tuple[int, int] | None:
        lo, ext = self.interval(s.min), self.interval(s.extent)
        if lo is None or ext is None:
            return None
        return lo[0], lo[1] + ext[1] - 1

    def nested(self, s: ir.Stmt) -> None:
        """Render ``s`` as a closure called in place: its loops start a fresh block count."""
        self.nest_count += 1
        fn = f"_nest{self.nest_count}"
        yields = self.kernel is not None and any(isinstance(c, ir.Barrier) for c in walk(s))
        self.emit(f"def {fn}():")
        saved = self.blocks
        self.blocks = 0
        self.body(s)
        self.blocks = saved
        self.emit(f"yield from {fn}()" if yields else f"{fn}()")

    # -- GPU kernels ---------------------------------------------------------------------------

    def launch_kernel(self, root: ir.For) -> None:
        name = f"{self.func.name}_kernel{self.kernel_count}"
        self.kernel_count += 1
        loops = [s for s in walk(root) if is_gpu_thread(s)]
        extents: dict[str, list[E.Expr]] = {}
        for loop in loops:
            if loop.thread_tag not in ir.THREAD_TAGS:
                raise CompileError(
                    f"kernel {name}: loop {loop.var.name} is bound to unknown thread tag "
                    f"{loop.thread_tag!r}"
                )
            extents.setdefault(loop.thread_tag, []).append(loop.extent)
            inner = {v.uid: v for e in (loop.min, loop.extent) for v in post_order(e)
                     if isinstance(v, E.Var) and v.uid not in self.vars}
            if inner:
                v = next(iter(inner.values()))
                raise CompileError(
                    f"kernel {name}: the {loop.thread_tag} loop {loop.var.name} has extent "
                    f"{loop.extent} (min {loop.min}), which depends on {v.name}, a variable "
                    "bound inside the kernel; launch sizes must be known when it starts"
                )
        generator = any(isinstance(s, ir.Barrier) for s in walk(root))
        launch: dict[str, str] = {}
        const_launch: dict[str, int] = {}
        self.emit(f"# kernel {name}" + (" (threads in lockstep)" if generator else ""))
        for tag in ir.THREAD_TAGS:
            if tag not in extents:
                continue
            consts = [c for c in map(const_int, extents[tag]) if c is not None]
            if len(consts) == len(extents[tag]):
                const_launch[tag] = max(max(consts), 0)
                launch[tag] = str(const_launch[tag])
            else:
                parts = ", ".join(self.expr(e) for e in extents[tag])
                self.emit(f"{_LAUNCH[tag]} = max({parts}, 0)")
                launch[tag] = _LAUNCH[tag]
        written = {s.buffer.uid: s.buffer for s in walk(root) if isinstance(s, ir.Store)}
        tracked = frozenset(
            uid for uid, b in written.items() if self.check_races and b.scope != "local"
        )
        self.kernel = _Kernel(name, generator, launch, const_launch, tracked)
        blocks = [t for t in reversed(ir.THREAD_TAGS[:3]) if t in launch]
        threads = [t for t in reversed(ir.THREAD_TAGS[3:]) if t in launch]
        self.emit(f"{' = '.join(_HW[t] for t in ir.THREAD_TAGS)} = 0")
        self.emit("_kg = {}")
        outer_trackers = [
            uid for uid in tracked if uid in self.bufs and uid not in self.pending_shared
        ]
        for uid in outer_trackers:  # buffers that live outside the kernel: records per launch
            self.make_tracker(written[uid], "_kg")
        if generator:
            self.kernel_generator(root, name, blocks, threads)
        else:
            self.kernel_loops(root, name, blocks, threads)
        for uid in outer_trackers + list(self.pending_shared):
            self.trackers.pop(uid, None)
        self.kernel = None

    def shared_per_block(self) -> None:
        """Make, for the block that starts here, the shared buffers allocated around the kernel."""
        k = self.kernel
        assert k is not None
        for uid, buf in self.pending_shared.items():
            size = " * ".join(self.expr(d) for d in buf.shape) or "1"
            py = self.bufs[uid]
            self.emit(f"{py} = _alloc_once(_sh, {uid}, {buf.dtype!r}, {size})  # shared")
            if uid in k.tracked:
                self.make_tracker(buf, "_sh")

    def kernel_loops(self, root: ir.For, name: str, blocks: list[str], threads: list[str]) -> None:
        k = self.kernel
        assert k is not None
        self.emit("try:")
        self.indent += 1
        saved = self.blocks
        self.blocks += 1
        for tag in blocks:
            self.emit(f"for {_HW[tag]} in range({k.launch[tag]}):")
            self.indent += 1
            self.blocks += 1
        self.emit("_sh = {}")
        if k.tracked:
            self.emit(f"_ep = [{k.linear(ir.THREAD_TAGS[:3])} << 32]")
        self.shared_per_block()
        for tag in threads:
            self.emit(f"for {_HW[tag]} in range({k.launch[tag]}):")
            self.indent += 1
            self.blocks += 1
        if k.tracked:
            self.emit(f"_me = (_ep[0] & -4294967296) | {k.linear(ir.THREAD_TAGS[3:])}")
        self.stmt(root)
        self.indent -= 1 + len(blocks) + len(threads)
        self.blocks = saved
        self.emit("except (_RuntimeError, ZeroDivisionError) as _e:")
        bid = ", ".join(_HW[t] for t in ir.THREAD_TAGS[:3])
        tid = ", ".join(_HW[t] for t in ir.THREAD_TAGS[3:])
        self.emit(f"    raise _kernel_error(_e, {name!r}, ({bid}), ({tid})) from None")

    def kernel_generator(
        self, root: ir.For, name: str, blocks: list[str], threads: list[str]
    ) -> None:
        k = self.kernel
        assert k is not None
        fn = f"_kernel{self.kernel_count - 1}"
        params = ", ".join(_HW[t] for t in ir.THREAD_TAGS)
        self.emit(f"def {fn}({params}, _sh, _kg, _ep):")
        self.indent += 1
        if k.tracked:
            self.emit(f"_me = (_ep[0] & -4294967296) | {k.linear(ir.THREAD_TAGS[3:])}")
        self.shared_per_block()
        self.indent -= 1
        saved = self.blocks
        self.blocks = 0
        self.body(root)
        self.blocks = saved
        for tag in blocks:
            self.emit(f"for {_HW[tag]} in range({k.launch[tag]}):")
            self.indent += 1
        self.emit("_sh = {}")
        self.emit(f"_ep = [{k.linear(ir.THREAD_TAGS[:3])} << 32]")
        bid = ", ".join(_HW[t] for t in ir.THREAD_TAGS[:3])
        tid = ", ".join(_HW[t] for t in ir.THREAD_TAGS[3:])
        loops = " ".join(f"for {_HW[t]} in range({k.launch[t]})" for t in threads)
        self.emit(
            f"_run_block({name!r}, ({bid}), [(({tid}), {fn}({params}, _sh, _kg, _ep)) {loops}], "
            "_ep)"
        )
        self.indent -= len(blocks)

    def thread_guard(self, s: ir.For) -> None:
        k = self.kernel
        assert k is not None
        hw = _HW[s.thread_tag]
        ext_c = const_int(s.extent)
        full = ext_c is not None and ext_c == k.const_launch.get(s.thread_tag)
        if not full:
            self.emit(f"if {hw} < {self.expr(s.extent)}:  # {s.thread_tag}")
            self.indent += 1
        lo_c = const_int(s.min)
        value = hw if lo_c == 0 else f"{hw} + {self.expr(s.min)}"
        bounds = self.loop_bounds(s)
        py = self.bind_var(s.var, bounds)
        self.emit(f"{py} = {value}" + (f"  # {s.thread_tag}" if full else ""))
        before = len(self.lines)
        saved = self.push_range_facts(s)
        self.stmt(s.body)
        del self.facts[saved:]
        if len(self.lines) == before:
            self.emit("pass")
        self.unbind_var(s.var)
        if not full:
            self.indent -= 1

    # -- buffers -------------------------------------------------------------------------------

    def buffer(self, buf: ir.Buffer) -> str:
        py = self.bufs.get(buf.uid)
        if py is None:
            raise CompileError(
                f"{self.func.name}: buffer {buf.name} is accessed but is neither a parameter nor "
                "allocated around the access"
            )
        return py

    def flat_index(self, buf: ir.Buffer, indices: tuple[E.Expr, ...], kind: str) -> str:
        if len(indices) != len(buf.shape):
            raise CompileError(
                f"{self.func.name}: {kind} of {buf.name} with {len(indices)} indices; "
                f"it has {len(buf.shape)} dimensions"
            )
        if not indices:
            return "0"
        dims = [self.expr(d) for d in buf.shape]
        parts: list[str] = []
        checks: list[str] = []
        temps: list[str] = []
        for i, d, dim in zip(indices, buf.shape, dims):
            text = self.expr(i)
            if not self.check_bounds or self.in_bounds(i, d):
                parts.append(text)
                temps.append(text)
                continue
            t = self.tmp()
            parts.append(t)
            temps.append(t)
            checks.append(f"(0 <= ({t} := {text}) < {dim})")
        flat = parts[0]
        for p, dim in zip(parts[1:], dims[1:]):
            flat = f"({flat} * {dim} + {p})" if dim != "1" else f"({flat} + {p})"
        if not checks:
            return flat
        cond = " & ".join(checks) if len(checks) > 1 else checks[0]
        return (
            f"{flat} if {cond} else _oob({kind!r}, {buf.name!r}, ({', '.join(temps)},), "
            f"({', '.join(dims)},))"
        )

    def in_bounds(self, index: E.Expr, dim: E.Expr) -> bool:
        """Whether 0 <= index < dim provably holds where the access runs."""
        n = const_int(dim)
        b = self.interval(index)
        if not (b is not None and b[0] >= 0 or self.known_nonnegative(index)):
            return False
        if n is not None and b is not None and b[1] < n:
            return True
        for op, lo, hi in self.facts:
            if not _same(lo, index):
                continue
            if op == Op.LT and _same(hi, dim):
                return True
            c = const_int(hi)
            if n is not None and c is not None and (c <= n if op == Op.LT else c < n):
                return True
        return False

    def known_nonnegative(self, index: E.Expr) -> bool:
        for op, lo, hi in self.facts:
            c = const_int(lo)
            if c is not None and _same(hi, index) and (c >= 0 if op == Op.LE else c >= -1):
                return True
        return False

    def interval(self, e: E.Expr) -> tuple[int, int] | None:
        """Inclusive integer bounds of ``e`` from constants and loop ranges, or None."""
        if isinstance(e, E.Const):
            return (int(e.value), int(e.value)) if isinstance(e.value, int) else None
        if isinstance(e, E.Var):
            return self.ranges.get(e.uid)
        if isinstance(e, E.Cast):
            inner = self.interval(e.value)
            if inner is None or not dt.is_int(e.type) or not dt.is_int(e.value.dtype):
                return None
            lo, hi = np.iinfo(e.type).min, np.iinfo(e.type).max
            return inner if lo <= inner[0] and inner[1] <= hi else None
        if not isinstance(e, E.Binary) or not dt.is_int(e.dtype):
            return None
        a, b = self.interval(e.a), self.interval(e.b)
        if a is None or b is None:
            return None
        if e.op is Op.ADD:
            return a[0] + b[0], a[1] + b[1]
        if e.op is Op.SUB:
            return a[0] - b[1], a[1] - b[0]
        if e.op is Op.MUL:
            products = [x * y for x in a for y in b]
            return min(products), max(products)
        if e.op is Op.MIN:
            return min(a[0], b[0]), min(a[1], b[1])
        if e.op is Op.MAX:
            return max(a[0], b[0]), max(a[1], b[1])
        if e.op in (Op.FLOORDIV, Op.FLOORMOD) and b[0] > 0:
            if e.op is Op.FLOORMOD:
                return 0, b[1] - 1
            lo = a[0] // b[1] if a[0] >= 0 else a[0] // b[0]
            hi = a[1] // b[0] if a[1] >= 0 else a[1] // b[1]
            return lo, hi
        return None

    def store_value(self, value: str, vtype: str, buf: ir.Buffer) -> str:
        btype = buf.dtype
        if btype in _HALF_BITS:
            bits = _HALF_BITS[btype]
            return f"{bits}({value})" if _floating(vtype) else f"{bits}(float({value}))"
        if dt.is_float(btype):
            if dt.is_float(vtype):
                return value
            return f"float({value})"
        if btype == "bool":
            return value if vtype == "bool" else f"({value} != 0)"
        if vtype == "bool":
            return f"int({value})"
        if dt.is_float(vtype):
            return self.wrap(f"_ftoi({value}, {np.iinfo(btype).min})", btype)
        if vtype in _NARROW and _fits(vtype, btype):
            return value
        return self.wrap(value, btype)

    # -- expressions ---------------------------------------------------------------------------

    def expr(self, e: E.Expr) -> str:
        method = getattr(self, "_e_" + type(e).__name__, None)
        if method is None:
            raise CompileError(
                f"the reference evaluator cannot run a {type(e).__name__} expression ({e}); "
                "lower the function to loop IR first"
            )
        return method(e)

    def wrap(self, text: str, dtype: str) -> str:
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
        t = self.tmp()
        return f"({t} if {lo} <= ({t} := {text}) <= {hi} else _wrap({t}, {dtype!r}))"

    def _e_Const(self, e: E.Const) -> str:
        if e.dtype == "bool":
            return "True" if e.value else "False"
        if dt.is_float(e.dtype):
            x = float(np.dtype(e.dtype).type(e.value)) if e.dtype != "float64" else float(e.value)
            if math.isnan(x):
                return "_nan"
            if math.isinf(x):
                return "_inf" if x > 0 else "(-_inf)"
            return repr(x) if x >= 0 and not (x == 0 and math.copysign(1, x) < 0) else f"({x!r})"
        v = int(e.value)
        return str(v) if v >= 0 else f"({v})"

    def _e_Var(self, e: E.Var) -> str:
        py = self.vars.get(e.uid)
        if py is None:
            raise CompileError(
                f"{self.func.name}: variable {e.name} is used where no loop, let or parameter "
                "shape binds it"
            )
        return py

    def _e_Load(self, e: ir.Load) -> str:
        view = self.buffer(e.buffer)
        flat = self.flat_index(e.buffer, e.indices, "load")
        trk = self.trackers.get(e.buffer.uid)
        text = f"{view}[{flat}]" if trk is None else f"_tload({trk}, {view}, {flat}, _me, _ep[0])"
        table = _HALF_TABLES.get(e.buffer.dtype)
        return f"{table}[{text}]" if table else text

    def _e_Binary(self, e: E.Binary) -> str:
        a, b, d, op = self.expr(e.a), self.expr(e.b), e.dtype, e.op
        flt = dt.is_float(d)
        if op.kind is OpKind.LOGICAL:
            return f"({a} {op.symbol} {b})"
        if op in _PY_INFIX:
            if _left_chain(e):  # (x + y) + z as x + y + z: long sums stay within Python's
                a = a[1:-1]     # limit of 200 nested parentheses
            text = f"({a} {op.symbol} {b})"
        elif op == Op.DIV:
            if not flt:
                raise CompileError(f"true division of {d} operands in {e}; use floordiv")
            return f"_fdiv({a}, {b})"
        elif op in (Op.FLOORDIV, Op.FLOORMOD):
            text = f"_f{op}({a}, {b})" if flt else f"({a} {op.symbol} {b})"
        elif op in (Op.TRUNCDIV, Op.TRUNCMOD):
            if flt:
                raise CompileError(f"{op} of {d} operands in {e}")
            text = f"_t{op[5:]}({a}, {b})"
        elif op in (Op.MIN, Op.MAX):
            t1, t2 = self.tmp(), self.tmp()
            cmp = "<=" if op == Op.MIN else ">="
            text = f"({t1} if ({t1} := {a}) {cmp} ({t2} := {b}) else {t2}"
            if flt:  # NaN-propagating, like numpy.minimum / maximum
                strict = "<" if op == Op.MIN else ">"
                text += f" if {t2} {strict} {t1} else {t1} + {t2}"
            text += ")"
        elif op == Op.POW:
            text = f"_fpow({a}, {b})" if flt else f"_ipow({a}, {b})"
        else:
            raise CompileError(f"unknown binary op {op!r} in {e}")
        return self.wrap(text, d) if d in _NARROW else text

    def _e_Compare(self, e: E.Compare) -> str:
        if e.op.kind is not OpKind.COMPARE:
            raise CompileError(f"unknown comparison {e.op!r} in {e}")
        return f"({self.expr(e.a)} {e.op.symbol} {self.expr(e.b)})"

    def _e_Not(self, e: E.Not) -> str:
        return f"(not {self.expr(e.a)})"

    def _e_Select(self, e: E.Select) -> str:
        # A conditional expression: only the taken side runs (padding reads rely on that).
        c, f = self.expr(e.cond), self.expr(e.false_value)
        saved = len(self.facts)
        self.facts.extend(_conjuncts(e.cond))
        t = self.expr(e.true_value)
        del self.facts[saved:]
        return f"({t} if {c} else {f})"

    def _e_Cast(self, e: E.Cast) -> str:
        return self.cast(self.expr(e.value), e.value.dtype, e.type)

    def cast(self, x: str, src: str, dst: str) -> str:
        if src == dst:
            return x
        if dst == "bool":
            return f"({x} != 0)"
        if _floating(dst):
            if not _floating(src):
                x, src = f"float({x})", "float64"
            if dst == "float64" or (dst == "float32" and src in dt.HALF_TYPES):
                return x
            return f"{_ROUND[dst]}({x})"
        if src == "bool":
            return f"int({x})"
        if _floating(src):
            return self.wrap(f"_ftoi({x}, {np.iinfo(dst).min})", dst)
        if _fits(src, dst):
            return x
        return self.wrap(x, dst)

    def _e_Call(self, e: E.Call) -> str:
        from autosched.targets.ref.pyruntime import INTRINSICS, INTRINSICS_F32
        from autosched.te.ops.transform import INDEX_CHECK

        if e.name == INDEX_CHECK:
            return f"_index_check({self.expr(e.args[0])}, {self.expr(e.args[1])})"
        if len(e.args) != 1:
            raise CompileError(f"intrinsic {e.name} takes one argument, got {len(e.args)} in {e}")
        a = self.expr(e.args[0])
        if e.name == "abs":
            text = f"abs({a})"
            return self.wrap(text, e.dtype) if e.dtype in _NARROW else text
        if e.name not in INTRINSICS:
            raise CompileError(
                f"the reference evaluator has no intrinsic {e.name!r}; known: abs, "
                + ", ".join(INTRINSICS)
            )
        if not dt.is_float(e.args[0].dtype):
            raise CompileError(f"intrinsic {e.name} of a {e.args[0].dtype} operand in {e}")
        if e.dtype == "float32" and e.name in INTRINSICS_F32:
            return f"_m_{e.name}32({a})"
        return f"_m_{e.name}({a})"


def _left_chain(e: E.Binary) -> bool:
    """``e.a`` renders as "(x op y)" with an operator of ``e.op``'s precedence, so its outer
    parentheses can go (Python's + - and * associate to the left)."""
    a = e.a
    group = (Op.ADD, Op.SUB) if e.op in (Op.ADD, Op.SUB) else (Op.MUL,)
    return isinstance(a, E.Binary) and a.op in group and a.dtype not in _NARROW


def _same(a: E.Expr, b: E.Expr) -> bool:
    return a is b or (hash(a) == hash(b) and E.structural_equal(a, b))


def _pure_int(e: E.Expr) -> bool:
    """An integer expression of variables and constants only: its value cannot change while
    the variables stay bound (a Load could, when the code stores to that buffer)."""
    return dt.is_int(e.dtype) and next(loads(e), None) is None


def _conjuncts(cond: E.Expr) -> list[tuple[Op, E.Expr, E.Expr]]:
    """The facts a < b / a <= b that hold where ``cond`` is true (its top-level "and" terms)."""
    if isinstance(cond, E.Binary) and cond.op is Op.AND:
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    if isinstance(cond, E.Compare) and cond.op in (Op.LT, Op.LE, Op.GT, Op.GE) \
            and _pure_int(cond.a) and _pure_int(cond.b):
        if cond.op in (Op.GT, Op.GE):
            return [(cond.op.mirrored, cond.b, cond.a)]
        return [(cond.op, cond.a, cond.b)]
    return []


# How the rendered code rounds a Python float to each float type, loads a half type's bits
# (a table indexed by them) and stores its bits (pyruntime's helpers).
_ROUND = {"float32": "_f32", "float16": "_f16", "bfloat16": "_bf16"}
_HALF_TABLES = {"float16": "_F16T", "bfloat16": "_BF16T"}
_HALF_BITS = {"float16": "_f16b", "bfloat16": "_bf16b"}


def _floating(dtype: str) -> bool:
    return dt.is_float(dtype) or dtype in dt.STORAGE_TYPES


def _fits(src: str, dst: str) -> bool:
    """Every value of integer dtype ``src`` is a value of integer dtype ``dst``."""
    s, d = np.iinfo(src), np.iinfo(dst)
    return d.min <= s.min and s.max <= d.max


def render(func: ir.PrimFunc, check_bounds: bool = True, check_races: bool = True) -> Rendered:
    """Python source that runs ``func`` (see the module docstring).

    >>> print(render(func).source)  # doctest: +SKIP
    def main(A, B, C):
        for i in range(4):
            C[i] = (A[i] + B[i])
    """
    return _Renderer(func, check_bounds, check_races).render()
