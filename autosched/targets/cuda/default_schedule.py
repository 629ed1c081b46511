"""The default GPU schedule: a loop-IR pass that binds every unbound top-level loop nest.

The outermost loops of the nest that are data-parallel (every store under them writes a
location that depends on the loop variable, and nothing reads another iteration's result) are
fused into one index ``f``, split into ``blockIdx.x`` x ``threadIdx.x`` and guarded by
``f < extent``. Reductions inside stay serial in each thread. A nest with no data-parallel loop
runs in one thread. So any operator built for "cuda" runs, bound or not.

Example::

    func = bind_unbound(func, threads=256)
"""

from __future__ import annotations

from autosched.targets.cuda import ir_util as U
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.tir import ir
from autosched.tir.evaluate import const_int
from autosched.tir.visit import loads, map_children, substitute_stmt, uses_var, walk


def bind_unbound(func: ir.PrimFunc, threads: int = 256) -> ir.PrimFunc:
    """``func`` with each top-level nest that has no thread loop bound to blocks x threads."""
    body = _host(func.body, threads)
    if body is func.body:
        return func
    return ir.PrimFunc(func.name, func.params, body, func.attrs)


def _host(s: ir.Stmt, threads: int) -> ir.Stmt:
    if isinstance(s, (ir.Seq, ir.Allocate, ir.LetStmt)):
        return map_children(s, lambda c: _host(c, threads))
    if U.has_thread_loop(s):
        return s  # bound by the schedule (codegen reports a nest bound only inside)
    return bind_nest(s, threads)


def _private_buffers(s: ir.Stmt) -> set[ir.Buffer]:
    return {st.buffer for st in walk(s) if isinstance(st, ir.Allocate)}


def is_data_parallel(loop: ir.For) -> bool:
    """True when the iterations of ``loop`` touch disjoint outputs and read none of each
    other's: each store's indices use the loop variable, and every read of a stored buffer is
    at the very indices of a store to it (the ``C[i] = C[i] + ...`` pattern)."""
    if loop.kind == "parallel" or const_int(loop.extent) == 1:
        return True  # one iteration cannot conflict with another
    private = _private_buffers(loop.body)
    stores = [st for st in walk(loop.body) if isinstance(st, ir.Store)]
    written: dict[ir.Buffer, list[tuple[E.Expr, ...]]] = {}
    for st in stores:
        if st.buffer in private:
            continue
        if not any(uses_var(i, loop.var) for i in st.indices):
            return False
        written.setdefault(st.buffer, []).append(st.indices)
    for ld in loads(loop.body):
        if ld.buffer in written and not any(
            E.structural_equal(ld.indices, idx) for idx in written[ld.buffer]
        ):
            return False
    return True


def bind_nest(s: ir.Stmt, threads: int) -> ir.Stmt:
    loops: list[ir.For] = []
    cur = s
    while (isinstance(cur, ir.For) and cur.kind in ("serial", "parallel")
           and is_data_parallel(cur)):
        loops.append(cur)
        cur = cur.body
    bx = E.Var("blockIdx_x")
    tx = E.Var("threadIdx_x")
    if not loops:
        inner = ir.For(tx, E.const(0), E.const(1), "thread", s, "threadIdx.x")
        return ir.For(bx, E.const(0), E.const(1), "thread", inner, "blockIdx.x")
    total: E.Expr = E.const(1)
    for lp in loops:
        total = E.binary(Op.MUL, total, lp.extent)
    n = const_int(total)
    block = threads if n is None else max(1, min(threads, n))
    blocks = E.binary(Op.FLOORDIV, E.binary(Op.ADD, total, block - 1), block)
    fused = E.binary(Op.ADD, E.binary(Op.MUL, bx, block), tx)
    mapping: dict[E.Var, E.Expr] = {}
    stride: E.Expr = E.const(1)
    for k, lp in enumerate(reversed(loops)):
        q = fused if const_int(stride) == 1 else E.binary(Op.FLOORDIV, fused, stride)
        outermost = k == len(loops) - 1
        idx = q if outermost else E.binary(Op.FLOORMOD, q, lp.extent)
        mapping[lp.var] = E.binary(Op.ADD, lp.min, idx) if const_int(lp.min) != 0 else idx
        stride = E.binary(Op.MUL, stride, lp.extent)
    body = substitute_stmt(cur, mapping)
    if n is None or n % block != 0:
        body = ir.IfThenElse(E.compare(Op.LT, fused, total), body)
    inner = ir.For(tx, E.const(0), E.const(block), "thread", body, "threadIdx.x")
    return ir.For(bx, E.const(0), blocks, "thread", inner, "blockIdx.x")
