"""Do times under qemu-user rank schedules? The question behind how a log of emulated records
is compiled (docs/REMOTE.md): without a board, x86 stands in for it. Random candidates of a
GEMM (and the two untuned defaults) for an AVX2 x86 target are built once, timed natively and
timed under qemu-x86_64 (-cpu max) by the emulated runner's harness, one thread each. Prints
the rank correlation of the two timings and, as multiples of the native best, the native time
of the emulator's fastest, of the untuned default (the sketch's default candidate) and the
median candidate.

    python benchmarks/emulated_ranking.py --sizes 128 100 --candidates 24

Needs qemu-x86_64 and x86_64-linux-gnu-gcc (apt-get install qemu-user gcc-x86-64-linux-gnu).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import numpy as np  # noqa: E402

from autosched.search.emulated import EmulatedMeasurer  # noqa: E402
from autosched.search.error_codes import ErrorCode  # noqa: E402
from autosched.search.measure import Measurer  # noqa: E402
from autosched.search.protocol import MeasureOptions  # noqa: E402
from autosched.search.space import SearchSpace  # noqa: E402
from autosched.search.task import Task  # noqa: E402
from autosched.search.workloads import gemm  # noqa: E402

TARGET = "llvm -mcpu=haswell -num-cores=1"  # AVX2: qemu 7's TCG emulates it, not AVX-512
EMULATOR = ["qemu-x86_64", "-cpu", "max"]


def ranks(v: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(v))


def one(size: int, candidates: int, seed: int, opts: MeasureOptions) -> str:
    task = Task(lambda: gemm(size, size, size), target=TARGET, name=f"gemm_{size}")
    space, rng = SearchSpace(task), np.random.default_rng(seed)
    schedules = [space.default_schedule(), task.schedule(),
                 *(space.schedule(space.sample(rng)) for _ in range(candidates))]
    with Measurer(task.target, opts) as m, \
            EmulatedMeasurer(task.target, opts, emulator=EMULATOR) as em:
        built, _ = m.build(task, schedules)
        native = m.run_artifacts(task, built)
        emulated = em.run_artifacts(task, built)
    ok = [(b.index, n.cost, e.cost) for b, n, e in zip(built, native, emulated)
          if n.error_code is e.error_code is ErrorCode.NO_ERROR]
    idx = [i for i, _, _ in ok]
    t = np.array([(n, e) for _, n, e in ok])
    rho = float(np.corrcoef(ranks(t[:, 0]), ranks(t[:, 1]))[0, 1])
    best = t[:, 0].min()
    picked = t[int(np.argmin(t[:, 1])), 0] / best
    untuned = t[idx.index(0), 0] / best if 0 in idx else float("nan")
    return (f"gemm {size}^3: {len(ok)} of {len(schedules)} ran; Spearman {rho:.2f}; native "
            f"time / native best: the emulator's fastest {picked:.2f}x, the untuned default "
            f"{untuned:.2f}x, the median {np.median(t[:, 0]) / best:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 100])
    p.add_argument("--candidates", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(baseline.header())
    opts = MeasureOptions(build_workers=2, repeat=3, min_repeat_ms=20, seed=1)
    for size in args.sizes:
        print(one(size, args.candidates, args.seed, opts), flush=True)


if __name__ == "__main__":
    main()
