"""Tensorized loop nests as nvcuda::wmma calls (the intrinsics of tir/tensor_intrin.py).

A loop annotated ("tensorize", name) heads the nest of one intrinsic. Its stores must match the
intrinsic exactly, or CompileError says what differs:

* mma: ``acc[i, j] = 0`` (the init) becomes ``fill_fragment``; ``acc[i, j] = acc[i, j] +
  f32(a[i, k]) * f32(b[k, j])`` becomes two ``load_matrix_sync`` (each operand row- or
  column-major, its leading dimension read off the strides of the nest's loops) and one
  ``mma_sync`` into the fragment of ``acc`` (a ``wmma.accumulator`` buffer, one fragment per
  16 x 16 tile of it)
* store: ``dst[i, j] = acc[i, j]`` becomes ``store_matrix_sync``

Every lane of the warp runs the calls with the same values: the nest must not depend on
``threadIdx.x``. Bound checks inside the nest are dropped, which is right only when every
buffer the nest reads or writes besides the fragments is shared memory (lowering zero-fills the
shared operand tiles of a tensorized nest, and a staging tile is allocated whole); a nest that
touches global memory under a guard is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autosched.errors import CompileError
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import substitute
from autosched.tir import ir
from autosched.tir.arith import Analyzer
from autosched.tir.evaluate import const_int
from autosched.tir.tensor_intrin import ACCUMULATOR_SCOPE, TENSOR_INTRINS, TensorIntrin
from autosched.tir.visit import walk

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
    out: set[ir.Buffer] = set()
    for loop, _ in tensorized(s):
        for st in walk(loop):
            if isinstance(st, ir.Store):
                out.update(b for b in [st.buffer, *_loaded(st.value)]
                           if b.scope != ACCUMULATOR_SCOPE)
    return out


def declare_fragments(w: Writer, buf: ir.Buffer, body: ir.Stmt, cname: str) -> None:
    """The accumulator fragments standing for the ``wmma.accumulator`` buffer ``buf``."""
    shapes = {(t.m, t.n, t.k) for loop, t in tensorized(body) if t.kind == "mma"
              and any(isinstance(st, ir.Store) and st.buffer == buf for st in walk(loop))}
    if len(shapes) != 1:
        raise CompileError(f"kernel {w.name}: {ACCUMULATOR_SCOPE} buffer {buf.name} must be "
                           f"computed by one kind of tensorized mma, found {len(shapes)}")
    ((m, n, k),) = shapes
    count = _fragments(w, buf, m, n)
    w.emit(f"{NS}fragment<{NS}accumulator, {m}, {n}, {k}, float> {cname}[{count}];")


def _fragments(w: Writer, buf: ir.Buffer, m: int, n: int) -> int:
    total, cols = buf.num_elements, const_int(buf.shape[-1])
    if total is None or cols is None or cols % n or (total // cols) % m:
        raise CompileError(f"kernel {w.name}: {ACCUMULATOR_SCOPE} buffer {buf.name} of shape "
                           f"{tuple(str(d) for d in buf.shape)} is no whole number of {m} x {n} "
                           "fragments")
    return total // (m * n)


@dataclass(frozen=True)
class _Access:
    """A buffer access at the nest's origin and its element strides along the nest's loops."""

    buffer: ir.Buffer
    origin: tuple[E.Expr, ...]
    base: E.Expr
    strides: tuple[int, ...]


def emit_nest(w: Writer, s: ir.For, intrin: TensorIntrin) -> None:
    """The wmma calls of the tensorized nest headed by ``s``."""
    where = f"kernel {w.name}: loop {s.var.name} tensorized as {intrin.name}"
    loops, stores, guarded = _flatten(s, where)
    if [const_int(lp.extent) for lp in loops] != list(intrin.extents[:len(loops)]) \
            or len(loops) < 2 or any(not _is_zero(lp.min) for lp in loops):
        raise CompileError(f"{where}: its loops {[(lp.var.name, str(lp.extent)) for lp in loops]} "
                           f"are not the intrinsic's {intrin.extents}")
    nest = [lp.var for lp in loops]
    unpadded = [b for st in stores for b in [st.buffer, *_loaded(st.value)]
                if b.scope not in (ACCUMULATOR_SCOPE, "shared")]
    if guarded and unpadded:
        bad = unpadded[0]
        raise CompileError(f"{where}: the nest is guarded and touches {bad.scope} buffer "
                           f"{bad.name}; stage it in shared memory, where tiles are padded")
    w.emit("{")
    for st in stores:
        if intrin.kind == "store":
            _store(w, st, nest, intrin, where)
        elif isinstance(st.value, E.Const):
            acc = _access(w, st.buffer, st.indices, nest, where)
            w.emit(f"  {NS}fill_fragment({_fragment(w, acc, intrin, where)}, "
                   f"{w._expr(E.const(float(st.value.value), 'float32'))});")
        else:
            _mma(w, st, nest, intrin, where)
    w.emit("}")


def _flatten(s: ir.For, where: str) -> tuple[list[ir.For], list[ir.Store], bool]:
    """The distinct loops of the nest (outermost first), its stores, and whether some store
    sits under an if."""
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


def _loaded(e: E.Expr) -> list[ir.Buffer]:
    from autosched.tir.visit import loads

    return [ld.buffer for ld in loads(e)]


def _is_zero(e: E.Expr) -> bool:
    return const_int(e) == 0


def _access(w: Writer, buf: ir.Buffer, indices: tuple[E.Expr, ...], nest: list[E.Var],
            where: str) -> _Access:
    """The origin and strides of ``buf[indices]`` along ``nest``; CompileError unless the
    offset is affine in the nest's variables with constant strides."""
    an = Analyzer()
    flat = ir.flat_offset(buf, indices)

    def at(point: tuple[int, ...]) -> E.Expr:
        return an.simplify(substitute(flat, {v: E.const(p, v.dtype) for v, p in zip(nest, point)}))

    zero = (0,) * len(nest)
    base = at(zero)
    strides = []
    for d in range(len(nest)):
        unit = tuple(int(d == e) for e in range(len(nest)))
        strides.append(const_int(an.simplify(at(unit) - base)))
    far = const_int(an.simplify(at((3,) * len(nest)) - base))
    if None in strides or far != 3 * sum(strides):  # type: ignore[arg-type]
        raise CompileError(f"{where}: {buf.name}[{', '.join(map(str, indices))}] is not an "
                           "affine access with constant strides along the nest")
    origin = tuple(an.simplify(substitute(i, {v: E.const(0, v.dtype) for v in nest}))
                   for i in indices)
    return _Access(buf, origin, base, tuple(strides))  # type: ignore[arg-type]


