"""Models and schedules shared by the tests and the benchmarks: ONNX models built with
onnx.helper (``models``; onnxruntime runs them for comparison) and the hand-written CUDA SGEMM
schedule (``gpu_sgemm_schedule``)."""
