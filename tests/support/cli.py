"""Test helpers for the ``autosched`` command line."""

from __future__ import annotations

import pytest

from autosched.cli import main


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """Run ``autosched ARGV`` in this process: it must exit 2 with one line on stderr, no
    traceback, holding every needle. Returns that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err
