"""The pretrained cost model: train it from measured candidates of many tasks and targets, rank
held-out tasks with it, ship it, load it.

A sample is one measured candidate: its per-store features (``features.extract_features``, so
target-normalised: vector lanes against the target's, threads against its cores ...), its
median cost, and its group, the (workload, target) it was measured on. The model ranks
throughputs relative to the best of each group (``OBJECTIVE``: squared error on their log2):
how far a candidate is from the best of its task on its machine is learnt, never absolute
times, which is what transfers between workloads and between related targets.

The shipped models live in ``autosched/cost_model/pretrained/<device>/``, one per kind of
device (``cpu``, ``gpu``: their sketches and features have little in common, and GPU records
made the CPU picks worse, magika's twice as slow): ``model.ubj`` (XGBoost's own UBJSON format,
loaded with XGBoost's loader; nothing is unpickled) and ``manifest.json`` (the feature
version it was trained with, the logs and how many of their records were used).
``load_pretrained`` refuses, with one warning line, a model of another feature version.

Example::

    model = train(samples, rounds=200)                  # samples: Samples from the logs
    for row in evaluate(model, held_out): print(row)    # Kendall tau, best@1, best@5 per task
    save_pretrained(model, "out/", {"logs": [...]})
    m = load_pretrained("out/")                          # an XGBModel that boosts on top of it
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autosched.cost_model.features import FEATURE_VERSION, N_FEATURES
from autosched.cost_model.xgb_model import AGGREGATED_WIDTH, XGBModel

PRETRAINED_DIR = Path(__file__).resolve().parent / "pretrained"
DEVICES = ("cpu", "gpu")  # Target.device: one shipped model each
MANIFEST = "manifest.json"
MODEL_FILE = "model.ubj"
MANIFEST_FORMAT = "autosched-pretrained-cost-model"
MAX_MODEL_BYTES = 64 << 20   # a model file is data from outside: bounded before it is read
MAX_MANIFEST_BYTES = 1 << 20
# The shipped model's training (chosen on the held-out splits of
# benchmarks/pretrain_cost_model.py; docs/cost_model.md): squared error on log2 of the
# throughput over the group's best, shallow regularised trees (deeper ones learnt the training
# tasks, not what carries over to others).
DEFAULT_ROUNDS = 150
OBJECTIVE = "log_regression"
MAX_DEPTH = 4
ETA = 0.1
PARAMS = {"min_child_weight": 5, "subsample": 0.8, "colsample_bytree": 0.5}
# A tuning job's trees on top of it: XGBModel's own depth and eta, 60 rounds (on held-out
# workloads, with 8-64 of a job's records, these ranked better than trees like the base's and
# than a model of the job's records alone: ``finetune_table``, docs/cost_model.md)
FINETUNE_ROUNDS = 60


@dataclass
class Samples:
    """Measured candidates: features (n_stores, N_FEATURES) each, median seconds, and the
    group (workload key @ target key) each was measured in; ``names`` says what each group is
    (task name and target) for tables."""

    features: list[np.ndarray] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)

    def add(self, features: np.ndarray, cost: float, group: str, name: str) -> None:
        self.features.append(features)
        self.costs.append(cost)
        self.groups.append(group)
        self.names.setdefault(group, name)

    def __len__(self) -> int:
        return len(self.costs)

    def extend(self, other: Samples) -> Samples:
        for x, c, g in zip(other.features, other.costs, other.groups):
            self.add(x, c, g, other.names[g])
        return self

    def split(self, held_out: Callable[[str], bool]) -> tuple[Samples, Samples]:
        """(kept, held out): the samples of groups for which ``held_out(group)`` is true go
        right."""
        kept, out = Samples(), Samples()
        for x, c, g in zip(self.features, self.costs, self.groups):
            (out if held_out(g) else kept).add(x, c, g, self.names[g])
        return kept, out

    def by_group(self) -> dict[str, list[int]]:
        """The indices of each group's samples, groups in order of first appearance."""
        out: dict[str, list[int]] = {}
        for i, g in enumerate(self.groups):
            out.setdefault(g, []).append(i)
        return out

    def throughputs(self) -> list[float]:
        """1 / cost (failures, cost inf, are 0): XGBModel normalises them per group."""
        return [1.0 / c if math.isfinite(c) and c > 0 else 0.0 for c in self.costs]


