"""Arguments shared by the subcommands of the ``autosched`` command line: number types, the one
``--shape NAME=D0,D1,...`` option, and checks on the paths a user names.

Example::

    p.add_argument("--trials", type=count, default=200)
    add_shape_option(p)
    shapes(args)        # {"input": (1, 3, 224, 224)} from --shape input=1,3,224,224
"""

from __future__ import annotations

import argparse
import os

from autosched.errors import AutoschedError

SHAPE_FORM = "NAME=D0,D1,..."


class ArgumentError(AutoschedError):
    """A command-line argument is malformed; the message names it and its expected form."""


def positive(text: str) -> int:
    """An argparse type: an integer >= 1 (sizes, batch sizes, repeats)."""
    return _int_at_least(text, 1)


def count(text: str) -> int:
    """An argparse type: an integer >= 0 (trial budgets)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {low}")
    return value


def add_shape_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", action="append", metavar=SHAPE_FORM,
                        help="bind an input's shape (symbolic dims)")


def add_precision_option(parser: argparse.ArgumentParser) -> None:
    from autosched.graph.precision import DEFAULT_PRECISION, PRECISIONS

    parser.add_argument("--precision", choices=tuple(PRECISIONS), default=DEFAULT_PRECISION,
                        help="how the model computes: fp32 (exact, the default), tf32, fp16 or "
                             "bf16 (half storage, float32 arithmetic); records of one precision "
                             "apply to it only")


def runner(text: str) -> str:
    """An argparse type: where candidates are measured (search/runner.py's forms)."""
    from autosched.search.runner import check_runner

    try:
        return check_runner(text)
    except AutoschedError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_tuning_options(parser: argparse.ArgumentParser, trials: int) -> None:
    parser.add_argument("--trials", type=count, default=None,
                        help=f"new measurements to make (default {trials}; none past "
                             "--total-trials when only that is given)")
    parser.add_argument("--total-trials", type=count, default=None,
                        help="stop once the log holds this many trials of the job (rerun a "
                             "killed job with it to finish the same budget)")
    parser.set_defaults(default_trials=trials)
    parser.add_argument("--batch-size", type=positive, default=16)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--runner", type=runner, default="local",
                        help="where candidates are measured: local (this machine), qemu "
                             "(another architecture under qemu-user here: checked, not timed), "
                             "ray (the Ray cluster on this machine or RAY_ADDRESS), "
                             "ray://HOST:PORT; docs/REMOTE.md")
    parser.add_argument("--node-builds", action="store_true",
                        help="with --runner ray: each measuring node builds the batches it "
                             "measures, one per node at once (nodes that compile fast), "
                             "instead of this machine")


def trial_budget(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """(trials, total_trials) for ``tune`` from ``--trials`` / ``--total-trials`` (the
    subcommand's default number of new trials when neither is given)."""
    trials = args.trials
    if trials is None and args.total_trials is None:
        trials = args.default_trials
    return trials, args.total_trials


def add_strict_target_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict-target", action="store_true",
                        help="apply only records of the very same target fingerprint (CPU name "
                             "and whole feature list), not those of targets with the same key")


def shapes(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """The ``--shape NAME=D0,D1,...`` (or ``NAME=D0xD1x...``) options as {name: dims}."""
    out = {}
    for item in args.shape or []:
        name, _, dims = item.rpartition("=")
        parts = dims.replace("x", ",").split(",")
        if not name or not all(p.strip().isdigit() for p in parts):
            raise ArgumentError(f"--shape {item!r}: expected {SHAPE_FORM} with dims that are "
                                "integers >= 0, e.g. input=1,3,224,224")
        out[name] = tuple(int(p) for p in parts)
    return out


def check_paths(args: argparse.Namespace) -> None:
    """The model (or build dir) and log named on the command line, when they exist, are
    regular files (a build dir may be a directory): reading a FIFO or a device would block or
    never end."""
    if getattr(args, "model", None):
        require_regular(args.model, "model", dir_ok=args.command in ("run", "bench"))
    if getattr(args, "log", None):
        require_regular(args.log, "--log")


def require_regular(path: str, what: str, dir_ok: bool = False) -> None:
    if os.path.exists(path) and not (os.path.isfile(path) or dir_ok and os.path.isdir(path)):
        kind = "a regular file or a build dir" if dir_ok else "a regular file"
        raise ArgumentError(f"{what}: {path} is not {kind}")

