"""What the host machine is: LLVM triple, CPU name, features, cores, the largest cache; and the
GPU arch if any."""

from __future__ import annotations

import contextlib
import functools
import os

from autosched.errors import CompileError


@functools.cache
def _llvm():  # noqa: ANN202
    import llvmlite.binding as llvm

    try:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
    except RuntimeError:
        pass
    try:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
    except (RuntimeError, AttributeError):
        pass
    return llvm


@functools.cache
def host_triple() -> str:
    return _llvm().get_process_triple()


@functools.cache
def host_cpu() -> str:
    return _llvm().get_host_cpu_name()


@functools.cache
def host_features() -> str:
    return _llvm().get_host_cpu_features().flatten()


def vector_bits(triple: str, cpu: str, features: str) -> int:
    if triple.startswith(("x86_64", "i686")):
        if "+avx512f" in features:
            return 512
        if "+avx2" in features or "+avx" in features:
            return 256
        return 128
    return 128  # NEON, RVV at minimum length, armv7 NEON


def vector_registers(triple: str, features: str) -> int:
    if triple.startswith(("x86_64", "i686")):
        return 32 if "+avx512f" in features else 16
    if triple.startswith(("aarch64", "arm64", "riscv")):
        return 32
    return 16


def usable_core_ids() -> list[int]:
    """The cores this process may run on, by number: its CPU affinity (``taskset``, a
    container's cpuset), every core where the system has no affinity."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this system
        cores = []
    return cores or list(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores this process may run on (not every core of the machine), so a pinned
    job's parallel loops do not oversubscribe."""
    return len(usable_core_ids())


def cpu_target_fields(opts: dict[str, str]) -> dict:
    """The Target fields of an llvm target's options: the host's triple, CPU, features and the
    cores this process may use unless they say otherwise (a cross target: a generic CPU with
    4 cores)."""
    triple = opts.get("mtriple", "")
    host = not triple or triple == host_triple()
    if host:
        triple = host_triple()
        cpu = opts.get("mcpu", host_cpu())
        features = opts.get("mattr", host_features() if "mcpu" not in opts else "")
    else:
        cpu = opts.get("mcpu", "generic")
        features = opts.get("mattr", "")
    cores = _cores(opts.get("num-cores"), default=usable_cores() if host else 4)
    return {
        "triple": triple,
        "cpu": cpu,
        "features": features,
        "num_cores": cores,
        "vector_bits": vector_bits(triple, cpu, features),
        "vector_registers": vector_registers(triple, features),
    }


def _cores(text: str | None, default: int) -> int:
    """The thread count of ``-num-cores=N`` (CompileError unless N is a positive integer)."""
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise CompileError(f"-num-cores={text}: expected a positive integer (the threads that "
                           "parallel loops run on)")
    return int(text)


@functools.cache
def detect_cuda_arch() -> str:
    """sm_XY of GPU 0 when a GPU and pycuda are present, else sm_90 (the H200 we tune for)."""
    try:
        import pycuda.driver as drv

        drv.init()
        major, minor = drv.Device(0).compute_capability()
        return f"sm_{major}{minor}"
    except Exception:  # no pycuda, no driver, no device: compile for the default arch
        return "sm_90"


@functools.cache
def llc_bytes() -> int:
    """The largest CPU cache of this machine (bytes), from sysfs; 32 MiB when unknown."""
    best = 0
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(root):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(root, entry, "size")) as f:
                    text = f.read().strip().upper()
                mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
                best = max(best, int(text.rstrip("KMG")) * mult)
    except OSError:
        pass
    return best or 32 << 20
