"""A whole model as one shared library with a C API: kernels, weights, memory plan, call order.

``build_library(spec, path)`` links every kernel of ``spec`` (each a compiled module of this
backend) and the glue generated here as LLVM IR into one object, so that nothing but the API
is visible (the kernels become internal functions; two kernels named alike no longer clash):

* the weights, embedded as one read-only constant, or (``weights_file``) the header of
  ``NAME.weights``, which create maps and checks (weights_file.py);
* ``NAME_create``: checks that the CPU has the features the code was compiled for
  (cpu_features.py), maps the weights file (when there is one) and allocates one workspace,
  the size of the static memory plan;
* ``NAME_run``: checks its pointers, then calls the kernels in order, each on its inputs,
  outputs, weights or workspace offsets; a kernel's failure stops the run and is returned;
* introspection tables and ``NAME_status_message``.

targets/model_api.py declares the API and writes the matching header; the calls are described there. Runtime dependencies: libc,
libm (when a kernel calls it) and, when a kernel has parallel loops, nothing more: the thread pool
(threadpool.py) is linked in with internal linkage, one per library (libgomp on triples the
pool does not support, or with AUTOSCHED_PARALLEL=gomp).
"""

from __future__ import annotations

import binascii
import ctypes
import itertools
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np

from autosched.errors import CompileError, RuntimeError_
from autosched.targets.llvm import types as T
from autosched.targets.llvm.abi import ALLOC_ALIGN, PARAM_ALIGN
from autosched.targets.llvm.compile import (
    JitEngine,
    compile_ir,
    pool_ir,
    target_machine,
    thread_libraries,
)
from autosched.targets.llvm.cpu_features import emit_cpu_check
from autosched.targets.llvm.runtime import cross_compiler
from autosched.targets.llvm.weights_file import detail_buffer, emit_open_weights
from autosched.targets.model_api import (
    API,
    STATUS_MESSAGES,
    STATUS_OK,
    WEIGHTS_HEADER_BYTES,
    Status,
    padded_weights,
    weights_header,
)
from autosched.targets.target import Target


@dataclass(frozen=True)
class Tensor:
    """An input or output of the model."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Place:
    """Where a kernel argument lives: ``input`` / ``output`` (index into the caller's pointer
    arrays), ``weights`` / ``workspace`` (byte offset into the embedded weights or the
    context's workspace), ``address`` (in process: an array of the caller's)."""

    region: str
    at: int


@dataclass(frozen=True)
class Call:
    """One kernel call: the compiled module and where each of its parameters lives."""

    module: Any
    args: tuple[Place, ...]


@dataclass(frozen=True)
class Copy:
    """An output that no kernel writes in place (a view of another value, a weight, an input):
    ``nbytes`` copied from ``src`` into output ``output`` after the kernels."""

    src: Place
    output: int
    nbytes: int


@dataclass(frozen=True)
class LibrarySpec:
    """Everything the library holds. ``name`` prefixes every exported symbol; with
    ``weights_file``, the weights are not embedded but read from NAME.weights at create
    (model_api.weights_file writes it)."""

    name: str
    target: Target
    version: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    weights: bytes
    workspace: int
    calls: tuple[Call, ...]
    copies: tuple[Copy, ...]
    weights_file: bool = False

    @property
    def uses_threads(self) -> bool:
        return any(c.module.uses_threads for c in self.calls)

    @property
    def thread_runtimes(self) -> list[str]:
        """What runs the kernels' parallel loops ("pool", "gomp"; see CPUModule)."""
        return sorted({r for c in self.calls if (r := getattr(c.module, "thread_runtime", None))})


def build_library(spec: LibrarySpec, path: str | os.PathLike) -> Path:
    """Compile and link ``spec`` into the shared library ``path``."""
    with tempfile.TemporaryDirectory() as tmp:
        module = _link(spec)
        obj = Path(tmp) / "model.o"
        obj.write_bytes(target_machine(spec.target).emit_object(module))
        exports = Path(tmp) / "exports.map"
        names = "; ".join(f"{spec.name}_{a}" for a in API)
        exports.write_text(f"{{ global: {names}; local: *; }};\n")
        _link_shared(spec, obj, exports, Path(path))
    return Path(path)


