"""Whether NVRTC can compile here: the CUDA tests that need no GPU still need NVRTC."""

from __future__ import annotations

import pytest

from autosched.errors import CompileError


def nvrtc_skip_reason() -> str | None:
    try:
        from autosched.targets.cuda.nvrtc import nvrtc_version

        nvrtc_version()
    except CompileError as exc:
        return str(exc)
    return None


NVRTC_SKIP = nvrtc_skip_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_SKIP is not None, reason=f"NVRTC unavailable: {NVRTC_SKIP}")
