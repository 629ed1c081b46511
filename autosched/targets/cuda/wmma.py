"""Tensorized loop nests as nvcuda::wmma calls (the intrinsics of tir/tensor_intrin.py).

A loop annotated ("tensorize", name) heads the nest of one intrinsic. Its stores must match the
intrinsic exactly, or CompileError says what differs:

* mma: ``acc[i, j] = 0`` (the init) becomes ``fill_fragment``; ``acc[i, j] = acc[i, j] +
  f32(a[i, k]) * f32(b[k, j])`` becomes one ``mma_sync`` into the fragment of ``acc`` (a
  ``wmma.accumulator`` buffer) from the fragments of ``a`` and ``b`` (``wmma.matrix_a`` and
  ``wmma.matrix_b`` buffers)
* load_a / load_b: ``frag[i, k] = a[i, k]`` becomes ``load_matrix_sync`` into the fragment
  (row- or column-major, the leading dimension read off the strides of the nest's loops)
* store: ``dst[i, j] = acc[i, j]`` becomes ``store_matrix_sync``

A fragment buffer is declared as an array of fragments, one per tile (the tile of the
intrinsic that writes it) in row-major order of the tiles; an access of the nest must cover one
tile exactly. Every lane of the warp runs the calls with the same values: the nest must not
depend on ``threadIdx.x``. Bound checks inside the nest are dropped, which is right only when
every buffer it touches is shared memory or fragments (lowering zero-fills the shared operand
tiles of a tensorized nest, and a staging tile is allocated whole); a nest that touches global
memory under a guard is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autosched.errors import CompileError
from autosched.targets.cuda.ir_util import known_divisor
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import substitute
from autosched.tir import ir
from autosched.tir.arith import Analyzer
from autosched.tir.evaluate import const_int
from autosched.tir.tensor_intrin import FRAGMENT_TILES, TENSOR_INTRINS, TensorIntrin
from autosched.tir.visit import loads, walk

NS = "nvcuda::wmma::"
HEADER = "mma.h"
_C_TYPE = {"float16": "half", "bfloat16": "__nv_bfloat16", "float32": NS + "precision::tf32"}


class Writer(Protocol):
    """What this module needs of the kernel writer (codegen._KernelWriter)."""

    name: str

    def emit(self, line: str) -> None: ...
    def _expr(self, e: E.Expr) -> str: ...
    def _access(self, buf: ir.Buffer, indices: tuple[E.Expr, ...]) -> str: ...
    def need_half(self, dtype: str = "float16") -> None: ...


def intrin_of(s: ir.For) -> TensorIntrin | None:
    """The intrinsic a loop is tensorized as, if any."""
    name = dict(s.annotations).get("tensorize")
    return None if name is None else TENSOR_INTRINS[name]


def tensorized(s: ir.Stmt) -> list[tuple[ir.For, TensorIntrin]]:
    """Every tensorized loop inside ``s`` with its intrinsic."""
    return [(st, t) for st in walk(s) if isinstance(st, ir.For)
            and (t := intrin_of(st)) is not None]


def operand_buffers(s: ir.Stmt) -> set[ir.Buffer]:
    """The buffers besides fragments that tensorized nests in ``s`` load or store (they need
    32-byte alignment)."""
    return {b for loop, _ in tensorized(s) for b in _touched(loop) if b.scope not in FRAGMENT_TILES}


def _touched(s: ir.Stmt) -> list[ir.Buffer]:
    """The buffers ``s`` stores to and loads from, in order of appearance."""
    out: list[ir.Buffer] = []
    for st in walk(s):
        if isinstance(st, ir.Store):
            out += [st.buffer] + [ld.buffer for ld in loads(st.value)]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Access:
    """A buffer access at the nest's origin and its element strides along the nest's loops."""

    buffer: ir.Buffer
    origin: tuple[E.Expr, ...]
    base: E.Expr
    strides: tuple[int, ...]


@dataclass(frozen=True)
class _Nest:
    """A tensorized nest: its distinct loops (outermost first), stores, and whether some
    store sits under an if."""

    intrin: TensorIntrin
    loops: tuple[ir.For, ...]
    stores: tuple[ir.Store, ...]
    guarded: bool
    where: str

    @property
    def vars(self) -> list[E.Var]:
        return [lp.var for lp in self.loops]

    def extent(self, d: int) -> int:
        return self.intrin.extents[d]


def declare_fragments(w: Writer, buf: ir.Buffer, body: ir.Stmt, cname: str) -> None:
    """The array of fragments standing for the fragment buffer ``buf`` (one per tile), typed
    after the one kind of tensorized nest in ``body`` that writes it."""
    use, _, _ = FRAGMENT_TILES[buf.scope]
    writers = [_nest(w, loop, t) for loop, t in tensorized(body)
               if t.scope == buf.scope and t.kind != "store"
               and any(st.buffer == buf for st in walk(loop) if isinstance(st, ir.Store))]
    kinds = {(n.intrin.m, n.intrin.n, n.intrin.k, n.intrin.in_dtype) for n in writers}
    if len(kinds) != 1:
        raise CompileError(f"kernel {w.name}: {buf.scope} buffer {buf.name} must be written by "
                           f"one kind of tensorized nest, found {len(kinds)}")
    nest = writers[0]
    t = nest.intrin
    count = _fragments(w, buf, *_tile_shape(buf.scope, t))
    if use == "accumulator":
        w.emit(f"{NS}fragment<{NS}accumulator, {t.m}, {t.n}, {t.k}, float> {cname}[{count}];")
        return
    layouts = {_load_layout(n, st)[0] for n in writers for st in n.stores}
    if len(layouts) != 1:
        raise CompileError(f"kernel {w.name}: {buf.name} is loaded in {len(layouts)} layouts")
    w.emit(f"{NS}fragment<{NS}{use}, {t.m}, {t.n}, {t.k}, {_C_TYPE[t.in_dtype]}, "
           f"{NS}{layouts.pop()}> {cname}[{count}];")


def _tile_shape(scope: str, t: TensorIntrin) -> tuple[int, int]:
    _, rows, cols = FRAGMENT_TILES[scope]
    return getattr(t, rows), getattr(t, cols)


def _fragments(w: Writer, buf: ir.Buffer, rows: int, cols: int) -> int:
    total, width = buf.num_elements, const_int(buf.shape[-1])
    if total is None or width is None or total % (rows * cols) or width % min(rows, cols):
        raise CompileError(f"kernel {w.name}: {buf.scope} buffer {buf.name} of shape "
                           f"{tuple(str(d) for d in buf.shape)} is no whole number of "
                           f"{rows} x {cols} fragments")
    return total // (rows * cols)


def _nest(w: Writer, s: ir.For, intrin: TensorIntrin) -> _Nest:
    """The nest headed by ``s``, its loops checked against the intrinsic's."""
    where = f"kernel {w.name}: loop {s.var.name} tensorized as {intrin.name}"
    loops, stores, guarded = walk_nest(s, where)
    if [const_int(lp.extent) for lp in loops] != list(intrin.extents[:len(loops)]) \
            or len(loops) < 2 or any(const_int(lp.min) != 0 for lp in loops):
        raise CompileError(f"{where}: its loops {[(lp.var.name, str(lp.extent)) for lp in loops]} "
                           f"are not the intrinsic's {intrin.extents}")
    return _Nest(intrin, tuple(loops), tuple(stores), guarded, where)


