"""ONNX models as autosched graphs: ``from_onnx(model, shapes=None) -> Graph``.

The importer loads the model (external data from the model's own directory, never outside
it), checks its opsets (ai.onnx only, and of other domains the contrib ops that
importers/contrib.py expands) and that every value is assigned once before it is read,
takes initializers as constants, binds symbolic input dims from ``shapes`` (a dim value of -1
or 0 is symbolic too), and checks that every op type has a converter (listing every
unsupported op and node at once). Variadic nodes with many inputs become trees
(passes.split_wide_nodes). Then it runs each node's converter in order on placeholders and
constants: TE tensors give the static shape and dtype of every value, numpy outputs become
constants (so shape subgraphs fold away: such nodes are dropped from the graph), unless they
would exceed autosched.graph.fold.FOLD_LIMIT_BYTES: then the node stays, as a kernel. Every
problem is a ModelImportError naming the file, node, op type or input.

Example::

    from importers.onnx import from_onnx
    g = from_onnx("model.onnx", shapes={"input": (1, 3, 224, 224)})
    print(g)                       # inputs, constants, nodes, outputs with shapes
    g.values["output"].shape       # (1, 1000)
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from autosched import te
from autosched.errors import ModelImportError
from autosched.graph.fold import FOLD_LIMIT_BYTES, folded_bytes, runtime_outputs
from autosched.graph.graph import INTERNAL_OP_TYPES, Graph, Node, ValueInfo
from autosched.graph.ops import ConvertContext, const_inputs, convert, shape_of, supported
from autosched.graph.ops_math import onnx_dtype
from autosched.graph.passes import split_wide_nodes
from autosched.te.tensor import Tensor
from importers import contrib
from importers.contrib import DEFAULT_DOMAINS
from importers.control_flow import expand

# the newest default-domain opset the installed onnx (1.23) defines; the supported ops keep
# their semantics up to it (later versions only added types)
MAX_OPSET = 28


def load(model: str | os.PathLike | Any) -> Any:
    """A ModelProto from a path (or the proto itself), checked to parse, with its external data
    read from the model's own directory (onnx's loader refuses locations outside it)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        _check_no_external_data(model, "ONNX model")
        return model
    path = os.fspath(model)
    if not os.path.exists(path):
        raise ModelImportError(f"ONNX file {path!r} does not exist")
    if not os.path.isfile(path):  # a FIFO or device would block the read forever
        raise ModelImportError(f"ONNX file {path!r} is not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read()
        proto = onnx.ModelProto()
        proto.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError and others on corrupt bytes
        raise ModelImportError(f"ONNX file {path!r} is truncated or corrupt: {e}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelImportError(f"ONNX file {path!r} holds no graph (truncated or not ONNX)")
    _load_external_data(proto, os.path.dirname(os.path.abspath(path)), f"ONNX file {path!r}")
    return proto


def _external_tensors(proto: Any) -> list[Any]:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(proto) if uses_external_data(t)]


def _load_external_data(proto: Any, base_dir: str, where: str) -> None:
    """Tensors stored in external files, read relative to ``base_dir``. onnx checks each
    location: no absolute paths, no ``..``, no symlinks out of the directory."""
    from onnx.external_data_helper import load_external_data_for_tensor

    root = os.path.realpath(base_dir)
    for t in _external_tensors(proto):
        # checked here too, so the guarantee does not rest on the installed onnx version
        location = {e.key: e.value for e in t.external_data}.get("location", "")
        path = os.path.realpath(os.path.join(root, location))
        if os.path.isabs(location) or os.path.commonpath([root, path]) != root:
            raise ModelImportError(f"{where}: external data of tensor {t.name!r} is at "
                                   f"{location!r}, outside the model's directory")
        try:
            load_external_data_for_tensor(t, base_dir)
        except Exception as e:  # onnx raises ValidationError, OSError and others
            raise ModelImportError(f"{where}: external data of tensor {t.name!r} cannot be "
                                   f"read: {str(e).splitlines()[0]}") from None


def _check_no_external_data(proto: Any, where: str) -> None:
    """A ModelProto does not know its directory: external data must be loaded already."""
    for t in _external_tensors(proto):
        location = {e.key: e.value for e in t.external_data}.get("location", "?")
        raise ModelImportError(
            f"{where}: tensor {t.name!r} keeps its data in the external file {location!r}; "
            "pass the model's path (or onnx.load(path)) so it is read from the model's "
            "directory")


def opset_of(proto: Any, where: str) -> int:
    """The default-domain opset. A node of any other domain is an error naming the domain,
    unless it is a known contrib op (importers.contrib); an imported domain that no node uses
    is harmless: exporters add ai.onnx.ml freely."""
    version = None
    others = {}
    for imp in proto.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            version = int(imp.version)
        else:
            others[imp.domain] = int(imp.version)
    for node in proto.graph.node:
        contrib.check_domain(node, others, where)
    if version is None:
        raise ModelImportError(f"{where}: the model imports no ai.onnx opset")
    if not 1 <= version <= MAX_OPSET:
        raise ModelImportError(
            f"{where}: ai.onnx opset {version} is not supported (this importer knows opsets "
            f"1 to {MAX_OPSET})")
    return version


def attribute(a: Any) -> Any:
    """An AttributeProto as a Python value (tensors as numpy arrays, strings as str)."""
    from onnx import AttributeProto, numpy_helper

    kind = a.type
    if kind == AttributeProto.GRAPH:  # an If branch, a Loop body: expanded at import
        from importers.control_flow import Subgraph

        return Subgraph(a.g)
    if kind == AttributeProto.FLOAT:
        return float(a.f)
    if kind == AttributeProto.INT:
        return int(a.i)
    if kind == AttributeProto.STRING:
        return a.s.decode()
    if kind == AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if kind == AttributeProto.FLOATS:
        return [float(v) for v in a.floats]
    if kind == AttributeProto.INTS:
        return [int(v) for v in a.ints]
    if kind == AttributeProto.STRINGS:
        return [s.decode() for s in a.strings]
    if kind == AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in a.tensors]
    raise ModelImportError(f"attribute {a.name!r} has a type ({kind}) the importer cannot read")


