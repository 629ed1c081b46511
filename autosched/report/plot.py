"""Tuning curves drawn: a PNG, or a self-contained HTML page (the PNG as a data URI and a table
per run; no script, nothing fetched).

One row of two panels per tuning run (each task's best latency against trials and against wall
time, log scale), then, when a run has several tasks, one row for the model (the estimated
end-to-end latency of every run, so runs can be compared). matplotlib is the
``autosched[plot]`` extra: it is imported when a plot is drawn, through its object API (no
pyplot, so no global backend and no window).

Example::

    runs = curves.tuning_runs("tuning_logs/resnet18-llvm.jsonl")
    check_output("curves.html")     # before a long tune: PlotError without matplotlib
    write(runs, "curves.html")      # or curves.png
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autosched.errors import AutoschedError
from autosched.report.curves import Step, TuningRun

FORMATS = (".png", ".html")
COLUMNS = ("task", "weight", "trials", "best latency", "time to best")
WIDTH_IN, ROW_HEIGHT_IN, DPI = 12.0, 3.6, 100  # a row of panels: 1200 x 360 pixels
EXTRA = "autosched[plot]"
NO_WEIGHTS = ("each task weighs 1: the log does not say how often a task occurs in its model "
              "(give --model MODEL.onnx)")


class PlotError(AutoschedError):
    """A plot that cannot be drawn here (no matplotlib, an output format we do not write)."""


def check_output(path: str | os.PathLike) -> None:
    """PlotError unless a plot can be written to ``path``: its suffix is .png or .html and
    matplotlib is installed. A tune calls this before it measures anything."""
    if Path(path).suffix.lower() not in FORMATS:
        raise PlotError(f"{path}: a plot is written as {' or '.join(FORMATS)}")
    _figure_class()


def write(runs: Sequence[TuningRun], path: str | os.PathLike,
          weights_from: str | None = None) -> Path:
    """Draw ``runs`` into ``path`` (.png or .html); ``weights_from`` names the model the task
    weights came from (None: every task weighs 1, and the plot says so)."""
    check_output(path)
    out = Path(path)
    if out.suffix.lower() == ".png":
        out.write_bytes(png(runs, weights_from))
    else:
        out.write_text(page(runs, weights_from), encoding="utf-8")
    return out


def png(runs: Sequence[TuningRun], weights_from: str | None = None) -> bytes:
    """The curves as PNG bytes, WIDTH_IN x ROW_HEIGHT_IN inches per row at DPI (a row per
    run, and one for the model when a run has several tasks)."""
    return _png(runs, subtitle(runs, weights_from))


def page(runs: Sequence[TuningRun], weights_from: str | None = None) -> str:
    """A self-contained HTML page: the PNG embedded as a data URI, and per run a table of its
    tasks (weight, trials, best latency, time to best)."""
    note = subtitle(runs, weights_from)
    data = base64.b64encode(_png(runs, note)).decode("ascii")
    logs = ", ".join(dict.fromkeys(Path(r.log).name for r in runs))
    sections = "\n".join(_section(run) for run in runs)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Tuning curves: {html.escape(logs)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
img {{ max-width: 100%; }}
table {{ border-collapse: collapse; }}
th, td {{ padding: 2px 10px; border-bottom: 1px solid #ddd; }}
td + td {{ text-align: right; }}
</style>
</head>
<body>
<h1>Tuning curves</h1>
<p>{html.escape(note)}</p>
<img alt="best latency against trials and wall time, per task and per model"
     src="data:image/png;base64,{data}">
{sections}
</body>
</html>
"""


def subtitle(runs: Sequence[TuningRun], weights_from: str | None) -> str:
    """Where the weights of the end-to-end estimate come from, and which runs have none."""
    notes = []
    if any(len(r.tasks) > 1 for r in runs):  # a single task's curve needs no weights
        notes.append(f"weights: how often each task occurs in {weights_from}" if weights_from
                     else NO_WEIGHTS)
    notes += [f"{_label(r)}: {len(r.missing)} weighted tasks have no successful record, so "
              "no end-to-end estimate" for r in runs if r.missing]
    return "; ".join(notes)


