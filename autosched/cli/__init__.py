"""The ``autosched`` command line (also ``python -m autosched``): one parser, one subcommand
module per kind of job (op, model, logs, demo), and one way to report errors.

    autosched tune-op gemm 1024 1024 1024 --target llvm --trials 64 --log tuning_logs/gemm.jsonl
    autosched best-op gemm 1024 1024 1024 --log tuning_logs/gemm.jsonl   # prints the schedule
    autosched tune model.onnx --target llvm --trials 200 --log tuning_logs/model.jsonl
    autosched compile model.onnx --log tuning_logs/model.jsonl -o build/model
    autosched run build/model          # or model.onnx; autosched bench model.onnx --log L
    autosched inspect model.onnx --shape input=1,3,224,224
    autosched logs plot tuning_logs/model.jsonl -o curves.html   # or a tune's --plot FILE
    autosched train-cost-model tuning_logs/*.jsonl* --model model.onnx -o build/cost_model
    autosched demo
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from autosched.cli import cost_model, demo, logs, model, op
from autosched.cli.args import SHAPE_FORM, check_paths
from autosched.errors import AutoschedError, ModelImportError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autosched", description="auto-scheduling tensor compiler")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print the traceback too")
    sub = parser.add_subparsers(dest="command", required=True)
    for commands in (op, model, logs, cost_model, demo):
        commands.add_subcommands(sub)
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


def _as_cli_error(exc: BaseException) -> BaseException:
    """The importer's advice to bind a symbolic dim, spelt as the option that does it here."""
    from importers.onnx import UnboundDimError

    if isinstance(exc, UnboundDimError):
        return exc.bound_with("--shape " + SHAPE_FORM.replace("NAME", exc.input, 1))
    return exc


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        check_paths(args)
        rc = args.fn(args)
        sys.stdout.flush()  # here, so that a reader that has gone is met below, not at exit
        return rc
    except BrokenPipeError:  # `autosched logs summary LOG | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except USER_ERRORS as exc:
        if args.debug:
            traceback.print_exc()
        subject = str(getattr(args, "model", ""))
        print(error_line(args.command, _as_cli_error(exc), subject), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a tuning log keeps every record measured so far
        if args.debug:
            traceback.print_exc()
        print(f"autosched {args.command}: interrupted", file=sys.stderr)
        return 130

