"""One timed measurement per device at a time, across processes.

Two tuning jobs on one machine (two models tuned side by side, a test run beside a tune) would
otherwise time their candidates at the same moments on the same cores or GPU, and each would
record the other's load as its own candidates' cost. Each measurement worker therefore holds
advisory locks on the device (``flock`` on files named after it in the system's temporary
folder) while it times a candidate; builds, searches and correctness checks run unlocked, so
jobs still overlap everywhere but in the timed loops. A CPU is locked core by core, the cores
the worker may run on (its affinity): jobs pinned to disjoint cores (simulated cluster nodes
on one host, say) time side by side; an unpinned job takes turns with all of them.

Example::

    with device_lock(target, waiting=lambda: conn.send(Beat())):
        costs = time_candidate(...)

The file is opened, never read: a planted file can at worst make a job wait (its owner holds
the lock), which the waiting callback reports as progress to the tuner, which stays alive.
``AUTOSCHED_MEASURE_LOCK=0`` turns the lock off (measuring on disjoint cores on purpose).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from autosched import settings

try:
    import fcntl
except ImportError:  # not a POSIX system: jobs are not serialised there
    fcntl = None  # type: ignore[assignment]

POLL_S = 0.02  # how often a waiting worker tries the lock again
WAITING_EVERY_S = 0.25  # how often it calls ``waiting`` meanwhile


def lock_path(device: str) -> str:
    """The lock file of ``device`` (a name such as ``cpu3`` or ``cuda-0000:19:00.0``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device)
    return os.path.join(tempfile.gettempdir(), f"autosched-measure-{safe}.lock")


def enabled() -> bool:
    return settings.flag(settings.MEASURE_LOCK)


@contextlib.contextmanager
def device_lock(target: Any, waiting: Callable[[], None] | None = None) -> Iterator[float]:
    """Hold the locks of the device ``target`` runs on (on a CPU, one per core this process
    may run on); yields the seconds spent waiting. ``waiting`` is called every quarter second
    while another process holds one of them."""
    if fcntl is None or not enabled():
        yield 0.0
        return
    # one order for every process (sorted names): two jobs each holding part of the other's
    # cores never wait for each other for good
    fds = [fd for fd in (_open(lock_path(n)) for n in sorted(set(
        target.backend.device_names(target)))) if fd is not None]
    t0 = last = time.perf_counter()
    try:
        for fd in fds:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        raise
                time.sleep(POLL_S)
                now = time.perf_counter()
                if waiting is not None and now - last >= WAITING_EVERY_S:
                    waiting()
                    last = now
        yield time.perf_counter() - t0
    finally:
        for fd in fds:
            os.close(fd)  # closing a descriptor releases its lock


def _open(path: str) -> int | None:
    """A descriptor of the lock file (created readable by every user: a read-only descriptor
    locks too, so jobs of different users share it), or None when it cannot be opened (then nothing is locked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError:
        return None
    return fd
