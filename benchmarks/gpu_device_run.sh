#!/usr/bin/env bash
# One device-machine batch: environment facts, CUDA tests, operator tests on "cuda", SGEMM.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-wheels/*.whl
#   PYTHONPATH=/tmp/site:$PWD bash benchmarks/gpu_device_run.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
{
echo "== environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 - <<'PY'
import cuda.bindings, pycuda, pycuda.driver as drv
from autosched.targets.cuda.nvrtc import nvrtc_version, include_dirs
drv.init()
print("cuda-bindings", cuda.bindings.__version__, "NVRTC", nvrtc_version(),
      "pycuda", pycuda.VERSION, "driver", drv.get_driver_version(), "fp16 headers", include_dirs())
PY
python3 -m pip list 2>/dev/null | grep -i -E "^(cuda-bindings|nvidia-cuda-nvrtc|nvidia-cuda-runtime|torch|numpy) "
echo "== CUDA backend tests"
python3 -m pytest tests/targets/cuda/test_cuda_gpu.py tests/targets/cuda/test_cuda_codegen.py tests/targets/cuda/test_cuda_cases.py -rfEs -p no:cacheprovider 2>&1 | tail -15
echo "== operator and schedule tests on the cuda target"
python3 -m pytest tests/*/test_ops_*.py tests/schedule/test_schedule.py --targets cuda -k cuda -rfE -p no:cacheprovider 2>&1 | tail -15
echo "== SGEMM"
python3 benchmarks/gpu_sgemm.py "$@"
} 2>&1 | tee "$OUT/device_log.txt"