def walk_nest(s: ir.For, where: str) -> tuple[list[ir.For], list[ir.Store], bool]:
    """The distinct loops (outermost first) and the stores of the tensorized nest headed by
    ``s``, and whether some store sits under an if; CompileError for anything else inside."""
    loops: list[ir.For] = []
    stores: list[ir.Store] = []
    guarded = False

    def visit(st: ir.Stmt) -> None:
        nonlocal guarded
        if isinstance(st, ir.For):
            if st.kind == "thread" or (st is not s and intrin_of(st) is not None):
                raise CompileError(f"{where}: loop {st.var.name} inside it is {st.kind}")
            if all(lp.var.uid != st.var.uid for lp in loops):
                loops.append(st)
            visit(st.body)
        elif isinstance(st, ir.Seq):
            for c in st.stmts:
                visit(c)
        elif isinstance(st, ir.IfThenElse) and st.else_body is None:
            guarded = True
            visit(st.then_body)
        elif isinstance(st, ir.Store):
            stores.append(st)
        else:
            raise CompileError(f"{where}: the nest holds a {type(st).__name__}, not only loops "
                               "and stores")

    visit(s)
    return loops, stores, guarded


def emit_nest(w: Writer, s: ir.For, intrin: TensorIntrin) -> None:
    """The wmma calls of the tensorized nest headed by ``s``."""
    nest = _nest(w, s, intrin)
    unpadded = [b for b in _touched(s) if b.scope not in FRAGMENT_TILES and b.scope != "shared"]
    if nest.guarded and unpadded:
        raise CompileError(f"{nest.where}: the nest is guarded and touches {unpadded[0].scope} "
                           f"buffer {unpadded[0].name}; stage it in shared memory, where tiles "
                           "are padded")
    w.emit("{")
    for st in nest.stores:
        if intrin.kind == "store":
            _store(w, nest, st)
        elif intrin.kind in ("load_a", "load_b"):
            _load(w, nest, st)
        elif isinstance(st.value, E.Const):
            acc = _fragment(w, nest, st.buffer, st.indices, (0, 1), nest.intrin.scope)
            w.emit(f"  {NS}fill_fragment({acc}, "
                   f"{w._expr(E.const(float(st.value.value), 'float32'))});")
        else:
            _mma(w, nest, st)
    w.emit("}")


