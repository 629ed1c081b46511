"""The reference evaluator: run any lowered PrimFunc on numpy arrays with exact semantics.

The function is rendered to Python once (``pyrender``; cached per function) and run on flat
memoryviews over the arrays, so outputs are written in place. CPU loop kinds all run serially;
GPU kernels run with CUDA semantics (every thread runs the block body, thread loops are guards,
barriers step the threads of a block in lockstep; see ``pyrender``). Out-of-bounds accesses,
integer division by zero and divergent barriers raise ``RuntimeError_``; fresh allocations read
as NaN (integers as 0xA5A5...) until written, so reading unwritten memory shows in the output.

Data races: inside a kernel, every access to a shared or global buffer that the kernel writes is
recorded per element, and two accesses by different threads, at least one a value-changing
write, raise unless a barrier of their block separates them (threads of different blocks never
synchronise). A missing barrier is then an error naming the buffer, element and both threads,
even where the lockstep order happens to give the right answer.

Example::

    from autosched.tir import ir
    from autosched.targets.ref.evaluate import evaluate
    from autosched.te.expr import Var, const
    A = ir.Buffer("A", (const(4),), "float32"); B = ir.Buffer("B", (const(4),), "float32")
    i = Var("i")
    body = ir.For(i, const(0), const(4), "serial",
                  ir.Store(B, (i,), ir.Load(A, (i,)) * 2.0))
    evaluate(ir.PrimFunc("double", (A, B), body), a, b)   # b == 2 * a
"""

from __future__ import annotations

import linecache
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autosched.errors import CompileError, RuntimeError_
from autosched.targets.ref.pyrender import render
from autosched.targets.ref.pyruntime import as_view, namespace
from autosched.targets.status import KernelFailure
from autosched.te import expr as E
from autosched.tir import ir
from autosched.tir.params import bind_arrays

_CACHE_SIZE = 256
_cache: OrderedDict[tuple[int, bool, bool], Program] = OrderedDict()


@dataclass(frozen=True, eq=False)
class Program:
    """A PrimFunc compiled to Python: call it with numpy arrays in ``func.params`` order."""

    func: ir.PrimFunc
    source: str
    fn: Callable[..., None]
    shape_vars: tuple[E.Var, ...]
    stored: frozenset[int]

    def __call__(self, *arrays: np.ndarray) -> None:
        env = bind_arrays(self.func.name, self.func.params, arrays, self.stored,
                          contiguous=False)
        views: list[Any] = []
        copies: list[tuple[np.ndarray, np.ndarray]] = []
        for arr in arrays:
            if not arr.flags.c_contiguous:
                work = np.asarray(arr, order="C")
                copies.append((arr, work))
                arr = work
            views.append(as_view(arr))
        views.extend(env[v.uid] for v in self.shape_vars)
        try:
            self.fn(*views)
        except ZeroDivisionError:
            raise RuntimeError_(f"{self.func.name}: integer division by zero") from None
        except KernelFailure as exc:
            raise exc.within(self.func.name) from None
        except RuntimeError_ as exc:
            raise RuntimeError_(f"{self.func.name}: {exc}") from None
        finally:
            for arr, work in copies:
                arr[...] = work


def compile_func(
    func: ir.PrimFunc, check_bounds: bool = True, check_races: bool = True
) -> Program:
    """``func`` rendered to Python and compiled (cached per function object and flags).

    >>> prog = compile_func(func)   # doctest: +SKIP
    >>> print(prog.source); prog(a, b, c)
    """
    key = (id(func), check_bounds, check_races)
    hit = _cache.get(key)
    if hit is not None and hit.func is func:
        _cache.move_to_end(key)
        return hit
    try:
        rendered = render(func, check_bounds, check_races)
    except RecursionError:
        raise CompileError(f"{func.name}: an expression is nested too deeply to render") from None
    filename = f"<autosched.ref {func.name} {id(func):x}>"
    # Tracebacks through the generated code show its lines.
    lines = rendered.source.splitlines(keepends=True)
    linecache.cache[filename] = (len(rendered.source), None, lines, filename)
    ns = namespace()
    try:
        exec(compile(rendered.source, filename, "exec"), ns)
    except (SyntaxError, RecursionError) as exc:
        raise CompileError(
            f"{func.name}: the rendered Python does not compile ({exc})\n{rendered.source}"
        ) from None
    prog = Program(func, rendered.source, ns[rendered.entry], rendered.shape_vars, rendered.stored)
    _cache[key] = prog
    while len(_cache) > _CACHE_SIZE:
        _, old = _cache.popitem(last=False)
        linecache.cache.pop(old.fn.__code__.co_filename, None)
    return prog


def evaluate(
    func: ir.PrimFunc, *arrays: np.ndarray, check_bounds: bool = True, check_races: bool = True
) -> None:
    """Run ``func`` on ``arrays`` (in ``func.params`` order); outputs are written in place.

    Raises RuntimeError_ for arrays of the wrong count, shape or dtype, for out-of-bounds
    accesses (unless ``check_bounds`` is False), integer division by zero, divergent GPU
    barriers and GPU data races (unless ``check_races`` is False). See the module docstring.
    """
    compile_func(func, check_bounds, check_races)(*arrays)
