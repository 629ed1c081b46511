"""te.thread_axis takes TVM's arguments: a domain, a tag, and a name for its variable."""

from __future__ import annotations

import pytest

from autosched import te
from autosched.errors import TEError


def test_thread_axis_name_names_the_variable():
    vx = te.thread_axis((0, 2), "vthread", name="vx")
    assert (vx.name, vx.thread_tag, vx.dom.extent.value) == ("vx", "vthread", 2)
    assert te.thread_axis("vthread", name="vy").name == "vy"


def test_thread_axis_name_defaults_to_the_tag():
    tx = te.thread_axis("threadIdx.x")
    assert (tx.name, tx.thread_tag) == ("threadIdx.x", "threadIdx.x")


def test_thread_axis_name_must_be_a_string():
    with pytest.raises(TEError, match="thread_axis vthread: name must be a str, got 3"):
        te.thread_axis((0, 2), "vthread", name=3)  # type: ignore[arg-type]
