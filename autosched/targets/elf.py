"""What a shared library is built for and which functions it defines, read from its ELF
headers without loading it (loading a library runs its code).

The deployed-model loader checks every kernel library with this before ``dlopen``: the machine
must be this one's, and each kernel symbol must be a function the library itself defines (a
symbol looked up through the library would otherwise also find its dependencies' functions,
libc's ``system`` among them).

Example::

    lib = read_shared_library(Path("build/kernel0_conv.so").read_bytes())
    lib.machine            # "x86_64"
    "conv" in lib.functions
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass

MACHINES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "x86_64",
            183: "aarch64", 243: "riscv"}
_HOST_NAMES = {"amd64": "x86_64", "arm64": "aarch64", "i686": "i386", "armv7l": "arm",
               "ppc64le": "ppc64", "riscv64": "riscv"}
_ET_DYN, _SHT_DYNSYM, _STT_FUNC, _GLOBAL_OR_WEAK = 3, 11, 2, (1, 2)


class ElfError(ValueError):
    """The bytes are not a well-formed ELF shared library."""


@dataclass(frozen=True)
class SharedLibrary:
    machine: str  # "x86_64", "aarch64", ... (MACHINES), or "machine 1234" when unknown
    functions: frozenset[str]  # functions it defines and exports (not those it imports)


def host_machine() -> str:
    """This machine's architecture in MACHINES' names."""
    name = platform.machine().lower()
    return _HOST_NAMES.get(name, name)


@dataclass(frozen=True)
class _Layout:
    """Field formats of one ELF class and byte order."""

    end: str  # "<" or ">"
    wide: bool  # ELF64

    def read(self, fmt: str, data: bytes, offset: int) -> tuple[int, ...]:
        try:
            return struct.unpack_from(self.end + fmt, data, offset)
        except (struct.error, OverflowError):  # past the end, or an offset beyond any file
            raise ElfError(f"truncated at byte {offset}") from None


def read_shared_library(data: bytes) -> SharedLibrary:
    """The machine and exported functions of the ELF shared library ``data``; ElfError when it
    is not one."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ElfError("not an ELF file")
    lay = _Layout("<" if data[5] == 1 else ">", data[4] == 2)
    e_type, e_machine = lay.read("HH", data, 16)
    if e_type != _ET_DYN:
        raise ElfError(f"an ELF file of type {e_type}, not a shared library")
    machine = MACHINES.get(e_machine, f"machine {e_machine}")
    return SharedLibrary(machine, frozenset(_exported_functions(lay, data)))


def _sections(lay: _Layout, data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(type, link, offset, size, entry size) of every section header."""
    shoff, shentsize, shnum = (lay.read("Q", data, 40)[0], *lay.read("HH", data, 58)) \
        if lay.wide else (lay.read("I", data, 32)[0], *lay.read("HH", data, 46))
    out = []
    for i in range(shnum):
        at = shoff + i * shentsize
        if lay.wide:
            _, typ, _, _, off, size, link, _, _, ent = lay.read("IIQQQQIIQQ", data, at)
        else:
            _, typ, _, _, off, size, link, _, _, ent = lay.read("IIIIIIIIII", data, at)
        out.append((typ, link, off, size, ent))
    return out


def _exported_functions(lay: _Layout, data: bytes) -> list[str]:
    sections = _sections(lay, data)
    names = []
    for typ, link, off, size, ent in sections:
        if typ != _SHT_DYNSYM:
            continue
        if not ent or link >= len(sections) or off + size > len(data):
            raise ElfError("a malformed dynamic symbol table")
        str_off, str_size = sections[link][2], sections[link][3]
        for at in range(off, off + size - ent + 1, ent):
            if lay.wide:
                name, info, _, shndx = lay.read("IBBH", data, at)
            else:
                name, _, _, info, _, shndx = lay.read("IIIBBH", data, at)
            if shndx != 0 and info & 0xF == _STT_FUNC and info >> 4 in _GLOBAL_OR_WEAK:
                names.append(_string(data, str_off, str_size, name))
    return names


def _string(data: bytes, table: int, size: int, at: int) -> str:
    if at >= size:
        raise ElfError("a symbol name outside its string table")
    end = data.find(b"\0", table + at, table + size)
    if end < 0:
        raise ElfError("an unterminated symbol name")
    return data[table + at: end].decode("ascii", errors="replace")
