"""Math intrinsics in CUDA C: the float, double and half spellings, and the fast-math ones.

Half-precision intrinsics are evaluated in float and rounded once to half: for these functions
that is as accurate as (or more than) the native h* variants, and exists on every arch.
float32 sigmoid and tanh are onnxruntime's rational functions (targets/rounding.py), with
``fmaf`` where it fuses and every other step rounded (``__fmul_rn`` ..., which NVRTC never
contracts), so that they are its results to the bit on the GPU as on the CPU."""

from __future__ import annotations

from autosched.errors import CompileError
from autosched.targets.cuda.dtypes import c_const
from autosched.targets.rounding import RATIONAL

# name -> (float32, float64)
_PRECISE = {
    "exp": ("expf", "exp"),
    "log": ("logf", "log"),
    "sqrt": ("sqrtf", "sqrt"),
    "rsqrt": ("rsqrtf", "rsqrt"),
    "tanh": ("as_tanhf", "tanh"),
    "erf": ("erff", "erf"),
    "sigmoid": ("as_sigmoidf", "as_sigmoid"),
    "floor": ("floorf", "floor"),
    "ceil": ("ceilf", "ceil"),
    "round": ("rintf", "rint"),  # half to even, as numpy.round
    "sin": ("sinf", "sin"),
    "cos": ("cosf", "cos"),
    "log2": ("log2f", "log2"),
    "exp2": ("exp2f", "exp2"),
    "log1p": ("log1pf", "log1p"),
    "expm1": ("expm1f", "expm1"),
    "abs": ("fabsf", "fabs"),
    "pow": ("powf", "pow"),
}

# Fast, less accurate float32 hardware versions, used only with the target option -fast-math.
_FAST = {
    "exp": "__expf",
    "log": "__logf",
    "sin": "__sinf",
    "cos": "__cosf",
    "log2": "__log2f",
    "pow": "__powf",
    "sigmoid": "as_fast_sigmoidf",
}



def _rational(name: str) -> str:
    """``as_<name>f``: RATIONAL[name] in float32, step by step as onnxruntime computes it."""
    r = RATIONAL[name]

    def f(v: float) -> str:
        return c_const(v, "float32")

    def floor(var: str, lo: float) -> str:  # NaN passes through
        return f"{var} = {var} < {f(lo)} ? {f(lo)} : {var};"

    def clamp(var: str, lo: float, hi: float) -> list[str]:
        return [floor(var, lo), f"{var} = {var} > {f(hi)} ? {f(hi)} : {var};"]

    def poly(var: str, coefs: tuple[float, ...]) -> list[str]:
        return [f"float {var} = {f(coefs[0])};"] + [f"{var} = fmaf({var}, v2, {f(k)});"
                                                     for k in coefs[1:]]

    body = ["float v = x;", *clamp("v", -r.bound, r.bound), "const float v2 = __fmul_rn(v, v);",
            *poly("p", r.p), *poly("q", r.q), "float y = __fdiv_rn(__fmul_rn(p, v), q);"]
    if r.offset:
        body.append(f"y = __fadd_rn(y, {f(r.offset)});")
    if r.floor is not None:
        body.append(floor("y", r.floor))
    lines = "".join(f"  {line}\n" for line in body + ["return y;"])
    return f"__device__ __forceinline__ float as_{name}f(float x) {{\n{lines}}}\n"


_PRELUDE = (_rational("sigmoid") + _rational("tanh") + """\
__device__ __forceinline__ double as_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
""")
_PRELUDE_FAST = """\
__device__ __forceinline__ float as_fast_sigmoidf(float x) { return __frcp_rn(1.0f + __expf(-x)); }
"""


def prelude_math(fast_math: bool) -> str:
    """Helper functions the generated kernels may call (fast variants only under -fast-math)."""
    return _PRELUDE + (_PRELUDE_FAST if fast_math else "")


def float_function(name: str, dtype: str, fast_math: bool) -> str:
    """The C function computing intrinsic ``name`` for a float ``dtype`` (half computes in
    float; the caller converts around it)."""
    if name not in _PRECISE:
        raise CompileError(f"the CUDA backend has no intrinsic {name!r} (dtype {dtype})")
    if dtype == "float64":
        return _PRECISE[name][1]
    if fast_math and name in _FAST:
        return _FAST[name]
    return _PRECISE[name][0]
