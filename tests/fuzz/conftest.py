"""The fuzzing tier: random ONNX graphs, schedule steps and tuning-log lines, drawn by
hypothesis. ``--fuzz-cases`` and ``--fuzz-seed`` (tests/support/options.py) set how many and
from which seed. No fixtures beyond the root conftest's."""
