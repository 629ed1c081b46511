"""The operator subcommands of the ``autosched`` command line: tune-op, best-op.

An operator is named with its sizes, in the order ``autosched.search.workloads`` lists them
(gemm M N K, conv2d N C H W O KH KW S P, ...).

    autosched tune-op gemm 1024 1024 1024 --target llvm --trials 64 --log tuning_logs/gemm.jsonl
    autosched best-op gemm 1024 1024 1024 --log tuning_logs/gemm.jsonl   # prints the schedule
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from autosched.cli.args import add_strict_target_option, add_tuning_options, positive, trial_budget
from autosched.cli.logs import add_plot_option, check_plot_option, write_curves


def _op_task(args: argparse.Namespace) -> Any:
    from autosched.search.task import Task
    from autosched.search.workloads import make

    tensors = make(args.op, args.sizes)
    name = f"{args.op}_{'x'.join(str(s) for s in args.sizes)}"
    return Task(lambda: tensors, target=args.target, name=name)


def cmd_tune_op(args: argparse.Namespace) -> int:
    from autosched.search.protocol import MeasureOptions
    from autosched.search.record import RecordLog
    from autosched.search.tune import TuneOptions, best_schedule, tune

    check_plot_option(args)
    task = _op_task(args)
    log = args.log or RecordLog.default_path(task.name, task.target)
    trials, total = trial_budget(args)
    best = tune(task, trials, log, total_trials=total, strict_target=args.strict_target,
                runner=args.runner,
                options=TuneOptions(batch_size=args.batch_size, seed=args.seed,
                                    measure=MeasureOptions(node_builds=args.node_builds)))[task.name]
    if math.isfinite(best):
        print(f"{task.name}: best {best * 1e3:.3f} ms, {task.flop_count / best / 1e9:.1f} GFLOPS; log {log}")
        print(best_schedule(task, log, args.strict_target).to_python() or "# the default schedule (no steps) was fastest")
        if args.plot:
            write_curves([log], args.plot)
        return 0
    checked = [r for r in RecordLog(log).records_for(task.workload_key, task.target)
               if r.ok and r.extra.get("emulated") is True]
    if checked:  # measured only under an emulator: correct schedules, no timing
        print(f"{task.name}: {len(checked)} candidates checked under emulation (correctness "
              f"only, no timing); log {log}")
        return 0
    print(f"{task.name}: no candidate ran successfully; see {log}", file=sys.stderr)
    return 1


def cmd_best_op(args: argparse.Namespace) -> int:
    from autosched.search.tune import best_schedule

    task = _op_task(args)
    print(best_schedule(task, args.log, args.strict_target).to_python())
    return 0


def add_subcommands(sub: Any) -> None:
    """Add tune-op / best-op to the ``autosched`` parser's subparsers."""
    for name, fn, helptext in (("tune-op", cmd_tune_op, "tune a named operator at given sizes"),
                               ("best-op", cmd_best_op, "print the best recorded schedule")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("op", help="gemm, conv2d, depthwise_conv2d, batch_matmul, softmax")
        p.add_argument("sizes", type=positive, nargs="+", help="the operator's sizes, e.g. M N K")
        p.add_argument("--target", default="llvm")
        p.add_argument("--log", default=None)
        add_strict_target_option(p)
        add_tuning_options(p, trials=64)
        if name == "tune-op":
            add_plot_option(p)
        p.set_defaults(fn=fn)