class NestLoops(Protocol):
    """What affine_access needs of a tensorized nest: its loop variables and a name for
    errors."""

    @property
    def where(self) -> str: ...

    @property
    def vars(self) -> list[E.Var]: ...


def affine_access(nest: NestLoops, buf: ir.Buffer, indices: tuple[E.Expr, ...]) -> Access:
    """The origin and strides of ``buf[indices]`` along the nest's loops; CompileError unless
    the offset is affine in them with constant strides."""
    an = Analyzer()
    flat = ir.flat_offset(buf, indices)
    nvars = nest.vars

    def at(point: tuple[int, ...]) -> E.Expr:
        return an.simplify(substitute(flat, {v: E.const(p, v.dtype) for v, p in zip(nvars, point)}))

    base = at((0,) * len(nvars))
    strides = []
    for d in range(len(nvars)):
        unit = tuple(int(d == e) for e in range(len(nvars)))
        strides.append(const_int(an.simplify(at(unit) - base)))
    far = const_int(an.simplify(at((3,) * len(nvars)) - base))
    if None in strides or far != 3 * sum(strides):  # type: ignore[arg-type]
        raise CompileError(f"{nest.where}: {buf.name}[{', '.join(map(str, indices))}] is not an "
                           "affine access with constant strides along the nest")
    origin = tuple(an.simplify(substitute(i, {v: E.const(0, v.dtype) for v in nvars}))
                   for i in indices)
    return Access(buf, origin, base, tuple(strides))  # type: ignore[arg-type]


