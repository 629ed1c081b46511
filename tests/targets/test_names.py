"""Names from the outside world used as task, tensor and axis names: every ONNX op type, the
CUDA and C math functions, C and C++ keywords, CUDA built-in variables and types, libc symbols
and the host's macros. The generated code declares its own identifiers (k_ / v_ on CUDA), so
none of these may collide with what the compiler already knows."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import autosched as aus
from autosched import te
from autosched.schedule.lower import lower
from autosched.targets.cuda.codegen import KERNEL_PREFIX, generate
from autosched.targets.cuda.default_schedule import bind_unbound
from autosched.targets.cuda.host_emulate import run_on_host, unavailable
from autosched.targets.cuda.nvrtc import compile_cuda
from autosched.targets.names import c_identifier
from autosched.targets.target import parse
from tests.support.nvrtc import needs_nvrtc

CUDA_MATH = """
sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh sinpi cospi sincos sincospi
exp exp2 exp10 expm1 log log2 log10 log1p logb ilogb pow sqrt rsqrt cbrt rcbrt hypot rhypot
norm norm3d norm4d rnorm erf erfc erfinv erfcinv erfcx normcdf normcdfinv lgamma tgamma j0 j1
jn y0 y1 yn cyl_bessel_i0 cyl_bessel_i1 fabs abs labs llabs floor ceil round rint lrint llrint
lround llround nearbyint trunc fmod remainder remquo modf frexp ldexp scalbn scalbln fma fmax
fmin fdim copysign nextafter nan isnan isinf isfinite signbit min max umin umax llmin llmax
sinf cosf tanf expf exp2f logf log2f powf sqrtf rsqrtf tanhf erff floorf ceilf rintf fabsf
fminf fmaxf fmodf __expf __logf __powf __fdividef __frcp_rn __int_as_float __float2half
__half2float __syncthreads atomicAdd atomicMax atomicCAS printf malloc free memcpy memset
assert
"""
CUDA_BUILTINS = """
threadIdx blockIdx blockDim gridDim warpSize dim3 uint3 float2 float4 int2 int4 half half2
size_t make_float4 make_int2 __shared__ __global__ __device__ __restrict__ __launch_bounds__
"""
C_CPP_WORDS = """
auto bool break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while alignas alignof and and_eq asm bitand bitor catch char16_t
char32_t class compl concept consteval constexpr constinit const_cast co_await co_return
co_yield decltype delete dynamic_cast explicit export false friend mutable namespace new
noexcept not not_eq nullptr operator or or_eq private protected public reinterpret_cast
requires static_assert static_cast template this thread_local throw true try typeid typename
using virtual wchar_t xor xor_eq main std
"""
HOST = """
NAN INFINITY HUGE_VAL NULL EOF errno stdin stdout stderr linux unix index time clock rand exit
signal div gamma aligned_alloc GOMP_parallel omp_get_num_threads as_emu as_launch as_error
as_floordiv as_floormod as_sigmoidf as_vl0 as_vs0 v_A k_A a__b 0abc x.y
autosched_parallel getpid syscall pthread_create pthread_detach sysconf sched_yield strtol getenv
open lseek mmap munmap close dladdr
"""

NAMES = sorted({s.name for s in onnx.defs.get_all_schemas()}
               | set((CUDA_MATH + CUDA_BUILTINS + C_CPP_WORDS + HOST).split()))
CUDA = "cuda -arch=sm_90"


def test_c_identifier_is_a_valid_name_under_its_prefix() -> None:
    for name in NAMES + ["input.1", "résumé", "3x3", "a b", "", "__x__"]:
        ident = c_identifier("v_", name)
        assert ident.startswith("v_") and "__" not in ident
        assert ident.isascii() and ident.replace("_", "a").isalnum()
    assert c_identifier("k_", "pow") == "k_pow" and c_identifier("v_", "input.1") == "v_input_1"


def _per_name_kernel(name: str) -> str:
    """The CUDA C of a row sum whose function, input, output and reduce axis are all ``name``."""
    A = te.placeholder((7, 5), name=name)
    k = te.reduce_axis((0, 5), name=name)
    B = te.compute((7,), lambda i: te.sum(A[i, k], axis=k), name=name)
    func = lower(te.create_schedule(B.op), [A, B], name=name)
    return generate(bind_unbound(func, threads=64), parse(CUDA)).code


@needs_nvrtc
def test_every_name_as_a_kernel_compiles_with_nvrtc() -> None:
    # one NVRTC run for all: the kernels of every name side by side in one program (__expf
    # and expf make the same kernel name, which only clashes in this joint program)
    names = {c_identifier(KERNEL_PREFIX, n): n for n in NAMES}.values()
    sources = [_per_name_kernel(n) for n in names]
    cut = sources[0].index('extern "C"')
    program = sources[0][:cut] + "".join(s[s.index('extern "C"'):] for s in sources)
    assert program.count("__global__") == len(names) > 400
    compile_cuda(program, "sm_90", name="names.cu")


def _weighted_sum(names: list[str]) -> tuple[list[te.Tensor], list[float]]:
    """Placeholders named ``names[2:]``; a reduction named ``names[0]`` over an axis named
    ``names[1]`` of their weighted sum (a workspace on CUDA), and an output named ``names[-1]``."""
    inputs = [te.placeholder((6, 3), name=n) for n in names[2:]]
    weights = [float(w) for w in np.linspace(0.5, 2.0, len(inputs))]
    k = te.reduce_axis((0, 3), name=names[1])

    def body(i: te.Var) -> te.Expr:
        terms = [x[i, k] * w for x, w in zip(inputs, weights)]
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return te.sum(total, axis=k)

    R = te.compute((6,), body, name=names[0])
    out = te.compute((6,), lambda i: R[i] * 3.0 + 1.0, name=names[-1])
    return inputs + [out], weights


def _chunks(size: int) -> list[list[str]]:
    return [NAMES[i:i + size] for i in range(0, len(NAMES), size)]


def _check(names: list[str], target: str, rng: np.random.Generator) -> None:
    args, weights = _weighted_sum(names)
    mod = aus.build(te.create_schedule(args[-1].op), args, target=target, name=names[0])
    arrays = [rng.uniform(-1, 1, (6, 3)).astype("float32") for _ in args[:-1]]
    out = np.full(6, np.nan, "float32")
    if target.startswith("cuda"):
        run_on_host(mod, *arrays, out)
    else:
        mod(*arrays, out)
    terms = [a.astype(np.float64) * w for a, w in zip(arrays, weights)]
    want = sum(terms).sum(axis=1) * 3 + 1
    # float32 sums of many terms that cancel: bound the error by the terms' magnitudes (n ulps of
    # the sum of absolute values), not by the result, which may be near zero
    magnitude = sum(np.abs(x) for x in terms).sum(axis=1) * 3 + 1
    bound = 3 * len(terms) * np.finfo(np.float32).eps * magnitude
    assert np.all(np.abs(out - want) <= bound), (out, want, bound)


@needs_nvrtc
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
@pytest.mark.parametrize("chunk", range(len(_chunks(160))))
def test_every_name_as_tensor_and_task_runs_host_emulated(chunk: int,
                                                          rng: np.random.Generator) -> None:
    _check(_chunks(160)[chunk], CUDA, rng)


@pytest.mark.parametrize("chunk", range(len(_chunks(160))))
def test_every_name_as_tensor_and_task_runs_on_llvm(chunk: int, rng: np.random.Generator) -> None:
    _check(_chunks(160)[chunk], "llvm", rng)


@pytest.mark.parametrize("name", ["memcpy", "memset", "malloc", "free", "aligned_alloc", "main",
                                  "sqrtf", "pow", "abort", "exit"])
def test_libc_symbols_as_llvm_function_names(name: str, rng: np.random.Generator) -> None:
    # the kernel allocates a buffer, runs a parallel loop, copies and calls expf: every runtime
    # function it needs must still be the C library's, not the kernel itself
    A = te.placeholder((64, 37), name="A")
    T = te.compute((64, 37), lambda i, j: te.exp(A[i, j]), name="T")
    C = te.compute((64, 37), lambda i, j: T[i, j] + A[i, j], name="C")
    s = te.create_schedule(C.op)
    s[C].parallel(C.op.axis[0])
    s[T].compute_root()
    s[T].parallel(T.op.axis[0])
    mod = aus.build(s, [A, C], target="llvm", name=name)
    a = rng.uniform(-2, 2, (64, 37)).astype("float32")
    c = np.full((64, 37), np.nan, "float32")
    mod(a, c)
    np.testing.assert_allclose(c, np.exp(a) + a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", [pytest.param(CUDA, marks=[needs_nvrtc, pytest.mark.skipif(
    unavailable() is not None, reason=str(unavailable()))]), "llvm"])
def test_names_of_symbolic_sizes(target: str, rng: np.random.Generator) -> None:
    # symbolic sizes become scalar parameters of the kernel: they are named too
    n, m = te.var("int"), te.var("blockIdx")
    A = te.placeholder((n, m), name="NAN")
    B = te.compute((n, m), lambda i, j: te.exp(A[i, j]) * 2.0, name="pow")
    mod = aus.build(te.create_schedule(B.op), [A, B], target=target, name="exp")
    a = rng.uniform(-1, 1, (13, 6)).astype("float32")
    b = np.full((13, 6), np.nan, "float32")
    if target == CUDA:
        run_on_host(mod, a, b)
    else:
        mod(a, b)
    np.testing.assert_allclose(b, np.exp(a) * 2, rtol=1e-6)


_SELF_CALL = """
import numpy as np, autosched as aus
from autosched import te
A = te.placeholder((37,), dtype="float64", name="A")
B = te.compute((37,), lambda i: te.exp(A[i]), name="B")
mod = aus.build(te.create_schedule(B.op), [A, B], target="llvm", name="exp")
a, b = np.random.rand(37), np.empty(37)
mod(a, b)
print(np.allclose(b, np.exp(a)))
"""


def test_llvm_kernel_named_like_the_libm_function_it_calls() -> None:
    # a one-node ONNX model (Exp on doubles) makes exactly this task; it runs in a process of
    # its own because the kernel recurses until the stack overflows
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SELF_CALL], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-500:]
