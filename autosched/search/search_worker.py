"""A worker process of ``tune.model_schedules``: reads (tasks, seed) pickled on stdin, writes
each task's ``model_candidates`` pickled on stdout. Started by ``measure.isolated_argv`` (the
parent's own data flows through the pipes; nothing else is read)."""

from __future__ import annotations

import os
import pickle
import sys


def main(argv: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # XGBoost predicts on one thread: workers share cores
    from autosched.search.measure_worker import die_with_parent
    from autosched.search.tune import model_candidates

    die_with_parent()
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed meanwhile must not corrupt the answer
    tasks, seed = pickle.load(sys.stdin.buffer)
    pickle.dump([model_candidates(t, seed=seed) for t in tasks], out)
    out.flush()
