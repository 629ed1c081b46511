"""The on-disk cache of built artifacts (cubins, host-emulation libraries), and the checks that
decide whether a file on disk may be trusted: loaded as code or used as a compiled kernel.

Anything at a predictable path can be planted by someone else, so a cached file is used only
when its folder is private (owned by this user, mode 0700), the file is owned by this user and
writable by no one else, and its bytes match the SHA-256 recorded beside it (``NAME.sha256``)
when it was stored. A refused file is rebuilt (with one warning per folder and process); a
folder that cannot be trusted is replaced by a private temporary one for this process.

Example::

    cache = DiskCache("cuda")                    # $AUTOSCHED_CACHE_DIR/cuda (~/.cache/autosched)
    data = cache.read("ab12.cubin")              # None when absent or refused
    cache.write("ab12.cubin", binary)            # atomic; the hash is stored beside it
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from autosched import settings

HASH_SUFFIX = ".sha256"
_WARNED: set[str] = set()
_LOCK = threading.Lock()


def cache_root() -> Path:
    """``$AUTOSCHED_CACHE_DIR`` or ``~/.cache/autosched`` (read at call time)."""
    root = settings.CACHE_DIR.value() or os.path.join(
        os.path.expanduser("~"), ".cache", "autosched")
    return Path(root)


def untrusted(st: os.stat_result, owners: tuple[int, ...] | None = None) -> str | None:
    """Why a file or folder with this stat may have been written by someone else (None when
    it may not): owned by a user not in ``owners`` (default: this user), or writable by its
    group or by everyone."""
    owners = (os.getuid(),) if owners is None else owners
    if st.st_uid not in owners:
        return f"it is owned by uid {st.st_uid}, not by uid {os.getuid()} (this user)"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by its group or by everyone (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def warn_once(folder: Path, message: str) -> None:
    """Warn about ``folder`` once per process (a cache refuses files by the hundred)."""
    with _LOCK:
        if str(folder) in _WARNED:
            return
        _WARNED.add(str(folder))
    warnings.warn(message, stacklevel=3)


class DiskCache:
    """A private folder of files keyed by name, each checked (owner, mode, SHA-256) before use."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.folder = _private_folder(cache_root() / kind)

    def verified(self, name: str) -> Path | None:
        """The path of ``name`` when it is there and passes every check (for files loaded by
        path, such as shared libraries); else None."""
        path = self.folder / name
        try:
            problem = untrusted(os.stat(path)) or _hash_problem(path, sha256_file(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            problem = f"it cannot be read ({exc.strerror})"
        if problem is None:
            return path
        self._refuse(path, problem)
        return None

    def read(self, name: str) -> bytes | None:
        """The bytes of ``name`` when it is there and passes every check; else None."""
        path = self.folder / name
        try:
            problem = untrusted(os.stat(path))
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            problem, data = f"it cannot be read ({exc.strerror})", b""
        problem = problem or _hash_problem(path, _digest(data))
        if problem is None:
            return data
        self._refuse(path, problem)
        return None

    def _refuse(self, path: Path, problem: str) -> None:
        warn_once(self.folder, f"autosched cache: not using {path}: {problem}; rebuilding it "
                               f"(other refused files in {self.folder} are rebuilt silently)")

    def write(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name`` (atomically, hash first); a full disk or read-only home
        costs only a rebuild next time."""
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.adopt(Path(tmp), name)
        except OSError:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)

    def adopt(self, tmp: Path, name: str) -> Path:
        """Move ``tmp`` (a file built in this folder) to ``name``, recording its hash."""
        os.chmod(tmp, 0o600 if not os.access(tmp, os.X_OK) else 0o700)
        _write_atomic(self.folder / (name + HASH_SUFFIX), sha256_file(tmp).encode())
        os.replace(tmp, self.folder / name)
        return self.folder / name


def _private_folder(folder: Path) -> Path:
    """``folder``, created 0700 (or tightened to 0700 when it is ours); a fresh temporary folder
    when it cannot be created or belongs to someone else."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(folder)
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(folder, 0o700)
            st = os.stat(folder)
        problem = untrusted(st) if stat.S_ISDIR(st.st_mode) else "it is not a folder"
    except OSError as exc:
        problem = f"it cannot be created ({exc.strerror})"
    if problem is None:
        return folder
    fallback = Path(_process_folder()) / folder.name
    fallback.mkdir(mode=0o700, exist_ok=True)
    warn_once(folder, f"autosched cache: not using {folder}: {problem}; using {fallback} for "
                      "this process (set AUTOSCHED_CACHE_DIR to a folder of your own)")
    return fallback


_PROCESS_FOLDER: list[str] = []


def _process_folder() -> str:
    with _LOCK:
        if not _PROCESS_FOLDER:
            folder = tempfile.mkdtemp(prefix="autosched-cache-")  # mode 0700
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            _PROCESS_FOLDER.append(folder)
        return _PROCESS_FOLDER[0]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _recorded(path: Path) -> str | None:
    hash_path = path.with_name(path.name + HASH_SUFFIX)
    try:
        if untrusted(os.stat(hash_path)):
            return None
        return hash_path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _hash_problem(path: Path, digest: str) -> str | None:
    recorded = _recorded(path)
    if recorded is None:
        return f"it has no trusted {path.name}{HASH_SUFFIX} beside it"
    if digest != recorded:
        return f"its contents do not match the SHA-256 recorded in {path.name}{HASH_SUFFIX}"
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