_models = itertools.count()  # JIT symbols are process-wide: each model's get their own prefix


class InProcess:
    """The glue of ``spec`` JIT-compiled for this process, calling the kernels' JIT code where
    it is (``jit_library``): the in-process executor's one call per run."""

    def __init__(self, spec: LibrarySpec) -> None:
        # the glue calls each kernel by a symbol bound to the JIT code it already has
        entries = kernel_symbols(spec, f"{spec.name}__jit{next(_models)}_")
        for call in spec.calls:
            symbol = entries[id(call.module)]
            llvm.add_symbol(symbol, call.module.address)
            if call.module.threads_address is not None:
                llvm.add_symbol(symbol + "__num_threads", call.module.threads_address)
        layout = str(target_machine(spec.target).target_data)
        glue = str(_Glue(spec, entries, layout).module())
        self._engine = JitEngine(compile_ir(glue, spec.target), spec.target)
        self._keep = [c.module for c in spec.calls]  # the kernels' code must outlive the glue
        address = self._engine.function_address
        ptr = ctypes.c_void_p
        self.create = ctypes.CFUNCTYPE(ctypes.c_int32, ptr, ptr)(address(f"{spec.name}_create"))
        self.run = ctypes.CFUNCTYPE(ctypes.c_int32, ptr, ptr, ptr)(address(f"{spec.name}_run"))
        self._destroy = ctypes.CFUNCTYPE(None, ptr)(address(f"{spec.name}_destroy"))
        self.message = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_int32)(
            address(f"{spec.name}_status_message"))

    def context(self, threads: int) -> int:
        """A new context running parallel loops on ``threads`` threads (0: OMP_NUM_THREADS or
        the core count); RuntimeError_ when it cannot be created."""
        ctx = ctypes.c_void_p()
        options = ctypes.c_int32(threads)
        status = self.create(ctypes.addressof(options), ctypes.addressof(ctx))
        if status:
            raise RuntimeError_(self.message(status).decode())
        return int(ctx.value or 0)

    def destroy(self, context: int) -> None:
        """Free a context (a method: whoever holds it keeps the JIT code alive)."""
        self._destroy(context)

    @staticmethod
    def set_threads(context: int, threads: int) -> None:
        """Change a context's thread count (its first field, see CONTEXT)."""
        ctypes.c_int32.from_address(context).value = threads


def jit_library(spec: LibrarySpec) -> InProcess | None:
    """The in-process entry point of ``spec``, whose kernels must all be JIT-compiled for this
    machine; None when one is not (a cross target)."""
    if not all(getattr(c.module, "address", None) for c in spec.calls):
        return None
    return InProcess(spec)


