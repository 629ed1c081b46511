"""Candidates of a cross-compiled CPU target run under a user-mode emulator (qemu-user): an
aarch64 "board" on an x86 machine, for correctness, not for speed.

Each candidate's module (object code for the target triple) is linked into a shared library
with the target's C compiler and run by a small C harness, built once with the same compiler,
that loads it, calls the kernel on the inputs in a file, writes the arguments back and times
a few calls. The outputs are checked against the task's default schedule run the same way.
Results come back with ``emulated=True``: their costs are seconds of emulation, which say
nothing of the board, and the tuner never takes them as performance (search/tune.py).

An EmulatedMeasurer is also a runner of its own (``--runner qemu``, runner.py): it builds the
candidates in the local build workers and runs them here, so a user without a board or a
cluster gets schedules checked on the target's instruction set.

Example::

    em = EmulatedMeasurer(parse("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"))
    built, _ = Measurer(em.target).build(task, schedules)
    results = em.run_artifacts(task, built)      # checked under qemu-aarch64; emulated=True
    results = em.measure(task, schedules)        # the same, built here (the qemu runner)
"""

from __future__ import annotations

import math
import pickle
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from autosched.errors import AutoschedError, MeasureError
from autosched.search import protocol as P
from autosched.search.error_codes import ErrorCode
from autosched.search.measure import Measurer, MeasureResult, failed_result
from autosched.search.measure_worker import (
    compare,
    default_module,
    random_inputs,
    unwritten_output,
)
from autosched.search.protocol import MeasureOptions
from autosched.search.task import Task
from autosched.targets.target import Target

MAX_ARGS = 32  # kernel arguments (buffers and sizes) the harness can pass

# argv: LIB SYMBOL DATA_IN DATA_OUT NUMBER MIN_MS REPEAT NBUF BYTES... NSIZE SIZE...
# Every argument is one 64-bit register or stack slot (a pointer or an int64_t), so one cast
# per argument count calls any kernel. NUMBER 0: calls per repeat chosen to last MIN_MS.
_HARNESS = r"""
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define MAX_ARGS MAX_ARGS_VALUE
typedef uint64_t A;
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int32_t call(void *f, int n, A *a) {
  switch (n) {
CASES
  }
  return -1;
}
int main(int argc, char **argv) {
  if (argc < 10) return 9;
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 4; }
  void *f = dlsym(lib, argv[2]);
  if (!f) { fprintf(stderr, "dlsym %s: %s\n", argv[2], dlerror()); return 4; }
  long number = atol(argv[5]), repeat = atol(argv[7]);
  double min_s = atof(argv[6]) * 1e-3;
  int nbuf = atoi(argv[8]), at = 9, n = 0;
  A a[MAX_ARGS]; size_t size[MAX_ARGS];
  FILE *in = fopen(argv[3], "rb");
  if (!in) return 8;
  for (int i = 0; i < nbuf; i++, n++) {
    size[i] = (size_t)atoll(argv[at++]);
    void *p = aligned_alloc(64, (size[i] + 63) / 64 * 64 + 64);
    if (!p || fread(p, 1, size[i], in) != size[i]) return 8;
    a[n] = (A)p;
  }
  fclose(in);
  for (int i = atoi(argv[at++]); i > 0; i--) a[n++] = (A)atoll(argv[at++]);
  int32_t status = call(f, n, a);
  if (status) { fprintf(stderr, "kernel status %d\n", status); return 3; }
  FILE *out = fopen(argv[4], "wb");
  for (int i = 0; i < nbuf; i++) fwrite((void *)a[i], 1, size[i], out);
  fclose(out);
  double t0 = now();
  status |= call(f, n, a);
  double first = now() - t0;
  if (number < 1) number = first > 0 ? (long)ceil(min_s / first) : 1;
  if (number < 1) number = 1;
  for (long r = 0; r < repeat; r++) {
    t0 = now();
    for (long k = 0; k < number; k++) status |= call(f, n, a);
    printf("%.9e\n", (now() - t0) / number);
  }
  if (status) { fprintf(stderr, "kernel status %d\n", status); return 3; }
  return 0;
}
"""


def harness_source() -> str:
    """The harness's C source, with one call per argument count up to MAX_ARGS."""
    cases = []
    for n in range(MAX_ARGS + 1):
        types = ", ".join(["A"] * n) or "void"
        args = ", ".join(f"a[{i}]" for i in range(n))
        cases.append(f"  case {n}: return ((int32_t (*)({types}))f)({args});")
    return _HARNESS.replace("CASES", "\n".join(cases)).replace("MAX_ARGS_VALUE", str(MAX_ARGS))


