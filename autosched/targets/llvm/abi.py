"""The C ABI of a compiled kernel.

Every PrimFunc becomes one exported function::

    int32_t NAME(T0 *restrict p0, T1 *restrict p1, ..., int64_t s0, int64_t s1, ...);

* ``p0, p1, ...`` are the parameter buffers in ``PrimFunc.params`` order, each a pointer to
  row-major, contiguous elements (``bool`` is one byte). They must not overlap where one is
  written, and each must be 16-byte aligned.
* ``s0, s1, ...`` are the symbolic sizes: every distinct ``Var`` in the parameters' shapes, in
  order of first appearance (params left to right, dims left to right).
* ``NAME`` is the PrimFunc's name, except that ``main`` (so that a C driver can have its own)
  and the names of what kernels call or LLVM may call for them (the C math functions, the
  allocator, memcpy / memset, the thread pool, libgomp, names starting with ``_``) get the prefix
  ``autosched_``: a kernel named ``exp`` must not call itself for ``exp()``.
* The result is 0, or the STATUS_* bits (autosched/targets/status.py) of what failed: a buffer
  the kernel allocates could not be, an index read from a tensor was out of range. The outputs
  are then not valid; the kernel never touches memory it has no right to.
* Kernels with parallel loops also export ``int32_t NAME__num_threads`` (0, the default in a
  shared library: OMP_NUM_THREADS or the core count) and call ``autosched_parallel``, the
  thread pool (threadpool.py), which an exported object or library holds a private copy of
  (libgomp's GOMP_parallel on triples the pool does not support).
"""

from __future__ import annotations

from dataclasses import dataclass

from autosched.te.expr import Var
from autosched.te.visit import post_order
from autosched.tir.ir import Buffer, PrimFunc

PARAM_ALIGN = 16  # numpy aligns data to 16 bytes; runtime.py copies an array that is not
ALLOC_ALIGN = 64  # buffers the kernel allocates itself: one cache line, one AVX-512 vector


@dataclass(frozen=True)
class Signature:
    symbol: str
    params: tuple[Buffer, ...]
    sym_vars: tuple[Var, ...]

    @property
    def num_threads_symbol(self) -> str:
        return f"{self.symbol}__num_threads"

    @property
    def threads_ran_symbol(self) -> str:
        return f"{self.symbol}__threads_ran"

    def c_declaration(self) -> str:
        """The prototype a C caller uses, e.g. ``int32_t mm(float *restrict A, ...);``."""
        from autosched.targets.llvm.c_types import c_type

        args = [f"{c_type(b.dtype)} *restrict {b.name}" for b in self.params]
        args += [f"int64_t {v.name}" for v in self.sym_vars]
        return f"int32_t {self.symbol}({', '.join(args)});"


# C math functions (each also with an f / l suffix) and the runtime a kernel calls
_MATH = frozenset("""
acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh erf erfc exp exp10 exp2 expm1
fabs fdim floor fma fmax fmin fmod frexp hypot ilogb ldexp lgamma llrint llround log log10 log1p
log2 logb lrint lround modf nan nearbyint nextafter nexttoward pow remainder remquo rint round
scalbln scalbn sin sincos sinh sqrt tan tanh tgamma trunc
""".split())
_RUNTIME = frozenset("main aligned_alloc malloc calloc realloc free memcpy memmove memset memcmp "
                     "bcmp abort getpid getenv strtol sysconf syscall sched_yield pthread_create "
                     "pthread_detach".split())  # the last eight: the thread pool's
_RUNTIME_PREFIXES = ("_", "GOMP_", "omp_", "llvm.", "autosched_parallel", "autosched_pool_")


def reserved(name: str) -> bool:
    """Whether a kernel named ``name`` would collide with a function it calls or links."""
    base = name[:-1] if name[-1:] in ("f", "l") and name[:-1] in _MATH else name
    return base in _MATH or name in _RUNTIME or name.startswith(_RUNTIME_PREFIXES)


def signature(func: PrimFunc) -> Signature:
    seen: dict[int, Var] = {}
    for buf in func.params:
        for dim in buf.shape:
            for n in post_order(dim):
                if isinstance(n, Var):
                    seen.setdefault(n.uid, n)
    symbol = f"autosched_{func.name}" if reserved(func.name) else func.name
    return Signature(symbol, tuple(func.params), tuple(seen.values()))
