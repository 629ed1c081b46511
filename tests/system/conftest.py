"""Tests of the whole system under stress: threads sharing a model, tuning jobs killed and
resumed, caches and deployed builds that must not be trusted, hostile sizes, the CLI's errors.
The soak versions are marked slow. No fixtures beyond the root conftest's."""
