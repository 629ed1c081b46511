"""The `autosched` command line.

    autosched tune-op gemm --shape 1024 1024 1024 --target llvm --trials 64 --log tuning_logs/gemm.jsonl
    autosched best-op gemm --shape 1024 1024 1024 --log tuning_logs/gemm.jsonl   # prints the schedule
    autosched tune model.onnx --target llvm --trials 200 --log tuning_logs/model.jsonl
    autosched compile model.onnx --log tuning_logs/model.jsonl -o build/model
    autosched run build/model          # or model.onnx; autosched bench model.onnx --log L
"""

from __future__ import annotations

import argparse
import math
import sys


def _op_task(args: argparse.Namespace):  # noqa: ANN202
    from autosched.search.task import Task
    from autosched.search.workloads import make

    tensors = make(args.op, args.shape)
    name = f"{args.op}_{'x'.join(str(s) for s in args.shape)}"
    return Task(lambda: tensors, target=args.target, name=name)


def cmd_tune_op(args: argparse.Namespace) -> int:
    from autosched.search.tune import TuneOptions, best_schedule, tune

    task = _op_task(args)
    log = args.log or f"tuning_logs/{task.name}-{task.target.kind}.jsonl"
    best = tune(task, trials=args.trials, log=log,
                options=TuneOptions(batch_size=args.batch_size, seed=args.seed))[task.name]
    if math.isfinite(best):
        print(f"{task.name}: best {best * 1e3:.3f} ms, {task.flop_count / best / 1e9:.1f} GFLOPS; log {log}")
        print(best_schedule(task, log).to_python() or "# the default schedule (no steps) was fastest")
        return 0
    print(f"{task.name}: no candidate ran successfully; see {log}", file=sys.stderr)
    return 1


def cmd_best_op(args: argparse.Namespace) -> int:
    from autosched.search.tune import best_schedule

    task = _op_task(args)
    print(best_schedule(task, args.log).to_python())
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from autosched.graph.inspect import inspect_model

    shapes = {}
    for item in args.shape or []:
        name, _, dims = item.rpartition("=")
        if not name or not dims:
            raise SystemExit(f"--shape {item!r}: expected name=1,3,224,224")
        shapes[name] = tuple(int(d) for d in dims.split(","))
    from autosched.errors import ModelImportError

    try:
        print(inspect_model(args.model, shapes, target=args.target, tasks=not args.no_tasks))
    except ModelImportError as e:
        print(f"autosched inspect: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autosched", description="auto-scheduling tensor compiler")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, helptext in (("tune-op", cmd_tune_op, "tune a named operator at given shapes"),
                               ("best-op", cmd_best_op, "print the best recorded schedule")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("op", help="gemm, conv2d, depthwise_conv2d, batch_matmul, softmax")
        p.add_argument("--shape", type=int, nargs="+", required=True)
        p.add_argument("--target", default="llvm")
        p.add_argument("--log", default=None)
        p.add_argument("--trials", type=int, default=64)
        p.add_argument("--batch-size", type=int, default=16)
        p.add_argument("--seed", type=int, default=None)
        p.set_defaults(fn=fn)
    p = sub.add_parser("inspect", help="operator counts, coverage, FLOPs and tasks of a model")
    p.add_argument("model", help="model.onnx")
    p.add_argument("--shape", action="append", metavar="NAME=D0,D1,...",
                   help="bind an input's shape (symbolic dims)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--no-tasks", action="store_true", help="skip task extraction")
    p.set_defaults(fn=cmd_inspect)
    from autosched.graph.cli_model import add_subcommands  # tune / compile / run / bench

    add_subcommands(sub)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
