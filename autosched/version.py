"""The version of autosched (stored in every tuning record; pyproject.toml says the same)."""

__version__ = "0.1.0"
