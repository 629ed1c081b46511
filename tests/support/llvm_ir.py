"""Hand-built loop IR for the LLVM backend tests: constants, buffers, loops, a build, inputs."""

from __future__ import annotations

import numpy as np

from autosched.targets.llvm import build_module
from autosched.targets.target import parse
from autosched.te import expr as E
from autosched.tir import ir


def c(v: int | float, dtype: str | None = None) -> E.Const:
    return E.const(v, dtype)


def buf(name: str, shape: tuple, dtype: str = "float32", scope: str = "global") -> ir.Buffer:
    return ir.Buffer(name, tuple(c(d) if isinstance(d, int) else d for d in shape), dtype, scope)


def loop(var: E.Var, extent: int | E.Expr, body: ir.Stmt, kind: str = "serial") -> ir.For:
    return ir.For(var, c(0), c(extent) if isinstance(extent, int) else extent, kind, body)


def build(body: ir.Stmt, params: list[ir.Buffer], name: str = "k", target: str = "llvm"):
    return build_module(ir.PrimFunc(name, tuple(params), body), parse(target))


def rand(rng: np.random.Generator, shape: tuple, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith("float"):
        return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -50), min(info.max, 50)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)


TOL = {"float16": dict(rtol=2e-3, atol=2e-3), "float32": dict(rtol=2e-6, atol=2e-6),
       "float64": dict(rtol=1e-12, atol=1e-12)}


def tol(dtype: str) -> dict:
    return TOL.get(dtype, dict(rtol=0, atol=0))
