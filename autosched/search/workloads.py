"""Named operators at given shapes, for the CLI and the benchmarks.

    gemm M N K                   C[M, N] = A[M, K] @ B[K, N]
    conv2d N C H W O KH KW S P   NCHW data, OIHW kernel, stride S, padding P
    depthwise_conv2d N C H W K S P
    batch_matmul B M K N         [B, M, K] @ [B, K, N]
    softmax M N                  over the last axis
"""

from __future__ import annotations

from collections.abc import Callable

from autosched.errors import TEError
from autosched.te import ops
from autosched.te.tensor import Tensor, placeholder


def gemm(M: int, N: int, K: int) -> list[Tensor]:
    A = placeholder((M, K), name="A")
    B = placeholder((K, N), name="B")
    return [A, B, ops.matmul(A, B)]


def conv2d(N: int, C: int, H: int, W: int, O: int, KH: int, KW: int, S: int = 1, P: int = 0) -> list[Tensor]:  # noqa: E741
    x = placeholder((N, C, H, W), name="data")
    w = placeholder((O, C, KH, KW), name="kernel")
    return [x, w, ops.conv2d_nchw(x, w, stride=S, padding=P)]


def depthwise_conv2d(N: int, C: int, H: int, W: int, K: int, S: int = 1, P: int = 0) -> list[Tensor]:
    x = placeholder((N, C, H, W), name="data")
    w = placeholder((C, 1, K, K), name="kernel")
    return [x, w, ops.conv2d_nchw(x, w, stride=S, padding=P, groups=C)]


def batch_matmul(B: int, M: int, K: int, N: int) -> list[Tensor]:
    a = placeholder((B, M, K), name="A")
    b = placeholder((B, K, N), name="B")
    return [a, b, ops.batch_matmul(a, b)]


def softmax(M: int, N: int) -> list[Tensor]:
    x = placeholder((M, N), name="x")
    return [x, ops.softmax(x, axis=-1)]


WORKLOADS: dict[str, Callable[..., list[Tensor]]] = {
    "gemm": gemm,
    "conv2d": conv2d,
    "depthwise_conv2d": depthwise_conv2d,
    "batch_matmul": batch_matmul,
    "softmax": softmax,
}


def make(name: str, shape: list[int]) -> list[Tensor]:
    if name not in WORKLOADS:
        raise TEError(f"unknown operator {name!r}; known: {', '.join(WORKLOADS)}")
    try:
        return WORKLOADS[name](*shape)
    except TypeError as exc:
        raise TEError(f"{name} takes {WORKLOADS[name].__doc__ or 'its shape'}: {exc}; see "
                      f"autosched.search.workloads") from None
