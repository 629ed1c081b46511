"""Tests of the graph layer (autosched/graph): passes, fusion, task extraction, the CPU and GPU
executors (the GPU one on a fake driver), and values at the edges of what they take, against
numpy and onnxruntime. No fixtures beyond the root conftest's."""
