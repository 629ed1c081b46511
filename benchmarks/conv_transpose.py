"""ConvTranspose on this CPU: the transposed convolutions of the model corpus (and two common
shapes from elsewhere), autosched's kernel untuned and tuned for ``--trials`` trials next to
onnxruntime's ConvTranspose alone (a one-node model), in one run.

    .venv/bin/python benchmarks/conv_transpose.py --trials 64
    .venv/bin/python benchmarks/conv_transpose.py --trials 0 --gather    # untuned, and the gather

``--gather`` adds the definition autosched used before it computed by output phase (every
output summed over all kernel taps, the ones that do not reach it masked by a divisibility
test), untuned, so that one run measures before and after. Every side is checked against
onnxruntime, then timed in alternating rounds on the same thread count (benchmarks/baseline.py):
the median round, the best in brackets. A round is about 0.5 s of calls: the kernel's own timer
(the median of 3 repeats of 150 ms) against the median ``InferenceSession.run``, whose Python
call (some 10 us) it includes. Prints the machine (CPU, LLVM's CPU name, load average) and a
table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402
from autosched.search.space import SearchSpace  # noqa: E402
from autosched.te import intrin as I  # noqa: E402
from autosched.te import ops  # noqa: E402
from autosched.te import reduce as R  # noqa: E402
from autosched.te.tensor import Tensor, compute, reduce_axis  # noqa: E402
from autosched.testing import models  # noqa: E402

# (where, data shape, output channels, kernel, stride, pads, output_padding)
SHAPES = [
    ("ppocr_det ConvTranspose.0", (1, 24, 120, 160), 24, 2, 2, 0, 0),
    ("ppocr_det ConvTranspose.2", (1, 24, 240, 320), 1, 2, 2, 0, 0),
    ("centerface deconv 0", (1, 24, 15, 20), 24, 2, 2, 0, 0),
    ("centerface deconv 1", (1, 24, 30, 40), 24, 2, 2, 0, 0),
    ("centerface deconv 2", (1, 24, 60, 80), 24, 2, 2, 0, 0),
    ("k3 s2 p1 op1 (U-Net, FPN)", (1, 64, 56, 56), 32, 3, 2, 1, 1),
    ("k4 s2 p1 (DCGAN)", (1, 64, 32, 32), 32, 4, 2, 1, 0),
]


def gather_transpose(data: Tensor, kernel: Tensor, stride: int, pad: int, opad: int) -> Tensor:
    """The former definition (ungrouped, undilated): out[n, f, y, x] sums data[n, c, (y + pad
    - ky) / stride, (x + pad - kx) / stride] * kernel[c, f, ky, kx] over every tap, where the
    divisions are exact and in range."""
    n, c, h, w = (int(d) for d in data.shape)
    _, o, kh, kw = (int(d) for d in kernel.shape)
    oh, ow = ((s - 1) * stride - 2 * pad + k + opad for s, k in ((h, kh), (w, kw)))
    rc, ry, rx = reduce_axis((0, c), "rc"), reduce_axis((0, kh), "ry"), reduce_axis((0, kw), "rx")

    def tap(pos: Any, r: Any, extent: int) -> tuple[Any, list[Any]]:
        at = pos - r + pad
        return I.floordiv(at, stride), [at >= 0, I.floormod(at, stride) == 0,
                                        at < extent * stride]

    def body(b: Any, f: Any, y: Any, x: Any) -> Any:
        (iy, cy), (ix, cx) = tap(y, ry, h), tap(x, rx, w)
        v = data[b, rc, iy, ix] * kernel[rc, f, ry, rx]
        return R.sum(I.if_then_else(I.all(*cy, *cx), v, te.const(0.0, "float32")),
                     axis=[rc, ry, rx])

    return compute((n, o, oh, ow), body, name="conv2d_transpose_nchw")


def ort_model(shape: tuple[int, ...], w: np.ndarray, stride: int, pad: int, opad: int) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[stride] * 2,
                            pads=[pad] * 4, output_padding=[opad] * 2)
    graph = helper.make_graph(
        [node], "conv_transpose", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def schedule(task: aus.Task, trials: int, work: Path) -> Any:
    if not trials:
        return SearchSpace(task).default_schedule()
    log = work / f"{task.name}.jsonl"
    aus.tune(task, trials=trials, log=log, options=aus.TuneOptions(seed=0, verbose=False))
    return aus.best_schedule(task, log)


def kernel_timer(task: aus.Task, sch: Any, x: np.ndarray, w: np.ndarray
                 ) -> tuple[np.ndarray, Callable[[], float]]:
    """The output of the built kernel, and a timer of one round."""
    mod = task.build(sch)
    out = np.empty(tuple(int(d) for d in task.outputs[0].shape), "float32")
    mod(x, w, out)
    return out.copy(), lambda: mod.time(x, w, out, repeat=3, min_repeat_ms=150).median


def sides(row: tuple, args: argparse.Namespace, work: Path, rng: np.random.Generator
          ) -> tuple[dict[str, Callable[[], float]], float]:
    """The timers of one shape (each checked against onnxruntime) and its GFLOP."""
    where, shape, o, k, stride, pad, opad = row
    x = rng.uniform(-1, 1, shape).astype("float32")
    w = rng.uniform(-1, 1, (shape[1], o, k, k)).astype("float32")
    sess = models.ort_session(ort_model(shape, w, stride, pad, opad), args.threads)
    (want,) = sess.run(None, {"x": x})
    data, kern = te.placeholder(shape, name="x"), te.placeholder(w.shape, name="w")
    variants = {"phases": lambda: ops.conv2d_transpose_nchw(data, kern, stride, pad, opad)}
    if args.gather:
        variants["gather"] = lambda: gather_transpose(data, kern, stride, pad, opad)
    timers: dict[str, Callable[[], float]] = {}
    for name, build in variants.items():
        y = build()
        task = aus.Task(lambda y=y: [data, kern, y], target="llvm", name=f"conv_transpose_{name}")
        budgets = [0] + ([args.trials] if name == "phases" and args.trials else [])
        for trials in budgets:
            got, timer = kernel_timer(task, schedule(task, trials, work / where), x, w)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{where} {name}")
            timers[f"{name} {f'{trials} trials' if trials else 'untuned'}"] = timer
    timers["onnxruntime"] = lambda: baseline.median_seconds(
        lambda: sess.run(None, {"x": x}), min_s=0.5)
    macs = np.prod(shape) * o * k * k
    return timers, 2 * macs / 1e9


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=64, help="tuning trials (0: untuned only)")
    ap.add_argument("--gather", action="store_true", help="add the former gather definition")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="both sides' threads")
    ap.add_argument("--only", help="run the shapes whose name contains this")
    args = ap.parse_args(argv)
    os.environ["AUTOSCHED_NUM_THREADS"] = str(args.threads)
    print(baseline.header())
    print(f"# peer: {baseline.ort_peer(args.threads)}; autosched threads {args.threads}, "
          f"OMP_WAIT_POLICY {baseline.omp_wait_policy()}")
    print(f"# ms: median of {args.rounds} alternating rounds (best round)", flush=True)
    work = Path(tempfile.mkdtemp(prefix="conv_transpose_"))
    rng = np.random.default_rng(0)
    header: list[str] = []
    for row in SHAPES:
        if args.only and args.only not in row[0]:
            continue
        (work / row[0]).mkdir()
        timers, gflop = sides(row, args, work, rng)
        got = baseline.alternate(timers, args.rounds)
        if not header:
            header = list(got)
            print("| shape | in -> out ch, k, stride | GFLOP | load | "
                  + " | ".join(f"{n} ms" for n in header) + " |")
            print("|---|---|---:|---:|" + "---:|" * len(header))
        where, shape, o, k, stride, pad, opad = row
        cells = " | ".join(f"{got[n].median * 1e3:.3f} ({got[n].best * 1e3:.3f})" for n in header)
        print(f"| {where} {shape[2]}x{shape[3]} | {shape[1]} -> {o}, {k}, {stride} | "
              f"{gflop:.3f} | {os.getloadavg()[0]:.2f} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
