"""Host arrays as kernels take them: data on a 64-byte boundary (a cache line; kernels need
``PARAM_ALIGN`` = 16), so vector loads of a parameter never split a line for want of alignment."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ALIGN = 64


def aligned_empty(shape: Sequence[int], dtype: np.dtype | str) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    nbytes = max(size, 1) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes].view(dtype)[:size].reshape(tuple(shape))


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` on a 64-byte boundary."""
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out


def aligned(a: np.ndarray, boundary: int = 16) -> np.ndarray:
    """``a`` itself when its data is on a ``boundary``-byte boundary, else an aligned copy."""
    return a if a.ctypes.data % boundary == 0 else aligned_copy(a)
