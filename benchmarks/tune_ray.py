"""Measurement throughput of the Ray runner: ResNet-18 (autosched.testing.models) tuned with
the same trial budget by the local runner and by ``--runner ray`` over N local worker nodes,
each from a fresh log; candidates measured per minute and the tuned model's latency.

    python benchmarks/tune_ray.py --trials 400                 # local, 1 node, 2 nodes
    python benchmarks/tune_ray.py --trials 400 --nodes 2 4 --image 112

The Ray side starts its own cluster on this machine (ray.cluster_utils.Cluster: a head without
resources, ``--nodes`` worker nodes advertising this CPU's target once each), so each node
measures one candidate at a time, as a board or a GPU machine would; builds happen here, in
the same build pool as the local runner's, or on the nodes with ``--node-builds``. Each node
is pinned to ``--node-cpus`` cores of its own and the tuner to the cores left by the largest
run's nodes (all of them when none are left), the same in every run, so a node times on its
own cores as a separate machine would (the measurement lock is per core) and the runs differ
only in their node count; the nodes still share the host's caches and memory, so the tuned
latencies are compared too (timed in alternating rounds; benchmarks/baseline.py). Prints the
machine (date, commit, CPU, load average) and writes benchmarks/results/tune_ray.json. Needs
the ``cluster`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import baseline  # noqa: E402

baseline.prepare()  # before numpy: OpenBLAS picks its kernel when numpy loads it

import autosched as aus  # noqa: E402
from autosched.graph.compiler import extract_tasks  # noqa: E402
from autosched.graph.executor import random_inputs  # noqa: E402
from autosched.search.protocol import MeasureOptions  # noqa: E402
from autosched.search.record import RecordLog  # noqa: E402
from autosched.search.runner import make_runner, resource_name  # noqa: E402
from autosched.search.tune import TuneOptions, tune  # noqa: E402
from autosched.targets.target import parse  # noqa: E402
from autosched.testing import models  # noqa: E402
from importers.onnx import from_onnx  # noqa: E402


def tune_with(runner: str, tasks: list, weights: list[int], log: Path, args: Any
              ) -> dict[str, float]:
    """Tune into a fresh ``log`` with ``runner``; wall seconds and candidates per minute."""
    r = make_runner(runner, tasks[0].target,
                    min_repeat_ms=args.min_repeat_ms,
                    node_builds=args.node_builds and runner != "local")
    # wall seconds inside the runner (the rest is search), inside its builds, and the sum of
    # the candidates' run round trips (what the measuring nodes were busy with)
    spent = {"runner_s": 0.0, "build_s": 0.0, "run_s": 0.0}
    measure = r.measure
    builder = getattr(r, "_builder", None)  # the Ray runner's Measurer; the local runner's own
    if not hasattr(builder, "build"):
        builder = r
    build = builder.build

    def timed(task: Any, candidates: Any) -> Any:
        t = time.perf_counter()
        try:
            results = measure(task, candidates)
            spent["run_s"] += sum(res.run_time for res in results)
            return results
        finally:
            spent["runner_s"] += time.perf_counter() - t

    def timed_build(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return build(*a, **kw)
        finally:
            spent["build_s"] += time.perf_counter() - t

    r.measure = timed  # type: ignore[method-assign]
    builder.build = timed_build
    t0 = time.perf_counter()
    try:
        tune(tasks, trials=args.trials, log=log, weights=weights, runner=r,
             options=TuneOptions(batch_size=args.batch_size, seed=0, verbose=False))
        secs = time.perf_counter() - t0
        # Ray: how long each node had a call in flight, and that as a share of the job (what a
        # node's idle time while the tuner searched cost)
        busy = {where.split(" node ")[1][:8]: s for where, s in getattr(r, "busy_s", {}).items()}
    finally:
        r.close()
    measured = len(RecordLog(log).load())
    out = {"tune_s": secs, **spent, "candidates": measured, "per_minute": measured / secs * 60}
    if busy:
        out["node_busy_s"] = busy
        out["node_busy_share"] = {k: round(v / secs, 3) for k, v in busy.items()}
    return out


def resnet18_tasks(image: int, target: str, trials: int) -> tuple[Any, Any, list, list[int]]:
    """ResNet-18 at ``image`` pixels: its graph, random inputs, tasks and their weights on
    ``target``; prints the machine and what is tuned."""
    graph = from_onnx(models.resnet18(image=image))
    tasks, weights = extract_tasks(graph, target)
    print(baseline.header())
    print(f"ResNet-18 1x3x{image}x{image} on {target}: {len(tasks)} tasks, {trials} trials a "
          "run", flush=True)
    return graph, random_inputs(graph), tasks, weights


def tuned_latencies(graph: Any, target: str, logs: dict[str, Any], feeds: dict[str, Any],
                    rounds: int, min_s: float) -> dict[str, list[float]]:
    """{run: [median, best] ms of the model compiled with its log}, timed in alternating
    rounds in this process; printed too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = {k: aus.compile(graph, target, log=v) for k, v in logs.items()}
    got = baseline.alternate({k: (lambda m=m: m.time(feeds, min_s=min_s))
                              for k, m in compiled.items()}, rounds)
    print(f"tuned ResNet-18 ms, median round (best round): {baseline.rounds_line(got)}")
    return {k: [r.median * 1e3, r.best * 1e3] for k, r in got.items()}


