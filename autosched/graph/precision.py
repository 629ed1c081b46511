"""Reduced-precision storage: the graph pass behind ``compile(..., precision="fp16" | "bf16")``.

The pass decides where each value lives, not how it is computed. float32 activations (node
outputs) and weights (constant kernel arguments) are stored in the precision's half type, so
kernels read and write half the bytes; every converter still computes in float32, because the
graph compiler (compiler.group_task) casts a kernel's half inputs to float32 where it reads
them and rounds its outputs once, where it writes them. So a convolution, MatMul or Gemm reads
half operands (``float(a[i, k]) * float(b[k, j])``, the form tensor-core rules look for),
accumulates in float32 and stores half; a fused elementwise chain rounds once, at its end.

Kept in float32, as numerics need it:

* the outputs of KEEP_FP32 ops (reductions such as ReduceMean / ReduceSum, log-softmax,
  exp / log / pow, cumulative sums) and of nodes marked FP32_OUTPUT (the partial sums of a
  GEMM split along K, passes.k_splits);
* the weights of those and of NORMALIZED ops (softmax and the norms: a norm's scale and bias),
  which compute in float32 and store their outputs in half as the other ops do: the values
  are bounded (probabilities; normalized rows times a scale), so half storage costs them
  only its relative rounding, and the matmuls that read them (attention's P x V, a
  transformer's projections after a LayerNorm) get two half operands, as tensor cores want
  (as in torch's ``model.half()``);
* the model's inputs and outputs: the first kernels read float32 inputs directly, the last
  ones write float32 (computed from half intermediates, never rounded to half);
* constants a converter reads as values (shapes, scales, scalars) rather than as arrays.

fp32 and tf32 store float32 and leave the graph as it is (tf32 differs only in the
tensor-core multiplies of the GPU sketch rules).

Example::

    from autosched.graph.precision import apply_precision
    g = apply_precision(optimize(graph), "fp16")
    {g.values[v].dtype for n in g.nodes for v in n.outputs}   # {"float16", ...}
"""

from __future__ import annotations

from autosched.graph.graph import FP32_OUTPUT, Graph, ValueInfo
from autosched.graph.ops import const_inputs
from autosched.te import dtype as dt
from autosched.te.dtype import DEFAULT_PRECISION, PRECISIONS, Precision, precision

__all__ = ["DEFAULT_PRECISION", "KEEP_FP32", "NORMALIZED", "PRECISIONS", "Precision", "apply_precision",
           "precision", "storage_dtype"]

# Ops whose outputs stay float32 in half precisions: reductions and the functions whose
# range or sensitivity half storage would hurt.
KEEP_FP32 = frozenset({
    "LogSoftmax",
    "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "CumSum",
    "Exp", "Log", "Pow",
})
# Ops computed in float32 whose outputs are bounded (stored in half) and whose weights stay
# float32.
NORMALIZED = frozenset({
    "Softmax", "Hardmax",
    "BatchNormalization", "LayerNormalization", "GroupNormalization", "InstanceNormalization",
    "LpNormalization", "MeanVarianceNormalization",
})


def storage_dtype(precision: str) -> str:
    """The dtype activations and weights are stored in under ``precision``."""
    return dt.precision(precision).storage


def apply_precision(graph: Graph, precision: str) -> Graph:
    """``graph`` with its float32 activations and weights stored in the half type of
    ``precision`` (see the module docstring for what stays float32); the graph itself for
    fp32 and tf32. Run after the other passes (weights are packed and folded first)."""
    half = storage_dtype(precision)
    if half == "float32":
        return graph
    outputs = set(graph.outputs)
    values = dict(graph.values)
    for n in graph.nodes:
        if n.op_type in KEEP_FP32 or n.attrs.get(FP32_OUTPUT):
            continue
        for o in n.outputs:
            info = values.get(o)
            if o and o not in outputs and o not in graph.constants and info is not None \
                    and info.dtype == "float32":
                values[o] = ValueInfo(o, info.shape, half)
    constants = dict(graph.constants)
    for name in _half_weights(graph, outputs):
        constants[name] = graph.constants[name].astype(dt.to_numpy(half))
        values[name] = ValueInfo(name, tuple(constants[name].shape), half)
    return Graph(inputs=list(graph.inputs), outputs=list(graph.outputs), nodes=list(graph.nodes),
                 constants=constants, values=values, name=graph.name, opset=graph.opset)


def _half_weights(graph: Graph, outputs: set[str]) -> list[str]:
    """float32 constants that kernels read as array arguments, only by ops computed for half
    storage: not scalars, not inputs a converter needs as values, not weights of KEEP_FP32 or
    NORMALIZED ops."""
    opset = graph.opset or 17
    excluded = set(outputs)
    read: set[str] = set()
    for n in graph.nodes:
        as_value = {n.inputs[k] for k in const_inputs(n.op_type, opset) if k < len(n.inputs)}
        for i in n.inputs:
            if i in graph.constants:
                read.add(i)
                if n.op_type in KEEP_FP32 or n.op_type in NORMALIZED or i in as_value:
                    excluded.add(i)
    return [c for c in sorted(read - excluded)
            if graph.constants[c].dtype == "float32" and graph.constants[c].size > 1]
