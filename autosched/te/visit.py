"""Generic traversal and rewriting of expressions."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from autosched.errors import TEError
from autosched.te import expr as E
from autosched.te.opcodes import OpKind


def children(e: E.Expr) -> Iterator[E.Expr]:
    for name in E.field_names(type(e)):
        value = getattr(e, name)
        if isinstance(value, E.Expr):
            yield value
        elif isinstance(value, tuple):
            yield from (v for v in value if isinstance(v, E.Expr))


def post_order(e: E.Expr) -> Iterator[E.Expr]:
    """Every node of ``e``, children before parents (shared nodes repeat). Iterative: a chain
    of thousands of operations is deeper than Python's recursion limit."""
    stack: list[tuple[E.Expr, bool]] = [(e, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            yield node
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(list(children(node))))


def rebuild(e: E.Expr, **changes: object) -> E.Expr:
    """``e`` with some fields replaced, re-folding constants through the checked builders."""
    values = {name: getattr(e, name) for name in E.field_names(type(e))}
    values.update(changes)
    if isinstance(e, E.Binary):
        if e.op.kind is OpKind.LOGICAL:
            return E.logical(e.op, values["a"], values["b"])
        return E.binary(e.op, values["a"], values["b"])
    if isinstance(e, E.Compare):
        return E.compare(e.op, values["a"], values["b"])
    if isinstance(e, E.Select):
        return E.select(values["cond"], values["true_value"], values["false_value"])
    if isinstance(e, E.Cast):
        return E.cast(e.type, values["value"])
    return type(e)(**values)


def _operands(e: E.Expr) -> Iterator[E.Expr]:
    """The children ``rewrite`` rewrites: Expr fields, and the Exprs in plain tuple fields."""
    for name in E.field_names(type(e)):
        value = getattr(e, name)
        if isinstance(value, E.Expr):
            yield value
        elif type(value) is tuple:
            yield from (v for v in value if isinstance(v, E.Expr))


def _rebuilt(e: E.Expr, new: list[E.Expr]) -> E.Expr:
    """``e`` with its operands (in _operands order) replaced by ``new``, when any changed."""
    changes: dict[str, object] = {}
    it = iter(new)
    for name in E.field_names(type(e)):
        value = getattr(e, name)
        if isinstance(value, E.Expr):
            v = next(it)
            if v is not value:
                changes[name] = v
        elif type(value) is tuple and any(isinstance(v, E.Expr) for v in value):
            new_t = tuple(next(it) if isinstance(v, E.Expr) else v for v in value)
            if any(a is not b for a, b in zip(new_t, value)):
                changes[name] = new_t
    return rebuild(e, **changes) if changes else e


def rewrite(e: E.Expr, fn: Callable[[E.Expr], E.Expr | None],
            memo: dict[int, tuple[E.Expr, E.Expr]] | None = None) -> E.Expr:
    """Rewrite bottom-up: children first, then ``fn`` on the rebuilt node (None keeps it).
    ``memo`` (by ``id`` of the original node, which the value keeps alive) shares the work
    on subexpressions that several calls with the same ``fn`` reach."""
    return _rewrite(e, None, fn, memo)


def rewrite_outer(e: E.Expr, fn: Callable[[E.Expr], E.Expr | None]) -> E.Expr:
    """Rewrite top-down: ``fn`` on each node before its children; a node it replaces (not
    None) is taken whole, its children unvisited, else its children are rewritten alike."""
    return _rewrite(e, fn, None)


def _rewrite(e: E.Expr, before: Callable[[E.Expr], E.Expr | None] | None,
             after: Callable[[E.Expr], E.Expr | None] | None,
             memo: dict[int, tuple[E.Expr, E.Expr]] | None = None) -> E.Expr:
    """``before`` on a node as it is reached (a replacement ends the walk there), ``after`` on
    it rebuilt from its rewritten children. Iterative (a stack of pending nodes and one of
    results), for expressions deeper than Python's recursion limit."""
    results: list[E.Expr] = []
    stack: list[tuple[E.Expr, int]] = [(e, -1)]   # (node, -1) to expand, (node, n) to build
    memo = {} if memo is None else memo
    while stack:
        node, n = stack.pop()
        if n < 0:
            hit = memo.get(id(node))
            if hit is not None:
                results.append(hit[1])
                continue
            out = before(node) if before is not None else None
            if out is not None:
                results.append(out)
                continue
            operands = list(_operands(node))
            if not operands:  # a leaf: nothing to rebuild
                out = after(node) if after is not None else None
                results.append(node if out is None else out)
                memo[id(node)] = (node, results[-1])
                continue
            stack.append((node, len(operands)))
            stack.extend((c, -1) for c in reversed(operands))
            continue
        new = results[len(results) - n:]
        del results[len(results) - n:]
        built = _rebuilt(node, new)
        out = after(built) if after is not None else None
        results.append(built if out is None else out)
        memo[id(node)] = (node, results[-1])
    return results[0]


def substitute(e: E.Expr, mapping: Mapping[E.Var, E.Expr]) -> E.Expr:
    """Replace variables by expressions."""
    return substituter(mapping)(e) if mapping else e


def substituter(mapping: Mapping[E.Var, E.Expr]) -> Callable[[E.Expr], E.Expr]:
    """``substitute`` of ``mapping`` as a function, for many expressions (a pass over a
    loop nest): the mapping is indexed once and the calls share one ``rewrite`` memo."""
    by_uid = {v.uid: x for v, x in mapping.items()}
    memo: dict[int, tuple[E.Expr, E.Expr]] = {}

    def replace(n: E.Expr) -> E.Expr | None:
        return by_uid.get(n.uid) if isinstance(n, E.Var) else None

    return lambda e: rewrite(e, replace, memo)


def free_vars(e: E.Expr) -> set[E.Var]:
    """Variables read by ``e`` (reduction axes bound inside a Reduce are excluded)."""
    out: dict[int, E.Var] = {}
    bound: set[int] = set()
    for n in post_order(e):
        if isinstance(n, E.Var):
            out[n.uid] = n
        elif isinstance(n, E.Reduce):
            bound.update(a.var.uid for a in n.axis)
            bound.update((n.combiner.lhs.uid, n.combiner.rhs.uid))
    return {v for uid, v in out.items() if uid not in bound}


def tensors_read(e: E.Expr) -> list:
    """Tensors read by ``e``, in first-read order, without repeats."""
    seen: dict = {}
    for n in post_order(e):
        if isinstance(n, E.TensorRead):
            seen.setdefault(n.tensor, None)
    return list(seen)


def check_body(body: E.Expr, axis: tuple[E.IterVar, ...], name: str) -> None:
    """A compute body may use only its own axes and symbolic sizes; a Reduce only at the top."""
    for n in post_order(body):
        if isinstance(n, E.Reduce) and n is not body:
            raise TEError(
                f"compute {name}: a reduction ({n.combiner.name}) must be the whole body, "
                "not part of a larger expression; split it into two computes"
            )
    from autosched.te.tensor import is_reduce_var

    for v in free_vars(body):
        if is_reduce_var(v):
            raise TEError(
                f"compute {name}: reduce axis {v.name} is used outside a reduction; "
                f"wrap the body in te.sum(..., axis={v.name}) (or another reducer)"
            )
