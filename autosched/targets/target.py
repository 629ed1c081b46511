"""Target descriptions. A target string is a kind followed by -key=value options:

    "llvm"                                           the host CPU (name and features detected)
    "llvm -mcpu=skylake -mattr=+avx2,+fma"           a given x86 CPU
    "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"   cross-compiled for an edge board
    "cuda" / "cuda -arch=sm_90"                      NVIDIA GPUs (arch detected when a GPU is present)
    "ref"                                            the reference evaluator (slow, exact semantics)

Limits the search and the code generators need are attributes here, never constants elsewhere.
Each kind's backend (targets/backend.py) parses its options and fills in the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autosched.errors import CompileError
from autosched.targets import backend as backends


@dataclass(frozen=True)
class Target:
    kind: str
    options: tuple[tuple[str, str], ...] = ()
    device: str = "cpu"  # "cpu" or "gpu": which schedules suit it (sketch rules, features, passes)
    # CPU
    triple: str = ""
    cpu: str = ""
    features: str = ""
    num_cores: int = 1
    vector_bits: int = 128
    vector_registers: int = 16  # architectural SIMD registers (register tiles must fit them)
    # GPU
    arch: str = ""
    max_threads_per_block: int = 1024
    max_shared_memory_per_block: int = 48 * 1024
    # what a block gets without opting in: untuned defaults stay within it (a block holding the
    # opt-in maximum leaves room for one block per SM, which a search may pick, a default not)
    default_shared_memory_per_block: int = 48 * 1024
    warp_size: int = 32
    extra: tuple[tuple[str, str], ...] = field(default=())

    @property
    def is_host(self) -> bool:
        if self.kind != "llvm":
            return False
        from autosched.targets.host import host_triple

        return self.triple in ("", host_triple())

    @property
    def backend(self) -> backends.Backend:
        """The backend registered for this target's kind."""
        return backends.get(self.kind)

    def option(self, key: str, default: str = "") -> str:
        return dict(self.options).get(key, default)

    def __str__(self) -> str:
        return " ".join([self.kind] + [f"-{k}={v}" if v else f"-{k}" for k, v in self.options])


def parse(text: str | Target) -> Target:
    """Parse a target string (see the module docstring)."""
    if isinstance(text, Target):
        return text
    parts = text.split()
    if not parts:
        raise CompileError(f"empty target {text!r}; expected one of {backends.kinds()}")
    options = []
    for p in parts[1:]:
        if not p.startswith("-"):
            raise CompileError(f"target {text!r}: option {p!r} must look like -key=value")
        key, _, value = p.lstrip("-").partition("=")
        options.append((key, value))
    return backends.get(parts[0]).target(tuple(options))
