"""Tests of the ONNX importer (importers/): import and converters against onnxruntime, ONNX's
own backend conformance suite (its real models are marked slow), hostile models, control flow.
No fixtures beyond the root conftest's."""
