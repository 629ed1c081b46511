"""What every test shares: the suite's options, the one GPU marker (tests marked ``gpu`` skip
without a GPU), the ``slow`` marker (deselected unless ``--slow`` or ``-m`` names it) and a
fresh random generator per test. Each layer's folder has its own conftest.py.

    pytest tests --targets ref              # the numeric tests on the reference evaluator only
    pytest tests --slow                     # with the soak tests and the heavy models
    pytest tests/fuzz --fuzz-cases 5000 --fuzz-seed 7
    pytest tests --seed 123                 # replays the random inputs a failure printed
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.support import backends, options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("autosched")
    group.addoption("--targets", help="comma-separated backends of the numeric tests (default: "
                    f"{','.join(backends.CPU_TARGETS)}; also interp, cuda)")
    group.addoption("--slow", action="store_true", help="run the tests marked slow too")
    group.addoption("--seed", type=int, help="seed of the rng fixture (replays a failure)")
    group.addoption("--fuzz-cases", type=int, default=options.DEFAULT_FUZZ_CASES,
                    help="random graphs of the fuzzing tier; the log and schedule fuzzers draw "
                         "a share of it (default: %(default)s)")
    group.addoption("--fuzz-seed", type=int, default=options.DEFAULT_FUZZ_SEED,
                    help="seed of the fuzzing tier (default: %(default)s)")


def pytest_configure(config: pytest.Config) -> None:
    # the suite compiles hundreds of GPU graphs without a log: under "auto" each task would
    # run a cost-model search first; the tests of "auto" and "model" name them themselves
    os.environ["AUTOSCHED_SCHEDULE"] = "default"
    backends.configure(config.getoption("targets"))
    options.configure(config.getoption("fuzz_cases"), config.getoption("fuzz_seed"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("slow") and "slow" not in config.getoption("markexpr"):
        slow = [item for item in items if "slow" in item.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if "slow" not in item.keywords]
    if backends.GPU_SKIP is not None:
        skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU: {backends.GPU_SKIP}")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Fresh random inputs every run. The seed is printed (pytest shows it with a failure) and
    ``--seed`` replays it."""
    seed = request.config.getoption("seed")
    if seed is None:
        seed = np.random.SeedSequence().entropy % 2**63
    print(f"{request.node.nodeid}: --seed={seed}")
    return np.random.default_rng(seed)
