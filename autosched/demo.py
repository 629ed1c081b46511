"""`make demo`: tune a small CNN end to end and compare it with onnxruntime.

The model (conv-relu, conv-relu, max pool, conv-batchnorm-relu, global average pool, Gemm on a
1x3x32x32 image; random weights, fixed seed) is built with onnx.helper at demo time. The demo
imports it, compiles it with default schedules, tunes every task for a short budget (the task
scheduler shares the trials), compiles it again with the best records, checks both models'
outputs against onnxruntime and times the two and onnxruntime end to end, in rounds that take
turns (a busy spell of a shared machine lands on all of them).

    autosched demo                 # about a minute on 2 cores
    autosched demo --trials 200 --log tuning_logs/demo.jsonl   # 200 more trials in that log
    autosched demo --gemm          # the hand-scheduled GEMM demo
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

import autosched as aus
from autosched import te


def small_cnn(image: int = 32, batch: int = 1, classes: int = 10, seed: int = 0) -> Any:
    """The demo model as an ONNX ModelProto (input "input", output "logits")."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
        return name

    def conv(x: str, name: str, cin: int, cout: int) -> str:
        w = const(f"{name}.w", rng.normal(0, np.sqrt(2 / (cin * 9)), (cout, cin, 3, 3)))
        b = const(f"{name}.b", rng.normal(0, 0.1, cout))
        nodes.append(helper.make_node("Conv", [x, w, b], [name], kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]))
        return name

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        return out

    y = node("Relu", [conv("input", "conv1", 3, 16)], "relu1")
    y = node("Relu", [conv(y, "conv2", 16, 32)], "relu2")
    y = node("MaxPool", [y], "pool", kernel_shape=[2, 2], strides=[2, 2])
    y = conv(y, "conv3", 32, 64)
    bn = [const(f"bn.{k}", v) for k, v in (("scale", rng.uniform(0.5, 1.5, 64)),
                                           ("bias", rng.normal(0, 0.1, 64)),
                                           ("mean", rng.normal(0, 0.1, 64)),
                                           ("var", rng.uniform(0.5, 1.5, 64)))]
    y = node("Relu", [node("BatchNormalization", [y, *bn], "bn")], "relu3")
    y = node("Flatten", [node("GlobalAveragePool", [y], "gap")], "flat", axis=1)
    w = const("fc.w", rng.normal(0, np.sqrt(1 / 64), (classes, 64)))
    b = const("fc.b", rng.normal(0, 0.1, classes))
    node("Gemm", [y, w, b], "logits", transB=1)
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, (batch, 3, image, image))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="autosched.demo")
    model.ir_version = 8
    return model


def _ort_session(model: Any, threads: int = 0) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads  # 0: onnxruntime's default (one per core)
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


# Seconds each row runs in one turn: short turns in many rounds, so that a slow spell of a shared
# machine (this kind of VM has spells of seconds in which its second core runs at half speed)
# lands on every row instead of on the one whose turn it happened to be.
TURN_S, ROUNDS = 0.1, 15

Turn = Callable[[], dict[str, list[float]]]


def _runs(calls: dict[str, Callable[[], Any]], seconds: float) -> dict[str, list[float]]:
    """Seconds of each run of ``calls``, run one after the other in turn (a, b, a, b, ...)
    for about ``seconds`` after one warm-up run each: a spell of a shared machine lands on
    all of them alike, so the runs compare pair by pair."""
    clock = time.perf_counter
    for call in calls.values():
        call()
    seen: dict[str, list[float]] = {k: [] for k in calls}
    deadline = clock() + seconds
    while clock() < deadline or len(next(iter(seen.values()))) < 5:
        for k, call in calls.items():
            t0 = clock()
            call()
            seen[k].append(clock() - t0)
    return seen


def _ort_turn(label: str, sess: Any, feeds: dict[str, np.ndarray]) -> Turn:
    return lambda: _runs({label: lambda: sess.run(None, feeds)}, TURN_S)


def _models_turn(models: dict[str, Any], feeds: dict[str, np.ndarray],
                 threads: int | None = None) -> Turn:
    """One turn of ``models`` (label: CompiledModel), their runs interleaved one by one."""
    def turn() -> dict[str, list[float]]:
        with ExitStack() as stack:
            calls = {}
            for label, model in models.items():
                model.set_threads(threads)
                stack.callback(model.set_threads, None)
                calls[label] = stack.enter_context(model.bound_call(feeds))
            return _runs(calls, TURN_S * len(models))

    return turn


def alternating(turns: list[Turn], rounds: int = ROUNDS) -> dict[str, list[list[float]]]:
    """Every row's run seconds per round: the turns take their turns for ``rounds`` rounds,
    so that a busy spell of a shared machine lands on all of them."""
    seen: dict[str, list[list[float]]] = {}
    for _ in range(rounds):
        for turn in turns:
            for k, runs in turn().items():
                seen.setdefault(k, []).append(runs)
    return seen


def summary(rounds: list[list[float]]) -> tuple[float, float]:
    """(median, fastest) seconds of a row: the median of its rounds' medians, and the fastest
    run of all."""
    return (float(np.median([np.median(r) for r in rounds])),
            float(min(min(r) for r in rounds)))


def paired_ratio(a: list[list[float]], b: list[list[float]]) -> float:
    """The median over all pairs of runs of b's time over a's, for two rows whose runs were
    interleaved (``_models_turn``)."""
    return float(np.median(np.concatenate([np.array(y[:len(x)]) / np.array(x[:len(y)])
                                           for x, y in zip(a, b)])))


