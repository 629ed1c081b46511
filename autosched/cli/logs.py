"""The tuning-log subcommands of the ``autosched`` command line: logs summary, best, distill,
merge, prune and plot.

    autosched logs summary tuning_logs/model.jsonl            # per workload and target (--json)
    autosched logs best a.jsonl b.jsonl.gz -o best.jsonl      # the best record of each
    autosched logs distill model.jsonl -k 4 -o small.jsonl    # the best 4 of each
    autosched logs merge a.jsonl b.jsonl -o all.jsonl         # one log, no IR measured twice
    autosched logs prune model.jsonl -o model.jsonl --target cuda/sm_80
    autosched logs plot tuning_logs/model.jsonl -o curves.html     # or -o curves.png
    autosched logs plot run1.jsonl run2.jsonl --model model.onnx -o curves.png

Logs may be gzipped (``.gz``), mix targets and formats, and hold corrupt lines (skipped, and
said so on stderr). A command that writes reads every input first and replaces ``-o`` in one
atomic rename, so ``-o`` may name an input.

A plot shows each task's best latency and the model's estimated end-to-end latency against
trials and wall time; the weights of that estimate are how often each task occurs in the model
(``--model``), else 1 per task. ``tune`` and ``tune-op`` draw the same plot with ``--plot``.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autosched.cli.args import (
    add_precision_option,
    add_shape_option,
    positive,
    require_regular,
    shapes,
)

if TYPE_CHECKING:
    from autosched.search.record import MeasureRecord

WARNINGS_SHOWN = 3  # per log; the rest are counted


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

    tasks, weights = extract_tasks(from_onnx(args.model, shapes(args)), args.target,
                                   args.precision)
    return {t.workload_key: w for t, w in zip(tasks, weights)}


def cmd_plot(args: argparse.Namespace) -> int:
    from autosched.report.plot import check_output

    check_output(args.output)
    for log in args.logs:
        require_regular(log, "log")
    write_curves(args.logs, args.output, model_weights(args), args.model)
    return 0


# -- summary, best, distill, merge, prune ---------------------------------------------------


def read_log(path: str) -> tuple[list[MeasureRecord], int]:
    """The records of a log named on the command line and how many lines it skipped; the first
    warnings are printed on stderr, one line each. A missing log is an error here."""
    from autosched.search.record import RecordLog

    require_regular(path, "log")
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such tuning log", path)
    log = RecordLog(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = log.load()
    for w in caught[:WARNINGS_SHOWN]:
        print(f"warning: {w.message}", file=sys.stderr)
    if len(caught) > WARNINGS_SHOWN:
        print(f"warning: {path}: {len(caught) - WARNINGS_SHOWN} more warnings", file=sys.stderr)
    return records, log.skipped


def _read_all(paths: Sequence[str]) -> list[MeasureRecord]:
    return [r for p in paths for r in read_log(p)[0]]


def _group_key(r: MeasureRecord) -> tuple[str, str]:
    return r.workload_key, r.target_key


def _groups(records: Iterable[MeasureRecord]) -> dict[tuple[str, str], list[MeasureRecord]]:
    """Records by (workload key, target key), in order of first appearance."""
    out: dict[tuple[str, str], list[MeasureRecord]] = {}
    for r in records:
        out.setdefault(_group_key(r), []).append(r)
    return out


def _fastest(records: Iterable[MeasureRecord], k: int) -> list[MeasureRecord]:
    """The ``k`` best (``ranked``: a schedule chosen in a model first)."""
    from autosched.search.record import ranked

    return ranked(records)[:k]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms" if math.isfinite(seconds) else "-"


def summary_rows(records: Sequence[MeasureRecord]) -> list[dict[str, Any]]:
    """Per workload and target: task name, record count, successes, best seconds (None when
    none succeeded) and the error codes counted, sorted by target then task."""
    rows = []
    for (wk, tk), recs in _groups(records).items():
        best = min((r.cost for r in recs if r.ok and not r.in_model), default=math.inf)
        rows.append({"task": recs[0].task_name, "workload_key": wk, "target": tk,
                     "records": len(recs), "ok": sum(r.ok for r in recs),
                     "best_seconds": best if math.isfinite(best) else None,
                     "errors": dict(Counter(r.error_code for r in recs if not r.ok))})
    return sorted(rows, key=lambda row: (row["target"], row["task"], row["workload_key"]))


def _table(rows: Sequence[dict[str, Any]], last: Callable[[dict[str, Any]], str],
           last_title: str) -> list[str]:
    """Rows under a heading per target: task, workload key, records, ok, best, ``last``."""
    lines: list[str] = []
    target = None
    for row in rows:
        if row["target"] != target:
            target = row["target"]
            lines.append(f"  target {target}")
            lines.append(f"    {'task':28s} {'workload':24s} {'records':>7s} {'ok':>6s} "
                         f"{'best':>12s}  {last_title}")
        best = _ms(row["best_seconds"] if row["best_seconds"] is not None else math.inf)
        lines.append(f"    {row['task'][:28]:28s} {row['workload_key'][:24]:24s} "
                     f"{row['records']:7d} {row['ok']:6d} {best:>12s}  {last(row)}")
    return lines


def _errors(row: dict[str, Any]) -> str:
    return ", ".join(f"{code} {n}" for code, n in sorted(row["errors"].items())) or "-"


def cmd_summary(args: argparse.Namespace) -> int:
    out = []
    for path in args.logs:
        records, skipped = read_log(path)
        rows = summary_rows(records)
        out.append({"log": path, "records": len(records), "skipped_lines": skipped,
                    "workloads": len({r["workload_key"] for r in rows}),
                    "targets": sorted({r["target"] for r in rows}), "rows": rows})
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for log in out:
        note = f", {log['skipped_lines']} lines skipped" if log["skipped_lines"] else ""
        print(f"{log['log']}: {_count(log['records'], 'record')}, "
              f"{_count(log['workloads'], 'workload')}, "
              f"{_count(len(log['targets']), 'target')}{note}")
        for line in _table(log["rows"], _errors, "errors"):
            print(line)
    return 0


def _write(records: list[MeasureRecord], output: str, what: str) -> None:
    from autosched.search.record import RecordLog

    require_regular(output, "-o")
    RecordLog(output).rewrite(records)
    groups = _groups(records)
    print(f"wrote {_count(len(records), 'record')} ({what}; "
          f"{_count(len({w for w, _ in groups}), 'workload')}, "
          f"{_count(len({t for _, t in groups}), 'target')}) to {output}")


def cmd_best(args: argparse.Namespace) -> int:
    groups = _groups(_read_all(args.logs))
    best = [top for recs in groups.values() for top in _fastest(recs, 1)]
    if args.output:
        _write(best, args.output, "the best of each workload and target")
        return 0
    by_group = {_group_key(r): r for r in best}
    rows = [row for row in summary_rows([r for recs in groups.values() for r in recs])
            if (row["workload_key"], row["target"]) in by_group]
    print("\n".join(_table(rows, lambda row: by_group[row["workload_key"], row["target"]].source,
                           "record")) or "no successful record")
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    groups = _groups(_read_all(args.logs))
    kept = [r for recs in groups.values() for r in _fastest(recs, args.k)]
    _write(kept, args.output, f"the best {args.k} of each workload and target")
    return 0


def _identity(r: MeasureRecord) -> tuple[str, ...]:
    """What makes two records the same measurement: workload, target and IR hash (the steps
    when a record has no hash)."""
    return (*_group_key(r), r.ir_hash or json.dumps(r.steps, sort_keys=True),
            str(r.in_model), str(r.timestamp) if r.in_model else "")


def cmd_merge(args: argparse.Namespace) -> int:
    seen: set[tuple[str, ...]] = set()
    kept = []
    records = _read_all(args.logs)
    for r in records:
        if _identity(r) not in seen:
            seen.add(_identity(r))
            kept.append(r)
    dropped = len(records) - len(kept)
    _write(kept, args.output, f"from {_count(len(args.logs), 'log')}, "
           f"{_count(dropped, 'duplicate')} dropped")
    return 0


def _named_target(key: str, names: Sequence[str]) -> bool:
    """Whether a target key is one of ``names`` or under one ("cuda" names "cuda/sm_90")."""
    return any(key == n or key.startswith(n.rstrip("/") + "/") for n in names)


def cmd_prune(args: argparse.Namespace) -> int:
    records, skipped = [], 0
    for path in args.logs:
        recs, n = read_log(path)
        records += recs
        skipped += n
    targets, workloads = args.target or [], set(args.workload or [])
    reasons: Counter[str] = Counter()
    kept = []
    for r in records:
        reason = ("transient" if r.transient else
                  "failed" if not r.ok and not args.keep_failed else
                  "target named" if _named_target(r.target_key, targets) else
                  "workload named" if r.workload_key in workloads or r.task_name in workloads
                  else "")
        if reason:
            reasons[reason] += 1
        else:
            kept.append(r)
    dropped = ", ".join(f"{n} {why}" for why, n in [("unparseable", skipped), *reasons.items()]
                        if n) or "nothing"
    _write(kept, args.output, f"dropped {dropped}")
    return 0


def _debug_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="on an error, print the traceback too")


def _add_tools(logs: Any) -> None:
    specs = (("summary", cmd_summary, "records, best latency and errors per workload and target"),
             ("best", cmd_best, "the best record of each workload and target"),
             ("distill", cmd_distill, "keep the best k records of each workload and target"),
             ("merge", cmd_merge, "merge logs into one, each measured IR once"),
             ("prune", cmd_prune, "drop failed, transient and unparseable lines, and records of "
                                  "the targets or workloads named"))
    for name, fn, helptext in specs:
        p = logs.add_parser(name, help=helptext)
        p.add_argument("logs", nargs="+", metavar="LOG", help="tuning logs (.jsonl or .jsonl.gz)")
        if name == "summary":
            p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        else:
            p.add_argument("-o", "--output", required=name != "best", metavar="OUT",
                           help="the log to write (.jsonl, or .jsonl.gz); may be an input")
        if name == "distill":
            p.add_argument("-k", type=positive, default=1, help="records kept per workload")
        if name == "prune":
            p.add_argument("--target", action="append", metavar="KEY",
                           help="drop this target's records (a key as summary prints it, or "
                                "its start: cuda, llvm/aarch64-linux-gnu)")
            p.add_argument("--workload", action="append", metavar="KEY|TASK",
                           help="drop this workload's records (its key or task name)")
            p.add_argument("--keep-failed", action="store_true",
                           help="keep records of failed candidates (a resumed job does not "
                                "measure them again)")
        _debug_option(p)
        p.set_defaults(fn=fn, command=f"logs {name}")


def add_subcommands(sub: Any) -> None:
    """Add ``logs summary|best|distill|merge|prune|plot`` to the ``autosched`` parser's
    subparsers."""
    logs = sub.add_parser("logs", help="what tuning logs say").add_subparsers(
        dest="action", required=True)
    _add_tools(logs)
    p = logs.add_parser("plot", help="plot tuning curves as PNG or a self-contained HTML page")
    p.add_argument("logs", nargs="+", metavar="LOG", help="tuning logs (JSON lines)")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html|FILE.png")
    p.add_argument("--model", default=None, metavar="MODEL.onnx",
                   help="weigh each task by how often it occurs in this model")
    p.add_argument("--target", default="llvm", help="the target the model's tasks are for")
    add_precision_option(p)
    add_shape_option(p)
    _debug_option(p)
    p.set_defaults(fn=cmd_plot, command="logs plot")
