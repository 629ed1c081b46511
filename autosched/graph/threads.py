"""How many threads the next run of a CPU model uses: all of its cores, or one, by what the
runs themselves take.

Parallel kernels pay for their gain in traffic between cores: a kernel reads what the one
before it wrote, part of it in another core's cache. On a virtual machine whose vCPUs the host
moves apart (a cache line passed between two of them taking 350 ns instead of 60, for seconds
or minutes at a time) that traffic can cost a small model more than its second core gains:
the demo's CNN runs 0.11 ms on 2 threads and 0.14 on 1 while the cores are close, 0.23 on 2
and 0.13 on 1 while they are far. A thread count fixed at compile time is wrong half the time.

So a model run without an explicit thread count (``CompiledModel.set_threads(None)``) keeps
timing its own runs: it runs on all its cores, and every ``interval`` runs tries a short burst
on one thread; the burst's median against the recent runs' median decides which count the runs
after it use. A burst that loses doubles the interval (up to ``MAX_INTERVAL`` runs), so a model
that gains from its cores (ResNet-18: 2x) spends a fraction of a percent trying; one that wins
starts it over, so the model moves back when the cores do. ``AUTOSCHED_ADAPTIVE_THREADS=0``
keeps the compile-time count.

Example::

    pick = AdaptiveThreads(2)
    for _ in range(1000):
        n = pick.next()            # 2, or 1 while one thread is faster
        t0 = time.perf_counter(); run(n); pick.observe(time.perf_counter() - t0)
"""

from __future__ import annotations

from collections import deque

import numpy as np

from autosched import settings

FIRST_INTERVAL = 16  # runs before the first try (and after a switch)
MAX_INTERVAL = 1024
BURST = 4  # runs of one try; the first is not counted (the caches move over)
RECENT = 8  # runs of the current count the try is compared with
MARGIN = 0.9  # a try must be this much faster to switch


def adaptive() -> bool:
    return settings.flag(settings.ADAPTIVE_THREADS)


class AdaptiveThreads:
    """The thread count of each run of one model context (not thread-safe: one per arena)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.current = threads
        self.interval = FIRST_INTERVAL
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.since = 0  # runs of the current count since the last try
        self.trying: list[float] | None = None
        self.switches = 0

    @property
    def other(self) -> int:
        return 1 if self.current != 1 else self.threads

    def next(self) -> int:
        """The thread count of the next run."""
        if self.threads <= 1:
            return self.threads
        if self.trying is None and self.since >= self.interval and len(self.recent) >= 4:
            self.trying = []
        return self.other if self.trying is not None else self.current

    def observe(self, seconds: float) -> None:
        """The seconds the run ``next`` was asked for took."""
        if self.trying is None:
            self.recent.append(seconds)
            self.since += 1
            return
        self.trying.append(seconds)
        if len(self.trying) < BURST:
            return
        tried = self.trying[1:]
        if float(np.median(tried)) < MARGIN * float(np.median(self.recent)):
            self.current = self.other
            self.recent = deque(tried, maxlen=RECENT)
            self.interval = FIRST_INTERVAL
            self.switches += 1
        else:
            self.interval = min(2 * self.interval, MAX_INTERVAL)
        self.trying, self.since = None, 0
