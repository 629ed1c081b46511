"""An XGBoost model that ranks schedule candidates from their loop-IR features.

A candidate has one feature row per store (``features.extract_features``), and the number of
stores differs between candidates (cache stages add stores). The rows are folded into one
fixed vector per candidate: the element-wise max and mean over the rows, the row of the
dominant store (most flops, then most iterations) and the number of stores. Why not Ansor's
"predict a score per store and sum the scores": that needs a custom objective (implemented and
tried: it ranked real timings slightly worse), the features are log-scaled so per-store scores
would have to be learnt in linear units, and the stores of one nest are not independent (the
init and update stores share loops). The folded vector lets the standard objectives see every
store at once.

Targets are throughputs normalised per task (group): ``throughput / best throughput of its
group``, so 1.0 is the best measured candidate of each task and failures are 0. Objectives:

* ``"rank"``: XGBoost's ``rank:pairwise`` with one query per task (only the order inside a
  task matters, which is all the search uses);
* ``"regression"``: squared error on the normalised throughput;
* ``"log_regression"``: squared error on its log2 (floored at 1e-3), so a 2x gap counts the
  same among slow candidates as among fast ones;
* ``"auto"`` (default): ``rank`` while the tasks have fewer than ``AUTO_SWITCH`` (100)
  measured candidates each on average, ``log_regression`` from then on.

Why: on real timings (benchmarks/cost_model_ranking.py; 400 random matmul schedules on CPU,
237 search-space GEMM 1024 candidates on an H200, 200 conv2d candidates on CPU) pairwise
ranking was best with 25-50 training candidates per task (held-out pairwise accuracy 0.75 /
0.84 / 0.64 at 25 against 0.72 / 0.81 / 0.61 for log_regression and 0.69 / 0.75 / 0.58 for
plain regression), and log_regression best from 100 on (0.80 / 0.87 / 0.80 at 100 against
0.76 / 0.84 / 0.70 for rank). See docs/cost_model.md for the tables.

A model can start from a base booster (the pretrained model shipped in
``cost_model/pretrained``, or any trained model a tuning job is given): ``fit`` / ``update``
then boost ``finetune_rounds`` more trees on top of the base with the job's own records,
instead of refitting from nothing, so what the base learnt from other logs is kept and the
job's records correct it. Each training starts again from the base (never from the previous
round's trees), so the tree count stays base + ``finetune_rounds``. The trees added on top
learn the base's objective (``objective`` is the one it was trained with; "auto" resolves to
the one its last training used), so their outputs add up. ``uncertainty`` says where the base
and the fine-tuned model disagree; the search measures some of those.

Training is synchronous and uses ``nthread`` threads (default 1). Do not train while a
measurement runs: XGBoost's OpenMP threads spin after work (set OMP_WAIT_POLICY=passive) and
distort the timings.

Example::

    model = XGBModel()
    model.fit([extract_features(f, target) for f in funcs], throughputs, groups=keys)
    scores = model.predict([extract_features(g, target) for g in candidates])  # higher: better
    model.save("model.json"); XGBModel.load("model.json").predict(...)
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autosched.cost_model.features import FEATURE_NAMES, N_FEATURES, extract_features
from autosched.cost_model.random_model import RandomModel

OBJECTIVES = ("auto", "rank", "regression", "log_regression")
# "auto" ranks pairwise until the tasks have this many measured candidates each on average.
AUTO_SWITCH = 100
LOG_FLOOR = 1e-3  # normalised throughput of failures and of anything slower, for log_regression
AGGREGATED_WIDTH = 3 * N_FEATURES + 1
_FLOPS = FEATURE_NAMES.index("flops")
_ITERS = FEATURE_NAMES.index("outer_prod")
FORMAT_VERSION = 1


def aggregate(features: Sequence[np.ndarray]) -> np.ndarray:
    """(n_candidates, AGGREGATED_WIDTH) float32: max, mean and dominant row of each candidate's
    per-store matrix, then log2(1 + number of stores)."""
    out = np.zeros((len(features), AGGREGATED_WIDTH), dtype=np.float32)
    for i, x in enumerate(features):
        if x.shape[0] == 0:
            continue
        dominant = int(np.lexsort((x[:, _ITERS], x[:, _FLOPS]))[-1])
        out[i, :N_FEATURES] = x.max(axis=0)
        out[i, N_FEATURES:2 * N_FEATURES] = x.mean(axis=0)
        out[i, 2 * N_FEATURES:3 * N_FEATURES] = x[dominant]
        out[i, -1] = math.log2(1 + x.shape[0])
    return out


def normalise(throughputs: Sequence[float], groups: Sequence[str]) -> np.ndarray:
    """Each throughput divided by the best of its group (0 where the group's best is 0)."""
    t = np.asarray(throughputs, dtype=np.float64)
    best: dict[str, float] = {}
    for g, v in zip(groups, t):
        best[g] = max(best.get(g, 0.0), float(v))
    scale = np.array([best[g] for g in groups], dtype=np.float64)
    return np.where(scale > 0, t / np.where(scale > 0, scale, 1.0), 0.0)


class XGBModel:
    """Ranks candidates: ``predict`` gives higher scores to faster ones (see the module doc).

    Before it has two candidates with different throughputs it scores at random
    (``RandomModel``), so the search can start cold.

    Example::

        m = XGBModel(objective="auto", nthread=1)
        m.update(feats, [1 / c for c in costs], groups=[task.workload_key] * len(costs))
        best_first = np.argsort(-m.predict(candidate_feats))
    """

    def __init__(self, objective: str = "auto", nthread: int = 1, num_rounds: int = 80,
                 max_depth: int = 6, eta: float = 0.2, seed: int = 0, base: Any = None,
                 finetune_rounds: int = 30, params: Mapping[str, Any] | None = None):
        if objective not in OBJECTIVES:
            raise ValueError(f"objective {objective!r}; expected one of {OBJECTIVES}")
        self.objective = objective
        self.nthread = nthread
        self.num_rounds = num_rounds
        self.max_depth = max_depth
        self.eta = eta
        self.seed = seed
        self.params = dict(params or {})  # more XGBoost parameters (subsample, ...)
        self.base: Any = base  # an xgboost Booster the training boosts on top of
        self.finetune_rounds = finetune_rounds
        self.booster: Any = None
        self.fallback = RandomModel(seed)
        self._x = np.zeros((0, AGGREGATED_WIDTH), dtype=np.float32)
        self._t: list[float] = []
        self._groups: list[str] = []
        # how many tensor-core candidates its base was trained on (the shipped manifest's
        # count): none, and it cannot rank tensor-core tiles (tune._tensor_cores_first)
        self.tensor_core_records = 0

    @property
    def trained(self) -> bool:
        """Whether predictions mean something (a base, or trees trained here)."""
        return self.booster is not None or self.base is not None

    @property
    def num_trees(self) -> int:
        model = self.booster if self.booster is not None else self.base
        return 0 if model is None else model.num_boosted_rounds()

    def keep_as_base(self) -> XGBModel:
        """Make the trained trees the base that later training boosts on top of (a tuning job
        does this with a trained model it is given, so its job's records refine it)."""
        if self.booster is not None:
            self.objective = self.effective_objective  # the trees on top learn the same
            self.base, self.booster = self.booster, None
        return self

    @property
    def num_samples(self) -> int:
        return len(self._t)

    @property
    def effective_objective(self) -> str:
        """The objective the next training uses ("auto" resolved by the data per task)."""
        if self.objective != "auto":
            return self.objective
        per_task = len(self._t) / max(len(set(self._groups)), 1)
        return "rank" if per_task < AUTO_SWITCH else "log_regression"

    def fit(self, features: Sequence[np.ndarray], throughputs: Sequence[float],
            groups: Sequence[str] | None = None) -> XGBModel:
        """Train on these candidates only (from scratch, or on top of the base). ``groups``
        names each candidate's task (one group if omitted); throughputs are normalised within
        each group."""
        self._x = np.zeros((0, AGGREGATED_WIDTH), dtype=np.float32)
        self._t, self._groups = [], []
        return self.update(features, throughputs, groups)

    def update(self, features: Sequence[np.ndarray], throughputs: Sequence[float],
               groups: Sequence[str] | None = None) -> XGBModel:
        """Add candidates to the kept training data and retrain on all of it, from scratch or
        from the base (a few thousand candidates train in well under a second, so retraining
        stays cheap and never drifts the way continuing from the last round's trees would)."""
        if len(features) != len(throughputs):
            raise ValueError(f"{len(features)} feature matrices but {len(throughputs)} throughputs")
        if groups is not None and len(groups) != len(features):
            raise ValueError(f"{len(features)} feature matrices but {len(groups)} groups")
        for i, x in enumerate(features):
            if x.ndim != 2 or x.shape[1] != N_FEATURES:
                raise ValueError(f"candidate {i}: features of shape {x.shape}, "
                                 f"expected (n_stores, {N_FEATURES})")
        bad = [t for t in throughputs if not (math.isfinite(t) and t >= 0)]
        if bad:
            raise ValueError(f"throughputs must be finite and >= 0, got {bad[:3]}")
        self._x = np.concatenate([self._x, aggregate(features)])
        self._t += [float(t) for t in throughputs]
        self._groups += [str(g) for g in groups] if groups is not None else ["default"] * len(features)
        self._train()
        return self

    def _train(self) -> None:
        import xgboost as xgb

        y = normalise(self._t, self._groups)
        if len(y) < 2 or float(y.max() - y.min()) == 0.0:
            self.booster = None
            return
        objective = self.effective_objective
        params: dict[str, Any] = {
            "objective": "rank:pairwise" if objective == "rank" else "reg:squarederror",
            "max_depth": self.max_depth,
            "eta": self.eta,
            "min_child_weight": 1,
            "subsample": 1.0,
            "tree_method": "hist",
            "max_bin": 64,
            "nthread": self.nthread,
            "seed": self.seed,
            "verbosity": 0,
            **self.params,
        }
        if objective == "rank":
            # Queries must be contiguous: sort by group, keep the order inside each group.
            names = sorted(set(self._groups))
            qid_of = {g: i for i, g in enumerate(names)}
            qid = np.array([qid_of[g] for g in self._groups])
            order = np.argsort(qid, kind="stable")
            dtrain = xgb.DMatrix(self._x[order], label=y[order], qid=qid[order])
        elif objective == "log_regression":
            dtrain = xgb.DMatrix(self._x, label=np.log2(np.maximum(y, LOG_FLOOR)))
        else:
            dtrain = xgb.DMatrix(self._x, label=y)
        if self.base is None:
            self.booster = xgb.train(params, dtrain, num_boost_round=self.num_rounds)
        else:  # train() copies the base: its trees stay as they are for the next round
            self.booster = xgb.train(params, dtrain, num_boost_round=self.finetune_rounds,
                                     xgb_model=self.base)

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """One score per candidate, higher is better (random before training)."""
        model = self.booster if self.booster is not None else self.base
        if model is None:
            return self.fallback.predict(features)
        if not features:
            return np.zeros(0)
        return _scores(model, features)

    def uncertainty(self, features: Sequence[np.ndarray]) -> np.ndarray | None:
        """How unsure the model is of each candidate, in [0, 1]: how far apart the base and the
        fine-tuned model rank it (fractions of the list). None until both exist."""
        if self.base is None or self.booster is None or not features:
            return None
        return np.abs(_ranks(_scores(self.base, features))
                      - _ranks(_scores(self.booster, features)))

    # -- persistence ------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Write the model (settings and trees, base included, not the training data) as one
        JSON file."""
        model = self.booster if self.booster is not None else self.base
        meta = {
            "format": "autosched-xgb-model",
            "version": FORMAT_VERSION,
            "n_features": N_FEATURES,
            "objective": self.objective,
            "nthread": self.nthread,
            "num_rounds": self.num_rounds,
            "max_depth": self.max_depth,
            "eta": self.eta,
            "seed": self.seed,
            "params": self.params,
            "booster": None if model is None else model.save_raw("json").decode(),
        }
        with open(path, "w") as fh:
            json.dump(meta, fh)

    @classmethod
    def load(cls, path: str) -> XGBModel:
        """Read a model written by ``save``; its features must have today's width."""
        import xgboost as xgb

        with open(path) as fh:
            meta = json.load(fh)
        if meta.get("format") != "autosched-xgb-model":
            raise ValueError(f"{path} is not an autosched XGBoost model file")
        if meta["n_features"] != N_FEATURES:
            raise ValueError(f"{path} was trained on {meta['n_features']} features per store; "
                             f"this version extracts {N_FEATURES}: retrain it from the logs")
        model = cls(meta["objective"], meta["nthread"], meta["num_rounds"], meta["max_depth"],
                    meta["eta"], meta["seed"], params=meta.get("params"))
        if meta["booster"] is not None:
            model.booster = xgb.Booster(params={"nthread": model.nthread})
            model.booster.load_model(bytearray(meta["booster"].encode()))
        return model


def _scores(booster: Any, features: Sequence[np.ndarray]) -> np.ndarray:
    import xgboost as xgb

    return booster.predict(xgb.DMatrix(aggregate(features))).astype(np.float64)


def _ranks(scores: np.ndarray) -> np.ndarray:
    """Each score's rank as a fraction in [0, 1] (0: the lowest)."""
    out = np.empty(len(scores))
    out[np.argsort(scores, kind="stable")] = np.arange(len(scores))
    return out / max(len(scores) - 1, 1)


def warm_start_from_records(records: Sequence[Any], tasks_by_key: Mapping[str, Any],
                            model: XGBModel | None = None) -> XGBModel:
    """Train ``model`` (a new XGBModel if None) on existing tuning records.

    Each record needs ``workload_key``, ``steps`` (step dicts or Step objects), ``costs``
    (seconds) and ``error_code`` ("NO_ERROR" when fine). Records of unknown workloads, failed
    ones, and ones whose steps no longer replay or lower are skipped. Throughput is the
    workload's best median cost over this record's median cost.

    Example::

        model = warm_start_from_records(RecordLog("tuning_logs/mm.jsonl").load(),
                                        {task.workload_key: task})
    """
    from autosched.errors import LowerError, ScheduleError
    from autosched.schedule.steps import Step, step_from_dict

    model = model or XGBModel()
    feats: list[np.ndarray] = []
    costs: list[float] = []
    keys: list[str] = []
    for rec in records:
        task = tasks_by_key.get(rec.workload_key)
        if task is None or str(rec.error_code) != "NO_ERROR" or not rec.costs:
            continue
        cost = statistics.median(float(c) for c in rec.costs)
        if not (math.isfinite(cost) and cost > 0):
            continue
        steps = [s if isinstance(s, Step) else step_from_dict(s) for s in rec.steps]
        try:
            func = task.lower(task.schedule(steps))
        except (ScheduleError, LowerError):
            continue
        feats.append(extract_features(func, task.target))
        costs.append(cost)
        keys.append(rec.workload_key)
    if feats:
        best: dict[str, float] = {}
        for k, c in zip(keys, costs):
            best[k] = min(best.get(k, math.inf), c)
        model.update(feats, [best[k] / c for k, c in zip(keys, costs)], keys)
    return model
