"""Which task to tune next, so that trials go where they cut end-to-end latency most.

The objective is the weighted sum of the tasks' best latencies (weights = how often each task's
subgraph occurs in a model). After every task has had a warm-up round, the scheduler picks the
task with the largest estimated gain per round, as in Ansor: the backward gradient (how much the
last rounds improved the task) blended with an optimistic forward estimate (the task could reach
the throughput of the best similar task: one of its family, see ``family``), times the task's
weight.

The gradient never returns to the task with the best rate of its family once its own gains
flatten (the forward estimate is zero there), however much of the model's time it holds: the
ResNet-18 stem got 64 of 4,100 trials. So every ``REVISIT``-th pick goes instead to the task
with the most latency (weight x best) per trial spent on it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

ALPHA = 0.2   # weight of the backward gradient against the forward estimate
WINDOW = 3    # rounds the backward gradient looks back over
REVISIT = 5   # every REVISIT-th pick goes to the most latency per trial spent
WARM_MIN = 4  # the fewest candidates of a warm-up round


def family(task: Any) -> tuple[str, ...]:
    """The names of a task's reduction stages (conv2d_nhwc_acc, T_matmul, winograd_input):
    tasks of one family can reach similar flop rates. A Winograd transform counts its
    multiplies by constants as flops at a rate no convolution can be held to, so across
    families the forward estimate sent most trials to the transforms (652 of 3,300 in one
    ResNet-18 run, against 32 for the stem)."""
    dag = getattr(task, "dag", None)
    if dag is None:
        return ()
    return tuple(sorted({op.name for op in dag.ops if getattr(op, "reduce_axis", None)}))


def _estimated_us(task: Any) -> float:
    """A rough one-core size of the task's kernel (sketch.estimated_us), 0 when it has
    none (a stand-in task)."""
    schedule = getattr(task, "schedule", None)
    if schedule is None:
        return 0.0
    from autosched.search.sketch import estimated_us

    return estimated_us(schedule())


class TaskScheduler:
    def __init__(self, tuners: Sequence[Any], weights: Sequence[float] | None = None):
        self.tuners = list(tuners)
        self.weights = list(weights) if weights is not None else [1.0] * len(self.tuners)
        if len(self.weights) != len(self.tuners):
            raise ValueError(f"{len(self.weights)} weights for {len(self.tuners)} tasks")
        # a task resumed from a log has had its warm-up: a scheduler made again (a resumed
        # job) warms up only the tasks nothing was measured for yet
        self.rounds = [1 if getattr(t, "records", None) else 0 for t in self.tuners]
        self.dead: set[int] = set()
        self.picks = 0
        # the warm-up goes to the largest tasks first (weight x estimated size): a budget
        # smaller than a warm-up round of every task is then spent where the model's time is
        # (300 trials warmed up only the first 24 of 75 tasks in model order, none of an
        # int8 model's heavy matmuls)
        self.size = [w * _estimated_us(t.task) for w, t in zip(self.weights, self.tuners)]
        self.warm_order = sorted(range(len(self.tuners)), key=lambda i: -self.size[i])
        self.total_size = sum(self.size)

    def round_size(self, tuner: Any, batch: int) -> int:
        """How many candidates ``tuner``'s next round measures: ``batch``, but a warm-up round
        that many times the task's share of the model's estimated time over the average
        share, at least WARM_MIN. With a whole batch each, 300 trials of a model of 19 tasks
        were all warm-up, 16 each for a 0.01 ms slice and for the 144 ms Winograd transform
        (dnsmos_sig_bak_ovr); the gradient now has the trials the small tasks leave."""
        i = self.tuners.index(tuner)
        if self.rounds[i] or self.total_size <= 0:
            return batch
        share = self.size[i] * len(self.size) / self.total_size
        return max(min(batch, math.ceil(batch * share)), min(WARM_MIN, batch))

    def next_task(self) -> Any:
        live = [i for i in range(len(self.tuners)) if i not in self.dead] or list(range(len(self.tuners)))
        for i in self.warm_order:  # warm-up: every task once
            if self.rounds[i] == 0 and i in live:
                return self.tuners[i]
        self.picks += 1
        if self.picks % REVISIT == 0:
            return self.tuners[max(live, key=self.latency_per_trial)]
        return self.tuners[max(live, key=self.gradient)]

    def latency_per_trial(self, i: int) -> float:
        t = self.tuners[i]
        if not math.isfinite(t.best_cost):
            return 0.0  # nothing works yet: the gradient keeps trying it
        return self.weights[i] * t.best_cost / max(t.trials, 1)

    def update(self, tuner: Any) -> None:
        self.rounds[self.tuners.index(tuner)] += 1

    def exhausted(self, tuner: Any) -> None:
        i = self.tuners.index(tuner)
        self.rounds[i] += 1
        self.dead.add(i)

    def gradient(self, i: int) -> float:
        t = self.tuners[i]
        hist = [h for h in t.history if math.isfinite(h)]
        if not hist:
            return math.inf  # nothing works yet: keep trying it
        best = hist[-1]
        k = min(WINDOW, len(hist) - 1)
        back = (hist[-1 - k] - best) / k if k > 0 else best
        # forward: the task could reach the best throughput (flop/s) seen in its family
        kind = family(t.task)
        rates = [u.task.flop_count / u.best_cost for u in self.tuners
                 if math.isfinite(u.best_cost) and u.best_cost > 0 and family(u.task) == kind]
        target = t.task.flop_count / max(rates) if rates and t.task.flop_count else best
        forward = max(best - target, 0.0) / max(self.rounds[i], 1)
        return self.weights[i] * (ALPHA * back + (1 - ALPHA) * forward)
