"""Precision modes (fp32, tf32, fp16, bf16): the targets they run on, the models they compile,
and the one check of outputs against an fp32 reference, with the tolerance of the precision
(te.dtype.PRECISIONS, the table the tuner's candidate check uses)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from autosched.search.measure_worker import compare
from autosched.testing import models
from tests.support.nvrtc import NVRTC_SKIP


def _host_emulation_skip() -> str | None:
    from autosched.targets.cuda.host_emulate import unavailable

    return NVRTC_SKIP or unavailable()


HOST_SKIP = _host_emulation_skip()

# CPU code, the CUDA C run on the host, and the GPU (marked gpu: the same checks on a device)
TARGETS = [
    "llvm",
    pytest.param("cuda -emulate=host", marks=pytest.mark.skipif(
        HOST_SKIP is not None, reason=str(HOST_SKIP))),
    pytest.param("cuda", marks=pytest.mark.gpu),
]

HALF = ["fp16", "bf16"]

# Small versions of the project's models: the demo CNN, ResNet-18 on 32x32 images, and one
# transformer encoder layer (MatMul, Softmax, LayerNormalization, Gelu) at sequence 16
MODELS: dict[str, Callable[[], Any]] = {
    "small_cnn": lambda: models.small_cnn(),
    "resnet18_small": lambda: models.resnet18(image=32, classes=10),
    "encoder_layer": lambda: models.bert_layer(seq=16, hidden=64, heads=4, ffn=128),
}


def assert_close(got: list[np.ndarray], want: list[np.ndarray], precision: str,
                 what: str) -> None:
    """Every output of ``got`` within ``precision``'s tolerance of the fp32 ``want``, same
    shapes and float32 dtype (inputs and outputs stay float32 in every precision)."""
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.float32 and g.shape == w.shape, f"{what}: output {k}"
        problem = compare(f"{k}", g, w, precision)
        assert problem is None, f"{what}: {problem}"
