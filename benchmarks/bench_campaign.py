"""Campaign overhead: 8 short trials on local Ray (2-worker DDP each) vs the same trainings run one
after another in this process, measured side by side in one run.

Prints: campaign wall / plain wall, the share of campaign wall time spent in training steps, and
the per-trial start-up (trial start -> first DDP step) with its parts, as medians over the trials.

    python benchmarks/bench_campaign.py [--trials 8] [--epochs 2] [--steps 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def campaign_spec(storage: str, trials: int, epochs: int, steps: int) -> dict:
    return {
        "name": "bench-campaign",
        "model": {"name": "xcit_nano_12_p8_224", "img_size": 32, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": epochs, "batch_size": 64, "lr": 1e-3, "warmup_epochs": 0,
                  "max_steps_per_epoch": steps, "seed": 0},
        # an lr range: every trial a distinct configuration (a repeated one would not train again)
        "space": {"embedding": {"choice": ["linear", "sne", "psne", "fsne"]},
                  "code_size": {"choice": [8, 16]}, "lr": {"float": [5e-4, 2e-3], "log": True}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "params_m", "mode": "min"}],
        "search": {"algorithm": "random", "num_trials": trials, "seed": 0},
        "scheduler": {"type": "fifo"},
        "resources": {"workers_per_trial": 2, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage": storage,
    }


def run_campaign(spec: dict) -> tuple[float, list[dict]]:
    from qkvsearch.search.campaign import launch
    from qkvsearch.search.status import load_records
    from qkvsearch.spaces import load_campaign

    t0 = time.perf_counter()
    exp = launch(load_campaign(spec))
    return time.perf_counter() - t0, load_records(exp)


def run_plain(configs: list[dict]) -> tuple[float, float]:
    """The same trainings in this process, one after another (world size 1, same global batch)."""
    import torch

    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.engine import Dist, fit

    torch.set_num_threads(2)
    t0 = time.perf_counter()
    train_s = 0.0
    for cfg in configs:
        history = fit(fill(cfg), Dist())
        train_s += sum(m["train_s"] for m in history)
    return time.perf_counter() - t0, train_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        wall_ray, records = run_campaign(campaign_spec(tmp, args.trials, args.epochs, args.steps))
    configs = [r["config"] for r in records if r["status"] != "duplicate"]  # what the campaign trained
    wall_plain, plain_train_s = run_plain(configs)

    steps_s = sum(e.get("train_s", 0.0) for r in records for e in r["epochs"])
    startup = [r["first_step_at"] - r["started_at"] for r in records if r.get("first_step_at")]
    per_trial = [r["ended_at"] - r["started_at"] for r in records]
    gaps = [b["started_at"] - a["ended_at"] for a, b in zip(records, records[1:])]
    print(f"trials: {len(records)} x ({args.epochs} epochs x {args.steps} steps), 2 DDP workers each, "
          f"{os.cpu_count()} CPUs")
    print(f"campaign wall        {wall_ray:8.1f} s   (includes ray.init)")
    print(f"plain sequential     {wall_plain:8.1f} s   (same configs, one process)")
    print(f"ratio campaign/plain {wall_ray / wall_plain:8.2f}x")
    print(f"training-step share  {steps_s / wall_ray:8.1%}  of campaign wall "
          f"(plain: {plain_train_s / wall_plain:.1%})")
    if startup:
        print(f"start-up per trial   {statistics.median(startup):8.2f} s median (trial start -> first DDP step; "
              f"min {min(startup):.2f}, max {max(startup):.2f})")
    print(f"trial wall           {statistics.median(per_trial):8.2f} s median")
    if gaps:
        print(f"gap between trials   {statistics.median(gaps):8.2f} s median (Tune bookkeeping)")


if __name__ == "__main__":
    main()
