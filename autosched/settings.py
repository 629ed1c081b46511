"""Every environment variable autosched reads, in one place: its name, default and what it
changes. Each is read when it is used, never at import time, so a program (or a test) may set
one between two calls. Those marked ``changes_code`` alter the code generated for a target.

Example::

    from autosched import settings
    if settings.flag(settings.ADAPTIVE_THREADS):
        ...
    print(settings.describe())          # the table the README shows
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    doc: str
    changes_code: bool = False

    def value(self) -> str:
        """The variable's value; the default when it is unset or empty."""
        return os.environ.get(self.name) or self.default


CACHE_DIR = Setting("AUTOSCHED_CACHE_DIR", "",
                    "the on-disk cache of built artifacts (default ~/.cache/autosched)")
CC = Setting("AUTOSCHED_CC", "", "the C compiler that links shared libraries (default: cc, or "
             "the triple's cross gcc)")
PARALLEL = Setting("AUTOSCHED_PARALLEL", "pool",
                   "what runs CPU parallel loops: autosched's own pool, or `gomp` (libgomp)",
                   changes_code=True)
PRINT_AFTER = Setting("AUTOSCHED_PRINT_AFTER", "",
                      "comma-separated lowering passes to print the loop IR after")
MEASURE_LOCK = Setting("AUTOSCHED_MEASURE_LOCK", "1",
                       "`0`: timed measurements of processes on one device do not take turns")
ADAPTIVE_THREADS = Setting("AUTOSCHED_ADAPTIVE_THREADS", "1",
                           "`0`: CPU models keep their thread count instead of trying one "
                           "thread when that runs faster")
SCHEDULE = Setting("AUTOSCHED_SCHEDULE", "auto",
                   "what a compile gives a task no log record covers, when it names none: "
                   "`auto` (the cost model's pick on GPUs, the untuned default on CPUs), "
                   "`default` or `model`")
PICK_CACHE = Setting("AUTOSCHED_PICK_CACHE", "1",
                     "`0`: zero-measurement picks are searched again, not read from the cache "
                     "(benchmarks that time the search)")
CONV_GEMM = Setting("AUTOSCHED_CONV_GEMM", "explicit",
                    "how GPU convolutions in tf32 / fp16 / bf16 read their im2col patches: "
                    "`explicit` (a kernel of their own writes them) or `implicit` (the "
                    "matmul's tile copy gathers them from the input)", changes_code=True)
CONV_COLUMNS = Setting("AUTOSCHED_CONV_COLUMNS", "batch",
                       "the columns of those convolutions' matmuls at batches above one: "
                       "`batch` (one GEMM over the whole batch's pixels) or `image` (a matmul "
                       "per image)", changes_code=True)
K_SPLIT = Setting("AUTOSCHED_K_SPLIT", "8",
                  "the most slices of K that a GPU GEMM in tf32 / fp16 / bf16 (a convolution's, "
                  "a MatMul's by constant weights) sums apart where few output tiles cover a "
                  "deep K (a power of two; `1`: never)", changes_code=True)
WGMMA = Setting("AUTOSCHED_WGMMA", "1",
                "`0`: on sm_90 GPUs, matmuls in tf32 / fp16 / bf16 are not offered block tiles "
                "on Hopper's warpgroup instruction (wgmma), only the warp-level tensor-core "
                "tiles (wmma)", changes_code=True)
TMA = Setting("AUTOSCHED_TMA", "0",
              "`1`: wgmma main loops copy their operands' K tiles with TMA copies issued by "
              "one thread instead of cp.async from every thread", changes_code=True)
MODEL_CACHE = Setting("AUTOSCHED_MODEL_CACHE", "build/models",
                      "where autosched.testing.models writes the reference ONNX models")

ALL = (CACHE_DIR, CC, PARALLEL, PRINT_AFTER, MEASURE_LOCK, ADAPTIVE_THREADS, SCHEDULE,
       PICK_CACHE, CONV_GEMM, CONV_COLUMNS, K_SPLIT, WGMMA, TMA, MODEL_CACHE)


def flag(s: Setting) -> bool:
    """An on/off setting: off when its value is ``0``, ``false``, ``no`` or ``off``."""
    return s.value().strip().lower() not in ("0", "false", "no", "off")


def describe() -> str:
    """The settings as a Markdown table."""
    rows = ["| variable | default | what it changes |", "|---|---|---|"]
    rows += [f"| `{s.name}` | {f'`{s.default}`' if s.default else '(unset)'} | {s.doc}"
             f"{' (changes generated code)' if s.changes_code else ''} |" for s in ALL]
    return "\n".join(rows)
