"""Build the pretrained cost model that ships in autosched/cost_model/pretrained/ from the logs
in tuning_logs/, and print how well it ranks workloads it was not trained on.

    python benchmarks/pretrain_cost_model.py                 # writes both shipped models
    python benchmarks/pretrain_cost_model.py -o /tmp/cm      # somewhere else (cpu/, gpu/)
    python benchmarks/pretrain_cost_model.py -o /tmp/cm --plots benchmarks/results   # + PNGs
    python benchmarks/pretrain_cost_model.py -o /tmp/cm --only cpu

One model per kind of device (``pretrained/cpu``, ``pretrained/gpu``). The CPU model learns
from CPU records only: with the H100 corpus logs in its training, the pick for magika ran
9.25 ms against 3.97 with CPU records alone (znver4, 300-trial tuned 4.6). The GPU model
learns from every log, which is the model whose GPU picks were measured (ResNet-18 1.41x and
MobileNetV2 0.77x of tuned on an H100); a GPU-only one is to be compared on a GPU first.

The records' tasks come from the models the logs tuned (ResNet-18 and MobileNetV2 at 224,
built by autosched.testing.models; the real models of tests/support/corpus.py, whose logs are
in tuning_logs/corpus_*/, read from the corpus cache and fetched when missing) and the
operators of the two cost-model logs. Three held-out evaluations are printed before the
shipped model is trained on everything:

* MobileNetV2 on the H200: no MobileNetV2 workload (depthwise convs, relu6 as Clip) is in
  training, on any target;
* three real models (magika, rivagan_decoder, silero_vad_v6: 1-d convs, a transformer-like
  text model, an LSTM) on this CPU kind: none of their workloads is in training;
* a quarter of all workloads, picked by a hash of their key, on every target.

Each table gives, per held-out (workload, target), Kendall's tau between predicted and measured
throughput and best@1 / best@5 (the best measured throughput among the 1 / 5 best predicted,
over the best), next to a random ranking's. It takes a few minutes (about 11,000 records are
replayed, lowered and featurised once).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from autosched.cost_model.pretrain import DEVICES, PRETRAINED_DIR  # noqa: E402
from autosched.search.training_data import build_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tuning_logs").glob("**/*.jsonl*"))
RECORDS_OF = {"cpu": "cpu", "gpu": None}  # each model's training records (None: every log's)
HELD_OUT = ["tuning_logs/mobilenet_v2_cuda_h200.jsonl.gz",
            [f"tuning_logs/corpus_llvm_znver4/{m}.llvm.jsonl.gz"
             for m in ("magika", "rivagan_decoder", "silero_vad_v6")]]


def corpus_graphs(logs: list[str]) -> list:
    """The graphs of the corpus models that ``logs`` name (tuning_logs/corpus_*/NAME.*)."""
    import autosched as aus
    from tests.support import corpus

    entries = corpus.load_manifest()
    names = sorted({Path(p).name.split(".")[0] for p in logs if "/corpus_" in p})
    return [aus.from_onnx(corpus.prepared_model(entries[n]), shapes=entries[n].shapes)
            for n in names if n in entries]


def held_out_plot(directory: Path):
    """A function for build_model's ``evaluated``: one PNG per held-out evaluation (matplotlib).
    Left: every held-out candidate at its predicted rank within its workload (0 = predicted
    best) against its measured throughput over its workload's best. Right: best@1 over the
    workloads, sorted, the model's against a random ranking's."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from autosched.cost_model import pretrain

    directory.mkdir(parents=True, exist_ok=True)

    def plot(what: str, model, samples) -> None:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        best_at_1 = []
        for _, pred, true in pretrain.group_predictions(model, samples):
            order = np.argsort(np.argsort(-pred)) / (len(pred) - 1)
            left.scatter(order, true / true.max(), s=4, alpha=0.25)
            best_at_1.append(pretrain.best_at(pred, true, 1))
        left.set_xlabel("predicted rank within its workload (0 = predicted best)")
        left.set_ylabel("measured throughput / workload's best")
        for label, vals in (("pretrained model", sorted(best_at_1)),
                            ("random ranking", sorted(r.best_at_1 for r in
                                                      pretrain.random_rankings(samples)))):
            right.plot(np.linspace(0, 1, len(vals)), vals, label=f"{label} "
                       f"(mean {np.mean(vals):.3f})")
        right.set_xlabel("fraction of held-out workloads")
        right.set_ylabel("best@1 (measured best of the top prediction / best)")
        right.legend()
        fig.suptitle(f"held out: {what}")
        fig.tight_layout()
        name = re.sub(r"[^a-z0-9]+", "_", what.lower()).strip("_")[:60]
        fig.savefig(directory / f"cost_model_held_out_{name}.png", dpi=110)
        plt.close(fig)

    return plot


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default=str(PRETRAINED_DIR))
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--hold-out-share", type=float, default=0.25)
    p.add_argument("--only", choices=DEVICES, default=None, help="build this device's model only")
    p.add_argument("--plots", type=Path, default=None,
                   help="write a PNG per held-out evaluation into this folder (matplotlib)")
    args = p.parse_args()
    import autosched as aus
    from autosched.graph.compiler import extract_tasks
    from autosched.testing.models import mobilenet_v2, resnet18

    os.chdir(ROOT)  # the logs are named relative to the checkout
    graphs = [aus.from_onnx(resnet18()), aus.from_onnx(mobilenet_v2()), *corpus_graphs(LOGS)]
    for device in [args.only] if args.only else DEVICES:
        print(f"\n== the {device} model", flush=True)
        build_model(LOGS, Path(args.output) / device,
                    lambda target: [t for g in graphs for t in extract_tasks(g, target)[0]],
                    hold_out=HELD_OUT, hold_out_share=args.hold_out_share,
                    rounds=args.rounds, device=RECORDS_OF[device],
                    evaluated=held_out_plot(args.plots / device) if args.plots else None)


if __name__ == "__main__":
    main()