def _fragment(w: Writer, acc: _Access, intrin: TensorIntrin, where: str) -> str:
    """The fragment of the accumulator tile at ``acc``'s origin."""
    buf = acc.buffer
    if buf.scope != ACCUMULATOR_SCOPE:
        raise CompileError(f"{where}: the accumulator {buf.name} is in scope {buf.scope}, not "
                           f"{ACCUMULATOR_SCOPE}")
    cols = const_int(buf.shape[-1])
    assert cols is not None, "declare_fragments checked the shape"
    if acc.strides[:2] != (cols, 1) or any(acc.strides[2:]):
        raise CompileError(f"{where}: the nest's (i, j) must walk the rows and columns of "
                           f"{buf.name}; its strides are {acc.strides}")
    tile = E.binary(Op.FLOORDIV, acc.base, intrin.m * cols)
    col = E.binary(Op.FLOORDIV, E.binary(Op.FLOORMOD, acc.base, cols), intrin.n)
    index = Analyzer().simplify(E.binary(Op.ADD, E.binary(Op.MUL, tile, cols // intrin.n), col))
    return f"{w._access(buf, (E.const(0),) * (len(buf.shape) - 1) + (index,))}"


def _layout(w: Writer, a: _Access, rows: int, cols: int, where: str, what: str,
            memory: bool = False) -> tuple[str, str]:
    """(layout, leading dimension) of a tile whose row and column strides are ``a.strides``
    at positions ``rows`` and ``cols``; the pointer must be 32-byte aligned and the leading
    dimension a multiple of 16 bytes."""
    sr, sc = a.strides[rows], a.strides[cols]
    prefix = "mem_" if memory else ""
    if sc == 1:
        layout, ld = f"{prefix}row_major", sr
    elif sr == 1:
        layout, ld = f"{prefix}col_major", sc
    else:
        raise CompileError(f"{where}: {what} {a.buffer.name} is neither row- nor column-major "
                           f"along the nest (strides {a.strides})")
    size = a.buffer.itemsize
    from autosched.targets.cuda.ir_util import known_divisor

    if (ld * size) % 16 or (known_divisor(a.base) * size) % 32:
        raise CompileError(f"{where}: {what} {a.buffer.name} needs a leading dimension of a "
                           f"multiple of 16 bytes (it is {ld} elements) and a 32-byte aligned "
                           f"tile (its offset {a.base} is not known to be)")
    return layout, str(ld)


def _pointer(w: Writer, a: _Access) -> str:
    return f"&{w._access(a.buffer, a.origin)}"


def _operand(e: E.Expr, dtype: str) -> ir.Load | None:
    if isinstance(e, E.Cast) and e.type == "float32":
        e = e.value
    return e if isinstance(e, ir.Load) and e.buffer.dtype == dtype else None


def _mma(w: Writer, st: ir.Store, nest: list[E.Var], intrin: TensorIntrin, where: str) -> None:
    v = st.value
    if not (isinstance(v, E.Binary) and v.op is Op.ADD and isinstance(v.a, ir.Load)
            and v.a.buffer == st.buffer and E.structural_equal(v.a.indices, st.indices)
            and isinstance(v.b, E.Binary) and v.b.op is Op.MUL and len(nest) == 3):
        raise CompileError(f"{where}: {st.buffer.name}[...] = {v} is not acc = acc + a * b")
    product = v.b
    ops = [_operand(product.a, intrin.in_dtype), _operand(product.b, intrin.in_dtype)]
    loads = [ld for ld in ops if ld is not None]
    if len(loads) != 2:
        raise CompileError(f"{where}: the factors of {product} must be {intrin.in_dtype} loads "
                           "(cast to float32 or not)")
    acc = _access(w, st.buffer, st.indices, nest, where)
    a, b = (_access(w, ld.buffer, ld.indices, nest, where) for ld in loads)
    if a.strides[1] or not a.strides[0] or not a.strides[2]:
        a, b = b, a  # the operand that ignores j is a
    if a.strides[1] or b.strides[0] or not (a.strides[0] and a.strides[2] and b.strides[1]
                                            and b.strides[2]):
        raise CompileError(f"{where}: the operands must be a[i, k] and b[k, j] (strides along "
                           f"(i, j, k): {a.buffer.name} {a.strides}, {b.buffer.name} "
                           f"{b.strides})")
    frag = _fragment(w, acc, intrin, where)
    ctype = _C_TYPE[intrin.in_dtype]
    if intrin.in_dtype != "float32":
        w.need_half(intrin.in_dtype)
    shape = f"{intrin.m}, {intrin.n}, {intrin.k}"
    for tag, access, rows, cols in (("a", a, 0, 2), ("b", b, 2, 1)):
        layout, ld = _layout(w, access, rows, cols, where, f"operand {tag}")
        name = f"as_w{tag}"
        w.emit(f"  {NS}fragment<{NS}matrix_{tag}, {shape}, {ctype}, {NS}{layout}> {name};")
        w.emit(f"  {NS}load_matrix_sync({name}, {_pointer(w, access)}, {ld});")
        if intrin.in_dtype == "float32":
            w.emit(f"  for (int as_t = 0; as_t < {name}.num_elements; ++as_t) "
                   f"{name}.x[as_t] = {NS}__float_to_tf32({name}.x[as_t]);")
    w.emit(f"  {NS}mma_sync({frag}, as_wa, as_wb, {frag});")


def _store(w: Writer, st: ir.Store, nest: list[E.Var], intrin: TensorIntrin, where: str) -> None:
    src = st.value
    if not isinstance(src, ir.Load) or src.buffer.scope != ACCUMULATOR_SCOPE \
            or st.buffer.dtype != "float32":
        raise CompileError(f"{where}: {st.buffer.name}[...] = {src} is not a float32 copy out "
                           f"of a {ACCUMULATOR_SCOPE} buffer")
    frag = _fragment(w, _access(w, src.buffer, src.indices, nest, where), intrin, where)
    dst = _access(w, st.buffer, st.indices, nest, where)
    layout, ld = _layout(w, dst, 0, 1, where, "destination", memory=True)
    w.emit(f"  {NS}store_matrix_sync({_pointer(w, dst)}, {frag}, {ld}, {NS}{layout});")
