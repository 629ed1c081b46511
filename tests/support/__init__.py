"""What the tests share: backends to run on, comparisons, random inputs, one-node ONNX models,
the TE interpreter oracle, fuzzing generators and the real-model corpus."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the working directory and import path of subprocesses the tests start."""