def _section(run: TuningRun) -> str:
    rows = "\n".join(
        f"<tr><td>{html.escape(t.name)}</td><td>{t.weight:g}</td><td>{t.trials}</td>"
        f"<td>{_ms(t.best)}</td><td>{_secs(t.seconds_to_best)}</td></tr>" for t in run.tasks)
    total = _ms(run.model[-1].best) if run.model else "n/a"
    return f"""<h2>{html.escape(_label(run))}</h2>
<p>{run.trials} trials in {_secs(run.seconds)}; estimated end-to-end latency {total}</p>
<table>
<thead><tr>{"".join(f"<th>{h}</th>" for h in COLUMNS)}</tr></thead>
<tbody>
{rows}
</tbody>
</table>"""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms" if math.isfinite(seconds) else "n/a"


def _secs(seconds: float) -> str:
    return f"{seconds:.1f} s" if math.isfinite(seconds) else "n/a"


def _label(run: TuningRun) -> str:
    return f"{Path(run.log).name} on {run.target}"


# -- drawing ---------------------------------------------------------------------------------


def _png(runs: Sequence[TuningRun], note: str) -> bytes:
    buf = io.BytesIO()
    _figure(runs, note).savefig(buf, format="png")
    return buf.getvalue()


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(f"plotting needs matplotlib: pip install '{EXTRA}'") from None
    return Figure


def _figure(runs: Sequence[TuningRun], note: str) -> Any:
    with_model = any(len(r.tasks) > 1 for r in runs)
    rows = len(runs) + with_model
    fig = _figure_class()(figsize=(WIDTH_IN, ROW_HEIGHT_IN * rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, 2, squeeze=False)
    axis = _Axis(runs)
    for row, run in zip(axes, runs):
        for ax in row:
            ax.set_prop_cycle(color=_colours(len(run.tasks)))
        for task in run.tasks:
            axis.draw(row, task.steps, run, label=task.name)
        axis.dress(row, f"{_label(run)}: best latency per task")
        row[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=6, frameon=False,
                      ncol=math.ceil(len(run.tasks) / 32))
    if with_model:
        one_target_per_log = len({r.log for r in runs}) == len(runs)
        for run in runs:
            label = Path(run.log).name if one_target_per_log else _label(run)
            axis.draw(axes[-1], run.model, run, label=label)
        axis.dress(axes[-1], "estimated end-to-end latency (weighted sum of the tasks' best)")
        if any(run.model for run in runs):
            axes[-1][1].legend(loc="upper right", fontsize=7)
    fig.suptitle("\n".join(filter(None, ("Tuning curves", note))), fontsize=10)
    return fig


class _Axis:
    """The units every panel shares: latency in ms (µs when every best is under 1 ms), wall
    time in s (min when a run took over 10 minutes)."""

    def __init__(self, runs: Sequence[TuningRun]):
        slowest = max(t.best for r in runs for t in r.tasks if math.isfinite(t.best))
        self.latency, self.per_second = ("ms", 1e3) if slowest >= 1e-3 else ("µs", 1e6)
        self.time, self.time_scale = (
            ("min", 60.0) if max(r.seconds for r in runs) > 600 else ("s", 1.0))

    def draw(self, row: Any, steps: Sequence[Step], run: TuningRun, label: str) -> None:
        """One best-so-far curve in both panels of a row, held flat to the end of the run."""
        if not steps:
            return
        best = [s.best * self.per_second for s in (*steps, steps[-1])]
        trials = [s.trial for s in steps] + [run.trials]
        seconds = [s.seconds / self.time_scale for s in steps] + [run.seconds / self.time_scale]
        row[0].step(trials, best, where="post", label=label, lw=1)
        row[1].step(seconds, best, where="post", label=label, lw=1)

    def dress(self, row: Any, title: str) -> None:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.1, not 10^-1

        row[0].set_xlabel("trials")
        row[1].set_xlabel(f"wall time since the first measurement ({self.time})")
        for ax in row:
            ax.set_ylabel(f"latency ({self.latency})")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            low, high = ax.get_ylim()  # under a decade has too few major ticks: label the minor
            ax.yaxis.set_minor_formatter(plain if high < 10 * low else NullFormatter())
            ax.grid(True, which="both", alpha=0.3)
        row[0].set_title(title, fontsize=9, loc="left")


def _colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    palette = [colormaps[name](i) for name in ("tab20", "tab20b") for i in range(20)]
    return [palette[i % len(palette)] for i in range(max(n, 1))]
