"""GPU sketch candidates of SGEMM that measured WRONG_ANSWER on the H200 (2026-12-02, sgemm
4096) while the reference evaluator ran the same loop IR correctly: the knob values (the log's
extra.candidate) and the lowered candidate for a size. The search, CUDA host-emulation tests and
benchmarks/gpu_diagnose.py pin them."""

from __future__ import annotations

import autosched as aus
from autosched.search.space import Candidate, Lowered, SearchSpace
from autosched.search.task import Task
from autosched.search.workloads import make

FAILING = [
    {"T_matmul.tile.i0": (8, 1, 1), "T_matmul.tile.i1": (4, 2, 4), "T_matmul.rtile.k": (4, 1),
     "T_matmul.fetch_vector": 4, "T_matmul.unroll": 0},
    {"T_matmul.tile.i0": (8, 4, 4), "T_matmul.tile.i1": (1, 4, 8), "T_matmul.rtile.k": (2, 8),
     "T_matmul.fetch_vector": 4, "T_matmul.unroll": 0},
    {"T_matmul.tile.i0": (4, 2, 1), "T_matmul.tile.i1": (32, 2, 2), "T_matmul.rtile.k": (2, 4),
     "T_matmul.fetch_vector": 1, "T_matmul.unroll": 0},
]


def lowered(params: dict, n: int) -> tuple[Task, Lowered]:
    """The n x n x n SGEMM task for sm_90 and its candidate with knob values ``params``."""
    tensors = make("gemm", [n, n, n])
    task = aus.Task(lambda: tensors, target="cuda -arch=sm_90", name="sgemm")
    space = SearchSpace(task)
    knobs = space.sketches[0].knobs
    low = space.lower(Candidate(0, tuple((k.name, params.get(k.name, k.default())) for k in knobs)))
    assert low is not None
    return task, low
