"""Campaign overhead: the same 8-trial campaign on local Ray with 1 and with 2 workers per trial, and the
same trainings run one after another in this process, measured side by side in one run.

Prints, per workers-per-trial: campaign wall / plain wall, the share of campaign wall time spent in
training steps, and the per-trial start-up (Tune's trial start -> first training step, medians over the
trials) with its parts: before the engine (Ray: trial process, Train controller and workers, imports of
Ray and torch) and the engine's own setup (data, model, optimizer, the import of timm), as the worker
records it (qs_setup_s). The machine's load average is printed with each campaign: other work on the
machine shows in every figure. The plain run is last and runs at the niceness of Ray's workers (15).

    python benchmarks/bench_campaign.py [--trials 8] [--epochs 2] [--steps 4] [--workers 1 2]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RAY_WORKER_NICENESS = int(os.environ.get("RAY_worker_niceness", "15"))  # Ray's default for its workers


def campaign_spec(storage: str, trials: int, epochs: int, steps: int, workers: int) -> dict:
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
        "resources": {"workers_per_trial": workers, "cpus_per_worker": 2 // workers, "max_concurrent_trials": 1},
        "storage": storage,
    }


def run_campaign(spec: dict) -> tuple[float, list[dict], dict[str, float]]:
    """-> (wall seconds, trial records, {trial_id: engine setup seconds of its first epoch})."""
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.search.monitor.status import load_records
    from qkvsearch.spaces import load_campaign

    os.environ.setdefault("QKVSEARCH_TUNE_DEFAULTS", "1")  # Tune's result.json files: engine_setup_s reads them
    t0 = time.perf_counter()
    exp = launch(load_campaign(spec))
    return time.perf_counter() - t0, load_records(exp), engine_setup_s(exp)


def engine_setup_s(exp: str) -> dict[str, float]:
    """qs_setup_s of each trial's first result, from Tune's result.json files (the records drop qs_ keys)."""
    out = {}
    for path in glob.glob(f"{exp}/*/result.json"):
        with open(path) as f:
            first = json.loads(f.readline() or "{}")
        if "qs_setup_s" in first:
            out[first["trial_id"]] = first["qs_setup_s"]
    return out


def run_plain(configs: list[dict]) -> tuple[float, float]:
    """The same trainings in this process, one after another (world size 1, same global batch), at the
    niceness Ray gives its worker processes: both sides then yield alike to other work on the machine."""
    import torch

    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.training.engine import Dist, fit

    os.nice(max(0, RAY_WORKER_NICENESS - os.nice(0)))
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    train_s = 0.0
    for cfg in configs:
        history = fit(fill(cfg), Dist())
        train_s += sum(m["train_s"] for m in history)
    return time.perf_counter() - t0, train_s


def _median(values: list[float]) -> str:
    if not values:
        return "    -   "
    return f"{statistics.median(values):8.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def summarise(workers: int, wall: float, records: list[dict], setup: dict[str, float], plain: tuple[float, float],
              load: str) -> None:
    wall_plain, plain_train_s = plain
    steps_s = sum(e.get("train_s", 0.0) for r in records for e in r["epochs"])
    started = [r for r in records if r.get("first_step_at")]
    startup = [r["first_step_at"] - r["started_at"] for r in started]
    engine = [setup[r["trial_id"]] for r in started if r["trial_id"] in setup]
    before = [s - setup[r["trial_id"]] for r, s in zip(started, startup) if r["trial_id"] in setup]
    per_trial = [r["ended_at"] - r["started_at"] for r in records]
    gaps = [b["started_at"] - a["ended_at"] for a, b in zip(records, records[1:])]
    print(f"\n{workers} worker(s) per trial ({len(records)} trials; load average at start {load})")
    print(f"  campaign wall        {wall:8.1f} s   (includes ray.init and the launch checks)")
    print(f"  ratio campaign/plain {wall / wall_plain:8.2f}x")
    print(f"  training-step share  {steps_s / wall:8.1%}  of campaign wall (plain: {plain_train_s / wall_plain:.1%})")
    print(f"  start-up per trial   {_median(startup)}  trial start -> first training step")
    print(f"    before the engine  {_median(before)}  Ray: trial, controller, workers, imports")
    print(f"    engine setup       {_median(engine)}  data, model, optimizer (qs_setup_s)")
    print(f"  trial wall           {_median(per_trial)}")
    if gaps:
        print(f"  gap between trials   {_median(gaps)}  (Tune bookkeeping)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="workers per trial, one campaign each")
    args = ap.parse_args()

    runs = {}
    for workers in args.workers:
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        with tempfile.TemporaryDirectory() as tmp:
            runs[workers] = (load, *run_campaign(campaign_spec(tmp, args.trials, args.epochs, args.steps, workers)))
    trained = {w: [r["config"] for r in recs if r["status"] != "duplicate"] for w, (_, _, recs, _) in runs.items()}
    plain_load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    plain = {}
    for workers, configs in trained.items():  # the campaigns draw the same configs: one plain run serves all
        same = next((w for w in plain if trained[w] == configs), None)
        plain[workers] = plain[same] if same is not None else run_plain(configs)

    print(f"\ntrials: {args.trials} x ({args.epochs} epochs x {args.steps} steps) on {os.cpu_count()} CPUs; "
          f"each trial's workers hold all CPUs")
    first = next(iter(plain.values()))
    print(f"plain sequential     {first[0]:8.1f} s   (same configs, one process, 2 threads, nice "
          f"{RAY_WORKER_NICENESS} like Ray's workers; load average at start {plain_load})")
    for workers, (load, wall, records, setup) in runs.items():
        summarise(workers, wall, records, setup, plain[workers], load)


if __name__ == "__main__":
    main()
