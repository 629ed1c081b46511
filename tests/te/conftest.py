"""Tests of the expression IR and the operator library (autosched/te): an operator test that
takes ``target`` runs on every backend of ``--targets``, the numpy TE interpreter ("interp")
included, and compares with numpy or onnxruntime."""

from __future__ import annotations

import pytest

from tests.support import backends


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backends.parametrize_target(metafunc)