def _fragment(w: Writer, nest: _Nest, buf: ir.Buffer, indices: tuple[E.Expr, ...],
              axes: tuple[int, int], scope: str) -> str:
    """The fragment of the ``scope`` buffer ``buf`` whose tile ``buf[indices]`` covers when
    the nest's loops ``axes`` walk the tile's rows and columns (the buffer may hold it
    transposed: a cache of a transposed operand) and the other loops do not move it."""
    if buf.scope != scope:
        raise CompileError(f"{nest.where}: {buf.name} is in scope {buf.scope}, not {scope}")
    acc = affine_access(nest, buf, indices)
    width = const_int(buf.shape[-1])
    assert width is not None, "declare_fragments checked the shape"
    moved = [(acc.strides[d], nest.extent(d)) for d in axes]
    if any(acc.strides[d] for d in range(len(nest.loops)) if d not in axes) \
            or sorted(s for s, _ in moved) != [1, width]:
        raise CompileError(f"{nest.where}: the nest must walk the rows and columns of one tile "
                           f"of {buf.name}; its strides are {acc.strides}")
    rows = next(e for s, e in moved if s == width)  # the tile's extents in the buffer
    cols = next(e for s, e in moved if s == 1)
    tile = E.binary(Op.FLOORDIV, acc.base, rows * width)
    col = E.binary(Op.FLOORDIV, E.binary(Op.FLOORMOD, acc.base, width), cols)
    index = Analyzer().simplify(E.binary(Op.ADD, E.binary(Op.MUL, tile, width // cols), col))
    return w._access(buf, (E.const(0),) * (len(buf.shape) - 1) + (index,))


def _layout(a: Access, rows: int, cols: int, nest: _Nest, what: str,
            memory: bool = False) -> tuple[str, str]:
    """(layout, leading dimension) of a tile whose rows and columns the nest's loops ``rows``
    and ``cols`` walk in ``a``; the pointer must be 32-byte aligned and the leading dimension
    a multiple of 16 bytes."""
    sr, sc = a.strides[rows], a.strides[cols]
    prefix = "mem_" if memory else ""
    if sc == 1:
        layout, ld = f"{prefix}row_major", sr
    elif sr == 1:
        layout, ld = f"{prefix}col_major", sc
    else:
        raise CompileError(f"{nest.where}: {what} {a.buffer.name} is neither row- nor "
                           f"column-major along the nest (strides {a.strides})")
    size = a.buffer.itemsize
    if (ld * size) % 16 or (known_divisor(a.base) * size) % 32:
        raise CompileError(f"{nest.where}: {what} {a.buffer.name} needs a leading dimension of "
                           f"a multiple of 16 bytes (it is {ld} elements) and a 32-byte aligned "
                           f"tile (its offset {a.base} is not known to be)")
    return layout, str(ld)


def _pointer(w: Writer, a: Access) -> str:
    return f"&{w._access(a.buffer, a.origin)}"


def _operand(e: E.Expr, dtype: str) -> ir.Load | None:
    if isinstance(e, E.Cast) and e.type == "float32":
        e = e.value
    return e if isinstance(e, ir.Load) and e.buffer.dtype == dtype else None


# the operand fragments: their scope -> (role, their tile's rows and columns among the mma
# nest's (i, j, k) loops)
_OPERANDS = {"wmma.matrix_a": ("a", (0, 2)), "wmma.matrix_b": ("b", (2, 1))}


def _load_layout(nest: _Nest, st: ir.Store) -> tuple[str, str, Access]:
    """(layout, leading dimension, access) in memory of the operand tile that a load nest's
    store copies; its two loops walk the tile's rows and columns: (i, k) or (k, j)."""
    src = st.value
    if not isinstance(src, ir.Load) or src.buffer.dtype != nest.intrin.in_dtype \
            or st.buffer.dtype != src.buffer.dtype:
        raise CompileError(f"{nest.where}: {st.buffer.name}[...] = {src} is no copy of "
                           f"{nest.intrin.in_dtype}")
    access = affine_access(nest, src.buffer, src.indices)
    layout, ld = _layout(access, 0, 1, nest, f"operand {_OPERANDS[nest.intrin.scope][0]}")
    return layout, ld, access


def _load(w: Writer, nest: _Nest, st: ir.Store) -> None:
    """``load_matrix_sync`` into the operand fragment (tf32: each element rounded as the
    instruction needs)."""
    _, ld, src = _load_layout(nest, st)
    target = _fragment(w, nest, st.buffer, st.indices, (0, 1), nest.intrin.scope)
    if nest.intrin.in_dtype != "float32":
        w.need_half(nest.intrin.in_dtype)
    w.emit(f"  {NS}load_matrix_sync({target}, {_pointer(w, src)}, {ld});")
    if nest.intrin.in_dtype == "float32":
        w.emit(f"  for (int as_t = 0; as_t < {target}.num_elements; ++as_t) "
               f"{target}.x[as_t] = {NS}__float_to_tf32({target}.x[as_t]);")


def _mma(w: Writer, nest: _Nest, st: ir.Store) -> None:
    v, t = st.value, nest.intrin
    if not (isinstance(v, E.Binary) and v.op is Op.ADD and isinstance(v.a, ir.Load)
            and v.a.buffer == st.buffer and E.structural_equal(v.a.indices, st.indices)
            and isinstance(v.b, E.Binary) and v.b.op is Op.MUL and len(nest.loops) == 3):
        raise CompileError(f"{nest.where}: {st.buffer.name}[...] = {v} is not acc = acc + a * b")
    product = v.b
    factors = [_operand(product.a, t.in_dtype), _operand(product.b, t.in_dtype)]
    operands = [ld for ld in factors if ld is not None and ld.buffer.scope in _OPERANDS]
    if sorted(_OPERANDS[ld.buffer.scope][0] for ld in operands) != ["a", "b"]:
        raise CompileError(f"{nest.where}: the factors of {product} must be {t.in_dtype} loads "
                           "(cast to float32 or not) of one wmma.matrix_a and one "
                           "wmma.matrix_b buffer")
    acc = _fragment(w, nest, st.buffer, st.indices, (0, 1), nest.intrin.scope)
    by_role = {_OPERANDS[ld.buffer.scope][0]: _fragment(w, nest, ld.buffer, ld.indices,
                                                        _OPERANDS[ld.buffer.scope][1],
                                                        ld.buffer.scope)
               for ld in operands}
    w.emit(f"  {NS}mma_sync({acc}, {by_role['a']}, {by_role['b']}, {acc});")


def _store(w: Writer, nest: _Nest, st: ir.Store) -> None:
    src = st.value
    if not isinstance(src, ir.Load) or st.buffer.dtype != "float32":
        raise CompileError(f"{nest.where}: {st.buffer.name}[...] = {src} is not a float32 copy "
                           "out of fragments")
    frag = _fragment(w, nest, src.buffer, src.indices, (0, 1), nest.intrin.scope)
    dst = affine_access(nest, st.buffer, st.indices)
    layout, ld = _layout(dst, 0, 1, nest, "destination", memory=True)
    w.emit(f"  {NS}store_matrix_sync({_pointer(w, dst)}, {frag}, {ld}, {NS}{layout});")