def model_demo(trials: int, log: str | None, target: str) -> None:
    from autosched.graph.compiler import extract_tasks
    from autosched.graph.executor import random_inputs
    from autosched.search.tune import TuneOptions
    from importers.onnx import from_onnx

    t_start = time.perf_counter()
    proto = small_cnn()
    graph = from_onnx(proto)
    feeds = random_inputs(graph, seed=1)
    tasks, weights = extract_tasks(graph, target)
    print(f"small CNN, input {graph.inputs[0]}: {len(graph.nodes)} nodes, {len(tasks)} tasks "
          f"after fusion: {', '.join(t.name for t in tasks)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no tuning record": expected before tuning
        before = aus.compile(graph, target=target, schedule="default")

    tmp = None
    if log is None:
        tmp = tempfile.TemporaryDirectory(prefix="autosched-demo-")
        log = os.path.join(tmp.name, "demo.jsonl")
    print(f"tuning {trials} trials over {len(tasks)} tasks (log {log}) ...", flush=True)
    t0 = time.perf_counter()
    # short measurements: the demo's budget goes into more candidates
    aus.tune_graph(graph, target=target, trials=trials, log=log,
                   options=TuneOptions(batch_size=8, seed=0, verbose=True),
                   min_repeat_ms=20.0, repeat=3)
    t_tune = time.perf_counter() - t0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        after = aus.compile(graph, target=target, log=log)
    for w in caught:  # a short budget may not reach every task: say so plainly
        print(f"note: {w.message}")
    if tmp is not None:
        tmp.cleanup()
    ref = _ort_session(proto).run(None, feeds)
    np.testing.assert_allclose(after.run(feeds)[0], ref[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(before.run(feeds)[0], ref[0], rtol=1e-4, atol=1e-4)
    # one thread each too: on a loaded machine those numbers move least. The untuned and the
    # tuned model run interleaved, run by run: a spell of the machine lands on both alike
    default, tuned = "autosched, default schedules", f"autosched, tuned ({trials} trials)"
    turns = [_models_turn({default: before, tuned: after}, feeds),
             _ort_turn("onnxruntime", _ort_session(proto), feeds),
             _models_turn({"autosched, tuned, 1 thread": after}, feeds, threads=1),
             _ort_turn("onnxruntime, 1 thread", _ort_session(proto, threads=1), feeds)]
    seen = alternating(turns)
    print(f"\noutputs match onnxruntime (rtol 1e-4, atol 1e-4); tuning took {t_tune:.0f} s, "
          f"the whole demo {time.perf_counter() - t_start:.0f} s; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    # the median and the fastest run, ROUNDS rounds of short turns: on a loaded machine a busy
    # spell then slows every row, not the one that happened to run in it
    print(f"{'end-to-end latency (ms)':32}{'median':>10}{'fastest':>10}")
    for label, rounds in seen.items():
        med, best = summary(rounds)
        print(f"{label:32}{med * 1e3:10.3f}{best * 1e3:10.3f}")
    ratio = paired_ratio(seen[default], seen[tuned])
    print(f"tuned / default, run by run: {ratio:.3f} (median of "
          f"{sum(len(r) for r in seen[tuned])} interleaved pairs): tuned "
          f"{'faster' if ratio < 1 else 'not faster'}")


def gemm_schedule(n: int, bn: int = 32, vec: int = 16):
    """The classic blocked GEMM: tiles of bn x bn, the k loop split by 4, packed B,
    a local accumulator, vectorized inner loop and parallel outer loop."""
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    packed = te.compute((n // bn, n, bn), lambda x, y, z: B[y, x * bn + z], name="packedB")
    C = te.compute(
        (n, n), lambda i, j: te.sum(A[i, k] * packed[j // bn, k, j % bn], axis=k), name="C"
    )
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, bn, bn)
    s[CC].compute_at(s[C], jo)
    ci, cj = s[CC].op.axis
    (kk,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(kk, factor=4)
    s[CC].reorder(ko, ci, ki, cj)
    s[CC].unroll(ki)
    s[CC].vectorize(cj)
    s[C].parallel(io)
    x, y, z = s[packed].op.axis
    s[packed].vectorize(z)
    s[packed].parallel(x)
    return s, [A, B, C]


def median_seconds(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def gemm_demo(n: int, target: str) -> None:
    """The hand-scheduled GEMM of the first demo, next to numpy."""
    s, tensors = gemm_schedule(n)
    print(aus.lower(s, tensors) if n <= 64 else s.to_python())
    mod = aus.build(s, tensors, target=target)
    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (n, n)).astype("float32")
    b = rng.uniform(-1, 1, (n, n)).astype("float32")
    c = np.full((n, n), np.nan, dtype="float32")
    mod(a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-3, atol=1e-3)
    flops = 2.0 * n**3
    t_ours = median_seconds(lambda: mod(a, b, c))
    t_np = median_seconds(lambda: a @ b)
    print(f"\nGEMM {n}x{n}x{n} float32 on {target}: output matches numpy")
    print(f"{'':10}{'ms':>10}{'GFLOPS':>10}")
    print(f"{'autosched':10}{t_ours * 1e3:10.2f}{flops / t_ours / 1e9:10.1f}")
    print(f"{'numpy':10}{t_np * 1e3:10.2f}{flops / t_np / 1e9:10.1f}")
    print(f"ratio autosched / numpy: {t_np / t_ours:.2f}")

