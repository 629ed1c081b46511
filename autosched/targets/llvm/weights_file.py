"""A CPU model library's weights file: ``create`` maps ``NAME.weights`` and checks it.

A library built with a weights file (library.py, ``LibrarySpec.weights_file``) holds the
file's expected header (model_api.py: magic, version, byte count, checksum, model name)
instead of the weights. ``emit_open_weights`` writes, as LLVM IR, the internal function

    int32_t NAME__open_weights(const char *path, const void **mapping, int64_t *length);

that ``create`` calls: ``path`` NULL means ``NAME.weights`` in the directory of the library
itself (``dladdr`` of the function, then ``strrchr`` for the last ``/``). It opens the file
(``O_NONBLOCK``: a FIFO does not block create), takes its size with ``lseek`` (not ``fstat``:
``struct stat`` is laid out differently on each architecture, an offset is not), maps it
read-only, closes the descriptor, and checks the header and then the checksum of the contents
before any kernel reads a weight in place. The mapping starts on a page, so the 128-byte
header keeps every weight 64-byte aligned. A failure unmaps what it mapped, writes one line
naming the file (model_api.WEIGHTS_FAILURES) into the buffer ``status_message`` returns for
the WEIGHTS status, and returns that status; nothing aborts.

Linux calling conventions and flags (``O_CLOEXEC``, ``O_NONBLOCK``, ``MAP_PRIVATE``) of x86-64
and aarch64; a 64-bit ``off_t``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llvmlite.ir as ir

from autosched.targets import model_api as api
from autosched.targets.llvm import types as T

O_FLAGS = 0x80000 | 0x800  # O_RDONLY | O_CLOEXEC | O_NONBLOCK
SEEK_END = 2
PROT_READ = 1
MAP_PRIVATE = 2
PTR = T.I8P


def detail_buffer(m: ir.Module, name: str) -> ir.GlobalVariable:
    """The last weights failure's message (empty until one), for status_message."""
    g = m.globals.get(f"{name}__weights_detail")
    if g is None:
        g = ir.GlobalVariable(m, ir.ArrayType(T.I8, api.WEIGHTS_DETAIL_BYTES),
                              f"{name}__weights_detail")
        g.initializer = ir.Constant(g.type.pointee, None)
        g.linkage = "internal"
    return g


def emit_open_weights(glue: Any, header: bytes) -> ir.Function:
    """``NAME__open_weights`` in ``glue``'s module (library.py's _Glue: its ``m``, ``spec``,
    ``string`` and ``extern``), checking the file against ``header``."""
    return _OpenWeights(glue, header).function


