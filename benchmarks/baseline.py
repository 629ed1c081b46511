"""Peers at their best, and the machine stated: the helper every benchmark script uses.

Call ``prepare()`` before numpy is imported (if numpy is already loaded, it starts the script
again with a cleaned environment), then state what is compared::

    from benchmarks import baseline
    baseline.prepare()
    import numpy as np
    print(baseline.header())              # date, commit, CPU model / LLVM name / ISA, GPU, load
    print("# peer:", baseline.numpy_peer())   # numpy, OpenBLAS kernel and threads (checked)
    rounds = baseline.alternate({"autosched": ours, "numpy": theirs}, rounds=5)
    print(baseline.rounds_line(rounds))   # median of the rounds and the best round, per side

Why: OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) in the environment pin OpenBLAS to one kernel
whatever the CPU. With OPENBLAS_CORETYPE=Haswell numpy's GEMM runs at about half its speed on a
CPU with full-width AVX-512 (5-12% slower on Zen 4, whose AVX-512 units are 256 bits wide), and
a comparison with it flatters whoever is compared. Tests keep the environment as
it is; only benchmark processes clean it. Peers are timed in alternating rounds in one process,
the order rotating, so a slow spell of a shared machine lands on every side.

This module imports only the standard library at load time: tvm_baseline.py uses it from the
TVM virtualenv, where autosched and llvmlite may be missing.
"""

from __future__ import annotations

import datetime
import functools
import os
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

# set in the environment, these pin OpenBLAS to a kernel chosen for another CPU
FORCED_BLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# OpenBLAS kernels that use AVX-512 (what OpenBLAS picks by itself on an AVX-512 CPU)
AVX512_BLAS_KERNELS = frozenset({"skylakex", "cooperlake", "sapphirerapids"})


class PeerError(SystemExit):
    """A peer would run handicapped (or cannot be stated); the benchmark refuses to run."""


def prepare() -> None:
    """Let OpenBLAS choose its kernel for this CPU: unset FORCED_BLAS_VARS in this process (and
    so in its children). OpenBLAS reads them once, when numpy loads it: if numpy is already
    imported, run this script again from the start without them."""
    forced = {k: os.environ[k] for k in FORCED_BLAS_VARS if k in os.environ}
    if not forced:
        return
    said = ", ".join(f"{k}={v}" for k, v in forced.items())
    if "numpy" in sys.modules:
        print(f"# baseline: numpy was imported with {said}; restarting without them",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        env = {k: v for k, v in os.environ.items() if k not in FORCED_BLAS_VARS}
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    for k in forced:
        del os.environ[k]
    print(f"# baseline: unset {said} so that OpenBLAS picks this CPU's kernel", file=sys.stderr)


# -- the machine ------------------------------------------------------------------------------


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def isa() -> str:
    """The widest vector ISA of this CPU: AVX-512, AVX2, NEON, or the machine name."""
    flags = set(_cpuinfo().get("flags", _cpuinfo().get("Features", "")).split())
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("asimd", "NEON")):
        if flag in flags:
            return name
    import platform

    return platform.machine() or "unknown"


def llvm_cpu() -> str:
    """LLVM's name for this CPU (what autosched compiles for), or '-' without llvmlite."""
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return "-"
    return llvm.get_host_cpu_name()


def gpu_name() -> str | None:
    """The first GPU's name, from torch if it is loaded, else nvidia-smi; None without one."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else None


def commit() -> str:
    """The checkout's commit, with '+changes' when autosched/ or benchmarks/ differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=20).stdout.strip()

    try:
        head = git("rev-parse", "--short=10", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "autosched",
                    "benchmarks")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@functools.cache
