"""Tests of the backends (autosched/targets), one folder each: llvm/ (codegen, runtime,
cross compilation under qemu), cuda/ (CUDA C and NVRTC without a GPU, the host emulator, and
test_cuda_gpu.py on a GPU), ref/ (the reference evaluator); test_names.py runs names from the
outside world through all of them. No fixtures beyond the root conftest's."""
