"""The tuning-log subcommands of the ``autosched`` command line: logs plot.

    autosched logs plot tuning_logs/model.jsonl -o curves.html     # or -o curves.png
    autosched logs plot run1.jsonl run2.jsonl --model model.onnx -o curves.png

A plot shows each task's best latency and the model's estimated end-to-end latency against
trials and wall time; the weights of that estimate are how often each task occurs in the model
(``--model``), else 1 per task. ``tune`` and ``tune-op`` draw the same plot with ``--plot``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from autosched.cli.args import add_shape_option, require_regular, shapes


def write_curves(logs: Sequence[str | os.PathLike], output: str | os.PathLike,
                 weights: Mapping[str, float] | None = None,
                 weights_from: str | None = None) -> None:
    """Plot the tuning curves of ``logs`` into ``output`` (.png or .html) and say where."""
    from autosched.report import curves, plot

    runs = [run for log in logs for run in curves.tuning_runs(log, weights)]
    print(f"tuning curves: {plot.write(runs, output, weights_from)}")


def add_plot_option(parser: argparse.ArgumentParser) -> None:
    """``--plot FILE``: a tune ends by plotting its log (the tune and tune-op subcommands)."""
    parser.add_argument("--plot", default=None, metavar="FILE.html|FILE.png",
                        help="at the end, plot the tuning curves of the log into FILE")


def check_plot_option(args: argparse.Namespace) -> None:
    """Fail before tuning when ``--plot`` cannot be written (no matplotlib, another format)."""
    if args.plot:
        from autosched.report.plot import check_output

        check_output(args.plot)


def model_weights(args: argparse.Namespace) -> dict[str, float] | None:
    """{workload key: how often the task occurs} for ``--model`` on ``--target``, else None."""
    if not args.model:
        return None
    from autosched.graph.compiler import extract_tasks
    from importers.onnx import from_onnx

    tasks, weights = extract_tasks(from_onnx(args.model, shapes(args)), args.target)
    return {t.workload_key: w for t, w in zip(tasks, weights)}


def cmd_plot(args: argparse.Namespace) -> int:
    from autosched.report.plot import check_output

    check_output(args.output)
    for log in args.logs:
        require_regular(log, "log")
    write_curves(args.logs, args.output, model_weights(args), args.model)
    return 0


def add_subcommands(sub: Any) -> None:
    """Add ``logs plot`` to the ``autosched`` parser's subparsers."""
    logs = sub.add_parser("logs", help="what tuning logs say").add_subparsers(
        dest="action", required=True)
    p = logs.add_parser("plot", help="plot tuning curves as PNG or a self-contained HTML page")
    p.add_argument("logs", nargs="+", metavar="LOG", help="tuning logs (JSON lines)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html|FILE.png")
    p.add_argument("--model", default=None, metavar="MODEL.onnx",
                   help="weigh each task by how often it occurs in this model")
    p.add_argument("--target", default="llvm", help="the target the model's tasks are for")
    add_shape_option(p)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="on an error, print the traceback too")
    p.set_defaults(fn=cmd_plot, command="logs plot")