def _pingpong() -> tuple[Any, str] | None:
    """benchmarks/core_pingpong.c built once per process with the system's C compiler: (its
    temporary directory, removed at exit; the executable), or None without a compiler or a
    second CPU."""
    import shutil
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or (os.cpu_count() or 1) < 2:
        return None
    tmp = tempfile.TemporaryDirectory(prefix="autosched-pingpong-")
    exe = os.path.join(tmp.name, "pingpong")
    try:
        subprocess.run([cc, "-O2", "-pthread", str(Path(__file__).with_name("core_pingpong.c")),
                        "-o", exe], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return tmp, exe


def core_round_trip_ns() -> float | None:
    """Nanoseconds for a cache line from CPU 0 to CPU 1 and back, measured now
    (benchmarks/core_pingpong.c); None without a C compiler or a second CPU. On this project's
    VMs it has been about 60 ns or about 350 ns, changing while a process runs, and
    autosched's parallel kernels run up to 30% slower in the second state (README)."""
    built = _pingpong()
    if built is None:
        return None
    try:
        out = subprocess.run([built[1]], check=True, capture_output=True, text=True, timeout=60)
        return float(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def header() -> str:
    """One line: date, commit, CPU model, LLVM CPU name, ISA, cores, GPU, load average and
    the core-to-core round trip."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cpu = _cpuinfo().get("model name", "unknown CPU")
    gpu = gpu_name()
    trip = core_round_trip_ns()
    return (f"# {date} | commit {commit()} | {cpu} ({llvm_cpu()}, {isa()}), "
            f"{os.cpu_count()} cores | GPU {gpu or 'none'} | load average {load()}"
            + (f" | core-to-core round trip {trip:.0f} ns" if trip is not None else ""))


def omp_wait_policy() -> str:
    """How autosched's OpenMP threads wait at barriers in this process: on a busy machine,
    libgomp's default (spinning) made a model of small kernels run 15x slower than passive."""
    return os.environ.get("OMP_WAIT_POLICY", "libgomp's default (spin, then sleep)")


# -- peers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blas:
    """numpy's BLAS as loaded in this process."""

    library: str
    kernel: str
    threads: int

    def __str__(self) -> str:
        return f"{self.library}, {self.kernel} kernel, {self.threads} threads"


def numpy_blas() -> Blas:
    """Which BLAS numpy runs, which kernel and how many threads (threadpoolctl)."""
    import numpy as np

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        warnings.warn("threadpoolctl is not installed: numpy's BLAS kernel cannot be stated "
                      "(pip install threadpoolctl)", stacklevel=2)
        return Blas("unknown BLAS", "unknown", 0)
    np.ones(1) @ np.ones(1)  # the BLAS library is loaded with numpy; this makes sure it is
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    if not pools:
        return Blas("no BLAS found", "unknown", 0)
    p = pools[0]
    return Blas(f"{p.get('internal_api', '?')} {p.get('version', '?')}",
                str(p.get("architecture", "unknown")), int(p.get("num_threads", 0)))


def check_blas(blas: Blas, cpu_isa: str) -> None:
    """Refuse a BLAS kernel below the CPU: on an AVX-512 CPU, an OpenBLAS kernel without it."""
    if (cpu_isa == "AVX-512" and blas.library.startswith("openblas")
            and blas.kernel.lower() not in AVX512_BLAS_KERNELS):
        raise PeerError(f"baseline: numpy's OpenBLAS runs its {blas.kernel} kernel on an AVX-512 "
                        f"CPU (is OPENBLAS_CORETYPE set? call baseline.prepare() before numpy)")


def numpy_peer() -> str:
    """numpy's version and BLAS, checked: a one-line description for the output."""
    import numpy as np

    blas = numpy_blas()
    check_blas(blas, isa())
    return f"numpy {np.__version__} ({blas})"


def ort_peer(threads: int | None) -> str:
    """How onnxruntime runs when given ``threads`` intra-op threads (None: its default)."""
    import onnxruntime as ort

    count = threads or "default (one per physical core)"
    return (f"onnxruntime {ort.__version__} (CPUExecutionProvider, all graph optimizations, "
            f"intra-op threads {count})")


_TORCH_DEFAULT_TF32: list[tuple[bool, bool]] = []  # (matmul, cuDNN) as torch came


def set_torch(tf32: bool | None) -> str:
    """Set torch's TF32 use for matmuls and cuDNN convolutions alike (None: as torch had them
    before the first call, its defaults), and let cuDNN pick its fastest algorithms
    (benchmark mode); say what was set."""
    import torch

    if not _TORCH_DEFAULT_TF32:
        _TORCH_DEFAULT_TF32.append((torch.backends.cuda.matmul.allow_tf32,
                                    torch.backends.cudnn.allow_tf32))
    matmul, conv = _TORCH_DEFAULT_TF32[0] if tf32 is None else (tf32, tf32)
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = conv
    torch.backends.cudnn.benchmark = True
    said = (f"TF32 {'on' if tf32 else 'off'} (matmul and cuDNN)" if tf32 is not None else
            f"torch's default TF32 (matmul {'on' if matmul else 'off'}, cuDNN "
            f"{'on' if conv else 'off'})")
    return f"torch {torch.__version__}, {said}, cudnn.benchmark on"


def torch_variants(module: Any) -> dict[str, Any]:
    """torch eager, torch.compile and torch.compile(mode='reduce-overhead') (CUDA graphs) of
    ``module``, each compiled from its own copy and after a reset, so the current TF32
    setting is the one compiled in and no mode reuses another's code."""
    import copy

    import torch

    torch._dynamo.reset()
    return {"torch eager": module,
            "torch.compile": torch.compile(copy.deepcopy(module)),
            "torch.compile reduce-overhead": torch.compile(copy.deepcopy(module),
                                                           mode="reduce-overhead")}


# -- timing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rounds:
    """One side's seconds per round, in the order they ran."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)

    def as_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median * 1e3, "best_ms": self.best * 1e3,
                "rounds_ms": [s * 1e3 for s in self.seconds]}


def alternate_calls(fns: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Call each function once per round, ``rounds`` times, rotating which goes first so that
    no side always follows the same neighbour; each one's results in order."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(fns)
    got: dict[str, list[T]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            got[n].append(fns[n]())
    return got


def alternate(timers: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, Rounds]:
    """Alternate timers (each returns the seconds of one round): ``alternate_calls``."""
    return {n: Rounds(tuple(v)) for n, v in alternate_calls(timers, rounds).items()}


def rounds_line(results: Mapping[str, Rounds], unit: float = 1e3, digits: int = 3) -> str:
    """'name median (best b)' per side, in ms by default."""
    return ", ".join(f"{n} {r.median * unit:.{digits}f} (best {r.best * unit:.{digits}f})"
                     for n, r in results.items())


def median_seconds(fn: Callable[[], Any], min_s: float = 0.2, min_runs: int = 5) -> float:
    """Median seconds of one call of ``fn`` over at least ``min_runs`` calls lasting ``min_s``
    in all, after one warm-up call: the executor's own rule (CompiledModel.time)."""
    from autosched.graph.executor import time_calls  # numpy: not before prepare()

    return time_calls([fn], min_runs, min_s)


def save(rows: Any, out: str | os.PathLike) -> None:
    """Write a benchmark's results as JSON to ``out`` (its folder made if needed)."""
    import json

    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(rows, indent=1) + "\n")


def cuda_median_seconds(fn: Callable[[], Any], repeat: int = 50, warmup: int = 5) -> float:
    """Median seconds of ``fn`` on the GPU (CUDA events around each call, after ``warmup``
    calls), under torch.no_grad."""
    import torch

    with torch.no_grad():
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeat):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)