class _OpenWeights:
    def __init__(self, glue: Any, header: bytes) -> None:
        self.glue = glue
        self.name = glue.spec.name
        self.header = header
        m = glue.m
        self.expected = ir.GlobalVariable(m, ir.ArrayType(T.I8, len(header)),
                                          f"{self.name}__weights_header")
        self.expected.initializer = ir.Constant(self.expected.type.pointee, bytearray(header))
        self.expected.global_constant = True
        self.expected.linkage = "private"
        self.detail = detail_buffer(m, self.name)
        fn_type = ir.FunctionType(T.I32, [PTR, PTR.as_pointer(), T.I64.as_pointer()])
        self.function = fn = ir.Function(m, fn_type, f"{self.name}__open_weights")
        fn.linkage = "internal"
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.emit()

    # helpers

    def c(self, fn: str, ret: ir.Type, args: list[ir.Type], *values: ir.Value,
          var_arg: bool = False) -> ir.Value:
        """A call of the libc (or libdl) function ``fn``."""
        f = self.glue.m.globals.get(fn)
        if f is None:
            f = ir.Function(self.glue.m, ir.FunctionType(ret, args, var_arg=var_arg), fn)
        return self.b.call(f, list(values))

    def i32(self, v: int) -> ir.Constant:
        return ir.Constant(T.I32, v)

    def i64(self, v: int) -> ir.Constant:
        return ir.Constant(T.I64, v - (1 << 64) if v >= 1 << 63 else v)  # IR text is signed

    def fail_unless(self, ok: ir.Value, why: str, *args: ir.Value,
                    cleanup: Callable[[], None] | None = None) -> None:
        """Continue when ``ok``; else ``cleanup()``, the message ``why`` (with ``args``) and
        the WEIGHTS status."""
        fn = self.function
        bad = fn.append_basic_block(f"{why}_failed")
        good = fn.append_basic_block(f"{why}_ok")
        self.b.cbranch(ok, good, bad)
        self.b.position_at_end(bad)
        if cleanup is not None:
            cleanup()
        buffer = self.b.bitcast(self.detail, PTR)
        self.c("snprintf", T.I32, [PTR, T.I64, PTR], buffer, self.i64(api.WEIGHTS_DETAIL_BYTES),
               self.glue.string(api.WEIGHTS_FAILURES[why]), self.glue.string(self.name), *args,
               var_arg=True)
        self.b.ret(self.i32(api.Status.WEIGHTS))
        self.b.position_at_end(good)

    def error_text(self) -> ir.Value:
        """strerror(errno)."""
        errno = self.b.load(self.c("__errno_location", T.I32.as_pointer(), []))
        return self.c("strerror", PTR, [T.I32], errno)

    def at(self, base: ir.Value, offset: int) -> ir.Value:
        return self.b.gep(base, [self.i64(offset)], inbounds=True)

    def same(self, base: ir.Value, start: int, end: int) -> ir.Value:
        """Whether bytes [start, end) of ``base`` are the expected header's."""
        want = self.b.bitcast(self.expected, PTR)
        diff = self.c("memcmp", T.I32, [PTR, PTR, T.I64], self.at(base, start),
                      self.at(want, start), self.i64(end - start))
        return self.b.icmp_signed("==", diff, self.i32(0))

    # the function

    def emit(self) -> None:
        b = self.b
        path_arg, mapping_out, length_out = self.function.args
        path = self.resolve(path_arg)
        fd = self.c("open", T.I32, [PTR, T.I32], path, self.i32(O_FLAGS), var_arg=True)
        self.fail_unless(b.icmp_signed(">=", fd, self.i32(0)), "open", path,
                         self.error_text())

        def close() -> None:
            self.c("close", T.I32, [T.I32], fd)

        size = self.c("lseek", T.I64, [T.I32, T.I64, T.I32], fd, self.i64(0), self.i32(SEEK_END))
        self.fail_unless(b.icmp_signed(">=", size, self.i64(api.WEIGHTS_HEADER_BYTES)), "size",
                         path, size, cleanup=close)
        mapped = self.c("mmap", PTR, [PTR, T.I64, T.I32, T.I32, T.I32, T.I64],
                        ir.Constant(PTR, None), size, self.i32(PROT_READ), self.i32(MAP_PRIVATE),
                        fd, self.i64(0))
        failed = b.icmp_signed("==", b.ptrtoint(mapped, T.I64), self.i64(-1))
        self.fail_unless(b.not_(failed), "map", path, self.error_text(), cleanup=close)
        close()

        def unmap() -> None:
            self.c("munmap", T.I32, [PTR, T.I64], mapped, size)

        for why, start, end in api.WEIGHTS_CHECKS:
            args = []
            if why == "version":
                args = [b.load(b.bitcast(self.at(mapped, start), T.I32.as_pointer()))]
            self.fail_unless(self.same(mapped, start, end), why, path, *args, cleanup=unmap)
        data_bytes = int.from_bytes(self.header[16:24], "little")
        total = self.i64(api.WEIGHTS_HEADER_BYTES + data_bytes)
        self.fail_unless(b.icmp_signed("==", size, total), "truncated", path, size, total,
                         cleanup=unmap)
        checksum = int.from_bytes(self.header[24:32], "little")
        got = self.checksum(self.at(mapped, api.WEIGHTS_HEADER_BYTES), data_bytes // 8)
        self.fail_unless(b.icmp_unsigned("==", got, self.i64(checksum)), "checksum", path,
                         cleanup=unmap)
        b.store(mapped, mapping_out)
        b.store(size, length_out)
        b.ret(self.i32(api.STATUS_OK))

    def resolve(self, path: ir.Value) -> ir.Value:
        """``path``, or when it is NULL NAME.weights next to this library."""
        b, fn = self.b, self.function
        given = b.block
        find = fn.append_basic_block("find_path")
        done = fn.append_basic_block("path")
        b.cbranch(b.icmp_unsigned("==", path, ir.Constant(PTR, None)), find, done)
        b.position_at_end(find)
        info = b.alloca(ir.ArrayType(PTR, 4))  # Dl_info: dli_fname, dli_fbase, dli_sname, ..
        found = self.c("dladdr", T.I32, [PTR, PTR], b.bitcast(self.function, PTR),
                       b.bitcast(info, PTR))
        library = b.load(b.gep(info, [self.i32(0), self.i32(0)], inbounds=True))
        known = b.and_(b.icmp_signed("!=", found, self.i32(0)),
                       b.icmp_unsigned("!=", library, ir.Constant(PTR, None)))
        self.fail_unless(known, "path", self.i32(api.WEIGHTS_PATH_MAX))
        slash = self.c("strrchr", PTR, [PTR, T.I32], library, self.i32(ord("/")))
        after = b.sub(b.ptrtoint(slash, T.I64), b.ptrtoint(library, T.I64))
        has_dir = b.icmp_unsigned("!=", slash, ir.Constant(PTR, None))
        dir_len = b.trunc(b.select(has_dir, b.add(after, self.i64(1)), self.i64(0)), T.I32)
        buffer = b.bitcast(b.alloca(ir.ArrayType(T.I8, api.WEIGHTS_PATH_MAX)), PTR)
        n = self.c("snprintf", T.I32, [PTR, T.I64, PTR], buffer, self.i64(api.WEIGHTS_PATH_MAX),
                   self.glue.string("%.*s%s"), dir_len, library,
                   self.glue.string(f"{self.name}.weights"), var_arg=True)
        fits = b.and_(b.icmp_signed(">=", n, self.i32(0)),
                      b.icmp_signed("<", n, self.i32(api.WEIGHTS_PATH_MAX)))
        self.fail_unless(fits, "path", self.i32(api.WEIGHTS_PATH_MAX))
        built = b.block
        b.branch(done)
        b.position_at_end(done)
        chosen = b.phi(PTR)
        chosen.add_incoming(path, given)
        chosen.add_incoming(buffer, built)
        return chosen

    def checksum(self, data: ir.Value, words: int) -> ir.Value:
        """model_api.weights_checksum of the ``words`` u64 words at ``data``."""
        b, fn = self.b, self.function
        if words == 0:
            return self.i64(0)
        p = b.bitcast(data, T.I64.as_pointer())
        before = b.block
        loop = fn.append_basic_block("checksum")
        done = fn.append_basic_block("checksum_done")
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(T.I64)
        total = b.phi(T.I64)
        word = b.load(b.gep(p, [i], inbounds=True), align=8)
        nxt = b.add(i, self.i64(1))
        x = b.xor(word, b.mul(nxt, self.i64(api.HASH_STEP)))
        x = b.xor(x, b.lshr(x, self.i64(31)))
        x = b.mul(x, self.i64(api.HASH_MIX))
        x = b.xor(x, b.lshr(x, self.i64(29)))
        added = b.add(total, x)
        i.add_incoming(self.i64(0), before)
        i.add_incoming(nxt, loop)
        total.add_incoming(self.i64(0), before)
        total.add_incoming(added, loop)
        b.cbranch(b.icmp_unsigned("<", nxt, self.i64(words)), loop, done)
        b.position_at_end(done)
        return added
