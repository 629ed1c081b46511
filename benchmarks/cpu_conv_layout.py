"""The ResNet-18 convolutions on the CPU with their untuned default schedules, kernel OIHW
(sums NCHW, the row is the vector) next to IHWO (sums channels-last, output channels the
vector; what the graph compiler uses for CPU targets), each followed by ReLU, checked against
each other. Prints a table.

    .venv/bin/python benchmarks/cpu_conv_layout.py [C,HW,K,STRIDE,KSIZE ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.search.space import SearchSpace  # noqa: E402
from autosched.te import ops  # noqa: E402

# (in channels, input size, out channels, stride, kernel size) of ResNet-18 at 224
LAYERS = [(3, 224, 64, 2, 7), (64, 56, 64, 1, 3), (64, 56, 128, 2, 3), (128, 28, 128, 1, 3),
          (128, 28, 256, 2, 3), (256, 14, 256, 1, 3), (256, 14, 512, 2, 3), (512, 7, 512, 1, 3),
          (256, 14, 512, 2, 1)]


def conv_task(c: int, hw: int, k: int, stride: int, ks: int, layout: str) -> aus.Task:
    x = te.placeholder((1, c, hw, hw), name="x")
    w = te.placeholder((k, c, ks, ks) if layout == "OIHW" else (c, ks, ks, k), name="w")
    y = ops.relu(ops.conv2d_nchw(x, w, stride=stride, padding=ks // 2, kernel_layout=layout))
    return aus.Task(lambda: [x, w, y], target="llvm", name=f"conv_{layout}")


def main(argv: list[str]) -> int:
    layers = [tuple(int(v) for v in a.split(",")) for a in argv] or LAYERS
    rng = np.random.default_rng(0)
    print("| C | HW | K | stride | k | OIHW ms | IHWO ms | OIHW GFLOPS | IHWO GFLOPS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, hw, k, stride, ks in layers:
        x = rng.uniform(-1, 1, (1, c, hw, hw)).astype("float32")
        w = rng.uniform(-1, 1, (k, c, ks, ks)).astype("float32")
        ms, gf, outs = {}, {}, {}
        for layout in ("OIHW", "IHWO"):
            task = conv_task(c, hw, k, stride, ks, layout)
            mod = task.build(SearchSpace(task).default_schedule())
            wv = w if layout == "OIHW" else np.ascontiguousarray(w.transpose(1, 2, 3, 0))
            out = np.empty(tuple(task.outputs[0].shape), "float32")
            mod(x, wv, out)
            outs[layout] = out.copy()
            t = mod.time(x, wv, out, repeat=5, min_repeat_ms=50).median
            ms[layout], gf[layout] = t * 1e3, task.flop_count / t / 1e9
        np.testing.assert_allclose(outs["IHWO"], outs["OIHW"], rtol=1e-4, atol=1e-4)
        print(f"| {c} | {hw} | {k} | {stride} | {ks} | {ms['OIHW']:.3f} | {ms['IHWO']:.3f} | "
              f"{gf['OIHW']:.1f} | {gf['IHWO']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
