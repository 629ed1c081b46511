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
import traceback

from autosched.errors import AutoschedError, ModelImportError
from autosched.graph.cli_model import check_paths, count, positive


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
    from autosched.graph.cli_model import parse_shapes
    from autosched.graph.inspect import inspect_model

    shapes = parse_shapes(args.shape)
    print(inspect_model(args.model, shapes, target=args.target, tasks=not args.no_tasks))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autosched", description="auto-scheduling tensor compiler")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the traceback too")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, helptext in (("tune-op", cmd_tune_op, "tune a named operator at given shapes"),
                               ("best-op", cmd_best_op, "print the best recorded schedule")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("op", help="gemm, conv2d, depthwise_conv2d, batch_matmul, softmax")
        p.add_argument("--shape", type=positive, nargs="+", required=True)
        p.add_argument("--target", default="llvm")
        p.add_argument("--log", default=None)
        p.add_argument("--trials", type=count, default=64)
        p.add_argument("--batch-size", type=positive, default=16)
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
    for p in sub.choices.values():  # --debug also after the subcommand
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="on an error, print the traceback too")
    return parser


# Errors a user can cause and fix (a bad model, path, log, build dir or argument): one line on
# stderr and exit status 2. Anything else is a bug in autosched and keeps its traceback.
USER_ERRORS = (AutoschedError, OSError)
HINTS = {
    FileNotFoundError: "check the path",
    FileExistsError: "remove it or give another path",
    IsADirectoryError: "give a file, not a directory",
    NotADirectoryError: "check the path",
    PermissionError: "check the file's permissions",
}


def error_line(command: str, exc: BaseException, subject: str = "") -> str:
    """``exc`` as the one line ``autosched COMMAND`` prints: what went wrong, where (the file
    the message names, else ``subject`` when the model or build dir is at fault), and how to fix
    it when the message does not say."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        what = f"{where}{exc.strerror}"
    else:
        what = str(exc).strip() or type(exc).__name__
        if subject and subject not in what and isinstance(exc, ModelImportError):
            what = f"{subject}: {what}"  # the model or build dir is at fault: say which
    lines = what.splitlines()
    more = f" ({len(lines) - 1} more lines with --debug)" if len(lines) > 1 else ""
    hint = next((h for t, h in HINTS.items() if isinstance(exc, t)), "")
    hint = f"; {hint}" if hint else ""
    return f"autosched {command}: {type(exc).__name__}: {lines[0]}{hint}{more}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check_paths(args)
        return args.fn(args)
    except USER_ERRORS as exc:
        if args.debug:
            traceback.print_exc()
        subject = str(getattr(args, "model", ""))
        print(error_line(args.command, exc, subject), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a tuning log keeps every record measured so far
        if args.debug:
            traceback.print_exc()
        print(f"autosched {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
