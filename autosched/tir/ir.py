"""The loop-nest IR that lowering produces and every backend consumes.

Statements are immutable nodes (like expressions). Buffers are multi-dimensional and row-major;
a backend flattens ``Load``/``Store`` indices itself (offset = sum(index[d] * stride[d])).

For loops carry a kind:

* ``serial``      an ordinary loop
* ``parallel``    iterations may run on different CPU threads
* ``vectorized``  the body is executed as one SIMD operation over the loop (constant extent)
* ``unrolled``    the body is replicated ``extent`` times (constant extent)
* ``thread``      a GPU index: ``thread_tag`` is "blockIdx.x" ... "threadIdx.z"; the loop is not
                  emitted, its variable is the hardware index (guarded when extent < launch size)

``annotations`` carry pragmas, e.g. ("auto_unroll_max_step", 16), ("unroll_explicit", True).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autosched.te import dtype as dt
from autosched.te.expr import Binary, Expr, Node, Var, binary, const, next_uid
from autosched.te.opcodes import Op
from autosched.te.visit import post_order
from autosched.tir.arith import simplify
from autosched.tir.evaluate import const_int

# the wmma ones hold a warp's fragments (tir/tensor_intrin.py)
SCOPES = ("global", "shared", "local", "wmma.accumulator", "wmma.matrix_a", "wmma.matrix_b")
FOR_KINDS = ("serial", "parallel", "vectorized", "unrolled", "thread")
THREAD_TAGS = tuple(f"{k}.{d}" for k in ("blockIdx", "threadIdx") for d in "xyz")  # hardware


@dataclass(frozen=True, eq=False)
class Buffer(Node):
    """Storage for a tensor (or a cached copy of part of one). Identified by uid."""

    name: str
    shape: tuple[Expr, ...]
    dtype: str
    scope: str = "global"
    uid: int = field(default_factory=next_uid)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(("Buffer", self.uid)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Buffer) and other.uid == self.uid

    __hash__ = Node.__hash__

    @property
    def itemsize(self) -> int:
        return dt.nbytes(self.dtype)

    @property
    def num_elements(self) -> int | None:
        """How many elements the buffer holds, when every dimension is a constant."""
        n = 1
        for d in self.shape:
            c = const_int(d)
            if c is None:
                return None
            n *= c
        return n

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """``buffer[indices]`` in loop IR (a TensorRead after lowering)."""

    buffer: Buffer
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


class Stmt(Node):
    def __str__(self) -> str:
        from autosched.tir.printer import stmt_str

        return stmt_str(self)

    __repr__ = __str__


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, eq=False)
class For(Stmt):
    var: Var
    min: Expr
    extent: Expr
    kind: str
    body: Stmt
    thread_tag: str = ""
    annotations: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True, eq=False)
class IfThenElse(Stmt):
    cond: Expr
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    """``buffer`` exists (uninitialised) while ``body`` runs. Its scope says where it lives."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False)
class LetStmt(Stmt):
    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True, eq=False)
class Barrier(Stmt):
    """All threads of a GPU block wait here (__syncthreads) so shared-memory writes are seen."""

    scope: str = "shared"


@dataclass(frozen=True, eq=False)
class PrimFunc(Node):
    """A lowered function: ``params`` are the argument buffers in call order."""

    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    attrs: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        from autosched.tir.printer import func_str

        return func_str(self)

    __repr__ = __str__


def seq(*stmts: Stmt | None) -> Stmt:
    """A Seq of the non-empty statements, flattened; one statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def flat_offset(buf: Buffer, indices: tuple[Expr, ...]) -> Expr:
    """The row-major element offset of ``buf[indices]`` (built with the folding builders)."""
    if len(indices) != len(buf.shape):
        raise ValueError(
            f"buffer {buf.name} has {len(buf.shape)} dims but is indexed with {len(indices)}"
        )
    if not indices:
        return const(0)
    off = indices[0]
    for dim, idx in zip(buf.shape[1:], indices[1:]):
        off = binary(Op.ADD, binary(Op.MUL, off, dim), idx)
    return off


_DIVMOD = frozenset((Op.FLOORDIV, Op.FLOORMOD, Op.TRUNCDIV, Op.TRUNCMOD))


def _divisions(e: Expr) -> int:
    return sum(isinstance(x, Binary) and x.op in _DIVMOD for x in post_order(e))


def access_offset(buf: Buffer, indices: tuple[Expr, ...]) -> tuple[Expr, bool]:
    """(offset, merged): ``flat_offset``, simplified (merged true) when its indices divide or
    take remainders and the simplified offset has fewer of them: a flat index split into a
    tensor's axes (a reshape fused into the kernel) and put back together row-major is the
    flat index again, as in ``x[i // 2560, i // 80 % 32, i % 80]`` of a (1, 24, 32, 80) x,
    offset ``i``."""
    off = flat_offset(buf, indices)
    before = _divisions(off)
    if not before:
        return off, False
    merged = simplify(off)
    return (merged, True) if _divisions(merged) < before else (off, False)
