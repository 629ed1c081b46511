"""Settings of the fuzzing tests, from ``--fuzz-cases`` and ``--fuzz-seed`` (tests/conftest.py
registers the options and calls ``configure``). Hypothesis fixes a test's settings while its
module is imported, before any fixture runs, so the modules read them from here."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_FUZZ_CASES = 500
DEFAULT_FUZZ_SEED = 20261204


@dataclass
class Fuzz:
    cases: int = DEFAULT_FUZZ_CASES
    seed: int = DEFAULT_FUZZ_SEED


FUZZ = Fuzz()


def configure(cases: int, seed: int) -> None:
    FUZZ.cases, FUZZ.seed = cases, seed
