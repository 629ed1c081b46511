"""What a kernel reports when it fails at run time, for every backend.

A compiled kernel returns (LLVM) or ORs into a status word (CUDA: a pointer parameter of the
kernels that check something) an int32: 0, or the STATUS_* bits below; the reference evaluator
raises at once. A kernel never touches memory it has no right to; when the status is not 0 its
outputs are not valid and the caller raises ``KernelFailure``.

Example::

    status = kernel(*args)
    if status:
        raise KernelFailure("conv", status)   # "conv: could not allocate ..."
"""

from __future__ import annotations

from autosched.errors import RuntimeError_

STATUS_ALLOC = 1  # an allocation failed: out of memory, or its byte count overflowed int64
STATUS_INDEX = 2  # an index loaded from a tensor (Gather) was out of range
STATUS_MESSAGES = {
    STATUS_ALLOC: "could not allocate an intermediate buffer (out of memory, or its size "
                  "overflows int64)",
    STATUS_INDEX: "an index read from the indices tensor is out of range",
}


def status_message(status: int) -> str:
    """What the failure bits of a kernel's status mean, in words."""
    known = [m for bit, m in STATUS_MESSAGES.items() if status & bit]
    unknown = status & ~sum(STATUS_MESSAGES)
    return "; ".join(known + ([f"unknown status bits {unknown:#x}"] if unknown else []))


class KernelFailure(RuntimeError_):
    """A kernel ran and reported a failure (the STATUS_* bits in ``status``); ``detail`` says
    more where the backend knows it (the reference evaluator: the index and the axis length)."""

    def __init__(self, kernel: str, status: int, detail: str = "") -> None:
        super().__init__(f"{kernel}: {status_message(status)}" + (f" ({detail})" if detail else ""))
        self.kernel = kernel
        self.status = status
        self.detail = detail

    def within(self, kernel: str) -> KernelFailure:
        """The same failure, reported by the function ``kernel`` that ran the failing code."""
        return KernelFailure(kernel, self.status, self.detail)
