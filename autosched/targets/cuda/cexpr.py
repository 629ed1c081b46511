"""CUDA C for loop-IR expressions: loads, arithmetic with C / IEEE semantics, casts, intrinsics.

Integer floordiv/floormod round toward negative infinity (helpers ``as_floordiv`` /
``as_floormod``) unless both operands are provably non-negative, where C's ``/`` and ``%`` agree.
Half values are ``half`` from cuda_fp16.h; functions with no portable half version run in float.
float32 and float64 + - * round every op (``__fadd_rn`` ..., which NVRTC never contracts into an
FMA), as onnxruntime does, except in a reduction's update ``acc + x*y``, which is one ``fmaf``
as in its GEMM and convolution kernels (targets/rounding.py); ``-fast-math`` lets NVRTC
contract anything. A run-time index check (``index_check`` of te/ops/transform.py) ORs
STATUS_INDEX into the kernel's status word (``as_index_check``); the clamp around it keeps the
read in bounds.
"""

from __future__ import annotations

from typing import Protocol

from autosched.errors import CompileError
from autosched.targets.cuda import ir_util as U
from autosched.targets.cuda.dtypes import FROM_FLOAT, NARROW_INTS, TO_FLOAT, c_const, c_type
from autosched.targets.cuda.intrinsics import float_function
from autosched.targets.rounding import fused_update
from autosched.targets.status import STATUS_INDEX
from autosched.te import dtype as dt
from autosched.te import expr as E
from autosched.te.opcodes import Op
from autosched.te.ops.transform import INDEX_CHECK
from autosched.tir import ir

PRELUDE_INT = """\
__device__ __forceinline__ int as_floordiv(int a, int b) {
  int q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
__device__ __forceinline__ int as_floormod(int a, int b) {
  int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
__device__ __forceinline__ long long as_floordiv(long long a, long long b) {
  long long q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
__device__ __forceinline__ long long as_floormod(long long a, long long b) {
  long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
"""

# The status word (targets/status.py) that a kernel with checks takes as its last parameter.
STATUS_PARAM = "as_status"
PRELUDE_STATUS = f"""\
__device__ __forceinline__ int as_index_check(int i, int n, int* s) {{
  if (i < 0 || i >= n) atomicOr(s, {STATUS_INDEX}); return i; }}
__device__ __forceinline__ long long as_index_check(long long i, long long n, int* s) {{
  if (i < 0 || i >= n) atomicOr(s, {STATUS_INDEX}); return i; }}
"""

# max / min keep a NaN of either operand (ONNX and numpy do; fmaxf / fminf return the other one)
PRELUDE_FLOAT = """\
__device__ __forceinline__ float as_max(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float as_min(float a, float b) { return (a < b || a != a) ? a : b; }
__device__ __forceinline__ double as_max(double a, double b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ double as_min(double a, double b) { return (a < b || a != a) ? a : b; }
"""


# The C operators that compute an op exactly (integer / and % truncate toward zero).
_C_INT_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.TRUNCDIV: "/", Op.TRUNCMOD: "%"}
_C_FLOAT_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.DIV: "/"}
_C_LOGICAL = {Op.AND: "&&", Op.OR: "||"}
# Float arithmetic rounded op by op: intrinsics NVRTC never fuses into an FMA.
_ROUNDED = {("float32", Op.ADD): "__fadd_rn", ("float32", Op.SUB): "__fsub_rn",
            ("float32", Op.MUL): "__fmul_rn", ("float64", Op.ADD): "__dadd_rn",
            ("float64", Op.SUB): "__dsub_rn", ("float64", Op.MUL): "__dmul_rn"}


class Names(Protocol):
    """The C identifiers of a kernel's variables and buffers, by uid."""

    by_uid: dict[int, str]

    def get(self, uid: int, name: str) -> str: ...


