"""Loop IR -> CUDA C.

Each top-level loop nest whose outermost loop is bound to ``blockIdx`` / ``threadIdx`` becomes
one ``extern "C" __global__`` kernel; several nests become several kernels, launched in order.
Thread loops are not emitted: their variable reads the hardware index, and a guard
``if (idx < extent)`` is added where the loop is shorter than the launch size of its tag (the
launch size of a tag is the largest extent any loop of that kernel binds to it). A kernel that
checks something at run time (a Gather index) takes a status word as its last parameter,
``int* __restrict__ as_status``, and ORs the STATUS_* bit of a failed check into it; a kernel
without checks has neither the parameter nor its helpers.

Example::

    src = generate(func, target)
    print(src.code)                  # the CUDA C
    src.kernels[0].grid              # (Expr, Expr, Expr) launch sizes, may use shape variables
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from autosched.errors import CompileError
from autosched.targets.cuda import ir_util as U
from autosched.targets.cuda import wgmma, wmma
from autosched.targets.cuda.cexpr import (
    PRELUDE_FLOAT,
    PRELUDE_INT,
    PRELUDE_STATUS,
    STATUS_PARAM,
    ExprWriter,
)
from autosched.targets.cuda.dtypes import HALF_HEADERS, VECTOR_TYPES, c_type
from autosched.targets.cuda.intrinsics import prelude_math
from autosched.targets.cuda.tma import TensorMap
from autosched.targets.names import c_identifier
from autosched.targets.target import Target
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.visit import (
    children,
    free_vars,
    post_order,
    rewrite,
    rewrite_outer,
    substitute,
)
from autosched.tir import ir
from autosched.tir.evaluate import const_int
from autosched.tir.tensor_intrin import FRAGMENT_TILES
from autosched.tir.visit import (
    loads,
    stored_buffers,
    substitute_stmt,
    used_buffers,
    used_vars,
    uses_var,
    walk,
)

# Every identifier the generated code declares lives in autosched's own namespace
# (autosched/targets/names.py): kernels are k_<name>, buffers and variables v_<name>, and the
# helpers of the preludes are as_<name>.
KERNEL_PREFIX = "k_"
VALUE_PREFIX = "v_"


@dataclass(frozen=True)
class KernelInfo:
    """One kernel: its name, launch sizes (expressions over shape variables) and parameters
    (TMA descriptors, then buffers, then scalars, then the status word when it ``checks``)."""

    name: str
    grid: tuple[E.Expr, E.Expr, E.Expr]
    block: tuple[E.Expr, E.Expr, E.Expr]
    buffers: tuple[ir.Buffer, ...]
    scalars: tuple[E.Var, ...]
    shared_bytes: int
    checks: bool
    dynamic_shared: int = 0  # bytes of dynamic shared memory to launch with (0: all static)
    # the TMA descriptors the host encodes, passed before the buffers: (buffer, its map)
    tensor_maps: tuple[tuple[ir.Buffer, TensorMap], ...] = ()


@dataclass(frozen=True)
class CudaSource:
    """Generated CUDA C with what the host needs to launch it."""

    code: str
    kernels: tuple[KernelInfo, ...]
    workspace: tuple[ir.Buffer, ...]  # global buffers the host allocates (intermediates)
    shape_vars: tuple[E.Var, ...]  # symbolic sizes, bound from argument shapes at call time
    uses_half: bool
    written: frozenset[ir.Buffer] = field(default_factory=frozenset)
    arch_specific: bool = False  # compiled for sm_XXa (wgmma: sm_90a)

    @property
    def checks(self) -> bool:
        """Whether some kernel reports to a status word (which the host must pass and read)."""
        return any(k.checks for k in self.kernels)


def generate(func: ir.PrimFunc, target: Target) -> CudaSource:
    """Render ``func`` (whose top-level nests are all thread-bound) as CUDA C."""
    return _FuncWriter(func, target).run()


ASYNC_COPY_ARCH = 80  # cp.async

# cp.async of 4, 8 or 16 bytes from global into shared memory (src_bytes: how many are read,
# the rest zero-filled), its commit and wait; host emulation (host_prelude.py) has its own
PRELUDE_ASYNC = """\
#ifndef AS_HOST_EMULATION
__device__ __forceinline__ unsigned as_smem(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void as_cp_async(uint4* d, const uint4* s, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n"
               :: "r"(as_smem(d)), "l"(s), "r"(src_bytes) : "memory"); }
__device__ __forceinline__ void as_cp_async(uint2* d, const uint2* s, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\\n"
               :: "r"(as_smem(d)), "l"(s), "r"(src_bytes) : "memory"); }
__device__ __forceinline__ void as_cp_async(unsigned int* d, const unsigned int* s,
                                            int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\\n"
               :: "r"(as_smem(d)), "l"(s), "r"(src_bytes) : "memory"); }
__device__ __forceinline__ void as_cp_async_commit() {
  asm volatile("cp.async.commit_group;\\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void as_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\\n" :: "n"(N) : "memory"); }
#endif
"""


# Shared memory a kernel may declare statically; one that needs more (opt-in per function, up to
# the arch's limit: 227 KB on sm_90) carves its buffers out of one dynamic allocation instead
STATIC_SHARED_BYTES = 48 * 1024
DYNAMIC_SHARED = "as_dyn_smem"
DYNAMIC_ALIGN = 128


def stmt_shared_bytes(s: ir.Stmt) -> int:
    """Shared memory ``s`` allocates (an upper bound: nested allocations summed)."""
    total = 0
    for st in walk(s):
        if isinstance(st, ir.Allocate) and st.buffer.scope == "shared":
            n = st.buffer.itemsize
            for d in st.buffer.shape:
                n *= int(d.value) if isinstance(d, E.Const) else 1
            total += n
    return total


def arch_number(arch: str) -> int:
    """A compute capability as a number (sm_90: 90; 0 when ``arch`` names none)."""
    return int("".join(c for c in arch if c.isdigit()) or 0)


def target_arch(target: Target) -> int:
    """The target's compute capability as a number (sm_90: 90; 0 when it names none)."""
    return arch_number(target.arch)