def _value_type(vi: Any, where: str) -> tuple[list[Any], str]:
    """Dims (int, or the symbolic name, or None) and dtype of a ValueInfoProto. A dim value
    that is not positive is symbolic: exporters write -1 or 0 for a dynamic batch."""
    t = vi.type
    if not t.HasField("tensor_type"):
        raise ModelImportError(f"{where}: value {vi.name!r} is not a tensor")
    try:
        dtype = onnx_dtype(t.tensor_type.elem_type)
    except ValueError as e:
        raise ModelImportError(f"{where}: value {vi.name!r}: {e}") from None
    if not t.tensor_type.HasField("shape"):
        return [], dtype
    dims: list[Any] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_value"):
            dims.append(d.dim_param or f"dim_value {d.dim_value}")
        else:
            dims.append(d.dim_param or None)
    return dims, dtype


class UnboundDimError(ModelImportError):
    """An input has a symbolic dim that no given shape binds; ``bound_with`` words the advice
    for the caller (``shapes={...}`` here, ``--shape NAME=...`` on the command line)."""

    def __init__(self, where: str, name: str, dim: int, dims: list[Any],
                 how: str | None = None) -> None:
        self.where, self.input, self.dim, self.dims = where, name, dim, dims
        sym = f" {dims[dim]!r}" if dims[dim] else ""
        how = how or f"shapes={{{name!r}: (...)}}"
        super().__init__(f"{where}: input {name!r} has symbolic dim {dim}{sym} {dims}; bind it "
                         f"with {how}")

    def bound_with(self, how: str) -> UnboundDimError:
        return UnboundDimError(self.where, self.input, self.dim, self.dims, how)


def _bind(name: str, dims: list[Any], given: tuple[int, ...] | None,
          where: str) -> tuple[int, ...]:
    if given is not None:
        given = tuple(int(v) for v in given)
        if min(given, default=0) < 0:
            raise ModelImportError(f"{where}: shape {given} given for input {name!r} has a "
                                   "negative dim")
        if len(given) != len(dims) and dims:
            raise ModelImportError(f"{where}: shape {given} given for input {name!r} has "
                                   f"{len(given)} dims, the model declares {len(dims)} {dims}")
        for k, (d, g) in enumerate(zip(dims, given)):
            if isinstance(d, int) and d != g:
                raise ModelImportError(f"{where}: shape {given} given for input {name!r} "
                                       f"disagrees with its static dim {k} = {d}")
        return given
    out = []
    for k, d in enumerate(dims):
        if not isinstance(d, int):
            raise UnboundDimError(where, name, k, dims)
        out.append(d)
    return tuple(out)


