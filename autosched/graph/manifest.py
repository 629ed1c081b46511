"""The manifest of a build directory (``manifest.json``), read as untrusted data.

``deploy.export`` writes it; ``read_manifest`` checks every field by type and by value before
the loader acts on any of it: names, shapes (non-negative, byte counts that fit), dtypes, that
every kernel library is a plain file name of the form the exporter writes and every symbol the
exported function that name promises, that each kernel call reads values that exist by then and
writes fresh ones no other call writes, that its arguments have the element counts and dtypes
its library was compiled for, and that reshaped views match their source's size. A bad field is
a ModelImportError naming the build dir, the field and the value.

Example::

    m = read_manifest(Path("build/model"))
    m.calls[0].symbol, m.libraries[m.calls[0].lib].sha256
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from autosched.errors import ModelImportError
from autosched.graph.graph import ValueInfo
from autosched.te import dtype as dt

NAME = "manifest.json"
VERSION = 2
MAX_BYTES = 64 << 20  # a manifest is a few KB per kernel
MAX_ITEMS = 1 << 20  # values, kernels, dims
MAX_DIM = (1 << 31) - 1  # kernels index with int32
MAX_TENSOR_BYTES = 1 << 48
SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
LIBRARY = re.compile(r"kernel[0-9]{1,6}_([A-Za-z0-9_]{0,100})\.so")
CONSTANT_KEY = re.compile(r"c[0-9]{1,7}")
SHA256 = re.compile(r"[0-9a-f]{64}")
FEATURE = re.compile(r"[a-z0-9._-]{1,40}")


def library_name(index: int, symbol: str) -> str:
    """The file name ``export`` gives the library of the ``index``-th distinct kernel."""
    return f"kernel{index}_{symbol[:100]}.so"


@dataclass(frozen=True)
class Call:
    task: str
    lib: str
    symbol: str
    args: tuple[str, ...]
    n_inputs: int


@dataclass(frozen=True)
class Library:
    sha256: str
    params: tuple[tuple[int, str], ...]  # (elements, dtype) of each parameter, in order


@dataclass(frozen=True)
class Manifest:
    raw: dict[str, Any]
    name: str
    target: str
    machine: str
    cpu_features: tuple[str, ...]  # LLVM names of vector features the kernels may use
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[str, ...]
    values: dict[str, ValueInfo]
    constants: dict[str, str]  # value name -> key in constants.npz
    calls: tuple[Call, ...]
    libraries: dict[str, Library]
    aliases: dict[str, str]  # a reshape -> the written value whose buffer it views


class _Bad(Exception):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


def _bad(where: str, problem: str) -> NoReturn:
    raise _Bad(where, problem)


def read_manifest(build_dir: Path) -> Manifest:
    """The checked manifest of ``build_dir``; ModelImportError names the first bad field."""
    path = build_dir / NAME
    try:
        raw = _load_json(path)
        return _manifest(raw)
    except _Bad as exc:
        raise ModelImportError(f"build dir {build_dir}: {NAME} {exc}; write the build dir "
                               "again with autosched compile MODEL -o DIR") from None


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ModelImportError(f"{path.parent} holds no {NAME} (not an autosched compile "
                               "output)")
    if path.stat().st_size > MAX_BYTES:
        _bad("file", f"{path.stat().st_size} bytes, more than a manifest can be ({MAX_BYTES})")
    try:
        raw = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:
        _bad("file", f"not JSON ({type(exc).__name__}: {str(exc)[:200]})")
    if not isinstance(raw, dict):
        _bad("file", f"a JSON {type(raw).__name__}, not an object")
    return raw


def _manifest(raw: dict[str, Any]) -> Manifest:
    if raw.get("version") != VERSION:
        _bad("version", f"{str(raw.get('version'))[:40]} is not {VERSION} (an older or newer "
                        "autosched wrote it)")
    inputs = tuple(ValueInfo(*_value(f"inputs[{i}]", v[0] if v else None, v[1:]))
                   for i, v in enumerate(_list("inputs", raw.get("inputs"), list)))
    values = {n: ValueInfo(*_value(f"values[{n!r}]", n, v))
              for n, v in _dict("values", raw.get("values"), list).items()}
    if len({v.name for v in inputs}) != len(inputs):
        _bad("inputs", "two inputs have one name")
    for v in inputs:
        if values.setdefault(v.name, v) != v:
            _bad(f"values[{v.name!r}]", f"{values[v.name]} differs from the input {v}")
    m = Manifest(
        raw=raw, name=_str("name", raw.get("name"), empty=True),
        target=_str("target", raw.get("target")),
        machine=_str("machine", raw.get("machine")), inputs=inputs,
        cpu_features=tuple(_str(f"cpu_features[{i}]", f, FEATURE) for i, f in
                           enumerate(_list("cpu_features", raw.get("cpu_features", []), str))),
        outputs=tuple(_str(f"outputs[{i}]", o) for i, o in
                      enumerate(_list("outputs", raw.get("outputs"), str))),
        values=values,
        constants={n: _str(f"constants[{n!r}]", k, CONSTANT_KEY)
                   for n, k in _dict("constants", raw.get("constants"), str).items()},
        calls=tuple(_call(f"kernels[{i}]", c)
                    for i, c in enumerate(_list("kernels", raw.get("kernels"), dict))),
        libraries={_str("libraries", f, LIBRARY): _library(f"libraries[{f!r}]", lib)
                   for f, lib in _dict("libraries", raw.get("libraries"), dict).items()},
        aliases={a: _str(f"aliases[{a!r}]", s)
                 for a, s in _dict("aliases", raw.get("aliases", {}), str).items()},
    )
    _check_dataflow(m)
    _check_libraries(m)
    return m


# -- fields ----------------------------------------------------------------------------------

def _str(where: str, v: Any, pattern: re.Pattern[str] | None = None, empty: bool = False
         ) -> str:
    if not isinstance(v, str) or not (v or empty) or len(v) > 4096:
        _bad(where, f"{str(v)[:60]!r} is not a non-empty string")
    if pattern is not None and not pattern.fullmatch(v):
        _bad(where, f"{v[:60]!r} does not match {pattern.pattern}")
    return v


def _int(where: str, v: Any, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:  # bool is an int subclass: refused too
        _bad(where, f"{str(v)[:40]} is not an integer in [{lo}, {hi}]")
    return v


def _list(where: str, v: Any, item: type) -> list[Any]:
    if not isinstance(v, list) or len(v) > MAX_ITEMS:
        _bad(where, f"expected a list, got {type(v).__name__}")
    for i, x in enumerate(v):
        if not isinstance(x, item):
            _bad(f"{where}[{i}]", f"expected a {item.__name__}, got {type(x).__name__}")
    return v


def _dict(where: str, v: Any, item: type) -> dict[str, Any]:
    if not isinstance(v, dict) or len(v) > MAX_ITEMS:
        _bad(where, f"expected an object, got {type(v).__name__}")
    for k, x in v.items():
        _str(f"{where} key", k)
        if not isinstance(x, item):
            _bad(f"{where}[{k!r}]", f"expected a {item.__name__}, got {type(x).__name__}")
    return v


def _shape(where: str, v: Any) -> tuple[int, ...]:
    dims = tuple(_int(f"{where}[{i}]", d, 0, MAX_DIM)
                 for i, d in enumerate(_list(where, v, int)))
    if len(dims) > 64:
        _bad(where, f"{len(dims)} dims")
    return dims


def _value(where: str, name: Any, v: list[Any]) -> tuple[str, tuple[int, ...], str]:
    """(name, shape, dtype) from ``[shape, dtype]``, checked: the byte count must fit."""
    if len(v) != 2:
        _bad(where, "expected [shape, dtype]")
    shape, dtype = _shape(f"{where} shape", v[0]), _str(f"{where} dtype", v[1])
    if dtype not in dt.ALL_TYPES:
        _bad(f"{where} dtype", f"{dtype[:40]!r} is not one of {', '.join(dt.ALL_TYPES)}")
    size = int(np.prod(shape, dtype=object)) * dt.nbytes(dtype)
    if size > MAX_TENSOR_BYTES:
        _bad(where, f"{dtype}{list(shape)} would take {size} bytes")
    return _str(where, name), shape, dtype


def _call(where: str, c: dict[str, Any]) -> Call:
    args = tuple(_str(f"{where}.args[{i}]", a)
                 for i, a in enumerate(_list(f"{where}.args", c.get("args"), str)))
    call = Call(task=_str(f"{where}.task", c.get("task"), empty=True),
                lib=_str(f"{where}.lib", c.get("lib"), LIBRARY),
                symbol=_str(f"{where}.symbol", c.get("symbol"), SYMBOL),
                args=args, n_inputs=_int(f"{where}.n_inputs", c.get("n_inputs"), 0, len(args)))
    if not isinstance(c.get("threads", False), bool):
        _bad(f"{where}.threads", f"{str(c.get('threads'))[:40]} is not true or false")
    if call.lib != library_name(int(call.lib[6:].partition("_")[0]), call.symbol):
        _bad(f"{where}.symbol", f"{call.symbol!r} is not the kernel {call.lib!r} exports")
    return call


def _library(where: str, lib: dict[str, Any]) -> Library:
    params = []
    for i, p in enumerate(_list(f"{where}.params", lib.get("params"), list)):
        _, shape, dtype = _value(f"{where}.params[{i}]", "param", p)
        params.append((int(np.prod(shape, dtype=object)), dtype))
    return Library(_str(f"{where}.sha256", lib.get("sha256"), SHA256), tuple(params))


# -- consistency -----------------------------------------------------------------------------

def _check_dataflow(m: Manifest) -> None:
    """Every value a call reads exists by then; each written value is written by one call,
    never an input, constant or view, and not also read by that call (kernels take noalias
    pointers)."""
    for n in m.constants:
        _known(m, f"constants[{n!r}]", n)
    ready = {v.name for v in m.inputs} | set(m.constants)
    for i, c in enumerate(m.calls):
        for a in c.args:
            _known(m, f"kernels[{i}].args", a)
        reads, writes = c.args[: c.n_inputs], c.args[c.n_inputs:]
        for a in reads:
            if a not in ready and m.aliases.get(a) not in ready:
                _bad(f"kernels[{i}].args", f"{a!r} is read before any kernel writes it")
        for a in writes:
            if a in ready or a in m.aliases or a in reads or writes.count(a) > 1:
                _bad(f"kernels[{i}].args", f"{a!r} is written here but is an input, constant, "
                                           "view, or another argument of this call")
            ready.add(a)
    _check_aliases(m, ready)
    for o in m.outputs:
        if o not in ready and o not in m.aliases:
            _bad("outputs", f"{o!r} is neither an input, a constant nor written by a kernel")


def _check_aliases(m: Manifest, ready: set[str]) -> None:
    written = {a for c in m.calls for a in c.args[c.n_inputs:]}
    for a, src in m.aliases.items():
        _known(m, f"aliases[{a!r}]", a)
        if src not in written or a in ready:
            _bad(f"aliases[{a!r}]", f"{src!r} is not a value a kernel writes, or {a!r} is")
        va, vs = m.values[a], m.values[src]
        if va.dtype != vs.dtype or np.prod(va.shape) != np.prod(vs.shape):
            _bad(f"aliases[{a!r}]", f"{va} cannot view {vs} (a reshape keeps dtype and size)")


def _known(m: Manifest, where: str, name: str) -> None:
    if name not in m.values:
        _bad(where, f"{name!r} is not in values")


def _check_libraries(m: Manifest) -> None:
    """Every call's library is listed, one symbol per library, and the call's arguments have
    the element counts and dtypes the library's parameters were compiled for."""
    symbols: dict[str, str] = {}
    for i, c in enumerate(m.calls):
        lib = m.libraries.get(c.lib)
        if lib is None:
            _bad(f"kernels[{i}].lib", f"{c.lib!r} is not in libraries")
        if symbols.setdefault(c.lib, c.symbol) != c.symbol:
            _bad(f"kernels[{i}].symbol", f"{c.lib!r} exports {symbols[c.lib]!r}, not "
                                         f"{c.symbol!r}")
        if len(c.args) != len(lib.params):
            _bad(f"kernels[{i}].args", f"{len(c.args)} arguments; {c.symbol} takes "
                                       f"{len(lib.params)}")
        for a, (elements, dtype) in zip(c.args, lib.params):
            v = m.values[a]
            if v.dtype != dtype or int(np.prod(v.shape, dtype=object)) != elements:
                _bad(f"kernels[{i}].args", f"{a!r} is {v.dtype}{list(v.shape)}; {c.symbol} "
                                           f"takes {elements} elements of {dtype} there")