class _Names:
    """Unique, valid C identifiers for variables and buffers (IR names may repeat)."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.by_uid: dict[int, str] = {}

    def get(self, uid: int, name: str) -> str:
        if uid in self.by_uid:
            return self.by_uid[uid]
        base = c_identifier(VALUE_PREFIX, name)
        cand, n = base, 1
        while cand in self.used:
            cand, n = f"{base}_{n}", n + 1
        self.used.add(cand)
        self.by_uid[uid] = cand
        return cand

    def fork(self) -> _Names:
        out = _Names()
        out.used = set(self.used)
        out.by_uid = dict(self.by_uid)
        return out


class _FuncWriter:
    def __init__(self, func: ir.PrimFunc, target: Target) -> None:
        self.func = func
        self.target = target
        self.fast_math = "fast-math" in dict(target.options)
        self.names = _Names()
        self.workspace: list[ir.Buffer] = []
        self.uses_half = False
        self.half_types: set[str] = set()
        self.uses_wmma = False
        self.uses_async = False  # some copy is a cp.async (PRELUDE_ASYNC)
        self.helpers: dict[str, str] = {}  # file-scope definitions by name (wgmma.helpers)
        self.arch_specific = False
        self.async_copies = target_arch(target) >= ASYNC_COPY_ARCH

    def note_dtype(self, dtype: str) -> None:
        """Kernels touching a half type include its header."""
        if dtype in HALF_HEADERS:
            self.uses_half = True
            self.half_types.add(dtype)

    def run(self) -> CudaSource:
        for b in self.func.params:
            self.names.get(b.uid, b.name)
        shape_vars: dict[int, E.Var] = {}
        for b in self.func.params:
            for d in b.shape:
                for v in free_vars(d):
                    shape_vars.setdefault(v.uid, v)
        for v in shape_vars.values():
            self.names.get(v.uid, v.name)
        regions: list[tuple[ir.For, list[ir.Stmt]]] = []
        self._collect(self.func.body, [], regions)
        if not regions:
            raise CompileError(f"function {self.func.name} has no kernel (its body is empty)")
        base = self.func.name
        kernels, bodies = [], []
        for n, (region, wrappers) in enumerate(regions):
            name = c_identifier(KERNEL_PREFIX,
                                base if len(regions) == 1 else f"{base}_kernel{n}")
            kw = _KernelWriter(self, name, region, wrappers, tuple(shape_vars.values()))
            info, text = kw.run()
            kernels.append(info)
            bodies.append(text)
        head = ["// generated by autosched for " + str(self.target)]
        head += [f"#include <{HALF_HEADERS[t]}>" for t in sorted(self.half_types)]
        head += [f"#include <{wmma.HEADER}>"] * self.uses_wmma
        prelude = PRELUDE_INT + PRELUDE_FLOAT + prelude_math(self.fast_math)
        if any(k.checks for k in kernels):
            prelude += PRELUDE_STATUS
        if self.uses_async:
            prelude += PRELUDE_ASYNC
        prelude += "".join(self.helpers.values())
        code = "\n".join(head + [prelude] + bodies)
        written = frozenset(stored_buffers(self.func.body))
        # uses_half tells the compiler to add CUDA's include directory, where mma.h is too
        return CudaSource(code, tuple(kernels), tuple(self.workspace),
                          tuple(shape_vars.values()), self.uses_half or self.uses_wmma, written,
                          self.arch_specific)

    def _collect(self, s: ir.Stmt, wrappers: list[ir.Stmt],
                 out: list[tuple[ir.For, list[ir.Stmt]]]) -> None:
        """Split the host level into kernel regions; allocations and lets above a region are
        pushed into each kernel that needs them; global allocations become workspace."""
        if isinstance(s, ir.Seq):
            for c in s.stmts:
                self._collect(c, wrappers, out)
        elif isinstance(s, ir.Allocate) and s.buffer.scope == "global":
            self.workspace.append(s.buffer)
            self.names.get(s.buffer.uid, s.buffer.name)
            self._collect(s.body, wrappers, out)
        elif isinstance(s, (ir.Allocate, ir.LetStmt)):
            self._collect(s.body, wrappers + [s], out)
        elif isinstance(s, ir.For) and s.kind == "thread" and s.thread_tag in ir.THREAD_TAGS:
            out.append((s, wrappers))
        else:
            what = f"loop {s.var.name} ({s.kind})" if isinstance(s, ir.For) else type(s).__name__
            raise CompileError(
                f"function {self.func.name}: {what} sits outside any kernel; a top-level loop "
                "nest must start with a loop bound to blockIdx/threadIdx (bind its outer loops, "
                "or leave the nest unbound so the default GPU schedule binds it)"
            )


class _KernelWriter(ExprWriter):
    def __init__(self, fw: _FuncWriter, name: str, region: ir.For, wrappers: list[ir.Stmt],
                 shape_vars: tuple[E.Var, ...]) -> None:
        self.fw = fw
        self.name = name
        self.region = region
        self.wrappers = wrappers
        self.shape_vars = shape_vars
        self.names = fw.names.fork()
        self.fast_math = fw.fast_math
        self.lines: list[str] = []
        self.depth = 1
        self.nonneg: set[int] = {v.uid for v in shape_vars}
        self.raw: dict[int, str] = {}  # placeholder vars printed as raw C text
        self.shared_bytes = 0
        self.dynamic = False  # shared buffers are carved out of DYNAMIC_SHARED
        self.tmp = 0
        self.unroll_explicit = False
        self.thread_loops: list[ir.For] = []  # enclosing blockIdx/threadIdx loops
        self.conditions: list[E.Expr] = []  # enclosing if conditions
        self.wmma_buffers: set[ir.Buffer] = set()  # shared buffers that wmma calls access
        # the shared tiles of gemm_block nests -> their names (the operand region of the main
        # loop shares the tile's allocation) and main loops
        self.wg_regions: dict[ir.Buffer, str] = {}
        self.wg_loops: dict[ir.Buffer, wgmma.MainLoop] = {}
        self.tensor_maps: list[tuple[str, ir.Buffer, TensorMap]] = []  # (parameter, ...)
        self.wg_epilogues: dict[ir.Buffer, wgmma.Epilogue] = {}  # their tiles' epilogue nests
        self.wg_done: set[ir.Buffer] = set()  # tiles whose main loop ran their epilogue nest
        self.async_copies = False  # inside a group of copies that may run asynchronously

    def need_half(self, dtype: str = "float16") -> None:
        self.fw.note_dtype(dtype)

    # -- structure ---------------------------------------------------------------------------

    def run(self) -> tuple[KernelInfo, str]:
        launch = self._launch_sizes()
        self.launch = launch
        body: ir.Stmt = self.region
        for w in reversed(self.wrappers):
            if isinstance(w, ir.Allocate):
                if w.buffer in used_buffers(body):
                    body = ir.Allocate(w.buffer, body)
            elif isinstance(w, ir.LetStmt):
                body = ir.LetStmt(w.var, w.value, body)
        used = used_buffers(body)
        written = stored_buffers(body)
        self.wmma_buffers = self._check_tensorized(body)
        params = [b for b in self.fw.func.params + tuple(self.fw.workspace) if b in used]
        for b in params:
            self.fw.note_dtype(b.dtype)
        extra = 0  # the main loops' operand regions beyond their tiles
        block_threads = const_int(launch["threadIdx"][0]) or 0
        for loop, intrin in wgmma.block_nests(body):
            out = wgmma.block_output(loop)
            ml = wgmma.block_loop(loop, intrin, block_threads)
            self.wg_loops[out] = ml
            extra += max(0, ml.shared_bytes() - (out.num_elements or 0) * out.itemsize)
        self.wg_epilogues = wgmma.epilogues(body, set(self.wg_loops), f"kernel {self.name}")
        self.dynamic = stmt_shared_bytes(body) + extra > STATIC_SHARED_BYTES or bool(extra)
        self._stmt(body)
        if self.dynamic:
            self.lines.insert(0, f"  extern __shared__ __align__({DYNAMIC_ALIGN}) unsigned char "
                                 f"{DYNAMIC_SHARED}[];")
        sig = [wgmma.tensor_map_param(name) for name, _, _ in self.tensor_maps]
        for b in params:
            const = "" if b in written else "const "
            sig.append(f"{const}{c_type(b.dtype)}* __restrict__ {self.names.get(b.uid, b.name)}")
        sig += [f"{c_type(v.dtype)} {self.names.get(v.uid, v.name)}" for v in self.shape_vars]
        if self.checks:
            sig.append(f"int* __restrict__ {STATUS_PARAM}")
        threads = [const_int(e) for e in launch["threadIdx"]]
        bounds = ""
        if all(t is not None for t in threads):
            total = threads[0] * threads[1] * threads[2]  # type: ignore[operator]
            if total > self.fw.target.max_threads_per_block:
                raise CompileError(
                    f"kernel {self.name} needs {total} threads per block (block "
                    f"{tuple(threads)}) but target {self.fw.target} allows "
                    f"{self.fw.target.max_threads_per_block}"
                )
            # a producer warpgroup hands its registers to the computing ones (setmaxnreg):
            # one block an SM, so the block starts with the most registers a thread can have
            one = any(ml.producer for ml in self.wg_loops.values())
            bounds = f"__launch_bounds__({total}{', 1' * one}) "
        if self.shared_bytes > self.fw.target.max_shared_memory_per_block:
            raise CompileError(
                f"kernel {self.name} declares {self.shared_bytes} bytes of shared memory but "
                f"target {self.fw.target} allows {self.fw.target.max_shared_memory_per_block} "
                "per block"
            )
        text = "\n".join(
            [f'extern "C" __global__ void {bounds}{self.name}({", ".join(sig)}) {{']
            + self.lines + ["}", ""]
        )
        info = KernelInfo(self.name, launch["blockIdx"], launch["threadIdx"], tuple(params),
                          self.shape_vars, self.shared_bytes, self.checks,
                          self.shared_bytes if self.dynamic else 0,
                          tuple((b, tm) for _, b, tm in self.tensor_maps))
        return info, text

    def _check_tensorized(self, body: ir.Stmt) -> set[ir.Buffer]:
        """The buffers that tensorized nests of the kernel access besides fragments; the
        target's arch must have their intrinsics."""
        nests = wmma.tensorized(body)
        if not nests:
            return set()
        arch = target_arch(self.fw.target)
        for loop, intrin in nests:
            if arch < intrin.min_arch:
                raise CompileError(f"kernel {self.name}: loop {loop.var.name} is tensorized as "
                                   f"{intrin.name}, which needs sm_{intrin.min_arch} or newer; "
                                   f"the target is {self.fw.target.arch or 'of no arch'}")
        blocks = [loop for loop, intrin in nests if intrin.kind == "gemm_block"]
        if blocks and arch != wgmma.ARCH:
            raise CompileError(f"kernel {self.name}: loop {blocks[0].var.name} runs on wgmma, "
                               f"which only sm_90 has (sm_90a); the target is "
                               f"{self.fw.target.arch}")
        self.fw.arch_specific |= bool(blocks)
        self.fw.uses_async |= bool(blocks)  # the main loops commit and wait cp.async groups
        self.fw.uses_wmma |= len(blocks) < len(nests)
        return wmma.operand_buffers(body)

    def _launch_sizes(self) -> dict[str, tuple[E.Expr, E.Expr, E.Expr]]:
        extents: dict[str, list[E.Expr]] = {t: [] for t in ir.THREAD_TAGS}
        for st in walk(self.region):
            threads = isinstance(st, ir.For) and wgmma.epilogue_threads(st)
            if threads:  # a nest each thread runs for the accumulators it holds
                extents["threadIdx.x"].append(E.const(threads))
            if isinstance(st, ir.For) and st.kind == "thread" and st.thread_tag in ir.THREAD_TAGS:
                bad = [v for v in free_vars(st.extent) if v not in self.shape_vars]
                if bad:
                    raise CompileError(
                        f"kernel {self.name}: loop {st.var.name} bound to {st.thread_tag} has "
                        f"extent {st.extent}, which depends on {bad[0].name}; a thread extent "
                        "may only use the function's shape variables"
                    )
                extents[st.thread_tag].append(st.extent)
        out: dict[str, tuple[E.Expr, E.Expr, E.Expr]] = {}
        for kind in ("blockIdx", "threadIdx"):
            dims = []
            for d in "xyz":
                exts = extents[f"{kind}.{d}"]
                dims.append(_max_extent(exts))
            out[kind] = (dims[0], dims[1], dims[2])
        return out

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def _stmt(self, s: ir.Stmt, unroll_budget: int = 0) -> None:
        if isinstance(s, ir.Seq):
            for c in s.stmts:
                self._stmt(c, unroll_budget)
        elif isinstance(s, ir.Store):
            self._check_accumulation(s)
            self.emit(f"{self._access(s.buffer, s.indices)} = {self.store_value(s)};")
        elif isinstance(s, ir.For):
            self._for(s, unroll_budget)
        elif isinstance(s, ir.IfThenElse):
            self.emit(f"if ({self._expr(s.cond)}) {{")
            self.conditions.append(s.cond)
            self._block_b(s.then_body, unroll_budget)
            if s.else_body is not None:
                self.emit("} else {")
                self._block_b(s.else_body, unroll_budget)
            self.conditions.pop()
            self.emit("}")
        elif isinstance(s, ir.Allocate):
            self._allocate(s)
            self._stmt(s.body, unroll_budget)
        elif isinstance(s, ir.LetStmt):
            v = self._var_name(s.var)
            self.emit("{")
            self.depth += 1
            self.emit(f"const {c_type(s.var.dtype)} {v} = {self._expr(s.value)};")
            if U.is_nonneg(s.value, self.nonneg):
                self.nonneg.add(s.var.uid)
            self._stmt(s.body, unroll_budget)
            self.depth -= 1
            self.emit("}")
        elif isinstance(s, ir.Barrier):
            if s.scope not in ("shared", "global"):
                raise CompileError(f"kernel {self.name}: unknown barrier scope {s.scope!r}")
            self.emit("__syncthreads();")
        else:
            raise CompileError(f"kernel {self.name}: cannot emit statement {type(s).__name__}")

    def _check_accumulation(self, s: ir.Store) -> None:
        """``B[i] = B[i] + ...`` inside a thread loop whose index ``i`` ignores: all those
        threads read-modify-write one element at once, a race, not a reduction."""
        if s.buffer.scope == "local":
            return  # private to each thread
        if not any(isinstance(ld, ir.Load) and ld.buffer == s.buffer
                   and E.structural_equal(ld.indices, s.indices) for ld in loads(s.value)):
            return
        for lp in self.thread_loops:
            ext = const_int(lp.extent)
            if ext == 1 or any(uses_var(i, lp.var) for i in s.indices):
                continue
            if s.buffer.scope == "shared" and lp.thread_tag.startswith("blockIdx"):
                continue  # each block has its own shared memory
            if any(uses_var(c, lp.var) for c in self.conditions):
                continue  # e.g. only thread 0 accumulates
            raise CompileError(
                f"kernel {self.name}: {s.buffer.name}[{', '.join(map(str, s.indices))}] is "
                f"accumulated by all {lp.extent} threads of {lp.thread_tag} (loop "
                f"{lp.var.name}) at once; a reduction axis bound to a GPU thread needs a "
                "cross-thread reduction, which this backend does not generate: keep the "
                "reduction serial per thread, or rfactor it and reduce the partial results "
                "in a second stage"
            )

    def _block_b(self, s: ir.Stmt, unroll_budget: int) -> None:
        self.depth += 1
        self._stmt(s, unroll_budget)
        self.depth -= 1

    def _allocate(self, s: ir.Allocate) -> None:
        b = s.buffer
        n = b.num_elements
        if n is None:
            raise CompileError(
                f"kernel {self.name}: {b.scope} buffer {b.name} has a symbolic shape "
                f"{tuple(str(d) for d in b.shape)}; shared and local buffers need constant sizes"
            )
        name = self.names.get(b.uid, b.name)
        self.fw.note_dtype(b.dtype)
        if b.scope == "shared" and self.dynamic:  # at the next multiple of DYNAMIC_ALIGN
            at = -(-self.shared_bytes // DYNAMIC_ALIGN) * DYNAMIC_ALIGN
            if b in self.wg_loops:  # a main loop's tile, its operand region in the same place
                n = max(n, -(-self.wg_loops[b].shared_bytes() // b.itemsize))
                self.wg_regions[b] = name
            self.shared_bytes = at + n * b.itemsize
            ctype = c_type(b.dtype)
            self.emit(f"{ctype}* {name} = reinterpret_cast<{ctype}*>({DYNAMIC_SHARED} + {at});"
                      f"  // shared {n}")
        elif b.scope == "shared":
            self.shared_bytes += n * b.itemsize
            align = 32 if b in self.wmma_buffers else 16  # wmma tiles start 32-byte aligned
            self.emit(f"__shared__ __align__({align}) {c_type(b.dtype)} {name}[{n}];")
        elif b.scope in FRAGMENT_TILES:
            wmma.declare_fragments(self, b, s.body, name)
        elif b.scope == "local":
            self.emit(f"{c_type(b.dtype)} {name}[{n}];")
        else:
            raise CompileError(
                f"kernel {self.name}: buffer {b.name} of scope {b.scope!r} is allocated inside "
                "a kernel but outside some of its thread loops, so threads would share it; "
                "give it scope 'shared' (cache_read/cache_write) or compute it at a loop inside "
                "every thread loop"
            )

    def raw_var(self, text: str, dtype: str = "int32") -> E.Var:
        """A variable printed as the C expression ``text``."""
        v = E.Var(f"as_raw{self.tmp}", dtype)
        self.tmp += 1
        self.raw[v.uid] = text
        return v

    def captured(self, s: ir.Stmt) -> list[str]:
        """The lines of ``s`` (indented from zero), not emitted."""
        saved = self.lines, self.depth
        self.lines, self.depth = [], 0
        try:
            self._stmt(s)
            return self.lines
        finally:
            self.lines, self.depth = saved

    def _var_name(self, v: E.Var) -> str:
        return self.names.get(v.uid, v.name)

    # -- loops -------------------------------------------------------------------------------

    def _for(self, s: ir.For, unroll_budget: int) -> None:
        """Annotations of a loop hold for the loops nested in it: auto_unroll_max_step N unrolls
        every inner nest of at most N steps; unroll_explicit replicates the bodies in the source
        instead of asking NVRTC with #pragma unroll."""
        ann = dict(s.annotations)
        if "auto_unroll_max_step" in ann:
            unroll_budget = max(unroll_budget, int(ann["auto_unroll_max_step"]))
        saved = self.unroll_explicit
        if "unroll_explicit" in ann:
            self.unroll_explicit = bool(ann["unroll_explicit"])
        try:
            self._for_body(s, unroll_budget, self.unroll_explicit)
        finally:
            self.unroll_explicit = saved

    def _for_body(self, s: ir.For, unroll_budget: int, explicit: bool) -> None:
        intrin = wmma.intrin_of(s)
        if intrin is not None and intrin.kind == "gemm_block":
            wgmma.emit_block(self, s, intrin)
            return
        if intrin is not None:
            wmma.emit_nest(self, s, intrin)
            return
        ann = dict(s.annotations)
        if wgmma.EPILOGUE_PRAGMA in ann:
            if not any(e.rows is s and e.tile in self.wg_done for e in self.wg_epilogues.values()):
                raise CompileError(f"kernel {self.name}: the epilogue nest of loop {s.var.name} "
                                   "follows no main loop of the tile it reads")
            return  # the main loop ran it
        if "async_copy" in ann or "async_wait" in ann:
            self._async_region(s, ann, unroll_budget)
            return
        v = self._var_name(s.var)
        lo = self._expr(s.min)
        if U.is_nonneg(s.min, self.nonneg):
            self.nonneg.add(s.var.uid)
        if s.kind == "thread" and s.thread_tag in ir.THREAD_TAGS:
            kind, dim = s.thread_tag.split(".")
            launch = self.launch[kind]["xyz".index(dim)]
            self.emit("{")
            self.depth += 1
            idx = f"(int){s.thread_tag}"
            self.emit(f"const int {v} = {idx};" if _is_zero(s.min) else
                      f"const int {v} = {lo} + {idx};")
            guard = not _same_extent(s.extent, launch)
            self.thread_loops.append(s)
            if guard:
                self.emit(f"if ({idx} < {self._expr(s.extent)}) {{")
                self._block_b(s.body, unroll_budget)
                self.emit("}")
            else:
                self._stmt(s.body, unroll_budget)
            self.thread_loops.pop()
            self.depth -= 1
            self.emit("}")
            return
        if s.kind == "vectorized" and (self._try_vector_copy(s) or self._try_vector(s)
                                       or self._try_packed(s)):
            return
        ext = const_int(s.extent)
        unroll = s.kind in ("unrolled", "vectorized") or s.thread_tag.startswith("vthread")
        if not unroll and unroll_budget and ext is not None:
            steps = _steps(s)
            unroll = steps is not None and steps <= unroll_budget
        if not unroll and ext is not None and _indexes_local(s):
            # a register array stays in registers only if every index into it is a constant
            # after unrolling; otherwise it spills to (slow) local memory
            steps = _steps(s)
            unroll = steps is not None and steps <= _LOCAL_UNROLL_STEPS
        if unroll and explicit and ext is not None and ext <= 64:
            for i in range(ext):
                self.emit("{")
                self.depth += 1
                self.emit(f"const int {v} = {lo} + {i};" if not _is_zero(s.min) else
                          f"const int {v} = {i};")
                self._stmt(s.body, unroll_budget)
                self.depth -= 1
                self.emit("}")
            return
        if unroll:
            self.emit("#pragma unroll")
        ctype = c_type(s.var.dtype)
        hi = self._expr(E.binary(Op.ADD, s.min, s.extent))
        self.emit(f"for ({ctype} {v} = {lo}; {v} < {hi}; ++{v}) {{")
        self._block_b(s.body, unroll_budget)
        self.emit("}")

    def _async_region(self, s: ir.For, ann: dict, unroll_budget: int) -> None:
        """A loop of one iteration that lowering's pipelines (Stage.pipeline) wrap around a
        group of copies that may complete asynchronously (``async_copy``: their global ->
        shared vector copies become cp.async, and the group is committed after them) or around
        the barrier that waits for all but the newest ``async_wait`` groups. Before sm_80 the
        copies are plain and nothing waits."""
        if const_int(s.extent) != 1 or s.var in used_vars(s.body):
            raise CompileError(f"kernel {self.name}: loop {s.var.name} annotated "
                               f"{sorted(ann)} must run once and not use its variable")
        can = self.fw.async_copies
        if "async_wait" in ann and can:
            self.emit(f"as_cp_async_wait<{int(ann['async_wait'])}>();")
        saved = self.async_copies
        self.async_copies = can and "async_copy" in ann
        self._stmt(s.body, unroll_budget)
        self.async_copies = saved
        if "async_copy" in ann and can:
            self.emit("as_cp_async_commit();")
        self.fw.uses_async |= can

    def _try_vector(self, s: ir.For) -> bool:
        """Emit a vectorized loop whose body is one store with float2/float4 accesses: one
        vector load per operand that is contiguous and aligned in the loop variable, and one
        vector store when the store is too (else the lanes packed into one access when their
        type fits one, else a scalar store per lane). Guards around the store: _guarded."""
        lanes = const_int(s.extent)
        st, guards = _peel_guards(s)
        if lanes not in (2, 4) or not isinstance(st, ir.Store):
            return False
        store_vec = self._vector_ok(st.buffer, st.indices, s, lanes)
        candidates = [ld for ld in _unconditional_loads(st.value)
                      if uses_var(ir.flat_offset(ld.buffer, ld.indices), s.var)
                      and self._vector_ok(ld.buffer, ld.indices, s, lanes)]
        if not store_vec and not candidates:
            return False
        # a store of a type float2 / float4 do not carry (halves) packed as one access
        packed = None if store_vec else COPY_TYPES.get(lanes * st.buffer.itemsize)
        if packed is not None and not self._aligned_lanes(st.buffer, st.indices, s, lanes):
            packed = None
        self._guarded(s, guards, lambda: self._vector_store(s, st, store_vec, packed,
                                                             candidates))
        return True

    def _guarded(self, s: ir.For, guards: list[E.Expr], vector: Callable[[], None]) -> None:
        """Emit ``vector`` (the vector form of the lanes of ``s``) under ``guards`` (the
        conditions around its store, whose lanes form intervals: _peel_guards), checked at
        the first and the last lane when they vary with it: when either fails, each lane runs
        alone."""
        if not guards:
            vector()
            return
        cond = guards[0]
        for g in guards[1:]:
            cond = E.logical(Op.AND, cond, g)
        per_lane = uses_var(cond, s.var)
        if per_lane:
            last = E.binary(Op.ADD, s.min, E.const((const_int(s.extent) or 1) - 1, s.var.dtype))
            cond = E.logical(Op.AND, substitute(cond, {s.var: s.min}),
                             substitute(cond, {s.var: last}))
        self.emit(f"if ({self._expr(cond)}) {{")
        self.depth += 1
        vector()
        self.depth -= 1
        if per_lane:
            self.emit("} else {")
            self.depth += 1
            for lane in range(const_int(s.extent) or 0):
                at = E.binary(Op.ADD, s.min, E.const(lane, s.var.dtype))
                self._stmt(substitute_stmt(s.body, {s.var: at}), 0)
            self.depth -= 1
        self.emit("}")

    def _vector_store(self, s: ir.For, st: ir.Store, store_vec: bool, packed: str | None,
                      candidates: list[ir.Load]) -> None:
        """The vector form of _try_vector, its checks passed."""
        lanes = const_int(s.extent) or 1
        comps = "xyzw"
        self.emit("{")
        self.depth += 1
        vector_loads: dict[int, E.Var] = {}
        for ld in candidates:
            if id(ld) in vector_loads:
                continue
            t = f"as_vl{self.tmp}"
            self.tmp += 1
            ltype = VECTOR_TYPES[ld.buffer.dtype][lanes // 4]
            self.emit(f"const {ltype} {t} = *(const {ltype}*)(&{self._lane0(ld, s)});")
            vector_loads[id(ld)] = E.Var(t, ld.dtype)
        value = self._lane_bases(rewrite(st.value, lambda n: vector_loads.get(id(n))),
                                 s.var, lanes)
        out = f"as_vs{self.tmp}"
        self.tmp += 1
        if store_vec:
            vtype = VECTOR_TYPES[st.buffer.dtype][lanes // 4]
            self.emit(f"{vtype} {out};")
        elif packed:
            self.emit(f"__align__(16) {c_type(st.buffer.dtype)} {out}[{lanes}];")
        for lane in range(lanes):
            at = E.binary(Op.ADD, s.min, E.const(lane, s.var.dtype))
            mapping: dict[E.Var, E.Expr] = {s.var: at}
            for p in vector_loads.values():
                lane_var = E.Var(f"{p.name}.{comps[lane]}", p.dtype)
                self.raw[lane_var.uid] = lane_var.name
                mapping[p] = lane_var
            lane_value = self.store_value(st, substitute(value, mapping))
            if store_vec:
                self.emit(f"{out}.{comps[lane]} = {lane_value};")
            elif packed:
                self.emit(f"{out}[{lane}] = {lane_value};")
            else:
                idx = tuple(substitute(i, {s.var: at}) for i in st.indices)
                self.emit(f"{self._access(st.buffer, idx)} = {lane_value};")
        if store_vec:
            vtype = VECTOR_TYPES[st.buffer.dtype][lanes // 4]
            self.emit(f"*({vtype}*)(&{self._lane0(ir.Load(st.buffer, st.indices), s)}) = {out};")
        elif packed:
            dst = self._lane0(ir.Load(st.buffer, st.indices), s)
            self.emit(f"*({packed}*)(&{dst}) = *(const {packed}*){out};")
        self.depth -= 1
        self.emit("}")

    def _try_packed(self, s: ir.For) -> bool:
        """Emit a vectorized loop whose body is one store of a type that _try_vector's float2 /
        float4 do not carry (halves, bytes) to consecutive aligned elements: each lane's value
        computed alone, the index arithmetic the lanes share computed once (_lane_bases), then
        stored together as one 4-, 8- or 16-byte access (eight halves of a gathered im2col
        patch row move as one uint4). Guards around the store: _guarded."""
        lanes = const_int(s.extent)
        st, guards = _peel_guards(s)
        if lanes is None or lanes < 2 or not isinstance(st, ir.Store):
            return False
        vtype = COPY_TYPES.get(lanes * st.buffer.itemsize)
        if vtype is None or not self._aligned_lanes(st.buffer, st.indices, s, lanes):
            return False
        self._guarded(s, guards, lambda: self._packed_store(s, st, lanes, vtype))
        return True

    def _packed_store(self, s: ir.For, st: ir.Store, lanes: int, vtype: str) -> None:
        """The packed form of _try_packed, its checks passed."""
        self.emit("{")
        self.depth += 1
        value = self._lane_bases(st.value, s.var, lanes)
        out = f"as_vs{self.tmp}"
        self.tmp += 1
        self.emit(f"__align__(16) {c_type(st.buffer.dtype)} {out}[{lanes}];")
        for lane in range(lanes):
            lane_value = substitute(value, {s.var: E.const(lane, s.var.dtype)})
            self.emit(f"{out}[{lane}] = {self.store_value(st, lane_value)};")
        dst = self._lane0(ir.Load(st.buffer, st.indices), s)
        self.emit(f"*({vtype}*)(&{dst}) = *(const {vtype}*){out};")
        self.depth -= 1
        self.emit("}")

    def _lane_bases(self, e: E.Expr, v: E.Var, lanes: int) -> E.Expr:
        """``e`` with each outermost integer part that is ``base + c * v`` for the lanes ``v``
        in ``[0, lanes)`` (U.lane_split) written so, ``base`` computed once into a ``const``
        before the lanes: the lanes then share their divisions by the tensor's extents. A base
        that reads memory (a gather's index) stays in each lane, under the lane's guards."""
        names: dict[str, E.Var] = {}

        def part(n: E.Expr) -> E.Expr | None:
            if not uses_var(n, v):
                return n
            if isinstance(n, E.Var) or not dt.is_int(n.dtype):
                return None
            split = U.lane_split(n, v, lanes)
            if split is None:
                return None
            base, c = split
            if any(isinstance(x, (ir.Load, E.Call)) for x in post_order(base)):
                return None  # computed before the lanes, a read would leave its guard
            if not isinstance(base, (E.Const, E.Var)):
                text = self._expr(base)
                if text not in names:
                    names[text] = E.Var(f"as_lb{self.tmp}", base.dtype)
                    self.tmp += 1
                    self.raw[names[text].uid] = names[text].name
                    self.emit(f"const {c_type(base.dtype)} {names[text].name} = {text};")
                base = names[text]
            step = E.binary(Op.MUL, E.cast(n.dtype, v), E.const(c, n.dtype))
            return E.binary(Op.ADD, base, step) if c else base

        return rewrite_outer(e, part)

    def _try_vector_copy(self, s: ir.For) -> bool:
        """Emit a vectorized loop that copies one dtype, ``dst[..] = src[..]`` or ``dst[..] =
        cond ? src[..] : 0`` (a tile zero-filled where it overhangs its tensor), under guards
        that do not depend on the lane, as one 4-, 8- or 16-byte load and store, whatever the
        element type (eight halves move as one uint4). A condition that varies with the lane
        is checked at the first and last lane (it is a conjunction of comparisons affine in
        the lane, so the lanes where it holds are an interval): the vector copy runs when
        both hold, else each lane is copied alone. Inside an asynchronous copy group
        (``async_copies``) a copy from global into shared memory is a cp.async."""
        lanes = const_int(s.extent)
        body, guards = s.body, []
        while (isinstance(body, ir.IfThenElse) and body.else_body is None
               and not uses_var(body.cond, s.var)):
            guards.append(body.cond)
            body = body.then_body
        if lanes is None or not isinstance(body, ir.Store) or not _is_zero(s.min):
            return False
        copy = _copy_source(body.value, body.buffer.dtype)
        vtype = COPY_TYPES.get(lanes * body.buffer.itemsize)
        if copy is None or vtype is None:
            return False
        src, cond = copy
        if cond is None and not guards and body.buffer.dtype in VECTOR_TYPES:
            return False  # _try_vector's float4 copy
        if not (self._aligned_lanes(body.buffer, body.indices, s, lanes)
                and self._aligned_lanes(src.buffer, src.indices, s, lanes)):
            return False
        per_lane = cond is not None and uses_var(cond, s.var)
        if cond is not None and per_lane and not _lane_interval(cond, s.var, lanes):
            return False
        if guards:
            self.emit(f"if ({' && '.join(f'({self._expr(g)})' for g in guards)}) {{")
            self.depth += 1
        self._vector_copy(s, body, src, cond, vtype)
        if guards:
            self.depth -= 1
            self.emit("}")
        return True

    def _vector_copy(self, s: ir.For, body: ir.Store, src: ir.Load, cond: E.Expr | None,
                     vtype: str) -> None:
        """The copy of _try_vector_copy, its checks passed."""
        lanes = const_int(s.extent) or 1
        per_lane = cond is not None and uses_var(cond, s.var)
        dst = f"({vtype}*)(&{self._lane0(ir.Load(body.buffer, body.indices), s)})"
        source = f"(const {vtype}*)(&{self._lane0(src, s)})"
        nbytes = lanes * body.buffer.itemsize
        is_async = (self.async_copies and body.buffer.scope == "shared"
                    and src.buffer.scope == "global")
        self.fw.uses_async |= is_async
        whole = f"as_cp_async({dst}, {source}, {nbytes});" if is_async else f"*{dst} = *{source};"
        if cond is None:
            self.emit(whole)
        elif is_async and not per_lane:
            # cp.async zero-fills what it does not read: nothing read where the tile overhangs
            # the tensor, from an address that is in bounds all the same
            start = tuple(E.const(0, i.dtype) for i in src.indices)
            origin = f"(const {vtype}*)(&{self._access(src.buffer, start)})"
            inside = self._expr(cond)
            self.emit(f"as_cp_async({dst}, ({inside}) ? {source} : {origin}, "
                      f"({inside}) ? {nbytes} : 0);")
        else:
            if per_lane:
                last = E.const(lanes - 1, s.var.dtype)
                test = E.logical(Op.AND, substitute(cond, {s.var: s.min}),
                                 substitute(cond, {s.var: last}))
            else:
                test = cond
            self.emit(f"if ({self._expr(test)}) {{")
            self.emit(f"  {whole}")
            self.emit("} else {")
            self.depth += 1
            if per_lane:
                for lane in range(lanes):
                    at = {s.var: E.const(lane, s.var.dtype)}
                    self._stmt(ir.Store(body.buffer, tuple(substitute(i, at) for i in body.indices),
                                        substitute(body.value, at)))
            else:
                self.emit(f"*{dst} = {COPY_ZERO[vtype]};")
            self.depth -= 1
            self.emit("}")

    def _aligned_lanes(self, buf: ir.Buffer, indices: tuple[E.Expr, ...], s: ir.For,
                       lanes: int) -> bool:
        """Whether ``buf[indices]`` walks ``lanes`` consecutive elements along the loop ``s``
        from an offset that is a multiple of ``lanes`` (not in registers)."""
        if buf.scope == "local" or not _is_zero(s.min):
            return False
        split = U.lane_split(ir.flat_offset(buf, indices), s.var, lanes)
        return split is not None and split[1] == 1 and U.known_divisor(split[0]) % lanes == 0

    def _lane0(self, ld: ir.Load, s: ir.For) -> str:
        idx = tuple(substitute(i, {s.var: s.min}) for i in ld.indices)
        return self._access(ld.buffer, idx)

    def _vector_ok(self, buf: ir.Buffer, indices: tuple[E.Expr, ...], s: ir.For,
                   lanes: int) -> bool:
        return buf.dtype in VECTOR_TYPES and self._aligned_lanes(buf, indices, s, lanes)

_LOCAL_UNROLL_STEPS = 1024


def _indexes_local(s: ir.For) -> bool:
    """True when the loop variable of ``s`` indexes a register ("local") array in its body."""
    for st in walk(s.body):
        if (isinstance(st, ir.Store) and st.buffer.scope == "local"
                and any(uses_var(i, s.var) for i in st.indices)):
            return True
    return any(ld.buffer.scope == "local" and any(uses_var(i, s.var) for i in ld.indices)
               for ld in loads(s.body))


# a copy of 4, 8 or 16 bytes as one access, and its zero
COPY_TYPES = {4: "unsigned int", 8: "uint2", 16: "uint4"}
COPY_ZERO = {"unsigned int": "0u", "uint2": "make_uint2(0u, 0u)",
             "uint4": "make_uint4(0u, 0u, 0u, 0u)"}


def _copy_source(value: E.Expr, dtype: str) -> tuple[ir.Load, E.Expr | None] | None:
    """(the load, the condition or None) of a stored value that is a load of ``dtype`` or
    ``cond ? load : 0`` (a storage type such as bfloat16 selected through float32, as
    lowering zero-fills it)."""
    if isinstance(value, E.Cast) and value.type == dtype and isinstance(value.value, E.Select):
        sel = value.value
        inner = sel.true_value
        if (isinstance(inner, E.Cast) and isinstance(inner.value, ir.Load)
                and inner.value.dtype == dtype and _is_zero_const(sel.false_value)):
            return inner.value, sel.cond
        return None
    if isinstance(value, E.Select) and _is_zero_const(value.false_value):
        load, cond = value.true_value, value.cond
    else:
        load, cond = value, None
    return (load, cond) if isinstance(load, ir.Load) and load.dtype == dtype else None


def _is_zero_const(e: E.Expr) -> bool:
    return isinstance(e, E.Const) and e.value == 0 and not (
        isinstance(e.value, float) and str(e.value).startswith("-"))


def _peel_guards(s: ir.For) -> tuple[ir.Stmt, list[E.Expr]]:
    """The statement inside the conditions (without else) that wrap the body of the lane loop
    ``s`` and whose lanes form intervals (_lane_interval), and those conditions."""
    st, guards = s.body, []
    while (isinstance(st, ir.IfThenElse) and st.else_body is None
           and _lane_interval(st.cond, s.var, const_int(s.extent) or 1)):
        guards.append(st.cond)
        st = st.then_body
    return st, guards


def _lane_interval(cond: E.Expr, v: E.Var, lanes: int) -> bool:
    """Whether the lanes ``v`` in ``[0, lanes)`` where ``cond`` holds form an interval: a
    conjunction of comparisons whose sides are affine in ``v``."""
    if isinstance(cond, E.Binary) and cond.op is Op.AND:
        return _lane_interval(cond.a, v, lanes) and _lane_interval(cond.b, v, lanes)
    if not uses_var(cond, v):
        return True
    return (isinstance(cond, E.Compare) and cond.op in (Op.LT, Op.LE, Op.GT, Op.GE)
            and U.lane_split(cond.a, v, lanes) is not None
            and U.lane_split(cond.b, v, lanes) is not None)


def _unconditional_loads(e: E.Expr) -> list[ir.Load]:
    """Loads of ``e`` that are evaluated whatever the data (not inside a Select branch, which
    may guard an out-of-bounds read), so they can be hoisted into one vector load."""
    out: list[ir.Load] = []

    def visit(x: E.Expr) -> None:
        if isinstance(x, E.Select):
            visit(x.cond)
            return
        if isinstance(x, ir.Load):
            out.append(x)
        for c in children(x):
            visit(c)

    visit(e)
    return out


def _is_zero(e: E.Expr) -> bool:
    return const_int(e) == 0


def _same_extent(a: E.Expr, b: E.Expr) -> bool:
    ca, cb = const_int(a), const_int(b)
    if ca is not None and cb is not None:
        return ca == cb
    return E.structural_equal(a, b)


def _max_extent(exts: list[E.Expr]) -> E.Expr:
    if not exts:
        return E.const(1)
    consts = [c for c in map(const_int, exts) if c is not None]
    if len(consts) == len(exts):
        return E.const(max(consts))
    out = exts[0]
    for x in exts[1:]:
        if not _same_extent(out, x):
            out = E.binary(Op.MAX, out, x)
    return out


def _steps(s: ir.Stmt) -> int | None:
    """How many statement instances the nest ``s`` runs (None when a loop is symbolic)."""
    if isinstance(s, ir.For):
        ext = const_int(s.extent)
        inner = _steps(s.body)
        return None if ext is None or inner is None else ext * inner
    if isinstance(s, ir.Seq):
        total = 0
        for c in s.stmts:
            n = _steps(c)
            if n is None:
                return None
            total += n
        return total
    if isinstance(s, ir.IfThenElse):
        a = _steps(s.then_body)
        b = 0 if s.else_body is None else _steps(s.else_body)
        return None if a is None or b is None else a + b
    if isinstance(s, (ir.Allocate, ir.LetStmt)):
        return _steps(s.body)
    return 1
