"""Tuning records: one JSON object per line, appended to a log that is the tuner's memory.

A record says what was measured (workload key, task name, the schedule's steps, the hash of the
lowered IR), where (the target fingerprint) and what came out (costs in seconds, or an error
code). Lines are appended and fsynced one at a time, so a job killed mid-way loses at most the
line being written; a torn or corrupt line is skipped with a warning naming the file and line.

The target fingerprint (1-3 KB) is written once per target per file, as a header line
``{"target_header": "llvm-3fa9c01d2b7e", "fingerprint": {...}}``, and each record names it by
that short reference (a hash of the fingerprint, so two headers of one reference always agree
and a header written twice is harmless). Logs of version 1, the fingerprint on every line,
still load; so do gzipped logs (``*.jsonl.gz``, read only).

Example::

    log = RecordLog("tuning_logs/matmul.jsonl")
    log.append(records_from(task, schedules, measurer.measure(task, schedules)))
    (top,) = log.best(task.workload_key, task.target)
    sch = task.schedule(top.schedule_steps())
    schedules = apply_history_best([task], log)       # {workload_key: Schedule}
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import logging
import math
import os
import stat
import statistics
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autosched.errors import ScheduleError
from autosched.schedule.steps import (
    MAX_INT,
    Step,
    check_step_dict,
    fits,
    short_repr,
    step_from_dict,
)
from autosched.search.error_codes import ErrorCode
from autosched.targets import backend as backends
from autosched.targets.backend import TargetKeys
from autosched.targets.target import Target
from autosched.tir.ir import PrimFunc
from autosched.version import __version__

if TYPE_CHECKING:
    from autosched.schedule.schedule import Schedule
    from autosched.search.task import Task

RECORD_VERSION = 2  # 2: records name their target by a header's reference
READ_VERSIONS = (1, 2)
DEFAULT_LOG_DIR = "tuning_logs"
MAX_ERROR_MSG = 2000
MIN_FREE_BYTES = 1 << 20  # a job refuses to start when its log's device has less free
MAX_GZ_BYTES = 4 << 30  # a gzipped log decompressing past this is refused (a zip bomb)
HEADER_KEY = "target_header"
GZIP_MAGIC = b"\x1f\x8b"

_log = logging.getLogger(__name__)
# (log, target, match level) already said: records of other targets applied; UNTIMED: records
# checked only under an emulator applied
_SAID: set[tuple[str, str, int]] = set()
UNTIMED = -1


# -- target fingerprints ---------------------------------------------------------------------


def target_fingerprint(target: Target) -> dict[str, Any]:
    """What the measured code depended on, as the target's backend describes it (for llvm the
    triple, CPU, features, thread count and the llvmlite / LLVM versions; for cuda the arch and
    the NVRTC and driver versions). Records store it whole; lookups use its keys.

    Example::

        fp = target_fingerprint(parse("llvm"))   # {"kind": "llvm", "triple": "x86_64-...", ...}
        fingerprint_key(fp)               # "llvm/x86_64-linux/v512/avx,avx2,...,sse4.2/t2"
    """
    return target.backend.fingerprint(target)


def fingerprint_key(fp: dict[str, Any] | Target) -> str:
    """A short stable string for lookups: what changes the generated code (docs/TARGETS.md):
    for llvm the architecture and OS, the vector width and ISA features the code generator uses
    and the thread count; for cuda the arch. Not the CPU's name, not library versions. A
    fingerprint read from a log whose kind no backend knows keys as its kind alone.

    Example::

        fingerprint_key(parse("cuda -arch=sm_90"))   # "cuda/sm_90"
        fingerprint_key(parse("llvm -mcpu=znver4"))  # "llvm/x86_64-linux/v512/avx,...,sse4.2/t16"
    """
    return target_keys(fp).key


def target_keys(fp: dict[str, Any] | Target) -> TargetKeys:
    """The keys a record's target is matched by, from the whole fingerprint to its family
    (backend.TargetKeys).

    Example::

        target_keys(parse("cuda -arch=sm_80")).family == target_keys(parse("cuda")).family
    """
    if isinstance(fp, Target):
        fp = target_fingerprint(fp)
    kind = str(fp.get("kind", ""))
    if kind not in backends.kinds():
        return TargetKeys(kind, kind, kind, kind)
    return backends.get(kind).target_keys(fp)


def _target_key(target: Target, strict: bool) -> str:
    keys = target_keys(target)
    return keys.exact if strict else keys.key


# How a record's target stands to the target looked up, closest first: measured on it (EXACT),
# on another CPU of the same key (COMPATIBLE: they apply), with another thread count (THREADS:
# they apply when the workload has nothing closer), on a related target (RELATED: they seed).
EXACT, COMPATIBLE, THREADS, RELATED = range(4)


def target_match(have: TargetKeys, want: TargetKeys, strict: bool = False) -> int | None:
    """How a record of target ``have`` matches target ``want`` (EXACT ... RELATED), or None
    when they are not related. ``strict``: whatever is not EXACT is at most RELATED."""
    if have.exact == want.exact:
        return EXACT
    if have.family != want.family:
        return None
    if strict:
        return RELATED
    if have.key == want.key:
        return COMPATIBLE
    return THREADS if have.isa == want.isa else RELATED


def target_ref(fp: dict[str, Any]) -> str:
    """The short reference a log's records use for the fingerprint ``fp``: its kind and a hash
    of the whole fingerprint (not fingerprint_key, which maps related fingerprints together).

    Example::

        target_ref(target_fingerprint(parse("llvm")))   # "llvm-3fa9c01d2b7e"
    """
    text = json.dumps(fp, sort_keys=True, separators=(",", ":"), allow_nan=False)
    kind = "".join(ch for ch in str(fp.get("kind", ""))[:16] if ch.isalnum()) or "target"
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def ir_hash(func: PrimFunc) -> str:
    """The hash of a lowered function's printed IR: equal hashes mean the same code, so the
    search never measures a candidate whose hash the log already has.

    Example::

        h = ir_hash(task.lower(sch))      # 32 hex digits
    """
    return hashlib.sha256(str(func).encode()).hexdigest()[:32]


# -- records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasureRecord:
    """One measured candidate, as stored on one line of a log.

    Example::

        rec = MeasureRecord.from_json(json.loads(line))
        rec.cost                 # median seconds, inf for a failed candidate
        task.schedule(rec.schedule_steps())
    """

    workload_key: str
    task_name: str
    target: dict[str, Any]
    steps: list[dict[str, Any]]
    costs: list[float]
    error_code: str = "NO_ERROR"
    error_msg: str = ""
    timestamp: float = 0.0
    build_time: float = 0.0
    autosched_version: str = ""
    ir_hash: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = RECORD_VERSION
    # Where load() found it ("path:line"), for warnings; not serialised, not compared.
    source: str = field(default="", compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.error_code == "NO_ERROR" and bool(self.costs)

    @property
    def cost(self) -> float:
        """Median seconds per call; inf for a failed candidate."""
        return statistics.median(self.costs) if self.ok else math.inf

    @property
    def emulated(self) -> bool:
        """Measured under an emulator (an aarch64 board emulated by qemu): its output was
        checked, but its cost (seconds of emulation) says nothing of the candidate's speed."""
        return self.extra.get("emulated") is True

    @property
    def untuned(self) -> bool:
        """The schedule of the search space's default candidate: what compiling without a log
        builds."""
        return self.extra.get("untuned") is True

    @property
    def in_model(self) -> bool:
        """The schedule chosen for the workload by timing it inside a model (graph/choose.py):
        its costs are that kernel's seconds in the model, not a candidate measured alone. It
        ranks before every candidate (the latest such record of a workload wins) and is not a
        trial: the search, the trial counts and the cost model leave it out."""
        return self.extra.get("in_model") is True

    @property
    def target_key(self) -> str:
        return fingerprint_key(self.target)

    def schedule_steps(self) -> list[Step]:
        """The steps as Step objects (ScheduleError when one is malformed)."""
        return [step_from_dict(d) for d in self.steps]

    def to_json_line(self, target: str | None = None) -> str:
        """The record as one line of the current version; ``target``: the reference of a
        header line that holds the fingerprint (RecordLog writes it), else the fingerprint."""
        d = {
            "version": RECORD_VERSION, "workload_key": self.workload_key,
            "task_name": self.task_name, "target": self.target if target is None else target,
            "steps": self.steps,
            "costs": self.costs, "error_code": self.error_code,
            "error_msg": self.error_msg[:MAX_ERROR_MSG], "timestamp": self.timestamp,
            "build_time": self.build_time, "autosched_version": self.autosched_version,
            "ir_hash": self.ir_hash, "extra": self.extra,
        }
        # allow_nan=False: a NaN cost would make a line other JSON readers reject
        return json.dumps(d, separators=(",", ":"), allow_nan=False)

    @property
    def transient(self) -> bool:
        """Whether the measurement was cut short from outside (the worker was killed by a
        signal it did not raise, or stopped): it says nothing of the candidate, so a resumed
        job does not count it as measured."""
        return self.error_code in TRANSIENT_ERRORS

    @staticmethod
    def from_json(d: dict[str, Any], source: str = "",
                  headers: dict[str, dict[str, Any]] | None = None) -> MeasureRecord:
        """Parse one decoded line; ValueError naming the problem when it is not a record (the
        values are checked too: a log is data from outside, and one bad line must not crash a
        resume or be chosen as the best). A target given by reference is looked up in
        ``headers`` ({reference: fingerprint}); MissingHeader when it is not there."""
        if not isinstance(d, dict):
            raise ValueError(f"a record must be a JSON object, got {type(d).__name__}")
        missing = [k for k in ("version", "workload_key", "target", "steps", "costs",
                               "error_code") if k not in d]
        if missing:
            raise ValueError(f"record lacks {', '.join(missing)}")
        if not isinstance(d["steps"], list) or not all(isinstance(s, dict) for s in d["steps"]):
            raise ValueError("record steps must be a list of objects")
        for s in d["steps"]:
            check_step_dict(s, ValueError)
        if not isinstance(d["costs"], list):
            raise ValueError(f"record costs must be a list of numbers, got {short_repr(d['costs'])}")
        costs = [_number(c, "record costs") for c in d["costs"]]
        if any(c <= 0 for c in costs):
            raise ValueError(f"record costs must be positive seconds, got {short_repr(d['costs'])}")
        target = d["target"]
        if isinstance(target, str):
            if target not in (headers or {}):
                raise MissingHeader(f"no target header {short_repr(target)} in the log")
            target = (headers or {})[target]
        if not isinstance(target, dict):
            raise ValueError("record target must be a fingerprint object or a header's reference")
        if d["error_code"] not in KNOWN_ERRORS:
            raise ValueError(f"unknown error code {short_repr(d['error_code'])}")
        extra = d.get("extra") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"record extra must be an object, got {short_repr(extra)}")
        if "candidate" in extra:
            _check_candidate(extra["candidate"])
        return MeasureRecord(
            workload_key=str(d["workload_key"]), task_name=str(d.get("task_name", "")),
            target=target, steps=d["steps"], costs=costs,
            error_code=d["error_code"], error_msg=str(d.get("error_msg", "")),
            timestamp=_number(d.get("timestamp", 0.0), "timestamp"),
            build_time=_number(d.get("build_time", 0.0), "build_time"),
            autosched_version=str(d.get("autosched_version", "")),
            ir_hash=str(d.get("ir_hash", "")), extra=dict(extra),
            version=int(d["version"]), source=source,
        )


