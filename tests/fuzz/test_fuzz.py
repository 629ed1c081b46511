"""Fuzzing tier: random small ONNX graphs compiled for llvm (default schedules) and compared with
onnxruntime.

CI runs ``--fuzz-cases`` (500 by default) seeded cases; `make test-fuzz` runs 5,000 with a
fresh seed (``--fuzz-seed`` replays one). A failure prints the model's nodes; hypothesis
shrinks it to a small graph first.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("hypothesis")
pytest.importorskip("onnxruntime")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from autosched.testing.models import ort_session  # noqa: E402
from tests.support.fuzz_graphs import graphs  # noqa: E402
from tests.support.options import FUZZ  # noqa: E402

CASES = FUZZ.cases
SEED = FUZZ.seed


def test_fuzz_settings_are_stated(capsys) -> None:  # noqa: ANN001
    with capsys.disabled():
        print(f"\nfuzzing tier: {CASES} graph cases, --fuzz-seed={SEED}")
    assert CASES >= 1


def _onnxruntime(model, x: np.ndarray) -> list[np.ndarray] | None:  # noqa: ANN001
    try:
        sess = ort_session(model)
    except Exception:  # noqa: BLE001  a graph onnxruntime rejects says nothing about us
        return None
    return sess.run(None, {"x": x})


@seed(SEED)
@settings(max_examples=CASES, deadline=None, database=None, derandomize=False,
          suppress_health_check=list(HealthCheck), print_blob=True)
@given(graphs())
def test_random_graph_matches_onnxruntime(case) -> None:  # noqa: ANN001
    import autosched as aus
    from importers.onnx import from_onnx

    model, x = case
    want = _onnxruntime(model, x)
    if want is None:
        return
    graph = from_onnx(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no tuning record": expected
        got = aus.compile(graph, target="llvm").run({"x": x})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)
