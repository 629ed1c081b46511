"""Identifiers in generated code, for every backend.

A generated name comes from names the user chose (tasks, tensors, axes, symbolic sizes) and
must not collide with anything the compiler, the C library or the runtime already defines: a
kernel called ``exp`` that calls ``exp``, a buffer called ``NAN``, a loop variable called
``int``. So each backend puts every name it generates under a prefix of its own, through
``c_identifier``; no header or library defines names with those prefixes.

Example::

    c_identifier("k_", "pow")          # 'k_pow'
    c_identifier("v_", "input.1")      # 'v_input_1'
    c_identifier("v_", "a__b")         # 'v_a_b' (C++ reserves names containing __)
"""

from __future__ import annotations

import re


def c_identifier(prefix: str, name: str) -> str:
    """``name`` as a C identifier under ``prefix``: characters other than ASCII letters, digits
    and ``_`` become ``_``, and runs of ``_`` shrink to one."""
    return re.sub(r"_+", "_", prefix + re.sub(r"[^A-Za-z0-9_]", "_", name))