def workload_of(group: str) -> str:
    """The workload key of a group (``workload key @ target key``)."""
    return group.partition("@")[0]


def train(samples: Samples, rounds: int = DEFAULT_ROUNDS, nthread: int = 1,
          seed: int = 0) -> XGBModel:
    """A model of ``samples`` (``OBJECTIVE``: throughputs normalised per group)."""
    if len(samples) < 2:
        raise ValueError(f"{len(samples)} usable records: too few to train a cost model")
    model = XGBModel(objective=OBJECTIVE, nthread=nthread, num_rounds=rounds,
                     max_depth=MAX_DEPTH, eta=ETA, seed=seed, params=PARAMS)
    return model.fit(samples.features, samples.throughputs(), samples.groups)


@dataclass(frozen=True)
class Ranking:
    """How well a model orders one group's candidates: Kendall's tau between predicted and
    true throughput, and best@k, the best true throughput among the k best predicted over the
    group's best (1.0: the true best is among them)."""

    group: str
    name: str
    n: int
    tau: float
    best_at_1: float
    best_at_5: float


def group_predictions(model: Any, samples: Samples, min_group: int = 8
                      ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(group, predicted scores, true throughputs) for each group of ``samples`` with at least
    ``min_group`` candidates."""
    thr = np.array(samples.throughputs())
    for g, idx in samples.by_group().items():
        if len(idx) >= min_group:
            pred = model.predict([samples.features[i] for i in idx])
            yield g, np.asarray(pred, dtype=np.float64), thr[idx]


def evaluate(model: Any, samples: Samples, min_group: int = 8) -> list[Ranking]:
    """One Ranking per group of ``samples`` with at least ``min_group`` candidates."""
    return [Ranking(g, samples.names[g], len(true), kendall_tau(pred, true),
                    best_at(pred, true, 1), best_at(pred, true, 5))
            for g, pred, true in group_predictions(model, samples, min_group)]


def kendall_tau(pred: np.ndarray, true: np.ndarray) -> float:
    """Kendall's tau-a over the pairs that the true values order (ties in truth skipped)."""
    dp = np.sign(pred[:, None] - pred[None, :])
    dt = np.sign(true[:, None] - true[None, :])
    upper = np.triu(np.ones_like(dt, dtype=bool), k=1) & (dt != 0)
    pairs = int(upper.sum())
    return float((dp * dt)[upper].sum() / pairs) if pairs else 0.0


def best_at(pred: np.ndarray, true: np.ndarray, k: int) -> float:
    """The best true value among the ``k`` best predicted, over the best true value."""
    best = float(true.max())
    if best <= 0:
        return 0.0
    top = np.argsort(-pred, kind="stable")[:k]
    return float(true[top].max()) / best


def finetune_table(base: XGBModel, held_out: Samples, ks: Sequence[int] = (8, 16, 32, 64),
                   reps: int = 2, seed: int = 0) -> str:
    """What a tuning job on a held-out workload would gain: after k of a group's candidates
    are measured, how the rest are ranked by the pretrained model alone, by a model of the k
    alone (``XGBModel()``, what tuning did before) and by the pretrained model with the k
    boosted on top; means of tau / best@1 / best@5 over groups with k + 16 candidates or more,
    ``reps`` random draws of the k each."""
    rng = np.random.default_rng(seed)
    by_group = held_out.by_group()
    thr = np.array(held_out.throughputs())
    lines = [f"{'k':>4s} {'draws':>5s}   {'pretrained: tau':>15s} {'best@1':>6s} {'best@5':>6s}"
             f"   {'job only: tau':>13s} {'best@1':>6s} {'best@5':>6s}"
             f"   {'fine-tuned: tau':>15s} {'best@1':>6s} {'best@5':>6s}"]
    for k in ks:
        got: list[list[tuple[float, float, float]]] = [[], [], []]
        for g, idx in by_group.items():
            if len(idx) < k + 16:
                continue
            for _ in range(reps):
                order = rng.permutation(idx)
                seen, rest = order[:k], order[k:]
                feats = [held_out.features[i] for i in seen]
                job = XGBModel().fit(feats, thr[seen].tolist(), [g] * k)
                tuned = XGBModel(base.effective_objective, base=base.booster,
                                 finetune_rounds=FINETUNE_ROUNDS).fit(
                    feats, thr[seen].tolist(), [g] * k)
                rest_feats = [held_out.features[i] for i in rest]
                for out, m in zip(got, (base, job, tuned)):
                    p = np.asarray(m.predict(rest_feats), dtype=np.float64)
                    t = thr[rest]
                    out.append((kendall_tau(p, t), best_at(p, t, 1), best_at(p, t, 5)))
        if not got[0]:
            continue
        cells = "   ".join(" ".join(f"{v:{w}.3f}" for v, w in zip(np.mean(r, axis=0), widths))
                           for r, widths in zip(got, ((15, 6, 6), (13, 6, 6), (15, 6, 6))))
        lines.append(f"{k:4d} {len(got[0]):5d}   {cells}")
    if len(lines) == 1:
        lines.append(f"  (no group has {min(ks)} + 16 candidates)")
    return "\n".join(lines)


def random_rankings(samples: Samples, min_group: int = 8, draws: int = 20,
                    seed: int = 0) -> list[Ranking]:
    """``evaluate`` of a model that scores at random, averaged over ``draws``: the baseline
    a table prints next to the model's."""
    rng = np.random.default_rng(seed)

    class _Random:
        def predict(self, feats: Sequence[np.ndarray]) -> np.ndarray:
            return rng.random(len(feats))

    runs = [evaluate(_Random(), samples, min_group) for _ in range(draws)]
    return [Ranking(r.group, r.name, r.n, float(np.mean([x[i].tau for x in runs])),
                    float(np.mean([x[i].best_at_1 for x in runs])),
                    float(np.mean([x[i].best_at_5 for x in runs])))
            for i, r in enumerate(runs[0])]


def ranking_table(model_rows: Sequence[Ranking], random_rows: Sequence[Ranking]) -> str:
    """The per-group table (model against random) and the mean of each column."""
    lines = [f"{'group':44s} {'n':>5s} {'tau':>6s} {'best@1':>7s} {'best@5':>7s}   "
             f"{'random: tau':>11s} {'best@1':>7s} {'best@5':>7s}"]
    for m, r in zip(model_rows, random_rows):
        lines.append(f"{m.name[:44]:44s} {m.n:5d} {m.tau:6.3f} {m.best_at_1:7.3f} "
                     f"{m.best_at_5:7.3f}   {r.tau:11.3f} {r.best_at_1:7.3f} {r.best_at_5:7.3f}")
    if model_rows:
        def mean(rows: Sequence[Ranking], f: str) -> float:
            return float(np.mean([getattr(x, f) for x in rows]))

        lines.append(f"{'mean over ' + str(len(model_rows)) + ' groups':44s} "
                     f"{sum(m.n for m in model_rows):5d} {mean(model_rows, 'tau'):6.3f} "
                     f"{mean(model_rows, 'best_at_1'):7.3f} {mean(model_rows, 'best_at_5'):7.3f}"
                     f"   {mean(random_rows, 'tau'):11.3f} {mean(random_rows, 'best_at_1'):7.3f} "
                     f"{mean(random_rows, 'best_at_5'):7.3f}")
    return "\n".join(lines)


# -- the shipped file ---------------------------------------------------------------------


def save_pretrained(model: XGBModel, directory: str | os.PathLike, info: dict[str, Any]) -> Path:
    """Write ``model.ubj`` and ``manifest.json`` (``info`` plus the feature version and the
    model's settings) into ``directory``; returns the manifest's path."""
    import xgboost as xgb

    if model.booster is None:
        raise ValueError("the model is not trained")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.booster.save_model(str(out / MODEL_FILE))
    manifest = {
        "format": MANIFEST_FORMAT,
        "feature_version": FEATURE_VERSION,
        "n_features": N_FEATURES,
        "aggregated_width": AGGREGATED_WIDTH,
        "model": MODEL_FILE,
        "objective": model.effective_objective,
        "trees": model.booster.num_boosted_rounds(),
        "max_depth": model.max_depth,
        "eta": model.eta,
        "params": model.params,
        "xgboost": xgb.__version__,
        **info,
    }
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def pretrained_dir(device: str) -> Path:
    """The folder of the shipped model for targets of ``device`` (Target.device)."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: the shipped cost models are for {DEVICES}")
    return PRETRAINED_DIR / device


@functools.cache
def pretrained_digest(device: str) -> str:
    """SHA-256 of the shipped model's files for ``device`` (what names the picks it made; ""
    when absent)."""
    h = hashlib.sha256()
    for name in (MANIFEST, MODEL_FILE):
        try:
            h.update((pretrained_dir(device) / name).read_bytes())
        except OSError:
            return ""
    return h.hexdigest()


def load_pretrained(directory: str | Path | None = None, nthread: int = 1,
                    device: str = "cpu") -> XGBModel | None:
    """The pretrained model in ``directory`` (if None, the one shipped for targets of
    ``device``) as an XGBModel whose training boosts on top of it; None, with one warning
    line, when it is missing, of another feature version, or not a model file.

    Example::

        model = load_pretrained(device=target.device) or XGBModel()
    """
    where = Path(directory) if directory is not None else pretrained_dir(device)
    try:
        manifest, booster = _read(where, nthread)
        objective = _objective(manifest, where / MANIFEST)
    except (OSError, ValueError) as exc:
        warnings.warn(f"no pretrained cost model: {exc}", stacklevel=2)
        return None
    model = XGBModel(objective, nthread=nthread, base=booster, finetune_rounds=FINETUNE_ROUNDS)
    logs = manifest.get("logs")
    counts = [log.get("tensor_cores") for log in logs if isinstance(log, dict)] \
        if isinstance(logs, list) else []
    model.tensor_core_records = sum(n for n in counts if isinstance(n, int) and n > 0)
    return model


def _objective(manifest: dict[str, Any], path: Path) -> str:
    """The objective the model was trained with: the trees a job adds on top learn the same."""
    from autosched.cost_model.xgb_model import OBJECTIVES

    objective = manifest.get("objective")
    if objective not in OBJECTIVES or objective == "auto":
        raise ValueError(f"{path}: objective {objective!r} is not one of {OBJECTIVES[1:]}")
    return str(objective)


def _read(where: Path, nthread: int) -> tuple[dict[str, Any], Any]:
    """The manifest and booster in ``where`` (ValueError / OSError saying what is wrong)."""
    import xgboost as xgb

    manifest_path = where / MANIFEST
    manifest = json.loads(_bounded(manifest_path, MAX_MANIFEST_BYTES))
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{manifest_path} is not a pretrained cost model's manifest")
    version = manifest.get("feature_version")
    if version != FEATURE_VERSION or manifest.get("n_features") != N_FEATURES:
        raise ValueError(f"{manifest_path} was trained on feature version {version} "
                         f"({manifest.get('n_features')} features per store); this version "
                         f"extracts version {FEATURE_VERSION} ({N_FEATURES}): retrain it with "
                         "autosched train-cost-model")
    name = manifest.get("model")
    if not isinstance(name, str) or Path(name).name != name:
        raise ValueError(f"{manifest_path}: model must name a file beside it, got {name!r}")
    raw = _bounded(where / name, MAX_MODEL_BYTES)
    booster = xgb.Booster(params={"nthread": nthread})
    try:
        booster.load_model(bytearray(raw))
    except xgb.core.XGBoostError as exc:
        raise ValueError(f"{where / name} is not an XGBoost model "
                         f"({str(exc).splitlines()[0][:200]})") from None
    if booster.num_features() != AGGREGATED_WIDTH:
        raise ValueError(f"{where / name} takes {booster.num_features()} features, "
                         f"expected {AGGREGATED_WIDTH}")
    return manifest, booster


def _bounded(path: Path, limit: int) -> bytes:
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is over {limit >> 20} MiB")
    return data
