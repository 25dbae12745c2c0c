"""Counted MACs beside measured cost (trainers.deploy.measure) for the embeddings and two attentions.

For each configuration: GMACs (trainers.model.cost), then ``--repeats`` measurements of latency (batch 1),
throughput (``--batch``), training step time (``--train-batch``) and peak memory, each measured afresh the
way a campaign measures (trainers.deploy.measure.measure: warm-up until settled, median within ±1 % or
``--max-s``); their median, their coefficient of variation over the repeats, the wall time of one
measurement and its share of one real training epoch of the same configuration on digits (1,437 training
images). Then Spearman's rank correlation of GMACs with each measured metric over the configurations.

    python benchmarks/bench_latency.py              # CPU (one thread) or the CUDA device when present
    python benchmarks/bench_latency.py --quick      # 2 repeats, short caps: a smoke test
"""
from __future__ import annotations

import argparse
import statistics
import time

import pandas as pd
import torch

from qkvsearch.trainers.deploy.measure import measure
from qkvsearch.trainers.model.cost import resolve_trial
from qkvsearch.trainers.training.engine import Dist, fit

XCIT = dict(model="xcit_nano_12_p8_224", img_size=32)   # XCiT-N12, patch 8: 16 tokens at 32 px
VIT = dict(model="vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4,
           mlp_ratio=2.0)  # the Vision X-formers size: 65 tokens
CONFIGS = {
    "linear": dict(XCIT, embedding="linear"),
    "sne (h 64)": dict(XCIT, embedding="sne"),
    "psne (h 96)": dict(XCIT, embedding="psne"),
    "fsne-c8 (h 128)": dict(XCIT, embedding="fsne", code_size=8),
    "fsne-c8 (h 64)": dict(XCIT, embedding="fsne", code_size=8, hidden_width=64),
    "sne (h 256)": dict(XCIT, embedding="sne", hidden_width=256),
    "vit softmax": dict(VIT, attention="softmax"),
    "vit performer": dict(VIT, attention="performer", attn_features=64),
}
METRICS = ("latency_ms", "throughput", "train_step_ms", "peak_mem_gb")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="measurements per configuration (default 5)")
    p.add_argument("--batch", type=int, default=64, help="inference batch for throughput")
    p.add_argument("--train-batch", type=int, default=32, help="training batch (the epoch's too)")
    p.add_argument("--max-s", type=float, default=None, help="timing cap per metric, s (default 3)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (a one-CPU trial's)")
    p.add_argument("--quick", action="store_true")
    return p.parse_args()


def epoch_s(cfg: dict, device: torch.device) -> float:
    """Wall seconds of one real training epoch (data loading, evaluation excluded) on digits."""
    run = fit(cfg, Dist(device=device))
    return run[-1]["train_s"]


def bench(name: str, raw: dict, args, device) -> dict:
    cfg, cost = resolve_trial({**raw, "dataset": "digits", "epochs": 1, "batch_size": args.train_batch,
                               "warmup_epochs": 0})
    runs, walls = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        runs.append(measure(cfg, device, batch=args.batch, train_batch=args.train_batch, max_s=args.max_s))
        walls.append(time.perf_counter() - t0)
    row = {"configuration": name, "GMACs": cost["gmacs"]}
    for m in METRICS:
        values = [r[m] for r in runs]
        row[m] = statistics.median(values)
        row[f"{m} CV %"] = 100 * statistics.pstdev(values) / statistics.mean(values)
    row["measure s"] = statistics.median(walls)
    row["epoch s"] = epoch_s(cfg, device)
    row["overhead %"] = 100 * row["measure s"] / row["epoch s"]
    print(f"  {name}: {row['latency_ms']:.2f} ms, {row['train_step_ms']:.1f} ms/step, "
          f"measured in {row['measure s']:.1f} s", flush=True)
    return row


def markdown(df: pd.DataFrame) -> str:
    cells = [[f"{v:.3g}" if isinstance(v, float) else str(v) for v in row] for row in df.itertuples(index=False)]
    return "\n".join(["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns),
                      *("| " + " | ".join(r) + " |" for r in cells)])


def main() -> None:
    args = parse_args()
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.max_s = args.max_s or (0.5 if args.quick else 3.0)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    names = list(CONFIGS)[:3] if args.quick else list(CONFIGS)
    env = measure(resolve_trial({**CONFIGS["linear"], "dataset": "digits", "epochs": 1})[0], device,
                  metrics=("latency_ms",), max_s=0.2)["env"]
    print(f"device: {env['device']} ({env['device_type']}, {env['precision']}, {env['threads']} threads), "
          f"torch {env['torch']}; {args.repeats} measurements per configuration")
    table = pd.DataFrame([bench(n, CONFIGS[n], args, device) for n in names])
    print(markdown(table))
    cost = table[list(METRICS)].assign(throughput=1 / table["throughput"])   # seconds per image
    rho = {m: table["GMACs"].corr(cost[m], method="spearman") for m in METRICS}
    print("Spearman rank correlation of GMACs with: " + ", ".join(
        f"{m} {v:.2f}" + (" (as time per image)" if m == "throughput" else "") for m, v in rho.items()))


if __name__ == "__main__":
    main()