def _check_ssa(g: Any, where: str) -> None:
    """Every value is defined once (by a graph input, an initializer or one node output) before
    any node reads it: onnx.checker's rules. Two writers of one name, an output shadowing an
    input or initializer, a read before the definition (a cycle, or nodes out of order) would
    otherwise import and compute something else."""
    inits = [i.name for i in g.initializer]
    # an initializer may also be listed as a graph input (older exporters): one definition
    sources = [("initializer", inits), ("graph input", [i.name for i in g.input
                                                        if i.name not in set(inits)])]
    defined: dict[str, str] = {}
    for kind, names in sources:
        for name in names:
            if name in defined:
                raise ModelImportError(f"{where}: value {name!r} is defined twice: by {kind} "
                                       f"{name!r} and by {defined[name]}")
            defined[name] = f"{kind} {name!r}"
    writers = {o: f"node {n.name!r} ({n.op_type})" for n in reversed(g.node) for o in n.output}
    for n in g.node:
        here = f"node {n.name!r} ({n.op_type})"
        for name in n.input:
            if name and name not in defined and name in writers:
                raise ModelImportError(
                    f"{where}: {here} reads {name!r} before {writers[name]} defines it (nodes "
                    "must be in topological order; a cycle?)")
        for name in n.output:
            if name and name in defined:
                raise ModelImportError(f"{where}: {here} writes {name!r}, which "
                                       f"{defined[name]} already defines (values are assigned "
                                       "once)")
            if name:
                defined[name] = here


def from_onnx(model: str | os.PathLike | Any,
              shapes: Mapping[str, tuple[int, ...]] | None = None) -> Graph:
    """Import an ONNX model (path or ModelProto) as a Graph with static shapes everywhere.

    ``shapes`` binds input shapes (needed for symbolic dims such as batch). Raises
    ModelImportError for a corrupt file, an unknown opset or domain, unsupported ops (all
    listed), undefined inputs and inconsistent shapes."""
    where = f"ONNX file {os.fspath(model)!r}" if isinstance(model, (str, os.PathLike)) else (
        "ONNX model")
    proto = load(model)
    opset = opset_of(proto, where)
    g = proto.graph
    shapes = dict(shapes or {})
    _check_ssa(g, where)

    constants = _initializers(g, where)
    unknown = [n for n in shapes if n not in {i.name for i in g.input}]
    if unknown:
        raise ModelImportError(f"{where}: shapes given for {unknown}, which are not inputs of "
                               f"the model (inputs: {[i.name for i in g.input]})")

    values: dict[str, ValueInfo] = {}
    env: dict[str, Tensor | np.ndarray] = {}
    inputs: list[ValueInfo] = []
    for vi in g.input:
        if vi.name in constants:
            continue  # an initializer listed as an input (older exporters) is a constant
        dims, dtype = _value_type(vi, where)
        shape = _bind(vi.name, dims, shapes.get(vi.name), where)
        info = ValueInfo(vi.name, shape, dtype)
        inputs.append(info)
        values[vi.name] = info
        env[vi.name] = te.placeholder(shape, dtype=dtype, name=_safe(vi.name))
    for name, arr in constants.items():
        values[name] = ValueInfo(name, tuple(arr.shape), str(arr.dtype))
        env[name] = arr

    nodes = [Node(n.name or f"{n.op_type}_{k}", contrib.op_type_of(n, where), list(n.input),
                  list(n.output), {a.name: attribute(a) for a in n.attribute})
             for k, n in enumerate(g.node)]
    named = {v for n in g.node for v in [*n.input, *n.output]} | set(values) | set(constants)
    nodes = split_wide_nodes(nodes, named)
    _check_supported(nodes, where)

    declared = {vi.name: vi for vi in list(g.output) + list(g.value_info)}
    ctx = ConvertContext(opset=opset)
    kept: list[Node] = []
    unfolded: dict[str, Node] = {}   # values too large to fold -> the node computing them
    queue = deque(nodes)
    while queue:
        node = queue.popleft()
        inlined = expand(node, env)  # If / Loop with constant controls, recurrent layers
        if inlined is not None:
            named.update(o for n in inlined for o in n.outputs)
            queue.extendleft(reversed(split_wide_nodes(inlined, named)))
            continue
        ins = _node_inputs(node, env, unfolded, opset, where)
        node, outs = _convert(node, ins, ctx, where)
        folded = True
        for name, v in zip(node.outputs, outs):
            if not name:
                continue
            if isinstance(v, Tensor):
                folded = False
                info = ValueInfo(name, shape_of(v), v.dtype)
            else:
                v = np.asarray(v)
                info = ValueInfo(name, tuple(v.shape), str(v.dtype))
            _check_declared(declared.get(name), info, node, where)
            values[name] = info
            env[name] = v
        if folded:
            for name, v in zip(node.outputs, outs):
                if name:
                    constants[name] = np.asarray(v)
        else:
            kept.append(node)
            if all(not i or i in constants for i in node.inputs):
                unfolded.update((o, node) for o in node.outputs if o)

    outputs = [o.name for o in g.output]
    for name in outputs:
        if name not in values:
            raise ModelImportError(f"{where}: graph output {name!r} is not produced by any "
                                   "node, input or initializer")
    used = {i for n in kept for i in n.inputs} | set(outputs)
    consts = {k: v for k, v in constants.items() if k in used}
    return Graph(inputs=inputs, outputs=outputs, nodes=kept, constants=consts,
                 values={k: v for k, v in values.items()}, name=g.name or "model", opset=opset)