def _pins(cores: list[int], nodes: int, per_node: int) -> list[list[int]] | None:
    """Cores for each of ``nodes`` simulated nodes (``per_node`` each, disjoint) and, last,
    the tuner's: the cores left when the largest run's nodes are placed, or every core when
    none are left (then the tuner shares them). None when the nodes do not fit: unpinned."""
    if nodes * per_node > len(cores):
        return None
    out = [cores[i * per_node:(i + 1) * per_node] for i in range(nodes)]
    return [*out, cores[nodes * per_node:] or cores]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2],
                    help="worker-node counts of the Ray runs")
    ap.add_argument("--target", default="llvm",
                    help='the target tuned, e.g. "llvm -num-cores=4" for nodes of 4 cores')
    ap.add_argument("--node-cpus", type=int, default=1,
                    help="CPUs each worker node advertises (its build workers with --node-builds)")
    ap.add_argument("--node-builds", action="store_true",
                    help="the Ray runs build each node's share of a batch on the node")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="pin each node to its own cores and the tuner to the rest, the same "
                         "cores in every Ray run (a node then times on its cores alone, as a "
                         "separate machine would)")
    ap.add_argument("--min-repeat-ms", type=float, default=MeasureOptions.min_repeat_ms,
                    help="each timed repeat's least milliseconds (default: what a tune uses)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds")
    ap.add_argument("--out", default="benchmarks/results/tune_ray.json")
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    graph, feeds, tasks, weights = resnet18_tasks(args.image, args.target, args.trials)
    rows: dict[str, Any] = {"trials": args.trials, "image": args.image, "cores": os.cpu_count(),
                            "target": args.target, "node_cpus": args.node_cpus,
                            "node_builds": args.node_builds,
                            "machine": baseline.header(), "runs": {}}
    work = Path(tempfile.mkdtemp(prefix="tune_ray-"))
    logs = {"local": work / "local.jsonl"}
    rows["runs"]["local"] = tune_with("local", tasks, weights, logs["local"], args)
    print(f"local: {rows['runs']['local']}", flush=True)
    everywhere = sorted(os.sched_getaffinity(0))
    for n in args.nodes:
        pins = _pins(everywhere, max(args.nodes), args.node_cpus) if args.pin else None
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for i in range(n):
            if pins:  # the node's raylet, and so its actors and their workers, inherit it
                os.sched_setaffinity(0, pins[i])
            cluster.add_node(num_cpus=args.node_cpus,
                             resources={resource_name(parse(args.target)): 1})
        os.sched_setaffinity(0, pins[-1] if pins else everywhere)  # the tuner's own cores
        ray.init(address=cluster.address, log_to_driver=False)
        name = f"ray x{n}"
        logs[name] = work / f"ray{n}.jsonl"
        try:
            rows["runs"][name] = tune_with("ray", tasks, weights, logs[name], args)
            rows["runs"][name]["cores"] = ({"nodes": pins[:n], "tuner": pins[-1]} if pins
                                           else "not pinned")
        finally:
            ray.shutdown()
            cluster.shutdown()
            os.sched_setaffinity(0, everywhere)
        one = rows["runs"].get("ray x1", rows["runs"]["local"])
        rows["runs"][name]["speedup_vs_local"] = (rows["runs"][name]["per_minute"]
                                                  / rows["runs"]["local"]["per_minute"])
        rows["runs"][name]["speedup_vs_one_node"] = (rows["runs"][name]["per_minute"]
                                                     / one["per_minute"])
        print(f"{name}: {rows['runs'][name]}", flush=True)
    for k, ms in tuned_latencies(graph, args.target, logs, feeds, args.rounds, 2.0).items():
        rows["runs"][k]["latency_ms"] = ms
    rows["load_average"] = os.getloadavg()
    print(json.dumps(rows, indent=1))
    baseline.save(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
