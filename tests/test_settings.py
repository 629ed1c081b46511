"""Every environment variable autosched reads is declared in autosched/settings.py, read at call
time, and listed in the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autosched import settings

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_reads_an_autosched_variable_itself() -> None:
    """os.environ / getenv with an AUTOSCHED_ name only in settings.py (workers' environments
    that pass a variable on are writes, not reads)."""
    read = re.compile(r"""(environ\.get|getenv|environ\[)\(?\s*["']AUTOSCHED_""")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "autosched").rglob("*.py")
                 if p.name != "settings.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if read.search(line)]
    assert not offenders, offenders


def test_the_readme_lists_every_setting() -> None:
    assert settings.describe() in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("1", True), ("", True),
                                       ("yes", True)])
def test_flags_are_read_when_used(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    from autosched.graph.threads import adaptive
    from autosched.search.device_lock import enabled

    monkeypatch.setenv("AUTOSCHED_ADAPTIVE_THREADS", value)
    monkeypatch.setenv("AUTOSCHED_MEASURE_LOCK", value)
    assert adaptive() is on and enabled() is on
