"""The ``autosched demo`` subcommand (``make demo``): see autosched.demo.

    autosched demo                                      # ~2-3 minutes on 2 cores
    autosched demo --trials 200 --log tuning_logs/demo.jsonl   # longer; resumes
    autosched demo --gemm                               # the hand-scheduled GEMM demo
"""

from __future__ import annotations

import argparse
from typing import Any

from autosched.cli.args import count, positive


def cmd_demo(args: argparse.Namespace) -> int:
    from autosched.demo import gemm_demo, model_demo

    if args.gemm:
        gemm_demo(args.n, args.target)
    else:
        model_demo(args.trials, args.log, args.target)
    return 0


def add_subcommands(sub: Any) -> None:
    """Add demo to the ``autosched`` parser's subparsers."""
    p = sub.add_parser("demo", help="tune a small CNN end to end next to onnxruntime")
    p.add_argument("--trials", type=count, default=64, help="tuning trials in all")
    p.add_argument("--log", default=None, help="keep the tuning log here (resumes)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--gemm", action="store_true", help="the hand-scheduled GEMM demo")
    p.add_argument("--n", type=positive, default=512, help="GEMM size for --gemm")
    p.set_defaults(fn=cmd_demo)
