"""CPU benchmark: hand-scheduled GEMM and conv2d through the LLVM backend against numpy, and
the model compiler's untuned Gemm over a constant weight against onnxruntime.

    .venv/bin/python benchmarks/cpu_gemm.py [--quick] [--weights-only] [--layouts]

GEMM 1024^3 float32, scheduled in the style of the classic TVM CPU GEMM tutorial: B packed into
column panels (array packing), C computed in 8x32 register tiles (blocking, loop permutation,
cache_write "local" accumulators unrolled over rows and vectorized over columns), tiles run in
parallel. conv2d 3x3, stride 1, pad 1, (1,64,56,56) -> 64 channels: padding as its own stage,
4 output channels x 56 columns of accumulators per tile. numpy runs in the same process (np.matmul;
for the convolution im2col + matmul, im2col included in its time) with OpenBLAS's own kernel for
this CPU (benchmarks/baseline.py), alternating with ours over a few rounds. Prints GFLOPS of the
median round and of the best round, and the ratios. --threads sets our thread count (the target
llvm -num-cores=N; default: all cores); OPENBLAS_NUM_THREADS numpy's.

Weight Gemms (WEIGHT_GEMMS: ddddocr's 20 x 1024 x 8210 classifier, MobileNetV2's 1 x 1280 x
1000): a one-node ONNX Gemm (transB=1, a bias), as torch's Linear exports it, compiled by
``aus.compile`` with untuned defaults, where the weight is stored as column panels
(passes.pack_gemm_weights); beside it the same Gemm with the weight fed as a (K, N) input,
which compiles to the kernel the weight got before panels (a (K, N) matrix), and onnxruntime
running the constant-weight model (its own prepacked weight). Each side is one whole run of
its model, alternating; milliseconds of the median round and of the best.

--layouts: the untuned default schedule of matmul + bias over a (K, N) weight against the same
over panels (te.ops.panel_matmul), kernels alone, for LAYOUT_SHAPES (where panels pay).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched import te  # noqa: E402


def gemm_schedule(M: int, N: int, K: int, mr: int = 8, nr: int = 32):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    # array packing: each nr-wide column panel of B becomes contiguous along k
    Bp = te.compute((N // nr, K, nr), lambda x, y, z: B[y, x * nr + z], name="Bp")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * Bp[j // nr, k, j % nr], axis=k),
                   name="C")
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")  # the mr x nr accumulator tile, kept in registers
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, mr, nr)
    tile = s[C].fuse(io, jo)
    s[C].parallel(tile)
    s[C].vectorize(ji)
    s[CC].compute_at(s[C], tile)
    xc, yc = s[CC].op.axis
    (kc,) = s[CC].op.reduce_axis
    s[CC].reorder(kc, xc, yc)  # k outermost: each step is mr broadcasts x nr/16 vector FMAs
    s[CC].unroll(xc)
    s[CC].vectorize(yc)
    x, _, z = s[Bp].op.axis
    s[Bp].vectorize(z)
    s[Bp].parallel(x)
    return s, [A, B, C]


def conv_schedule(C_in: int, H: int, W: int, C_out: int, fr: int = 4):
    A = te.placeholder((1, C_in, H, W), name="A")
    Wt = te.placeholder((C_out, C_in, 3, 3), name="W")
    P = te.compute(
        (1, C_in, H + 2, W + 2),
        lambda n, c, y, x: te.if_then_else(
            te.all(y >= 1, y < H + 1, x >= 1, x < W + 1), A[n, c, y - 1, x - 1], 0.0),
        name="P")
    rc = te.reduce_axis((0, C_in), name="rc")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    Out = te.compute(
        (1, C_out, H, W),
        lambda n, f, y, x: te.sum(P[n, rc, y + ry, x + rx] * Wt[f, rc, ry, rx], axis=[rc, ry, rx]),
        name="O")
    s = te.create_schedule(Out.op)
    OL = s.cache_write(Out, "local")  # fr channels x one output row of accumulators
    n, f, y, x = s[Out].op.axis
    fo, fi = s[Out].split(f, factor=fr)
    s[Out].reorder(n, fo, y, fi, x)
    rows = s[Out].fuse(fo, y)
    s[Out].parallel(rows)
    s[Out].vectorize(x)
    s[OL].compute_at(s[Out], rows)
    _, fl, _, xl = s[OL].op.axis
    rcl, ryl, rxl = s[OL].op.reduce_axis
    s[OL].reorder(rcl, ryl, rxl, fl, xl)
    s[OL].unroll(fl)
    s[OL].vectorize(xl)
    _, pc, _, px = s[P].op.axis
    s[P].parallel(pc)
    return s, [A, Wt, Out]


def module_timer(mod, *arrays, min_ms: float, repeat: int):  # noqa: ANN001, ANN201
    """One round of ours: the median of ``repeat`` repeats lasting ``min_ms`` each."""
    return lambda: mod.time(*arrays, repeat=repeat, min_repeat_ms=min_ms).median


def numpy_timer(fn, min_ms: float, repeat: int):  # noqa: ANN001, ANN201
    """One round of numpy's: the median of calls lasting about as long as ours in all."""
    return lambda: baseline.median_seconds(fn, min_s=min_ms * repeat / 1e3, min_runs=repeat)


