"""Helpers that the Python code rendered by ``pyrender`` calls at run time.

Scalars are Python ints, floats and bools: integer intermediates are exact (stores and casts wrap
to the destination dtype), float math runs in float64 and is rounded where a value is stored or
cast to a narrower float; float32 sigmoid and tanh are onnxruntime's rational functions in
float32 (targets/rounding.py), as the compiled backends compute them, so that a folded constant
equals what they (and onnxruntime) would compute. Every helper here gives the IEEE / C answer
where Python would raise (``1.0 / 0.0``, ``math.log(0.0)``, ``int(nan)``), so an evaluated
program fails only on purpose: an out-of-bounds access, an integer division by zero, or a GPU
barrier that not every thread of a block reaches.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from autosched.errors import RuntimeError_
from autosched.targets.rounding import RATIONAL, rational32
from autosched.targets.status import STATUS_INDEX, KernelFailure
from autosched.te import dtype as dt

INF = math.inf
NAN = math.nan

# ---------------------------------------------------------------------------------------------
# Storage: every buffer is a flat memoryview over a numpy array; float16 is stored as its bits.

_F16 = struct.Struct("<e")
_U16 = struct.Struct("<H")
# float16 loads index this table with the 16-bit pattern (memoryview has no "e" format).
F16_TABLE: list[float] = np.arange(65536, dtype=np.uint16).view(np.float16).astype(float).tolist()


def f16_bits(x: float) -> int:
    """The float16 bit pattern nearest to ``x`` (round half to even, overflow to inf)."""
    try:
        return _U16.unpack(_F16.pack(x))[0]
    except OverflowError:
        return 0xFC00 if x < 0 else 0x7C00


def f16(x: float) -> float:
    return F16_TABLE[f16_bits(x)]


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
# bfloat16 is the upper half of a float32: loads index this table with its 16 bits.
with np.errstate(invalid="ignore"):  # signalling NaNs become quiet ones
    BF16_TABLE: list[float] = (np.arange(65536, dtype=np.uint32) << 16).view(
        np.float32).astype(float).tolist()


def bf16_bits(x: float) -> int:
    """The bfloat16 bit pattern nearest to float32 ``x`` (round half to even, NaN quiet,
    overflow to inf)."""
    if x != x:
        return 0x7FC0
    try:
        u = _U32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return 0xFF80 if x < 0 else 0x7F80
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16


def bf16(x: float) -> float:
    return BF16_TABLE[bf16_bits(x)]


def f32(x: float) -> float:
    """``x`` rounded to float32 (the C cast: nearest, overflow to inf)."""
    return _F32.unpack(_F32.pack(x))[0]


def storage_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a buffer's memoryview is taken over."""
    return np.dtype(np.uint16) if dtype in dt.HALF_TYPES else np.dtype(dtype)


def as_view(arr: np.ndarray) -> memoryview:
    """A flat memoryview over a C-contiguous array (float16 and bfloat16 as raw bits)."""
    flat = arr.reshape(-1)
    if arr.dtype.name in dt.HALF_TYPES:
        flat = flat.view(np.uint16)
    return memoryview(flat)  # type: ignore[arg-type]  # numpy stubs: __buffer__ on 3.12+


_GARBAGE_BYTE = 0xA5  # what unwritten integer memory reads as: -1515870811 as int32


def alloc(dtype: str, size: int) -> memoryview:
    """A fresh buffer whose unwritten elements are conspicuous: NaN, 0xA5A5... or True."""
    arr = np.empty(max(int(size), 0), dtype=storage_dtype(dtype))
    if dtype in dt.HALF_TYPES:
        arr.fill(0x7E00 if dtype == "float16" else 0x7FC0)  # a quiet NaN
    elif dt.is_float(dtype):
        arr.fill(np.nan)
    elif dtype == "bool":
        arr.fill(True)
    else:
        arr.view(np.uint8).fill(_GARBAGE_BYTE)
    return memoryview(arr)  # type: ignore[arg-type]  # numpy stubs: __buffer__ on 3.12+


def alloc_once(table: dict, uid: int, dtype: str, size: int) -> memoryview:
    """The buffer ``uid`` of ``table`` (one per GPU block for shared memory), made on first use."""
    view = table.get(uid)
    if view is None:
        view = table[uid] = alloc(dtype, size)
    return view


