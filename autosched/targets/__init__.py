"""Targets: descriptions (target.py), the Backend / Module interface and its registry
(backend.py), and one package per backend (llvm/, cuda/, ref/)."""

from autosched.targets.target import Target

__all__ = ["Target"]