def im2col_conv(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    _, c, h, wd = a.shape
    padded = np.pad(a[0], ((0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))  # c,h,w,3,3
    cols = win.transpose(0, 3, 4, 1, 2).reshape(c * 9, h * wd)
    return (w.reshape(w.shape[0], -1) @ cols).reshape(1, w.shape[0], h, wd)


def gemm_row(rng: np.random.Generator, target: str, min_ms: float, repeat: int, rounds: int
             ) -> tuple:
    M = N = K = 1024
    s, args = gemm_schedule(M, N, K)
    mod = aus.build(s, args, target=target)
    a = rng.uniform(-1, 1, (M, K)).astype("float32")
    b = rng.uniform(-1, 1, (K, N)).astype("float32")
    c = np.empty((M, N), "float32")
    mod(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
    got = baseline.alternate({"autosched": module_timer(mod, a, b, c, min_ms=min_ms, repeat=repeat),
                              "numpy": numpy_timer(lambda: np.matmul(a, b), min_ms, repeat)},
                             rounds)
    return "GEMM 1024x1024x1024 f32", 2.0 * M * N * K, got


def conv_row(rng: np.random.Generator, target: str, min_ms: float, repeat: int, rounds: int
             ) -> tuple:
    ci, h, w, co = 64, 56, 56, 64
    s, args = conv_schedule(ci, h, w, co)
    mod = aus.build(s, args, target=target)
    x = rng.uniform(-1, 1, (1, ci, h, w)).astype("float32")
    wt = rng.uniform(-1, 1, (co, ci, 3, 3)).astype("float32")
    out = np.empty((1, co, h, w), "float32")
    mod(x, wt, out)
    np.testing.assert_allclose(out, im2col_conv(x, wt), rtol=1e-3, atol=1e-3)
    got = baseline.alternate(
        {"autosched": module_timer(mod, x, wt, out, min_ms=min_ms, repeat=repeat),
         "numpy": numpy_timer(lambda: im2col_conv(x, wt), min_ms, repeat)}, rounds)
    return "conv2d 3x3 (1,64,56,56)->64 f32", 2.0 * co * ci * 9 * h * w, got


WEIGHT_GEMMS = ((20, 1024, 8210), (1, 1280, 1000))


def weight_gemm_models(m: int, k: int, n: int, rng: np.random.Generator) -> tuple:
    """(constant-weight model, the same Gemm with the weight an input (K, N), the inputs)."""
    from onnx import TensorProto, helper, numpy_helper

    w = rng.uniform(-1, 1, (n, k)).astype("float32")
    bias = rng.uniform(-1, 1, n).astype("float32")

    def gemm(weight_input: bool) -> object:
        ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])]
        inits = [numpy_helper.from_array(bias, "b")]
        if weight_input:
            ins.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, n]))
        else:
            inits.append(numpy_helper.from_array(w, "w"))
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=int(not weight_input))
        graph = helper.make_graph([node], "gemm", ins, [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    feeds = {"x": rng.uniform(-1, 1, (m, k)).astype("float32")}
    return gemm(False), gemm(True), feeds, {**feeds, "w": np.ascontiguousarray(w.T)}


def weight_gemm_row(rng: np.random.Generator, target: str, min_ms: float, repeat: int,
                    rounds: int, m: int, k: int, n: int) -> tuple:
    from autosched.testing.models import ort_session
    from importers.onnx import from_onnx

    const_model, input_model, feeds, input_feeds = weight_gemm_models(m, k, n, rng)
    panels = aus.compile(from_onnx(const_model), target=target)
    plain = aus.compile(from_onnx(input_model), target=target)
    sess = ort_session(const_model)
    want = sess.run(None, feeds)[0]
    for got in (panels.run(feeds)[0], plain.run(input_feeds)[0]):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    min_s = min_ms * repeat / 1e3
    got = baseline.alternate({
        "(K, N)": lambda: plain.time(input_feeds, repeat=repeat, min_s=min_s),
        "panels": lambda: panels.time(feeds, repeat=repeat, min_s=min_s),
        "onnxruntime": lambda: baseline.median_seconds(lambda: sess.run(None, feeds), min_s,
                                                       repeat)}, rounds)
    return f"Gemm {m}x{k}x{n} + bias, weight (N, K)", 2.0 * m * n * k, got


# the corpus's weight products first (ddddocr_ocr's Gemm and LSTM input projection,
# MobileNetV2's Gemm, magika's two MatMuls, silero_vad_ifless's Gemm), then other sizes
LAYOUT_SHAPES = ((20, 1024, 8210), (20, 512, 2048), (1, 1280, 1000), (2048, 257, 64),
                 (1, 512, 214), (1, 128, 512), (1, 2048, 1000), (128, 768, 768),
                 (128, 768, 3072), (64, 256, 256), (256, 1024, 1024), (1, 1024, 4096),
                 (1, 1024, 64), (8, 64, 100))


def layout_row(rng: np.random.Generator, target: str, min_ms: float, repeat: int, rounds: int,
               m: int, k: int, n: int) -> tuple:
    """matmul + bias, untuned, with the weight (K, N) and as panels: kernels alone."""
    from autosched.graph.passes import as_panels, panel_columns
    from autosched.search.space import SearchSpace
    from autosched.targets.target import parse
    from autosched.te import ops

    a, b, bias = (rng.uniform(-1, 1, s).astype("float32") for s in ((m, k), (k, n), (n,)))
    width = panel_columns(n, parse(target).vector_bits // 32)
    if width is None:
        raise SystemExit(f"{n} columns take no panels")
    bp = as_panels(b, width)
    timers = {}
    for side, weight in (("(K, N)", b), ("panels", bp)):
        A, B, C = (te.placeholder(v.shape, name=x) for v, x in ((a, "A"), (weight, "B"),
                                                                 (bias, "C")))
        product = ops.panel_matmul(A, B, n) if side == "panels" else ops.matmul(A, B)
        y = ops.add(product, C)
        args = [A, B, C, y]
        sch = SearchSpace(aus.Task(y, args=args, target=target)).default_schedule()
        mod = aus.build(sch, args, target=target)
        out = np.empty((m, n), "float32")
        mod(a, weight, bias, out)
        np.testing.assert_allclose(out, a @ b + bias, rtol=1e-3, atol=1e-3)
        timers[side] = module_timer(mod, a, weight, bias, out, min_ms=min_ms, repeat=repeat)
    return f"{m}x{k}x{n}, panels of {width}", 2.0 * m * n * k, baseline.alternate(timers,
                                                                                  rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter timing runs")
    ap.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="our threads")
    ap.add_argument("--weights-only", action="store_true",
                    help="only the weight Gemms against onnxruntime")
    ap.add_argument("--layouts", action="store_true",
                    help="only (K, N) against panel weights, untuned kernels alone")
    opts = ap.parse_args()
    min_ms, repeat = (50, 3) if opts.quick else (200, 5)
    threads = opts.threads
    target = f"llvm -num-cores={threads}"
    print(baseline.header())
    print(f"# autosched {threads} threads, OMP_WAIT_POLICY {baseline.omp_wait_policy()}; "
          f"peer {baseline.numpy_peer()}", flush=True)
    rng = np.random.default_rng()
    if opts.layouts:
        layouts = [layout_row(rng, target, min_ms, repeat, opts.rounds, *shape)
                   for shape in LAYOUT_SHAPES]
        print(f"# {opts.rounds} alternating rounds; load average {baseline.load()} at the end")
        print(f"| {'matmul + bias, untuned, us median':34} | weight (K, N) | panels | speed-up |")
        print(f"|{'-' * 36}|--------------:|-------:|---------:|")
        for name, _, got in layouts:
            plain, panels = got["(K, N)"].median, got["panels"].median
            print(f"| {name:34} | {plain * 1e6:13.1f} | {panels * 1e6:6.1f} | "
                  f"{plain / panels:8.2f} |")
        return
    rows = [] if opts.weights_only else [
        make(rng, target, min_ms, repeat, opts.rounds) for make in (gemm_row, conv_row)]
    weights = [weight_gemm_row(rng, target, min_ms, repeat, opts.rounds, *shape)
               for shape in WEIGHT_GEMMS]
    print(f"# {opts.rounds} alternating rounds; load average {baseline.load()} at the end")
    if rows:
        print_numpy_table(rows)
    print(f"| {'untuned, ms median (best)':40} | weight (K, N) | weight in panels | "
          "onnxruntime | ort / panels |")
    print(f"|{'-' * 42}|--------------:|-----------------:|------------:|-------------:|")
    for name, _, got in weights:
        plain, panels, ort = got["(K, N)"], got["panels"], got["onnxruntime"]
        cells = [f"{r.median * 1e3:.3f} ({r.best * 1e3:.3f})" for r in (plain, panels, ort)]
        print(f"| {name:40} | {cells[0]:>13} | {cells[1]:>16} | {cells[2]:>11} | "
              f"{ort.median / panels.median:12.2f} |")


def print_numpy_table(rows: list[tuple]) -> None:
    print(f"| {'workload':34} | autosched GFLOPS median (best) | numpy GFLOPS median (best) "
          "| ratio median (best) |")
    print(f"|{'-' * 36}|-------------------------------:|---------------------------:"
          "|--------------------:|")
    for name, flops, got in rows:
        ours, theirs = got["autosched"], got["numpy"]
        g = [flops / t / 1e9 for t in (ours.median, ours.best, theirs.median, theirs.best)]
        print(f"| {name:34} | {g[0]:19.1f} ({g[1]:6.1f}) | {g[2]:15.1f} ({g[3]:6.1f}) | "
              f"{g[0] / g[2]:11.2f} ({g[1] / g[3]:4.2f}) |")


if __name__ == "__main__":
    main()
