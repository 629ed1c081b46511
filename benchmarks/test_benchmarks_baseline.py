"""benchmarks/baseline.py: peers run at their best (OpenBLAS's own kernel), rounds alternate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import baseline

ROOT = Path(__file__).resolve().parents[1]

# numpy imported first, with OpenBLAS forced to Haswell: prepare() must start the script again
# without the variables, and print which kernel numpy then runs
_SCRIPT = """
import json, os, sys
sys.path.insert(0, {root!r})
import numpy
from benchmarks import baseline
baseline.prepare()
blas = baseline.numpy_blas()
print(json.dumps([blas.kernel, os.environ.get("OPENBLAS_CORETYPE")]))
"""


def _kernel_in_subprocess(env: dict[str, str], prepare: bool) -> list:
    code = _SCRIPT.format(root=str(ROOT))
    if not prepare:
        code = code.replace("baseline.prepare()", "")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_prepare_restarts_without_the_forced_kernel() -> None:
    pytest.importorskip("threadpoolctl")
    clean = {k: v for k, v in os.environ.items() if k not in baseline.FORCED_BLAS_VARS}
    own, _ = _kernel_in_subprocess(clean, prepare=False)
    forced = "Haswell" if own != "Haswell" else "Prescott"
    env = dict(clean, OPENBLAS_CORETYPE=forced, OPENBLAS_L2_SIZE="512")
    assert _kernel_in_subprocess(env, prepare=False)[0] == forced  # the handicap is real
    assert _kernel_in_subprocess(env, prepare=True) == [own, None]


def test_check_blas_refuses_avx2_kernel_on_avx512() -> None:
    slow = baseline.Blas("openblas 0.3.31", "Haswell", 2)
    with pytest.raises(baseline.PeerError, match="Haswell kernel on an AVX-512"):
        baseline.check_blas(slow, "AVX-512")
    baseline.check_blas(slow, "AVX2")  # Haswell is that CPU's own kernel
    baseline.check_blas(baseline.Blas("openblas 0.3.31", "SkylakeX", 2), "AVX-512")


def test_alternate_rotates_and_reports_median_and_best() -> None:
    rng = np.random.default_rng()
    values = {n: list(rng.uniform(0.5, 2.0, 5)) for n in ("a", "b", "c")}
    order: list[str] = []

    def timer(name: str):  # noqa: ANN202
        def once() -> float:
            order.append(name)
            return values[name][sum(o == name for o in order) - 1]
        return once

    got = baseline.alternate({n: timer(n) for n in values}, rounds=5)
    assert order[:6] == ["a", "b", "c", "b", "c", "a"]  # each round starts one later
    for name, r in got.items():
        assert r.seconds == tuple(values[name])
        assert r.median == pytest.approx(float(np.median(values[name])))
        assert r.best == min(values[name])
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        baseline.alternate({"a": timer("a")}, rounds=0)


def test_header_states_machine() -> None:
    line = baseline.header()
    assert line.startswith("# ") and "commit " in line and "load average" in line
    assert baseline.isa() in line and f"{os.cpu_count()} cores" in line


def test_core_round_trip_is_measured_where_it_can_be() -> None:
    import shutil

    trip = baseline.core_round_trip_ns()
    if (os.cpu_count() or 1) < 2 or not (shutil.which("cc") or shutil.which("gcc")):
        assert trip is None
    else:  # a cache line between two cores: tens to thousands of nanoseconds, never zero
        assert trip is not None and 5 < trip < 100_000, trip
        assert "core-to-core round trip" in baseline.header()
