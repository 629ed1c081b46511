"""Targets: descriptions (target.py) and one module per backend (llvm/, cuda/)."""

from autosched.targets.target import Target

__all__ = ["Target"]