def default_emulator(target: Target) -> list[str]:
    """The qemu-user command for ``target``'s architecture, with the cross toolchain's sysroot
    and the target's CPU where qemu knows it (so an instruction the board lacks faults)."""
    arch = target.triple.split("-")[0]
    qemu = shutil.which(f"qemu-{arch}")
    if qemu is None:
        raise MeasureError(f"no qemu-{arch} to emulate {target}: install qemu-user "
                           "(apt-get install qemu-user)")
    cmd = [qemu]
    sysroot = Path(f"/usr/{arch}-linux-gnu")
    if sysroot.is_dir():
        cmd += ["-L", str(sysroot)]
    if target.cpu:
        known = subprocess.run([qemu, "-cpu", "help"], capture_output=True, text=True).stdout
        if target.cpu in known.split():
            cmd += ["-cpu", target.cpu]
    return cmd


class EmulatedMeasurer:
    """Runs built candidates of a cross-compiled CPU ``target`` under an emulator, checking
    each against the default schedule; the same ``run_artifacts`` as Measurer's, so a board
    node can stand in for the board, and the same ``measure``, so it is a runner too (built
    in local build workers, started on first use). ``emulator`` is the command prefix
    (default: qemu-user for the target's architecture)."""

    def __init__(self, target: Target, options: MeasureOptions | None = None,
                 emulator: Sequence[str] | None = None, **overrides: Any):
        from autosched.targets.llvm.runtime import cross_compiler

        self.target = target
        self.options = replace(options or MeasureOptions(), **overrides)
        self.rng = np.random.default_rng(self.options.seed)
        self.emulator = list(emulator) if emulator is not None else default_emulator(target)
        self.cc = cross_compiler(target.triple, host=False)
        self._dir = Path(tempfile.mkdtemp(prefix="autosched-emulate-"))
        self._harness: Path | None = None
        self._states: dict[str, tuple[list[np.ndarray | None], list[np.ndarray]]] = {}
        self._builder: Measurer | None = None

    def measure(self, task: Task, candidates: Sequence[Any]) -> list[MeasureResult]:
        """Build each candidate (a Schedule or a list of its steps) here, run it under the
        emulator; one result per candidate, in order (runner.Runner's ``measure``)."""
        built, results = self._build_workers().build(task, candidates)
        for b, res in zip(built, self.run_artifacts(task, built)):
            results[b.index] = res
        done = [r for r in results if r is not None]
        assert len(done) == len(results), "every candidate is built and run, or failed"
        return done

    def lower_candidates(self, task: Task, candidates: Sequence[Any]) -> dict[int, Any]:
        """Search candidates lowered in the build workers (Measurer.lower_candidates)."""
        return self._build_workers().lower_candidates(task, candidates)

    def run_artifacts(self, task: Task, artifacts: Sequence[P.Artifact], *,
                      test_hooks: Mapping[int, str] | None = None,
                      reference: bytes | None = None) -> list[MeasureResult]:
        """Each artifact's result, in order: checked and timed under the emulator
        (``reference``: the default schedule built elsewhere, as Measurer.run_artifacts')."""
        del test_hooks  # the emulated path has no test hooks
        if str(task.target) != str(self.target):
            raise MeasureError(f"this emulator runs {self.target}; task {task.name} is for "
                               f"{task.target}")
        inputs, reference_outputs = self._state(task, reference)
        return [self._run_one(task, b, inputs, reference_outputs) for b in artifacts]

    def close(self) -> None:
        if self._builder is not None:
            self._builder.close()
            self._builder = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> EmulatedMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build_workers(self) -> Measurer:
        if self._builder is None:
            self._builder = Measurer(self.target, self.options)
        return self._builder

    # -- the task's inputs and reference ------------------------------------------------------
    def _state(self, task: Task, built: bytes | None = None
               ) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
        key = task.workload_key
        if key not in self._states:
            inputs = random_inputs(task, self.rng)
            try:
                mod = default_module(task, built)
                outs, _ = self._execute(task, mod, "reference", inputs,
                                        self.options.reference_timeout, timed=False)
            except (AutoschedError, _Failed) as exc:
                raise MeasureError(f"cannot check candidates of {task.name}: the default "
                                   f"schedule failed under {self.emulator[0]}: {exc}") from None
            self._states[key] = inputs, outs
        return self._states[key]

    # -- one candidate ------------------------------------------------------------------------
    def _run_one(self, task: Task, b: P.Artifact, inputs: list[np.ndarray | None],
                 reference: list[np.ndarray]) -> MeasureResult:
        kw: dict[str, Any] = {"ir_hash": b.ir_hash, "build_time": b.build_time,
                              "emulated": True}
        t0 = time.perf_counter()
        try:
            mod = pickle.loads(b.artifact)
            timeout = self.options.run_timeout * (self.options.repeat + 2)
            outs, costs = self._execute(task, mod, f"c{b.index}", inputs, timeout, timed=True)
        except _Failed as f:
            return failed_result(f.code, str(f), run_time=time.perf_counter() - t0, **kw)
        except AutoschedError as exc:  # linking the library
            return failed_result(ErrorCode.COMPILE_ERROR, f"{type(exc).__name__}: {exc}",
                          run_time=time.perf_counter() - t0, **kw)
        run_time = time.perf_counter() - t0
        names = [t.name for t, x in zip(task.args, inputs) if x is None]
        if self.options.check:
            for name, got, want in zip(names, outs, reference):
                problem = compare(name, got, want, task.precision)
                if problem:
                    return failed_result(ErrorCode.WRONG_ANSWER, problem, run_time=run_time, **kw)
        return MeasureResult(tuple(costs), ErrorCode.NO_ERROR, "", timestamp=time.time(),
                             run_time=run_time, **kw)

    def _execute(self, task: Task, mod: Any, name: str, inputs: list[np.ndarray | None],
                 timeout: float, timed: bool) -> tuple[list[np.ndarray], list[float]]:
        """Run ``mod`` (a CPU module of the target) under the emulator on ``inputs``: its
        outputs (in argument order) and, when ``timed``, seconds per call per repeat."""
        from autosched.tir.params import bind_arrays

        lib = mod.export_library(self._dir / f"{name}.so")
        args = [x if x is not None else unwritten_output(t) for t, x in zip(task.args, inputs)]
        sig = mod.signature
        sizes = bind_arrays(mod.entry_name, sig.params, args, frozenset())
        if len(args) + len(sig.sym_vars) > MAX_ARGS:
            raise _Failed(ErrorCode.RUNTIME_ERROR, f"{mod.entry_name} takes more than "
                          f"{MAX_ARGS} arguments, the most the emulation harness passes")
        data_in, data_out = self._dir / f"{name}.in", self._dir / f"{name}.out"
        data_in.write_bytes(b"".join(np.asarray(a, order="C").tobytes() for a in args))
        opts = self.options
        number = opts.number or 0
        argv = [*self.emulator, str(self._harness_path()), lib, mod.entry_name, str(data_in),
                str(data_out), str(number), str(opts.min_repeat_ms),
                str(opts.repeat if timed else 0), str(len(args)),
                *(str(a.nbytes) for a in args), str(len(sig.sym_vars)),
                *(str(sizes[v.uid]) for v in sig.sym_vars)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  cwd=self._dir)
        except subprocess.TimeoutExpired:
            raise _Failed(ErrorCode.RUN_TIMEOUT, f"{name} took over {timeout:g} s under "
                          f"{self.emulator[0]}; killed") from None
        finally:
            data_in.unlink(missing_ok=True)
        _check_exit(proc, name)
        raw = data_out.read_bytes()
        data_out.unlink(missing_ok=True)
        outs, at = [], 0
        for a, x in zip(args, inputs):
            if x is None:
                outs.append(np.frombuffer(raw[at:at + a.nbytes], a.dtype).reshape(a.shape))
            at += a.nbytes
        try:
            # a clock tick of 0 s would not be a valid record cost: 1 ns is the floor
            costs = [max(float(v), 1e-9) for v in proc.stdout.split()]
        except ValueError:
            costs = []
        if timed and (len(costs) != opts.repeat or not all(map(math.isfinite, costs))):
            raise _Failed(ErrorCode.RUNTIME_ERROR, f"{name}: the harness printed "
                          f"{proc.stdout[-200:]!r}, not {opts.repeat} timings")
        return outs, costs

    def _harness_path(self) -> Path:
        if self._harness is None:
            src, exe = self._dir / "harness.c", self._dir / "harness"
            src.write_text(harness_source())
            cmd = [self.cc, "-O2", "-o", str(exe), str(src), "-ldl", "-lm"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise MeasureError(f"cannot build the emulation harness: {' '.join(cmd)}\n"
                                   f"{proc.stderr[-1500:]}")
            self._harness = exe
        return self._harness


class _Failed(Exception):
    def __init__(self, code: ErrorCode, msg: str):
        super().__init__(msg)
        self.code = code


def _check_exit(proc: subprocess.CompletedProcess, name: str) -> None:
    rc = proc.returncode
    if rc == 0:
        return
    tail = proc.stderr.strip()[-1500:]
    if rc < 0:  # the emulator passes on the signal that killed the emulated program
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = f"signal {-rc}"
        raise _Failed(ErrorCode.CRASH, f"{name} was killed by {sig} under emulation: {tail}")
    raise _Failed(ErrorCode.RUNTIME_ERROR, f"{name} exited with status {rc} under emulation: "
                  f"{tail}")
