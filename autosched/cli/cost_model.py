"""``autosched train-cost-model``: a pretrained cost model from tuning logs.

    autosched train-cost-model tuning_logs/*.jsonl* --model resnet18.onnx -o build/cost_model
    autosched train-cost-model LOG... -o DIR --hold-out LOG --hold-out-share 0.25

Each record's task is rebuilt from its workload key: the tasks of the ``--model`` files for
every target the logs hold, and the named operators the project's cost-model logs measured.
``--hold-out LOG`` (the log's workloads are left out of training, on every target) and
``--hold-out-share F`` (that share of all workloads, picked by key) print how well a model
trained without them ranks them; the model written is trained on everything.
"""

from __future__ import annotations

import argparse
import errno
import os
from typing import Any

from autosched.cli.args import ArgumentError, add_shape_option, positive, require_regular, shapes


def cmd_train(args: argparse.Namespace) -> int:
    from autosched.graph.compiler import extract_tasks
    from autosched.search.training_data import build_model
    from importers.onnx import from_onnx

    for log in args.logs:
        require_regular(log, "log")
        if not os.path.exists(log):
            raise FileNotFoundError(errno.ENOENT, "no such log", log)
    unknown = [h for h in args.hold_out or [] if h not in args.logs]
    if unknown:
        raise ArgumentError(f"--hold-out {unknown[0]}: not one of the logs given")
    if not 0 <= args.hold_out_share < 1:
        raise ArgumentError(f"--hold-out-share {args.hold_out_share}: expected 0 <= F < 1")
    for m in args.models or []:
        require_regular(m, "--model")
    graphs = [from_onnx(m, shapes(args)) for m in args.models or []]
    try:
        build_model(args.logs, args.output,
                    lambda target: [t for g in graphs for t in extract_tasks(g, target)[0]],
                    hold_out=args.hold_out or [], hold_out_share=args.hold_out_share,
                    rounds=args.rounds)
    except ValueError as exc:  # the logs hold nothing to learn from
        raise ArgumentError(f"{exc} (records of the named operators, or of the --model files' "
                            "tasks, are used)") from None
    return 0


def add_subcommands(sub: Any) -> None:
    p = sub.add_parser("train-cost-model", help="train a pretrained cost model from tuning logs")
    p.add_argument("logs", nargs="+", help="tuning logs (.jsonl or .jsonl.gz)")
    p.add_argument("-o", "--output", required=True,
                   help="directory to write model.ubj and manifest.json into")
    p.add_argument("--model", action="append", dest="models", metavar="MODEL.onnx",
                   help="an ONNX model the logs tuned (its tasks rebuild their records)")
    add_shape_option(p)
    p.add_argument("--rounds", type=positive, default=None, help="boosting rounds (trees)")
    p.add_argument("--hold-out", action="append", metavar="LOG",
                   help="evaluate on this log's workloads with a model trained without them")
    p.add_argument("--hold-out-share", type=float, default=0.0, metavar="F",
                   help="evaluate on this share of the workloads, trained without them")
    p.set_defaults(fn=cmd_train)