class ExprWriter:
    """Renders expressions of one kernel. The kernel writer provides ``name`` (for errors),
    ``names`` (C identifiers by uid), ``raw`` (placeholder vars printed verbatim), ``nonneg``
    (uids of variables known to be >= 0), ``fast_math`` and ``need_half()``; ``checks``
    becomes True once an expression reports to the status word."""

    name: str
    names: Names
    raw: dict[int, str]
    nonneg: set[int]
    fast_math: bool
    checks: bool = False

    def need_half(self, dtype: str = "float16") -> None:
        raise NotImplementedError


    def _access(self, buf: ir.Buffer, indices: tuple[E.Expr, ...]) -> str:
        name = self.names.get(buf.uid, buf.name)
        try:
            off, _ = ir.access_offset(buf, indices)
        except ValueError as exc:
            raise CompileError(f"kernel {self.name}: {exc}") from None
        return f"{name}[{self._expr(off)}]"

    def _expr(self, e: E.Expr) -> str:
        if isinstance(e, E.Const):
            if e.dtype in FROM_FLOAT:
                self.need_half(e.dtype)
            return c_const(e.value, e.dtype)
        if isinstance(e, E.Var):
            if e.uid in self.raw:
                return self.raw[e.uid]
            if e.uid not in self.names.by_uid:
                raise CompileError(
                    f"kernel {self.name}: variable {e.name} is used but never defined "
                    "(not a loop variable, let, or shape variable of the function)"
                )
            return self.names.by_uid[e.uid]
        if isinstance(e, ir.Load):
            return self._access(e.buffer, e.indices)
        if isinstance(e, E.Binary):
            return self._binary(e)
        if isinstance(e, E.Compare):
            return f"({self._expr(e.a)} {e.op.symbol} {self._expr(e.b)})"  # C spells them alike
        if isinstance(e, E.Not):
            return f"(!{self._expr(e.a)})"
        if isinstance(e, E.Select):
            return (f"({self._expr(e.cond)} ? {self._expr(e.true_value)} : "
                    f"{self._expr(e.false_value)})")
        if isinstance(e, E.Cast):
            return self._cast(e.type, e.value)
        if isinstance(e, E.Call):
            return self._call(e)
        if isinstance(e, (E.TensorRead, E.Reduce)):
            raise CompileError(
                f"kernel {self.name}: {type(e).__name__} {e} reached codegen; lowering should "
                "have turned it into loads and loops"
            )
        raise CompileError(f"kernel {self.name}: cannot emit expression {type(e).__name__}")

    def _cast(self, to: str, value: E.Expr) -> str:
        src = value.dtype
        x = self._expr(value)
        if to == src:
            return x
        if to == "bool":
            if src in TO_FLOAT:
                return f"({TO_FLOAT[src]}({x}) != 0.0f)"
            return f"(({x}) != 0)"
        if to in FROM_FLOAT:
            self.need_half(to)
            if src in TO_FLOAT:
                x = f"{TO_FLOAT[src]}({x})"
            return f"{FROM_FLOAT[to]}((float)({x}))"
        if src in TO_FLOAT:
            return f"(({c_type(to)}){TO_FLOAT[src]}({x}))"
        return f"(({c_type(to)})({x}))"

    def _half(self, e: E.Expr) -> str:
        """``e`` (a half) as a float expression."""
        return f"__half2float({self._expr(e)})"

    def _binary(self, e: E.Binary) -> str:
        op, t = e.op, e.dtype
        if op in _C_LOGICAL:
            return f"({self._expr(e.a)} {_C_LOGICAL[op]} {self._expr(e.b)})"
        if t == "float16" and op in (Op.MIN, Op.MAX, Op.POW, Op.FLOORDIV, Op.FLOORMOD):
            # no portable half versions: compute in float, round once
            self.need_half()
            inner = self._float_binary(op, "float32", self._half(e.a), self._half(e.b))
            return f"__float2half({inner})"
        if dt.is_float(t):
            return self._float_binary(op, t, self._expr(e.a), self._expr(e.b))
        a, b = self._expr(e.a), self._expr(e.b)
        if op in _C_INT_INFIX:
            out = f"({a} {_C_INT_INFIX[op]} {b})"
        elif op in (Op.MIN, Op.MAX):
            out = f"{op}({a}, {b})"
        elif op in (Op.FLOORDIV, Op.FLOORMOD):
            plain = (t.startswith("uint")
                     or (U.is_nonneg(e.a, self.nonneg) and U.is_nonneg(e.b, self.nonneg)))
            if plain:  # C's / and % round toward zero: the same on non-negative operands
                out = f"({a} {_C_INT_INFIX[op.truncating]} {b})"
            else:
                wide = "long long" if t == "int64" else "int"
                out = f"as_{op}(({wide})({a}), ({wide})({b}))"
        else:
            raise CompileError(f"kernel {self.name}: integer {op} ({e}) is not supported on "
                               "CUDA; cast to a float type first")
        if t in NARROW_INTS:
            out = f"(({c_type(t)}){out})"
        return out

    def _float_binary(self, op: Op, t: str, a: str, b: str) -> str:
        if op in _C_FLOAT_INFIX:
            if op is Op.DIV and self.fast_math and t == "float32":
                return f"__fdividef({a}, {b})"
            if (t, op) in _ROUNDED and not self.fast_math:
                return f"{_ROUNDED[t, op]}({a}, {b})"
            return f"({a} {_C_FLOAT_INFIX[op]} {b})"
        f = "f" if t == "float32" else ""
        if t == "float16":  # add/sub/mul/div handled above through cuda_fp16 operators
            raise CompileError(f"kernel {self.name}: half {op} reached the float path")
        if op in (Op.MIN, Op.MAX):
            return f"as_{op}({a}, {b})"
        if op is Op.POW:
            return f"{float_function('pow', t, self.fast_math)}({a}, {b})"
        if op is Op.FLOORDIV:
            return f"floor{f}({a} / {b})"
        if op is Op.FLOORMOD:
            q = self._float_binary(Op.MUL, t, f"floor{f}(({a}) / ({b}))", b)
            return self._float_binary(Op.SUB, t, a, q)
        raise CompileError(f"kernel {self.name}: float {op} is not supported")

    def store_value(self, s: ir.Store, value: E.Expr | None = None) -> str:
        """The C value that store ``s`` writes (``value``: its value with some loads replaced
        by vector lanes): a reduction's update acc + x*y as one fused multiply-add."""
        value = s.value if value is None else value
        if self.fast_math or not fused_update(s):
            return self._expr(value)
        assert isinstance(value, E.Binary)
        mul, acc = (value.b, value.a) if _is_mul(value.b) else (value.a, value.b)
        assert isinstance(mul, E.Binary)
        fma = "fmaf" if s.buffer.dtype == "float32" else "fma"
        return f"{fma}({self._expr(mul.a)}, {self._expr(mul.b)}, {self._expr(acc)})"

    def _call(self, e: E.Call) -> str:
        t = e.dtype
        if e.name == INDEX_CHECK:
            self.checks = True
            wide = c_type(t)
            i, n = (self._expr(a) for a in e.args)
            return f"as_index_check(({wide})({i}), ({wide})({n}), {STATUS_PARAM})"
        if e.name == "abs" and not dt.is_float(t):
            x = self._expr(e.args[0])
            if t.startswith("uint"):
                return x
            return f"llabs({x})" if t == "int64" else f"(({c_type(t)})abs({x}))"
        if not dt.is_float(t):
            raise CompileError(f"kernel {self.name}: intrinsic {e.name} on {t} ({e})")
        if t == "float16":
            self.need_half()
            fn = float_function(e.name, "float32", self.fast_math)
            args = ", ".join(self._half(a) for a in e.args)
            return f"__float2half({fn}({args}))"
        fn = float_function(e.name, t, self.fast_math)
        return f"{fn}({', '.join(self._expr(a) for a in e.args)})"


def _is_mul(e: E.Expr) -> bool:
    return isinstance(e, E.Binary) and e.op is Op.MUL
