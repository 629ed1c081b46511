"""benchmarks/pretrain_cost_model.py's plots of a held-out evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autosched.cost_model import pretrain
from autosched.cost_model.features import N_FEATURES


def test_held_out_plot_writes_one_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from benchmarks.pretrain_cost_model import held_out_plot

    rng = np.random.default_rng()
    samples = pretrain.Samples()
    for g in range(3):  # three workloads of ten candidates, one made-up feature deciding
        for _ in range(10):
            x = rng.uniform(0, 4, (2, N_FEATURES))
            samples.add(x, 1e-3 / (1 + x[:, 0].max()) * rng.uniform(0.9, 1.1), f"w{g}@t", f"w{g}")
    model = pretrain.train(samples, 8)
    held_out_plot(tmp_path / "plots")("workloads of a.jsonl, b.jsonl", model, samples)
    (png,) = (tmp_path / "plots").iterdir()
    assert png.name == "cost_model_held_out_workloads_of_a_jsonl_b_jsonl.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
