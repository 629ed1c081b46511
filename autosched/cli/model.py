"""The model subcommands of the ``autosched`` command line: tune, compile, run, bench, inspect.

    autosched inspect model.onnx --shape input=1,3,224,224
    autosched tune model.onnx --target llvm --trials 200 --log tuning_logs/model.jsonl
    autosched compile model.onnx --target llvm --log tuning_logs/model.jsonl -o build/model
    autosched compile model.onnx --schedule model -o build/model   # no log: the cost model picks
        # build/model/<name>.so (the model, a C API), <name>.h, README
        # (--weights-file: and <name>.weights, which the library maps)
    autosched run build/model            # or model.onnx [--log L]; random inputs by default
    autosched bench model.onnx --target llvm --log tuning_logs/model.jsonl
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from autosched.cli.args import (
    ArgumentError,
    add_precision_option,
    add_shape_option,
    add_strict_target_option,
    add_tuning_options,
    positive,
    require_regular,
    shapes,
    trial_budget,
)
from autosched.cli.logs import add_plot_option, check_plot_option, write_curves
from autosched.graph.compiler import SCHEDULES


def _graph(args: argparse.Namespace) -> Any:
    from importers.onnx import from_onnx

    return from_onnx(args.model, shapes(args))


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if math.isfinite(s) else "n/a"


def task_table(tasks: list[Any], weights: list[int], log: str | os.PathLike,
               strict_target: bool = False) -> tuple[str, float]:
    """Per task: trials, best latency, weight; and the estimated end-to-end latency (sum of
    weight x best; inf while a task has no successful record). Records checked only under an
    emulator have no latency: their task shows "untimed"."""
    from autosched.search.record import RecordLog

    rl = RecordLog(log) if os.path.exists(log) else None
    lines = [f"  {'task':34s} {'w':>3s} {'trials':>6s} {'best':>12s} {'w x best':>12s}"]
    total = 0.0
    for t, w in zip(tasks, weights):
        recs = rl.records_for(t.workload_key, t.target, strict_target) if rl else []
        ok = [r.cost for r in recs if r.ok and not r.emulated]
        best = min(ok) if ok else math.inf
        total += w * best
        shown = "untimed" if not ok and any(r.ok for r in recs) else _ms(best)
        lines.append(f"  {t.name[:34]:34s} {w:3d} {len(recs):6d} {shown:>12s} "
                     f"{_ms(w * best):>12s}")
    lines.append(f"  estimated end-to-end latency: {_ms(total)}")
    return "\n".join(lines), total


def cmd_tune(args: argparse.Namespace) -> int:
    from autosched.graph.choose import choose_after_tuning, describe_choices
    from autosched.graph.compiler import extract_tasks
    from autosched.search.protocol import MeasureOptions
    from autosched.search.record import RecordLog
    from autosched.search.tune import TuneOptions, tune

    check_plot_option(args)
    graph = _graph(args)
    tasks, weights = extract_tasks(graph, args.target, args.precision)
    log = args.log or RecordLog.default_path(Path(args.model).stem, tasks[0].target)
    trials, total = trial_budget(args)
    asked = (f"{trials} trials (new measurements)" if total is None else
             f"up to {total} trials in the log" if trials is None else
             f"{trials} trials (new measurements), up to {total} in the log")
    print(f"{args.model}: {len(tasks)} tasks ({sum(weights)} kernels), {asked}, log {log}")
    # one tune() call (one task scheduler, one set of workers); a table every ~1/8 of the budget
    every = max(args.batch_size * 4, (trials or total or 0) // 8)
    start = time.perf_counter()
    shown = measured = 0

    def show(done: int) -> None:
        nonlocal shown
        print(f"{done} new trials ({time.perf_counter() - start:.0f} s)")
        print(task_table(tasks, weights, log, args.strict_target)[0], flush=True)
        shown = done

    def report(done: int) -> None:
        nonlocal measured
        measured = done
        if done // every != shown // every:
            show(done)

    tune(tasks, trials, log, total_trials=total, weights=weights, on_round=report,
         strict_target=args.strict_target, runner=args.runner,
         options=TuneOptions(batch_size=args.batch_size, seed=args.seed, verbose=False,
                             measure=MeasureOptions(node_builds=args.node_builds)))
    if measured != shown:  # the last rounds since the last table
        show(measured)
    choices = [] if args.no_choose else choose_after_tuning(graph, tasks, log, args.precision,
                                                            args.runner)
    if choices:
        print(describe_choices(choices), flush=True)
    if args.plot:
        write_curves([log], args.plot, {t.workload_key: w for t, w in zip(tasks, weights)},
                     args.model)
    return 0


def _compiled(args: argparse.Namespace) -> tuple[Any, Any]:
    """(model with run/time, graph) from an .onnx file or a build dir."""
    if os.path.isdir(args.model):
        from autosched.graph.loader import load

        m = load(args.model)
        return m, m.graph
    from autosched.graph.compiler import compile

    graph = _graph(args)
    return compile(graph, target=args.target, log=args.log, strict_target=args.strict_target,
                   schedule=args.schedule, precision=args.precision), graph


def cmd_compile(args: argparse.Namespace) -> int:
    from autosched.graph.compiler import compile
    from autosched.graph.deploy import export

    graph = _graph(args)
    t0 = time.perf_counter()
    # export needs the kernels only: no executor (a CUDA model then needs no pycuda or GPU)
    model = compile(graph, target=args.target, log=args.log, strict_target=args.strict_target,
                    executor=False, schedule=args.schedule, precision=args.precision)
    path = export(model, args.output, name=args.name, weights_file=args.weights_file)
    print(f"compiled {len(model.kernels)} kernels in {time.perf_counter() - t0:.1f} s; wrote "
          f"{path} and {path.with_suffix('.h').name} (C API, example in "
          f"{path.parent / 'README'}; from Python: autosched.load)")
    return 0


def _inputs(args: argparse.Namespace, graph: Any) -> dict[str, np.ndarray]:
    from autosched.graph.executor import random_inputs

    feeds = random_inputs(graph, seed=0)
    for item in args.input or []:
        name, _, path = item.partition("=")
        if name not in feeds or not path:
            raise ArgumentError(f"--input {item!r}: expected NAME=FILE.npy with NAME one of "
                                f"the model's inputs {sorted(feeds)}")
        feeds[name] = _load_npy(path, f"--input {name}")
    return feeds


def _load_npy(path: str, what: str) -> np.ndarray:
    """An array from a .npy file; never unpickles (a .npy of objects is refused)."""
    require_regular(path, what)
    try:
        a = np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as exc:
        raise ArgumentError(f"{what}: {path} is not a .npy file of numbers ({type(exc).__name__}"
                            "); write the array with numpy.save") from None
    if not isinstance(a, np.ndarray):  # an .npz archive
        a.close()
        raise ArgumentError(f"{what}: {path} is an .npz archive; give one array as .npy")
    return a


def cmd_run(args: argparse.Namespace) -> int:
    model, graph = _compiled(args)
    feeds = _inputs(args, graph)
    outs = model.run(feeds)
    for name, o in zip(graph.outputs, outs):
        print(f"output {name}: {o.dtype}{list(o.shape)}  mean {float(np.mean(o)):.6g}")
    print(f"latency {_ms(model.time(feeds))} (median)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from autosched.graph.precision import precision
    from autosched.search.measure_worker import compare

    model, graph = _compiled(args)
    feeds = _inputs(args, graph)
    ours = model.run(feeds)
    t_ours = model.time(feeds, repeat=args.repeat)
    print(f"autosched ({args.target}): {_ms(t_ours)}")
    if os.path.isdir(args.model):
        return 0
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: no comparison")
        return 0
    try:
        sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
    except Exception as exc:  # onnxruntime's own error types; the peer failing is not ours
        print(f"onnxruntime could not run the model ({type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}): no comparison")
        return 0
    sess.run(None, feeds)
    ts: list[float] = []
    deadline = time.perf_counter() + 0.5
    while len(ts) < args.repeat or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        ts.append(time.perf_counter() - t0)
    t_ort = float(np.median(ts))
    # fp32 keeps its 1e-4 / 1e-4; other precisions are checked as tuned candidates are
    # (te.dtype.PRECISIONS: atol relative to the largest reference magnitude)
    if args.precision == "fp32":
        err = max(float(np.max(np.abs(a - b) / (1e-4 + 1e-4 * np.abs(b))))
                  for a, b in zip(ours, ref))
        how = f"max |diff| / (1e-4 + 1e-4 |ref|) = {err:.3g}"
        match = err <= 1
    else:
        problems = [compare(str(k), a, b, args.precision)
                    for k, (a, b) in enumerate(zip(ours, ref))]
        p = precision(args.precision)
        how = (f"{args.precision} tolerance: rtol {p.rtol:g}, atol {p.atol:g} x the largest "
               f"|ref|")
        match = not any(problems)
    print(f"onnxruntime (CPU):  {_ms(t_ort)}; speedup {t_ort / t_ours:.2f}x; outputs "
          f"{'match' if match else 'DIFFER'} ({how})")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from importers.inspect import inspect_model

    print(inspect_model(args.model, shapes(args), target=args.target, tasks=not args.no_tasks))
    return 0


def add_subcommands(sub: Any) -> None:
    """Add tune / compile / run / bench / inspect to the ``autosched`` parser's subparsers."""
    specs = (("tune", cmd_tune, "tune every task of an ONNX model"),
             ("compile", cmd_compile, "compile an ONNX model into a build dir"),
             ("run", cmd_run, "run an ONNX model or a build dir on random or given inputs"),
             ("bench", cmd_bench, "latency of an ONNX model next to onnxruntime"),
             ("inspect", cmd_inspect, "operator counts, coverage, FLOPs and tasks of a model"))
    for name, fn, helptext in specs:
        p = sub.add_parser(name, help=helptext)
        p.add_argument("model", help="model.onnx" + (" or a build dir" if name == "run" else ""))
        p.add_argument("--target", default="llvm")
        add_shape_option(p)
        if name != "inspect":
            p.add_argument("--log", default=None, help="tuning log (JSON lines)")
            add_strict_target_option(p)
        if name == "tune":
            add_tuning_options(p, trials=200)
            add_plot_option(p)
            p.add_argument("--no-choose", action="store_true",
                           help="skip choosing each task's schedule by timing the best few "
                                "inside the model at the end (done when the model runs here)")
        if name in ("tune", "compile", "run", "bench"):
            add_precision_option(p)
        if name in ("compile", "run", "bench"):
            p.add_argument("--schedule", choices=SCHEDULES, default=None,
                           help="for tasks without a record: the untuned default schedule, "
                                "the one the pretrained cost model ranks best (nothing timed), "
                                "or auto: the model's on GPUs, the default on CPUs (default: "
                                "$AUTOSCHED_SCHEDULE, else auto)")
        if name == "compile":
            p.add_argument("-o", "--output", required=True, help="build dir to write")
            p.add_argument("--name", default=None,
                           help="the library's name, prefix of its C symbols (default: the "
                                "model's graph name)")
            p.add_argument("--weights-file", action="store_true",
                           help="write the weights to NAME.weights, which the library maps "
                                "at create, instead of into the library")
        if name in ("run", "bench"):
            p.add_argument("--input", action="append", metavar="NAME=FILE.npy")
            p.add_argument("--repeat", type=positive, default=10)
        if name == "inspect":
            p.add_argument("--no-tasks", action="store_true", help="skip task extraction")
        p.set_defaults(fn=fn)