def _link_shared(spec: LibrarySpec, obj: Path, exports: Path, out: Path) -> None:
    compiler = cross_compiler(spec.target.triple, spec.target.is_host)
    libs = [flag for r in spec.thread_runtimes for flag in thread_libraries(r)]
    libs += ["-ldl"] if spec.weights_file else []  # dladdr, in libc only from glibc 2.34
    cmd = [compiler, "-shared", "-o", os.fspath(out), os.fspath(obj),
           f"-Wl,--version-script={exports}", "-Wl,--as-needed", *libs, "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CompileError(f"linking failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def _link(spec: LibrarySpec) -> llvm.ModuleRef:
    """The glue module with every kernel linked in; everything but the API internal."""
    tm = target_machine(spec.target)
    entries = kernel_symbols(spec, f"{spec.name}__")
    modules = {id(c.module): c.module for c in spec.calls}
    kernels = [_renamed(m, entries[i][: -len(m.entry_name)]) for i, m in modules.items()]
    glue = _Glue(spec, entries, str(tm.target_data)).module()
    try:
        module = llvm.parse_assembly(str(glue))
        if spec.weights and not spec.weights_file:
            module.link_in(_weights(f"{spec.name}__weights", spec.weights, spec.target.triple))
        for k in kernels:
            module.link_in(k)
        if "pool" in spec.thread_runtimes:
            module.link_in(pool_ir(spec.target))
        module.verify()
    except RuntimeError as exc:
        raise CompileError(f"the model library's LLVM IR is invalid: {exc}") from exc
    api = {f"{spec.name}_{a}" for a in API}
    for g in [*module.functions, *module.global_variables]:
        if not g.is_declaration and g.name not in api:
            g.linkage = "internal"
    return module


def kernel_symbols(spec: LibrarySpec, prefix: str) -> dict[int, str]:
    """A distinct symbol for each distinct kernel module (by id): ``PREFIXk<i>_<entry>``."""
    entries: dict[int, str] = {}
    for call in spec.calls:
        if id(call.module) not in entries:
            entries[id(call.module)] = f"{prefix}k{len(entries)}_{call.module.entry_name}"
    return entries


def _renamed(mod: Any, prefix: str) -> llvm.ModuleRef:
    """``mod``'s optimised IR with every symbol it defines prefixed (kernels named alike, or
    named after a kernel's helper, do not clash)."""
    m = llvm.parse_assembly(mod.get_llvm_ir())
    for g in [*m.functions, *m.global_variables]:
        if not g.is_declaration:
            g.name = prefix + g.name
    return m


def _weights(symbol: str, data: bytes, triple: str) -> llvm.ModuleRef:
    """A module defining ``symbol``: the constant bytes ``data``, 64-byte aligned (its IR
    text escapes each byte as ``\\XX``, vectorised: a model's weights are megabytes)."""
    digits = np.frombuffer(binascii.hexlify(data).upper(), np.uint8).reshape(-1, 2)
    escaped = np.concatenate([np.full((len(data), 1), ord("\\"), np.uint8), digits], axis=1)
    text = (f'target triple = "{triple}"\n@{symbol} = constant [{len(data)} x i8] '
            f'c"{escaped.tobytes().decode()}", align {ALLOC_ALIGN}\n')
    return llvm.parse_assembly(text)


# -- the glue ---------------------------------------------------------------------------------

I32P = T.I32.as_pointer()
I64P = T.I64.as_pointer()
PTR = T.I8P
INFO = ir.LiteralStructType([PTR, PTR, T.I32, I64P])  # name, dtype, ndim, shape
# threads, workspace, the weights file's mapping (its start and length; unused without one)
CONTEXT = ir.LiteralStructType([T.I32, PTR, PTR, T.I64])
CONTEXT_BYTES = 32
OPTIONS = ir.LiteralStructType([T.I32, T.I32, PTR, PTR])  # model_api.py's NAME_options


class _Glue:
    """The model-level functions and tables, as llvmlite IR."""

    def __init__(self, spec: LibrarySpec, entries: dict[int, str], data_layout: str) -> None:
        self.spec = spec
        self.entries = entries
        self.m = ir.Module(name=spec.name)
        self.m.triple = spec.target.triple
        self.m.data_layout = data_layout
        self.strings: dict[str, ir.GlobalVariable] = {}

    def module(self) -> ir.Module:
        s = self.spec
        self.counts()
        for which, tensors in (("input", s.inputs), ("output", s.outputs)):
            self.info(which, tensors)
        self.constant_string("target", str(s.target))
        self.constant_string("version", s.version)
        self.status_message()
        self.create()
        self.destroy()
        self.run()
        return self.m

    # helpers

    def api(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return ir.Function(self.m, ir.FunctionType(ret, args), f"{self.spec.name}_{name}")

    def extern(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = self.m.globals.get(name)
        return fn if fn is not None else ir.Function(self.m, ir.FunctionType(ret, args), name)

    def weights(self) -> ir.GlobalVariable:
        """The weights, linked in later (_weights)."""
        s = self.spec
        return ir.GlobalVariable(self.m, ir.ArrayType(T.I8, len(s.weights)), f"{s.name}__weights")

    def kernel(self, module: Any) -> tuple[ir.Value, ir.Value | None]:
        """The function to call for ``module`` and its thread-count i32 (None without parallel
        loops), by the names ``entries`` gives them (see ``kernel_symbols``)."""
        fn_type = ir.FunctionType(T.I32, [PTR] * len(module.signature.params))
        entry = self.entries[id(module)]
        if not module.uses_threads:
            return self.extern(entry, T.I32, fn_type.args), None
        name = entry + "__num_threads"
        g = self.m.globals.get(name) or ir.GlobalVariable(self.m, T.I32, name)
        return self.extern(entry, T.I32, fn_type.args), g

    def string(self, text: str) -> ir.Constant:
        if text not in self.strings:
            data = bytearray(text.encode()) + b"\0"
            g = ir.GlobalVariable(self.m, ir.ArrayType(T.I8, len(data)),
                                  f"{self.spec.name}__s{len(self.strings)}")
            g.initializer = ir.Constant(g.type.pointee, data)
            g.global_constant = True
            g.linkage = "private"
            self.strings[text] = g
        return self.strings[text].bitcast(PTR)

    def table(self, name: str, ty: ir.Type, values: list[ir.Constant]) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.m, ir.ArrayType(ty, len(values)), f"{self.spec.name}__{name}")
        g.initializer = ir.Constant(g.type.pointee, values)
        g.global_constant = True
        g.linkage = "private"
        return g

    # introspection

    def counts(self) -> None:
        for which, n in (("num_inputs", len(self.spec.inputs)),
                         ("num_outputs", len(self.spec.outputs))):
            b = ir.IRBuilder(self.api(which, T.I32, []).append_basic_block())
            b.ret(ir.Constant(T.I32, n))

    def info(self, which: str, tensors: tuple[Tensor, ...]) -> None:
        rows = []
        for j, t in enumerate(tensors):
            dims = self.table(f"{which}{j}_shape", T.I64,
                              [ir.Constant(T.I64, d) for d in t.shape] or [ir.Constant(T.I64, 1)])
            rows.append(ir.Constant(INFO, [self.string(t.name), self.string(t.dtype),
                                           ir.Constant(T.I32, len(t.shape)), dims.bitcast(I64P)]))
        table = self.table(f"{which}s", INFO, rows)
        fn = self.api(which, INFO.as_pointer(), [T.I32])
        b = ir.IRBuilder(fn.append_basic_block())
        (i,) = fn.args
        inside = b.icmp_unsigned("<", i, ir.Constant(T.I32, len(tensors)))
        index = b.select(inside, i, ir.Constant(T.I32, 0))
        row = b.gep(table, [ir.Constant(T.I32, 0), index], inbounds=True)
        b.ret(b.select(inside, row, ir.Constant(INFO.as_pointer(), None)))

    def constant_string(self, name: str, text: str) -> None:
        b = ir.IRBuilder(self.api(name, PTR, []).append_basic_block())
        b.ret(self.string(text))

    def status_message(self) -> None:
        fn = self.api("status_message", PTR, [T.I32])
        b = ir.IRBuilder(fn.append_basic_block())
        (status,) = fn.args
        msg = self.string("unknown status")
        for bit, text in reversed(list(STATUS_MESSAGES.items())):  # the lowest bit wins
            hit = b.icmp_unsigned("!=", b.and_(status, ir.Constant(T.I32, bit)),
                                  ir.Constant(T.I32, 0))
            if bit == Status.WEIGHTS and self.spec.weights_file:  # which file, what is wrong
                detail = b.bitcast(detail_buffer(self.m, self.spec.name), PTR)
                known = b.icmp_unsigned("!=", b.load(detail), ir.Constant(T.I8, 0))
                text_here = b.select(known, detail, self.string(text))
                msg = b.select(hit, text_here, msg)
                continue
            msg = b.select(hit, self.string(text), msg)
        ok = b.icmp_unsigned("==", status, ir.Constant(T.I32, STATUS_OK))
        b.ret(b.select(ok, self.string(STATUS_MESSAGES[STATUS_OK]), msg))

    # create / destroy / run

    def create(self) -> None:
        fn = self.api("create", T.I32, [I32P, PTR.as_pointer()])
        opts, out = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        fail = fn.append_basic_block("fail")
        b_fail = ir.IRBuilder(fail)
        code = b_fail.phi(T.I32)
        b_fail.ret(code)

        def check(ok: ir.Value, status: Status, label: str) -> None:
            block = fn.append_basic_block(label)
            code.add_incoming(ir.Constant(T.I32, status), b.block)
            b.cbranch(ok, block, fail)
            b.position_at_end(block)

        check(b.icmp_unsigned("!=", out, ir.Constant(out.type, None)), Status.ARGUMENT, "args")
        cpu_ok = emit_cpu_check(b, self.spec.target)
        if cpu_ok is not None:
            check(cpu_ok, Status.CPU, "cpu")
        malloc = self.extern("malloc", PTR, [T.I64])
        ctx = b.call(malloc, [ir.Constant(T.I64, CONTEXT_BYTES)])
        check(b.icmp_unsigned("!=", ctx, ir.Constant(PTR, None)), Status.ALLOC, "ctx")
        size = -(-max(self.spec.workspace, 1) // ALLOC_ALIGN) * ALLOC_ALIGN
        aligned_alloc = self.extern("aligned_alloc", PTR, [T.I64, T.I64])
        ws = b.call(aligned_alloc, [ir.Constant(T.I64, ALLOC_ALIGN), ir.Constant(T.I64, size)])
        has_ws = fn.append_basic_block("workspace")
        no_ws = fn.append_basic_block("no_workspace")
        b.cbranch(b.icmp_unsigned("!=", ws, ir.Constant(PTR, None)), has_ws, no_ws)
        b.position_at_end(no_ws)
        b.call(self.extern("free", T.VOID, [PTR]), [ctx])
        code.add_incoming(ir.Constant(T.I32, Status.ALLOC), no_ws)
        b.branch(fail)
        b.position_at_end(has_ws)
        c = b.bitcast(ctx, CONTEXT.as_pointer())
        has_opts = b.icmp_unsigned("!=", opts, ir.Constant(I32P, None))
        safe = b.select(has_opts, opts, b.bitcast(self.default_options(), I32P))
        if self.spec.weights_file:  # mapped before anything reads the context
            o = b.bitcast(safe, OPTIONS.as_pointer())
            path = b.load(b.gep(o, [ir.Constant(T.I32, 0), ir.Constant(T.I32, 3)]))
            header = weights_header(self.spec.name, padded_weights(self.spec.weights))
            status = b.call(emit_open_weights(self, header),
                            [path, self.field(b, c, 2), self.field(b, c, 3)])
            mapped = fn.append_basic_block("mapped")
            unmapped = fn.append_basic_block("not_mapped")
            b.cbranch(b.icmp_unsigned("==", status, ir.Constant(T.I32, STATUS_OK)), mapped,
                      unmapped)
            b.position_at_end(unmapped)
            b.call(self.extern("free", T.VOID, [PTR]), [ws])
            b.call(self.extern("free", T.VOID, [PTR]), [ctx])
            code.add_incoming(status, unmapped)
            b.branch(fail)
            b.position_at_end(mapped)
        b.store(b.load(safe), self.field(b, c, 0))
        b.store(ws, self.field(b, c, 1))
        b.store(ctx, out)
        b.ret(ir.Constant(T.I32, STATUS_OK))

    def default_options(self) -> ir.GlobalVariable:
        """The options create reads when given none: all zero."""
        g = ir.GlobalVariable(self.m, OPTIONS, f"{self.spec.name}__default_options")
        g.initializer = ir.Constant(OPTIONS, None)
        g.global_constant = True
        g.linkage = "private"
        return g

    @staticmethod
    def field(b: ir.IRBuilder, ctx: ir.Value, k: int) -> ir.Value:
        return b.gep(ctx, [ir.Constant(T.I32, 0), ir.Constant(T.I32, k)], inbounds=True)

    def destroy(self) -> None:
        fn = self.api("destroy", T.VOID, [PTR])
        (ctx,) = fn.args
        b = ir.IRBuilder(fn.append_basic_block())
        free = self.extern("free", T.VOID, [PTR])
        with b.if_then(b.icmp_unsigned("!=", ctx, ir.Constant(PTR, None))):
            c = b.bitcast(ctx, CONTEXT.as_pointer())
            if self.spec.weights_file:
                munmap = self.extern("munmap", T.I32, [PTR, T.I64])
                b.call(munmap, [b.load(self.field(b, c, 2)), b.load(self.field(b, c, 3))])
            b.call(free, [b.load(self.field(b, c, 1))])
            b.call(free, [ctx])
        b.ret_void()

    def run(self) -> None:
        s = self.spec
        fn = self.api("run", T.I32, [PTR, PTR.as_pointer(), PTR.as_pointer()])
        ctx, inputs, outputs = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        bad = fn.append_basic_block("bad_argument")
        ir.IRBuilder(bad).ret(ir.Constant(T.I32, Status.ARGUMENT))

        def require(ok: ir.Value) -> None:
            block = fn.append_basic_block()
            b.cbranch(ok, block, bad)
            b.position_at_end(block)

        for p in (ctx, inputs, outputs):
            require(b.icmp_unsigned("!=", p, ir.Constant(p.type, None)))
        c = b.bitcast(ctx, CONTEXT.as_pointer())
        regions = {"workspace": b.load(self.field(b, c, 1))}
        if s.weights_file:  # in place, in the context's mapping of the file
            regions["weights"] = b.gep(b.load(self.field(b, c, 2)),
                                       [ir.Constant(T.I64, WEIGHTS_HEADER_BYTES)], inbounds=True)
        elif s.weights:
            regions["weights"] = b.bitcast(self.weights(), PTR)
        for region, array, n in (("input", inputs, len(s.inputs)),
                                 ("output", outputs, len(s.outputs))):
            for j in range(n):
                p = b.load(b.gep(array, [ir.Constant(T.I32, j)], inbounds=True))
                misaligned = b.and_(b.ptrtoint(p, T.I64), ir.Constant(T.I64, PARAM_ALIGN - 1))
                require(b.and_(b.icmp_unsigned("!=", p, ir.Constant(PTR, None)),
                               b.icmp_unsigned("==", misaligned, ir.Constant(T.I64, 0))))
                regions[f"{region}{j}"] = p

        def where(place: Place) -> ir.Value:
            if place.region in ("input", "output"):
                return regions[f"{place.region}{place.at}"]
            if place.region == "address":
                return ir.Constant(T.I64, place.at).inttoptr(PTR)
            return b.gep(regions[place.region], [ir.Constant(T.I64, place.at)], inbounds=True)

        threads = b.load(self.field(b, c, 0))
        failed = fn.append_basic_block("failed")
        b_failed = ir.IRBuilder(failed)
        code = b_failed.phi(T.I32)
        b_failed.ret(code)
        for call in s.calls:
            kernel, team = self.kernel(call.module)
            if team is not None:
                b.store(threads, team)
            status = b.call(kernel, [where(p) for p in call.args])
            code.add_incoming(status, b.block)
            ok = fn.append_basic_block()
            b.cbranch(b.icmp_unsigned("==", status, ir.Constant(T.I32, 0)), ok, failed)
            b.position_at_end(ok)
        memcpy = self.extern("memcpy", PTR, [PTR, PTR, T.I64])
        for cp in s.copies:
            b.call(memcpy, [regions[f"output{cp.output}"], where(cp.src),
                            ir.Constant(T.I64, cp.nbytes)])
        b.ret(ir.Constant(T.I32, STATUS_OK))