class MissingHeader(ValueError):
    """A record names its target by a reference that no header line of the log defines."""


# -- checking the values of a decoded line -------------------------------------------------

# Error codes a record may carry: the measurer's, and the transient one (the worker was killed
# from outside, so the candidate is measured again when the job resumes).
WORKER_KILLED = "WORKER_KILLED"
TRANSIENT_ERRORS = frozenset({WORKER_KILLED})
KNOWN_ERRORS = frozenset(ErrorCode.__members__) | TRANSIENT_ERRORS


def _no_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; our writer never emits them, and a record holding one
    # could not be written back (to_json_line refuses them)
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    out = float(text)
    if not math.isfinite(out):  # 1e400
        raise ValueError(f"number {text[:40]} is out of range")
    return out


def _number(value: Any, what: str) -> float:
    """A finite float from a JSON number (ValueError for strings, booleans, overflow, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: expected a finite number, got {short_repr(value)}")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError(f"{what}: {short_repr(value)} is out of range") from None
    if not math.isfinite(out):
        raise ValueError(f"{what}: expected a finite number, got {short_repr(value)}")
    return out


def _check_candidate(c: Any) -> None:
    """extra.candidate: {"sketch": index, "params": {knob name: int or list of ints}} (every
    knob's values are ints: choices, or tile lengths)."""
    if not isinstance(c, dict) or not isinstance(c.get("params"), dict):
        raise ValueError(f"extra.candidate must have a params object, got {short_repr(c)}")
    sketch = c.get("sketch")
    if isinstance(sketch, bool) or not isinstance(sketch, int) or not 0 <= sketch < MAX_INT:
        raise ValueError(f"extra.candidate.sketch must be a sketch index, got {short_repr(sketch)}")
    for name, value in c["params"].items():
        if not (fits(value, (int,)) or type(value) is list and all(
                fits(v, (int,)) for v in value)):
            raise ValueError(f"extra.candidate knob {name} must be an int or a list of ints, "
                             f"got {short_repr(value)}")


def records_from(task: Task, schedules: Sequence[Schedule | Sequence[Step]],
                 results: Sequence[Any], extras: Sequence[dict] | None = None
                 ) -> list[MeasureRecord]:
    """Records for measured candidates (``results`` from Measurer.measure, same order).

    Example::

        log.append(records_from(task, cands, measurer.measure(task, cands)))
    """
    if len(schedules) != len(results):
        raise ValueError(f"{len(schedules)} schedules but {len(results)} results")
    fp = target_fingerprint(task.target)
    version = __version__
    out = []
    for n, (sch, res) in enumerate(zip(schedules, results)):
        steps = sch.steps if hasattr(sch, "steps") else list(sch)
        out.append(MeasureRecord(
            workload_key=task.workload_key, task_name=task.name, target=fp,
            steps=[s.to_dict() for s in steps], costs=[float(c) for c in res.costs],
            error_code=WORKER_KILLED if res.transient else res.error_code.name,
            error_msg=res.error_msg[:MAX_ERROR_MSG],
            timestamp=res.timestamp, build_time=res.build_time, autosched_version=version,
            ir_hash=res.ir_hash, extra=dict(extras[n]) if extras else {},
        ))
    return out


def in_model_choice(records: Iterable[MeasureRecord]) -> MeasureRecord | None:
    """The latest successful record chosen in a model (``MeasureRecord.in_model``), if any."""
    chosen = [r for r in records if r.in_model and r.ok]
    return max(chosen, key=lambda r: r.timestamp) if chosen else None


def ranked(records: Iterable[MeasureRecord]) -> list[MeasureRecord]:
    """Successful records, best first: the schedule chosen in a model, then the candidates
    measured alone by cost."""
    recs = list(records)
    choice = in_model_choice(recs)
    alone = sorted((r for r in recs if r.ok and not r.in_model), key=lambda r: r.cost)
    return ([choice] if choice else []) + alone


# -- the log ------------------------------------------------------------------------------


class RecordLog:
    """An append-only JSON-lines file of MeasureRecords.

    Example::

        log = RecordLog("tuning_logs/matmul.jsonl")   # parent directories made on append
        log.append(records)
        log.best(task.workload_key, task.target, k=3)   # fastest first, errors ignored
        log.measured_ir_hashes(task.workload_key, task.target)
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._cache: tuple[tuple[int, int], list[MeasureRecord]] | None = None
        # (device and inode, bytes scanned, header references seen) of the file appended to
        self._seen_headers: tuple[tuple[int, int], int, set[str]] | None = None
        self.skipped = 0  # lines the last load() skipped (corrupt, other version, no header)

    @staticmethod
    def default_path(name: str, target: Target) -> Path:
        """Where a job tuning ``name`` for ``target`` logs unless told: the one default,
        tuning_logs/<name>-<kind>.jsonl."""
        return Path(DEFAULT_LOG_DIR) / f"{name}-{target.kind}.jsonl"

    def append(self, records: Iterable[MeasureRecord]) -> None:
        """Append each record as one line, flushed and fsynced before the next (with its
        target's header line in the same write the first time the file sees that target). A
        write that fails (a full disk) leaves no torn line and raises OSError naming the log."""
        records = list(records)
        if not records:
            return
        self._refuse_gzip()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)  # read: torn-line check
        try:
            if _ends_without_newline(fd):
                # a torn last line from a killed job: end it so our first record stays whole
                self._write_whole(fd, b"\n", f"0 of {len(records)} records written")
            chunks = encode_records(records, self._headers_in(fd))
            for n, chunk in enumerate(chunks):
                self._write_whole(fd, chunk, f"{n} of {len(records)} records written")
                os.fsync(fd)
        finally:
            os.close(fd)

    def _headers_in(self, fd: int) -> set[str]:
        """The references of the whole header lines in the open log. Read once per process and
        then only the part appended since (by anyone): a header another writer added is not
        written again, and one that two writers add at once is harmless."""
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        seen = self._seen_headers
        if seen is None or seen[0] != ident or st.st_size < seen[1]:
            seen = (ident, 0, set())
        _, offset, refs = seen
        tail = os.pread(fd, st.st_size - offset, offset) if st.st_size > offset else b""
        whole = tail[: tail.rfind(b"\n") + 1]  # a line still being written is read next time
        for raw in whole.split(b"\n"):
            if HEADER_KEY.encode() in raw:
                with contextlib.suppress(ValueError, TypeError, RecursionError):
                    refs.add(_header(_decode(raw))[0])
        self._seen_headers = (ident, offset + len(whole), refs)
        return refs

    def rewrite(self, records: Iterable[MeasureRecord]) -> None:
        """Replace the file with ``records`` (gzipped when the name ends in .gz) in one atomic
        rename: a reader sees the old file or the new one, and a failed write leaves the old.

        Example::

            RecordLog("best.jsonl").rewrite(best_records)
        """
        data = b"".join(encode_records(records, set()))
        if self.path.suffix == ".gz":
            data = gzip.compress(data, mtime=0)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._cache = self._seen_headers = None

    def _gzipped(self) -> bool:
        """Named .gz, or starting with gzip's magic bytes (a gzipped log under another name)."""
        if self.path.suffix == ".gz":
            return True
        try:
            with open(self.path, "rb") as f:
                return f.read(2) == GZIP_MAGIC
        except (FileNotFoundError, IsADirectoryError):
            return False

    def _refuse_gzip(self) -> None:
        if self._gzipped():
            raise OSError(errno.EINVAL, "a gzipped tuning log is read-only; gunzip it, or log "
                          "to another file", str(self.path))

    def _write_whole(self, fd: int, data: bytes, progress: str) -> None:
        """Write ``data`` to the end of the log, looping over short writes; on an error cut
        the part written back off, so no reader ever sees a torn record."""
        start = os.fstat(fd).st_size
        done = 0
        try:
            # one write per line unless it comes back short: O_APPEND keeps concurrent
            # writers' lines whole
            while done < len(data):
                n = os.write(fd, data[done:])
                if n <= 0:  # no progress and no error: treat as a full device
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += n
        except OSError as exc:
            # O_APPEND: our bytes are the file's tail unless another writer appended since
            if done and os.fstat(fd).st_size == start + done:
                with contextlib.suppress(OSError):  # the error below says what matters
                    os.ftruncate(fd, start)
            raise type(exc)(exc.errno, f"cannot append to the tuning log ({exc.strerror}); "
                            f"{progress}, none torn", str(self.path)) from None

    def check_writable(self) -> None:
        """OSError naming the log when records cannot be appended to it (no permission, a
        directory, a full disk, a gzipped log): a tuning job calls this before it measures
        anything."""
        self._refuse_gzip()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise type(exc)(exc.errno, f"the tuning log cannot be written ({exc.strerror}); "
                            "nothing was measured", str(self.path)) from None
        try:
            st = os.fstatvfs(fd)
        finally:
            os.close(fd)
        if st.f_bavail * st.f_frsize < MIN_FREE_BYTES:
            raise OSError(errno.ENOSPC, f"the tuning log's device has under "
                          f"{MIN_FREE_BYTES >> 20} MiB free; nothing was measured", str(self.path))

    def load(self) -> list[MeasureRecord]:
        """Every record of a known version in the file (gzipped when its name ends in .gz), in
        order. Torn, corrupt and other-version lines, and records whose target header the file
        lacks, are skipped with a warning naming the file and line; a missing file is empty."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block the read forever
            raise OSError(errno.EINVAL, "the tuning log is not a regular file", str(self.path))
        stamp = (st.st_size, st.st_mtime_ns)
        if self._cache is not None and self._cache[0] == stamp:
            return list(self._cache[1])
        records = self._parse(self._read())
        self._cache = (stamp, records)
        return list(records)

    def _read(self) -> bytes:
        if not self._gzipped():
            return self.path.read_bytes()
        try:
            with gzip.open(self.path, "rb") as f:
                data = f.read(MAX_GZ_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
            if self.path.suffix != ".gz":  # a text log whose first line is corrupt
                return self.path.read_bytes()  # (starting with gzip's magic by chance)
            raise OSError(errno.EINVAL, f"the gzipped tuning log cannot be read ({exc})",
                          str(self.path)) from None
        if len(data) > MAX_GZ_BYTES:
            raise OSError(errno.EFBIG, f"the gzipped tuning log holds over {MAX_GZ_BYTES >> 30} "
                          "GiB", str(self.path))
        return data

    def _parse(self, data: bytes) -> list[MeasureRecord]:
        lines = data.split(b"\n")
        torn_tail = not data.endswith(b"\n")
        decoded: list[tuple[int, Any]] = []
        headers: dict[str, dict[str, Any]] = {}  # from anywhere in the file: a merged log's too
        other_versions: list[tuple[int, Any]] = []

        self.skipped = 0

        def skip(n: int, what: str, exc: Exception) -> None:
            self.skipped += 1
            if torn_tail and n == len(lines):
                what = "truncated last line"
            warnings.warn(f"{self.path} line {n}: skipping {what} ({exc})", stacklevel=4)

        for n, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                d = _decode(raw)
                if isinstance(d, dict) and HEADER_KEY in d:
                    ref, fp = _header(d)
                    headers[ref] = fp
                elif isinstance(d, dict) and d.get("version") not in READ_VERSIONS:
                    other_versions.append((n, d.get("version")))
                else:
                    decoded.append((n, d))
            except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
                skip(n, "corrupt line", exc)
        out: list[MeasureRecord] = []
        for n, d in decoded:
            try:
                out.append(MeasureRecord.from_json(d, f"{self.path}:{n}", headers))
            except MissingHeader as exc:
                skip(n, "a record without its target header", exc)
            except (ValueError, TypeError) as exc:
                skip(n, "corrupt line", exc)
        self.skipped += len(other_versions)
        if other_versions:
            shown = ", ".join(f"{n} (version {v!r})" for n, v in other_versions[:10])
            more = f" and {len(other_versions) - 10} more" if len(other_versions) > 10 else ""
            known = " or ".join(str(v) for v in READ_VERSIONS)
            warnings.warn(f"{self.path}: skipping {len(other_versions)} records not of version "
                          f"{known}: lines {shown}{more}", stacklevel=3)
        return out

    def records_for(self, workload_key: str, target: Target | dict, strict: bool = False
                    ) -> list[MeasureRecord]:
        """The measurements (errors included) of one workload on a target of the same key (a
        Target, or a fingerprint read from a log): measured there or on another CPU that gets
        the same code, which a line says once per log and target. ``strict``: the whole
        fingerprint must match. Records cut short from outside (``transient``) measured
        nothing and are left out."""
        want = target_keys(target)
        applied = [(m, r) for m, r in self._matching(workload_key, want, strict)
                   if m in (EXACT, COMPATIBLE) and not r.in_model]
        self._say_applied(applied, want)
        return [r for _, r in applied]

    def choices_for(self, workload_key: str, target: Target | dict) -> list[MeasureRecord]:
        """The schedules chosen in a model (``MeasureRecord.in_model``) for one workload on a
        target of the same key, oldest first."""
        return [r for m, r in self._matching(workload_key, target_keys(target), False)
                if m in (EXACT, COMPATIBLE) and r.in_model]

    def related_records(self, workload_key: str, target: Target | dict, strict: bool = False
                        ) -> list[MeasureRecord]:
        """The measurements of one workload on related targets: the same family (another
        vector ISA, another thread count, another GPU arch) but not the same key. They do not
        count as the target's trials; they seed its search and its cost model."""
        return [r for m, r in self._matching(workload_key, target_keys(target), strict)
                if m in (THREADS, RELATED) and not r.in_model]

    def best(self, workload_key: str, target: Target | dict, k: int = 1, strict: bool = False
             ) -> list[MeasureRecord]:
        """The ``k`` fastest successful records of ``workload_key`` on a target of the same key
        (``records_for``), after the schedule chosen in a model (``in_model_choice``); when
        there are none, those of the same vector ISA with another thread count (a line says so
        once per log and target). ``strict``: the whole fingerprint.
        Records measured under an emulator rank only when there are no others: checked on
        the target but untimed there, and emulated times do not rank schedules
        (docs/REMOTE.md), so the untuned default's record comes first (what compiling without
        a log builds, checked), then the others by emulated time; a line says so once per log
        and target."""
        want = target_keys(target)
        matching = self._matching(workload_key, want, strict)
        choice = in_model_choice(r for m, r in matching if m in (EXACT, COMPATIBLE))
        ok = [(m, r) for m, r in matching if r.ok and not r.in_model]
        ok = [(m, r) for m, r in ok if not r.emulated] or ok
        applied = ([(m, r) for m, r in ok if m in (EXACT, COMPATIBLE)]
                   or [(m, r) for m, r in ok if m == THREADS])
        top = sorted(applied, key=lambda mr: (mr[1].emulated and not mr[1].untuned,
                                              mr[1].cost))[:k]
        if choice is not None:  # chosen in the model: before every time measured alone
            top = [(EXACT, choice), *[(m, r) for m, r in top if r.ir_hash != choice.ir_hash]]
            top = top[:k]
        self._say_applied(top, want)
        if top and top[0][1].emulated and (str(self.path), want.exact, UNTIMED) not in _SAID:
            _SAID.add((str(self.path), want.exact, UNTIMED))
            _log.warning("%s: workloads without a timed record on %s take one checked only "
                         "under an emulator, untimed: the untuned default's where it is "
                         "logged (emulated times do not rank schedules); tune on the device "
                         "for speed", self.path, want.exact)
        return [r for _, r in top]

    def measured_ir_hashes(self, workload_key: str, target: Target | dict, strict: bool = False
                           ) -> set[str]:
        """IR hashes already measured (with or without error): never measure them again."""
        return {r.ir_hash for r in self.records_for(workload_key, target, strict) if r.ir_hash}

    def _matching(self, workload_key: str, want: TargetKeys, strict: bool
                  ) -> list[tuple[int, MeasureRecord]]:
        """(target_match level, record) of the workload's records on targets related to
        ``want``, transient ones left out."""
        out = []
        for r in self.load():
            if r.workload_key == workload_key and not r.transient:
                m = target_match(target_keys(r.target), want, strict)
                if m is not None:
                    out.append((m, r))
        return out

    def _say_applied(self, applied: Iterable[tuple[int, MeasureRecord]], want: TargetKeys
                     ) -> None:
        """One line per log, target and kind of difference when records of another target
        apply (not one per workload: a model has dozens)."""
        for m, r in applied:
            said = (str(self.path), want.exact, m)
            if m == EXACT or said in _SAID:
                continue
            _SAID.add(said)
            have = target_keys(r.target)
            why = ("the same code" if m == COMPATIBLE else
                   "the same vector ISA, another thread count, for workloads without a "
                   "record of their own")
            _log.warning("%s: applying records measured on %s to %s: %s (%s)", self.path,
                         have.exact, want.exact, why, have.key if m == COMPATIBLE else have.isa)

    def __repr__(self) -> str:
        return f"RecordLog({str(self.path)!r})"


def encode_records(records: Iterable[MeasureRecord], known: set[str]) -> Iterator[bytes]:
    """Each record as the bytes that put it in a log: its line, preceded by its target's header
    line when the reference is not in ``known`` (the headers the file has; updated)."""
    for rec in records:
        ref = target_ref(rec.target)
        line = (rec.to_json_line(ref) + "\n").encode()
        if ref not in known:
            known.add(ref)
            header = {"version": RECORD_VERSION, HEADER_KEY: ref, "fingerprint": rec.target}
            line = (json.dumps(header, separators=(",", ":"), allow_nan=False) + "\n"
                    ).encode() + line
        yield line


def _decode(raw: bytes) -> Any:
    return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)


def _header(d: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(reference, fingerprint) of a decoded header line; ValueError when the fingerprint is not
    an object or does not hash to the reference (a header cannot redefine another's)."""
    ref, fp = d.get(HEADER_KEY), d.get("fingerprint")
    if not isinstance(fp, dict):
        raise ValueError(f"target header {short_repr(ref)} has no fingerprint object")
    if ref != target_ref(fp):
        raise ValueError(f"target header {short_repr(ref)} does not match its fingerprint "
                         f"(which hashes to {target_ref(fp)})")
    return ref, fp


def _ends_without_newline(fd: int) -> bool:
    size = os.fstat(fd).st_size
    if size == 0:
        return False
    return os.pread(fd, 1, size - 1) != b"\n"


# -- applying the best records -------------------------------------------------------------


class ApplyHistoryBest:
    """The best replayable record of each task in a log; tasks without one get their default
    schedule, and the constructor warns which ones.

    Example::

        best = ApplyHistoryBest(tasks, "tuning_logs/resnet18-llvm.jsonl")
        sch = best.schedule_for(task)       # replayed best, or task.schedule() (default)
        best.missing                        # tasks that fell back to the default
    """

    def __init__(self, tasks: Sequence[Task] | Task, log: RecordLog | str | os.PathLike,
                 candidates: int = 8, strict: bool = False):
        from autosched.search.task import Task

        self.tasks = [tasks] if isinstance(tasks, Task) else list(tasks)
        self.log = log if isinstance(log, RecordLog) else RecordLog(log)
        self.records: dict[int, MeasureRecord | None] = {}
        self.schedules: dict[int, Schedule] = {}
        self.missing: list[Task] = []
        self.strict = strict
        for task in self.tasks:
            rec, sch = self._best_replay(task, candidates)
            self.records[id(task)] = rec
            self.schedules[id(task)] = sch
            if rec is None:
                self.missing.append(task)
        if self.missing:
            listed = ", ".join(f"{t.name} (key {t.workload_key}, {_target_key(t.target, strict)})"
                               for t in self.missing)
            warnings.warn(f"no tuning record in {self.log.path} for {len(self.missing)} of "
                          f"{len(self.tasks)} workloads: {listed}; using the default schedule",
                          stacklevel=2)

    def _best_replay(self, task: Task, candidates: int) -> tuple[MeasureRecord | None, Schedule]:
        for rec in self.log.best(task.workload_key, task.target, k=candidates,
                                 strict=self.strict):
            try:
                return rec, task.schedule(rec.schedule_steps())
            except ScheduleError as exc:
                warnings.warn(f"{rec.source or self.log.path}: the best record of {task.name} "
                              f"does not replay ({exc}); trying the next best", stacklevel=3)
        return None, task.schedule()

    def schedule_for(self, task: Task) -> Schedule:
        if id(task) not in self.schedules:
            rec, sch = self._best_replay(task, 8)
            self.records[id(task)], self.schedules[id(task)] = rec, sch
        return self.schedules[id(task)]

    def record_for(self, task: Task) -> MeasureRecord | None:
        self.schedule_for(task)
        return self.records[id(task)]


def apply_history_best(tasks: Sequence[Task] | Task, log: RecordLog | str | os.PathLike,
                       strict_target: bool = False) -> dict[str, Schedule]:
    """{workload_key: best replayed schedule}, the default schedule where the log has none
    (with a warning listing those workloads). Records of targets with the same key apply
    (``RecordLog.best``); ``strict_target`` applies only those of the very same fingerprint.

    Example::

        schedules = apply_history_best(tasks, "tuning_logs/resnet18-llvm.jsonl")
        mod = task.build(schedules[task.workload_key])
    """
    best = ApplyHistoryBest(tasks, log, strict=strict_target)
    out: dict[str, Schedule] = {}
    for task in best.tasks:
        out.setdefault(task.workload_key, best.schedules[id(task)])
    return out
