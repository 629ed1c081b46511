"""Reports on tuning: what a tuning log says about how a tune went.

``curves`` turns a log into best-so-far curves per task and per model (no plotting library
needed); ``plot`` draws them as a PNG or a self-contained HTML page (matplotlib, the
``autosched[plot]`` extra, imported only when a plot is drawn).

Example::

    from autosched.report import curves, plot

    runs = curves.tuning_runs("tuning_logs/resnet18-llvm.jsonl")
    plot.write(runs, "curves.html")
"""