def oob(kind: str, buffer: str, index: Sequence[int], shape: Sequence[int]) -> Any:
    """Raise for an out-of-bounds ``kind`` ("load" / "store") of ``buffer[index]``."""
    idx = ", ".join(str(i) for i in index)
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    bad = [d for d, (i, n) in enumerate(zip(index, shape)) if not 0 <= i < n]
    raise RuntimeError_(
        f"{kind} out of bounds: {buffer}[{idx}] with shape ({dims}) (dimension {bad[0]})"
    )


def index_check(i: int, n: int) -> int:
    """``i`` when 0 <= i < n; else the run fails with STATUS_INDEX, as the compiled kernels'
    status does (the Program running the code names its function)."""
    if not 0 <= i < n:
        raise KernelFailure("index_check", STATUS_INDEX, f"{i} not in [0, {n})")
    return i


# ---------------------------------------------------------------------------------------------
# Integer conversions


def int_range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def wrap(x: int, dtype: str) -> int:
    """``x`` modulo 2**bits, in the range of integer ``dtype`` (two's complement)."""
    lo, hi = int_range(dtype)
    span = hi - lo + 1
    return (x - lo) % span + lo


def ftoi(x: float, invalid: int) -> int:
    """Float to integer, truncating toward zero; NaN and inf give ``invalid`` (x86 gives the
    most negative value of the destination type)."""
    try:
        return int(x)
    except (ValueError, OverflowError):
        return invalid


# ---------------------------------------------------------------------------------------------
# Arithmetic with C / IEEE semantics


