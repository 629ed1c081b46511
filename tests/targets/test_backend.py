"""The Backend / Module interface: the registry, the protocol, no target-kind branches outside
autosched/targets/, and a toy backend (below, under 150 lines) that runs the operator tests.

The toy backend is also a pytest plugin: ``pytest -p <this module> --targets toy`` runs the
numeric tests on it.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import autosched as aus
from autosched import te
from autosched.errors import CompileError
from autosched.targets import backend as backends
from autosched.targets.backend import Backend, Module, Timing, WallClockModule, time_repeats
from autosched.targets.ref.evaluate import evaluate
from autosched.targets.target import Target, parse
from autosched.tir.ir import PrimFunc
from tests.support import ROOT

# -- a toy backend: the reference evaluator under another name ----------------------------------


class ToyModule(WallClockModule):
    """The loop IR run by the reference evaluator."""

    def __init__(self, func: PrimFunc, target: Target) -> None:
        self.func = func
        self.target = target

    def __call__(self, *arrays: np.ndarray) -> None:
        evaluate(self.func, *arrays)

    def get_source(self) -> str:
        return str(self.func)


class ToyBackend(Backend):
    kind = "toy"

    def target(self, options: tuple[tuple[str, str], ...]) -> Target:
        return Target(self.kind, options)

    def build(self, func: PrimFunc, target: Target) -> ToyModule:
        return ToyModule(func, target)


def pytest_configure(config: pytest.Config) -> None:
    """Loaded as a plugin (-p tests.targets.test_backend): the toy backend is a target like
    any other."""
    backends.register(ToyBackend())


@pytest.fixture
def toy() -> Backend:
    return backends.register(ToyBackend())


# -- the registry and the protocol --------------------------------------------------------------


def _scale() -> tuple[te.Schedule, list[te.Tensor]]:
    A = te.placeholder((13, 7), name="A")
    B = te.compute((13, 7), lambda i, j: A[i, j] * 3.0 + 1.0, name="B")
    return te.create_schedule(B.op), [A, B]


@pytest.mark.parametrize("target", ["llvm", "ref", "cuda -emulate=ir"])
def test_builtin_backends_build_modules(target: str, rng: np.random.Generator) -> None:
    tgt = parse(target)
    assert tgt.backend is backends.get(tgt.kind) and tgt.kind in backends.kinds()
    s, args = _scale()
    mod = aus.build(s, args, target=tgt)
    assert isinstance(mod, Module) and mod.target == tgt
    a = rng.uniform(-1, 1, (13, 7)).astype(np.float32)
    b = np.full_like(a, np.nan)
    mod.bind(a, b)()
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-6, atol=1e-6)
    timing = mod.time(a, b, number=2, repeat=3, warmup=0)
    assert len(timing.samples) == 3 and 0 < timing.min <= timing.median and timing.mean > 0


def test_devices_and_fingerprints() -> None:
    assert parse("llvm").device == parse("ref").device == "cpu"
    assert parse("cuda -arch=sm_80").device == "gpu"
    assert parse("cuda -arch=sm_80").backend.device_memory(parse("cuda -emulate=ir")) is None
    fp = parse("cuda").backend.fingerprint(parse("cuda -arch=sm_80"))
    assert fp["kind"] == "cuda" and parse("cuda").backend.fingerprint_key(fp) == "cuda/sm_80"
    assert parse("llvm").backend.exports and not parse("ref").backend.exports


def test_unknown_kinds_and_options_are_refused() -> None:
    with pytest.raises(CompileError, match="unknown target kind 'tpu'.*'llvm'"):
        parse("tpu -x=1")
    with pytest.raises(CompileError, match="-emulate=gpu"):
        parse("cuda -emulate=gpu")


def test_time_repeats_grows_number_to_the_minimum_repeat_time() -> None:
    calls: list[int] = []

    def run(n: int) -> float:
        calls.append(n)
        return n * 1e-4  # 0.1 ms a call

    timing = time_repeats(run, number=1, repeat=2, warmup=3, min_repeat_ms=5)
    assert calls[0] == 3 and calls[-1] == calls[-2] >= 50
    assert timing.samples == pytest.approx((1e-4, 1e-4))


def test_a_registered_backend_is_a_target(toy: Backend, rng: np.random.Generator) -> None:
    s, args = _scale()
    mod = aus.build(s, args, target="toy -any=option")
    assert isinstance(mod, ToyModule) and mod.target.option("any") == "option"
    assert "toy" in backends.kinds() and parse("toy").backend is toy
    a = rng.uniform(-1, 1, (13, 7)).astype(np.float32)
    b = np.empty_like(a)
    mod(a, b)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-6, atol=1e-6)


def test_the_toy_backend_runs_the_operator_tests() -> None:
    """A subprocess pytest: the plugin registers "toy", ``--targets`` picks it."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_ops_*.py"))
    plugin = ".".join(Path(__file__).resolve().relative_to(ROOT).with_suffix("").parts)
    cmd = [sys.executable, "-m", "pytest", "-p", plugin, "-p", "no:cacheprovider", *files,
           "--targets=toy"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 500, proc.stdout[-2000:]


# -- no code outside autosched/targets/ branches on a target kind --------------------------------

KIND_NAMES = frozenset({"llvm", "cuda", "ref"})
# names through which a target is reached: target.kind, tgt.kind, task.target.kind, ...
TARGET_NAMES = re.compile(r"(^|\.)(target|tgt|parse\(.*\))$")


def _is_kind_name(node: ast.AST) -> bool:
    """A string constant naming a backend kind, or a tuple / list / set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in KIND_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_kind_name(e) for e in node.elts)
    return False


def _is_target_kind(node: ast.AST) -> bool:
    """``<target>.kind`` or ``getattr(<target>, "kind", ...)``."""
    if isinstance(node, ast.Attribute) and node.attr == "kind":
        return TARGET_NAMES.search(ast.unparse(node.value)) is not None
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and node.args[1:]:
        kind = node.args[1]
        return isinstance(kind, ast.Constant) and kind.value == "kind"
    return False


def kind_comparisons(source: str) -> Iterator[tuple[int, str]]:
    """(line, code) of each comparison of a target kind in ``source``: a target's kind
    compared with anything, or anything compared with the name of a backend kind."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if any(_is_target_kind(o) or _is_kind_name(o) for o in operands):
            yield node.lineno, ast.unparse(node)


def test_the_check_sees_what_it_should() -> None:
    caught = "\n".join([
        'if target.kind == "cuda": pass', 'ok = self.task.target.kind != "llvm"',
        'gpu = getattr(target, "kind", "llvm") == "cuda"', 'x = kind in ("llvm", "cuda")',
        'y = parse(t).kind == other', 'z = msg[0] != "ref"'])
    assert [line for line, _ in kind_comparisons(caught)] == [1, 2, 3, 4, 5, 6]
    ignored = "\n".join([
        'a = iv.kind == "reduce"', 'b = dtype.kind in "fc"', 'c = cell.kind == "lstm"',
        'd = s.kind != "serial"', 'e = lp.kind == "thread"', 'f = name == "hang"'])
    assert list(kind_comparisons(ignored)) == []


def test_no_kind_comparison_outside_targets() -> None:
    found = []
    for package in ("autosched", "importers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("autosched", "targets"):
                continue
            found += [f"{rel}:{line}: {code}"
                      for line, code in kind_comparisons(path.read_text())]
    assert not found, "ask the target's backend or device instead:\n" + "\n".join(found)


def test_modules_time_themselves_with_one_signature() -> None:
    s, args = _scale()
    def keywords(time: Callable[..., Timing]) -> list[tuple[str, object]]:
        params = inspect.signature(time).parameters.values()
        return [(p.name, p.default) for p in params if p.kind is p.KEYWORD_ONLY]

    want = keywords(Module.time)
    assert [name for name, _ in want] == ["number", "repeat", "warmup", "min_repeat_ms"]
    for target in ("llvm", "ref", "cuda -emulate=ir", "cuda -emulate=host"):
        assert keywords(aus.build(s, args, target=target).time) == want, target