def _initializers(g: Any, where: str) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    constants: dict[str, np.ndarray] = {}
    for init in g.initializer:
        try:
            constants[init.name] = numpy_helper.to_array(init)
        except Exception as e:  # bad raw_data length, unknown data type
            raise ModelImportError(f"{where}: initializer {init.name!r} cannot be read: {e}"
                                   ) from None
    for sparse in g.sparse_initializer:
        raise ModelImportError(f"{where}: sparse initializer {sparse.values.name!r} is not "
                               "supported")
    return constants


def importable(op_type: str) -> bool:
    """Whether the importer takes ``op_type`` (as ``contrib.op_type_of`` names it): an ONNX op
    with a converter, or a contrib op it expands."""
    return contrib.expands(op_type) or (supported(op_type) and op_type not in INTERNAL_OP_TYPES)


def _check_supported(nodes: list[Node], where: str) -> None:
    """Every op type has a converter and is an ONNX one: all offenders listed at once."""
    unknown = [n for n in nodes if not importable(n.op_type)]
    if unknown:
        kinds = sorted({n.op_type for n in unknown})
        raise ModelImportError(
            f"{where}: {len(unknown)} nodes use unsupported op types {kinds}: "
            + ", ".join(f"{n.op_type} (node {n.name!r})" for n in unknown))


def _node_inputs(node: Node, env: dict[str, Tensor | np.ndarray], unfolded: dict[str, Node],
                 opset: int, where: str) -> list[Tensor | np.ndarray | None]:
    """What the converter of ``node`` reads: arrays for constants, None for omitted inputs,
    and a fresh placeholder per use of a runtime value (shapes are all the importer needs, and
    a chain of node computations would make deep models deep TE expressions)."""
    ins: list[Tensor | np.ndarray | None] = []
    for k, name in enumerate(node.inputs):
        if name == "":
            ins.append(None)
        elif name in env:
            v = env[name]
            ins.append(te.placeholder(v.shape, dtype=v.dtype, name=_safe(name))
                       if isinstance(v, Tensor) else v)
        else:
            raise ModelImportError(
                f"{where}: node {node.name!r} ({node.op_type}) reads input {k} {name!r}, "
                "which no graph input, initializer or earlier node defines (a missing "
                "initializer?)")
    for k in const_inputs(node.op_type, opset):
        if k < len(ins) and isinstance(ins[k], Tensor):
            big = unfolded.get(node.inputs[k])
            why = ("" if big is None else f"; node {big.name!r} ({big.op_type}) computes it at "
                   f"run time, since folding it would take over {FOLD_LIMIT_BYTES} bytes")
            raise ModelImportError(
                f"{where}: node {node.name!r} ({node.op_type}) needs input {k} "
                f"({node.inputs[k]!r}) to be a constant: it fixes the output shape{why}")
    return ins


def _convert(node: Node, ins: list[Tensor | np.ndarray | None], ctx: ConvertContext,
             where: str) -> tuple[Node, list[Any]]:
    """The node's outputs: arrays when it folds, else TE tensors. A node of constants whose
    values would take more than FOLD_LIMIT_BYTES stays a runtime kernel (maybe as another
    node: autosched.graph.fold.runtime_node)."""
    if ins and all(v is None or isinstance(v, np.ndarray) for v in ins):
        size = folded_bytes(node, ins, ctx.opset)
        if size is not None and size > FOLD_LIMIT_BYTES:
            return runtime_outputs(node, ins, ctx, where)
    return node, convert(node, ins, ctx)


def _check_declared(vi: Any, info: ValueInfo, node: Node, where: str) -> None:
    """A dtype the model declares for a value must agree with the inferred one; a declared shape
    that disagrees is a warning (exporters leave stale shape annotations, which onnxruntime too
    only warns about: the inferred shape is what the ops compute)."""
    if vi is None or not vi.type.HasField("tensor_type") or vi.type.tensor_type.elem_type == 0:
        return  # nothing declared
    dims, dtype = _value_type(vi, where)
    static = [d for d in dims if isinstance(d, int)]
    bad_rank = bool(dims) and len(dims) != len(info.shape)
    bad_dim = not bad_rank and any(isinstance(d, int) and d != s
                                   for d, s in zip(dims, info.shape))
    if bad_rank or bad_dim or (dtype != info.dtype):
        text = (f"{where}: node {node.name!r} ({node.op_type}) output {info.name!r} is inferred "
                f"as {info.dtype}{list(info.shape)} but the model declares {dtype}{dims}"
                + (f" (static dims {static})" if static != dims else ""))
        if dtype != info.dtype:
            raise ModelImportError(text)
        warnings.warn(f"{text}; using the inferred shape", stacklevel=4)


def _safe(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"v_{out}"