def fdiv(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a != a or a == 0:
            return NAN
        return math.copysign(INF, a) * math.copysign(1.0, b)


def ffloordiv(a: float, b: float) -> float:
    q = fdiv(a, b)
    return float(math.floor(q)) if math.isfinite(q) else q


def ffloormod(a: float, b: float) -> float:
    try:
        return a % b
    except ZeroDivisionError:
        return NAN


def tdiv(a: int, b: int) -> int:
    """Integer division rounding toward zero (C's ``/``)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def tmod(a: int, b: int) -> int:
    """Remainder with the sign of the dividend (C's ``%``)."""
    return a - tdiv(a, b) * b


def ipow(a: int, b: int) -> int:
    if b >= 0:
        return a**b
    if a == 0:
        raise ZeroDivisionError("integer 0 raised to a negative power")
    return tdiv(1, a**-b)


def fpow(a: float, b: float) -> float:
    try:
        r = a**b
    except (ZeroDivisionError, OverflowError):
        with np.errstate(all="ignore"):
            return float(np.power(np.float64(a), np.float64(b)))
    return NAN if isinstance(r, complex) else r


# ---------------------------------------------------------------------------------------------
# Math intrinsics: the math module where it answers, numpy (IEEE) where math raises


def _intrinsic(fast: Callable[[float], float], exact: Callable[[Any], Any]) -> Callable:
    def fn(x: float) -> float:
        try:
            return fast(x)
        except (ValueError, OverflowError, ZeroDivisionError):
            with np.errstate(all="ignore"):
                return float(exact(np.float64(x)))

    return fn


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)  # x < 0 or NaN: no overflow
    return e / (1.0 + e)


INTRINSICS: dict[str, Callable[[float], float]] = {
    "exp": _intrinsic(math.exp, np.exp),
    "log": _intrinsic(math.log, np.log),
    "sqrt": _intrinsic(math.sqrt, np.sqrt),
    "rsqrt": _intrinsic(lambda x: 1.0 / math.sqrt(x), lambda x: 1.0 / np.sqrt(x)),
    "tanh": math.tanh,
    "erf": math.erf,
    "sigmoid": _sigmoid,
    "floor": _intrinsic(lambda x: float(math.floor(x)), np.floor),
    "ceil": _intrinsic(lambda x: float(math.ceil(x)), np.ceil),
    "round": _intrinsic(lambda x: float(round(x)), np.round),  # half to even, like numpy
    "sin": _intrinsic(math.sin, np.sin),
    "cos": _intrinsic(math.cos, np.cos),
    "log2": _intrinsic(math.log2, np.log2),
    "exp2": _intrinsic(lambda x: 2.0**x, np.exp2),
    "log1p": _intrinsic(math.log1p, np.log1p),
    "expm1": _intrinsic(math.expm1, np.expm1),
}

# The float32 versions where they differ from the float64 math above (called ``_m_<name>32``).
INTRINSICS_F32: dict[str, Callable[[float], float]] = {
    name: functools.partial(rational32, name) for name in RATIONAL}


# ---------------------------------------------------------------------------------------------
# GPU blocks


def _ids(ids: Sequence[tuple[int, int, int]], limit: int = 4) -> str:
    shown = ", ".join(str(t) for t in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def kernel_error(exc: Exception, kernel: str, block: tuple, thread: tuple) -> RuntimeError_:
    """``exc`` raised while running a kernel, with where it happened (a status failure is
    reported for the whole function, as the compiled kernels report it)."""
    if isinstance(exc, KernelFailure):
        return exc
    what = "integer division by zero" if isinstance(exc, ZeroDivisionError) else str(exc)
    return RuntimeError_(f"{what} (kernel {kernel}, blockIdx={block}, threadIdx={thread})")


def run_block(
    kernel: str,
    block: tuple,
    threads: Sequence[tuple[tuple, Iterator[int]]],
    epoch: list[int] | None = None,
) -> None:
    """Run the threads of one block in lockstep: each thread (a generator that yields the id of
    every barrier it reaches) runs until its next barrier, in threadIdx order; no thread passes
    a barrier before every live thread of the block has reached that same barrier. ``epoch[0]``
    (for the race checker) counts the barriers the block has passed."""
    live = list(threads)
    while live:
        arrived: list[tuple[tuple, Iterator[int]]] = []
        sites: dict[int, list[tuple]] = {}
        finished: list[tuple] = []
        for tid, gen in live:
            try:
                site = next(gen)
            except StopIteration:
                finished.append(tid)
                continue
            except (RuntimeError_, ZeroDivisionError) as exc:
                raise kernel_error(exc, kernel, block, tid) from None
            arrived.append((tid, gen))
            sites.setdefault(site, []).append(tid)
        if arrived and finished:
            site, waiting = next(iter(sites.items()))
            raise RuntimeError_(
                f"divergent barrier in kernel {kernel}, blockIdx={block}: threads "
                f"{_ids(waiting)} wait at barrier #{site} but threads {_ids(finished)} "
                "finished without reaching it"
            )
        if len(sites) > 1:
            detail = "; ".join(f"barrier #{s}: threads {_ids(t)}" for s, t in sites.items())
            raise RuntimeError_(
                f"divergent barrier in kernel {kernel}, blockIdx={block}: threads wait at "
                f"different barriers ({detail})"
            )
        live = arrived
        if epoch is not None:
            epoch[0] += 1


# ---------------------------------------------------------------------------------------------
# Data races: which threads wrote and read each element of a buffer since the last barrier.
#
# A thread is a key (block index << 32 | thread index), an access time an epoch
# (block index << 32 | barriers the block has passed). Two accesses of one element by different
# threads, at least one a write, race unless the same block separates them by a barrier:
# that is, unless both keys name the same block and the epochs differ. A write of the value
# already stored changes nothing and races with nothing (threads that redundantly compute the
# same stage are benign); its thread counts as a writer of that value.


class RaceTracker:
    """Access records of one buffer during one kernel launch (or one block, for shared)."""

    __slots__ = ("name", "shape", "scope", "kernel", "launch", "recs")

    def __init__(self, name: str, shape: tuple, scope: str, kernel: str, launch: tuple) -> None:
        self.name, self.shape, self.scope, self.kernel = name, shape, scope, kernel
        self.launch = launch  # (gx, gy, gz, tx, ty, tz) to name threads in messages
        # flat index -> [write epoch, writer keys, read epoch, reader keys]
        self.recs: dict[int, list] = {}

    def who(self, key: int) -> str:
        gx, gy, _, tx, ty, _ = self.launch
        b, t = key >> 32, key & 0xFFFFFFFF
        return (
            f"thread {(t % tx, t // tx % ty, t // (tx * ty))} of block "
            f"{(b % gx, b // gx % gy, b // (gx * gy))}"
        )

    def race(self, me: int, other: int, what: str, k: int) -> RuntimeError_:
        index = np.unravel_index(k, tuple(int(d) for d in self.shape)) if self.shape else ()
        where = f"{self.name}[{', '.join(str(int(i)) for i in index)}]"
        sync = "since the last barrier" if other >> 32 == me >> 32 else "in another block"
        return RuntimeError_(
            f"data race in kernel {self.kernel} on {self.scope} buffer {where}: {self.who(me)} "
            f"{what} {self.who(other)} {sync}"
        )


def _racer(keys: set[int] | tuple, epoch: int, me: int, now: int) -> int | None:
    """A key of ``keys`` (accesses at ``epoch``) that races with thread ``me`` at ``now``: any
    other thread at the same epoch, any thread of another block."""
    for other in keys:
        if other != me and (epoch == now or (other ^ me) >> 32):
            return other
    return None


def race_load(tr: RaceTracker, view: memoryview, k: int, me: int, now: int) -> Any:
    rec = tr.recs.get(k)
    if rec is None:
        tr.recs[k] = [-1, (), now, {me}]
        return view[k]
    w = rec[0]
    # The writers of an element share one epoch, and so one block: (w ^ now) >> 32 is nonzero
    # exactly when they are another block's threads.
    if (w == now and me not in rec[1]) or ((w ^ now) >> 32 and rec[1]):
        other = _racer(rec[1], w, me, now)
        if other is not None:
            raise tr.race(me, other, "reads the value written by", k)
    r = rec[2]
    if r == now:
        rec[3].add(me)
    elif (r ^ now) >> 32:
        rec[2] = now
        rec[3].add(me)  # reads of earlier blocks still race with this block's writes
    else:
        rec[2], rec[3] = now, {me}  # a barrier separates the block's earlier reads
    return view[k]


def race_store(tr: RaceTracker, view: memoryview, k: int, value: Any, me: int, now: int) -> None:
    rec = tr.recs.get(k)
    if rec is None:
        tr.recs[k] = [now, {me}, now, set()]
        view[k] = value
        return
    old = view[k]
    if old == value or (old != old and value != value):
        if rec[0] == now:
            rec[1].add(me)
        else:
            rec[0], rec[1] = now, {me}
        return
    other = _racer(rec[1], rec[0], me, now)
    if other is not None:
        raise tr.race(me, other, "overwrites the value written by", k)
    other = _racer(rec[3], rec[2], me, now)
    if other is not None:
        raise tr.race(me, other, "overwrites the value read by", k)
    rec[0], rec[1] = now, {me}
    view[k] = value


def tracker_once(
    table: dict, uid: int, name: str, shape: tuple, scope: str, kernel: str, launch: tuple
) -> RaceTracker:
    key = ("race", uid)
    tr = table.get(key)
    if tr is None:
        tr = table[key] = RaceTracker(name, shape, scope, kernel, launch)
    return tr


def namespace() -> dict[str, Any]:
    """The globals the rendered code runs in."""
    ns: dict[str, Any] = {
        "_inf": INF,
        "_nan": NAN,
        "_F16T": F16_TABLE,
        "_f16b": f16_bits,
        "_f16": f16,
        "_BF16T": BF16_TABLE,
        "_bf16b": bf16_bits,
        "_bf16": bf16,
        "_f32": f32,
        "_alloc": alloc,
        "_alloc_once": alloc_once,
        "_oob": oob,
        "_index_check": index_check,
        "_wrap": wrap,
        "_ftoi": ftoi,
        "_fdiv": fdiv,
        "_ffloordiv": ffloordiv,
        "_ffloormod": ffloormod,
        "_tdiv": tdiv,
        "_tmod": tmod,
        "_ipow": ipow,
        "_fpow": fpow,
        "_run_block": run_block,
        "_tload": race_load,
        "_tstore": race_store,
        "_track": tracker_once,
        "_kernel_error": kernel_error,
        "_RuntimeError": RuntimeError_,
    }
    ns.update({f"_m_{name}": fn for name, fn in INTRINSICS.items()})
    ns.update({f"_m_{name}32": fn for name, fn in INTRINSICS_F32.items()})
    return ns
