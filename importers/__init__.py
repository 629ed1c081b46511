"""Model importers: each turns a model file into an autosched Graph (see autosched/graph).

Example::

    from importers import from_onnx
    g = from_onnx("resnet18.onnx", shapes={"input": (1, 3, 224, 224)})
"""

from importers.onnx import from_onnx

__all__ = ["from_onnx"]
