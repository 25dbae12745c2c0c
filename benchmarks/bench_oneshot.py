"""One-shot search measured on one process (no Ray): how fast subnets are scored with inherited weights, and how
well that score ranks them against the same subnets trained on their own, beside the retraining's own noise.

0. The noise floor first: one configuration under 3 seeds against the spread of ``--noise-configs``
   configurations (their top-1's standard deviations); a task whose ratio is under 3 cannot rank them
   (``--dataset digits_clutter`` is the harder one the package makes offline: trainers.data.formats).
1. A supernet (trainers.supernet) trained over a space of >= 100 configurations (embeddings, widths, code sizes,
   depths) with the sandwich rule and in-place distillation, as a one-shot campaign's supernet trial trains it.
2. ``--score`` subnets drawn at random, scored with the weights they inherit (BatchNorm recalibrated):
   subnets per minute (target >= 60 on a CPU core for this tiny model).
3. ``--retrain`` of them trained from scratch with the standalone recipe under two seeds: Kendall's tau and
   Spearman's rho of inherited against standalone top-1 with a 95 % bootstrap interval
   (search.analysis.fidelity), the noise floor (tau of seed 0 against seed 1), the top-k overlap, and the
   compute: supernet + scoring against training every scored subnet from scratch.

    python benchmarks/bench_oneshot.py [--dataset digits] [--supernet-epochs 20] [--retrain-epochs 10]
                                       [--score 120] [--retrain 12] [--threads 1] [--img-size 16]
                                       [--noise-configs 8] [--noise-only] [--space embeddings]
"""
from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch

from qkvsearch.search.analysis.fidelity import rank_agreement, top_k_overlap
from qkvsearch.search.campaign.oneshot.plan import candidates, supernet_plan
from qkvsearch.spaces import base_config, load_campaign
from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.supernet.plan import SupernetPlan
from qkvsearch.trainers.supernet.scoring import SubnetScorer
from qkvsearch.trainers.supernet.training import SupernetRun
from qkvsearch.trainers.training import engine

SPACES = {
    # 104 configurations of the embedding and its widths: they perform alike (README: the noise floor)
    "embeddings": {"embedding": {"choice": ["linear", "sne", "psne", "fsne"]},
                   "hidden_width": {"choice": [0.125, 0.25, 0.5, 0.75, 1.0]}, "code_size": {"choice": [4, 8, 16]},
                   "depth": {"choice": [2, 3, 4, 5]}},
    # 126 configurations whose capacity ranges wider: token dim d 32-128 (4 heads), 1-4 blocks, MLP ratio 1 or 4
    "capacity": {"embedding": {"choice": ["linear", "sne", "psne", "fsne"]}, "hidden_width": {"choice": [0.25, 1.0]},
                 "code_size": {"choice": [8]}, "embed_dim": {"choice": [32, 64, 128]}, "depth": {"choice": [1, 2, 4]},
                 "mlp_ratio": {"choice": [1.0, 4.0]}},
}


def spec(args) -> dict:
    return {"name": "bench-oneshot", "model": {"name": "xcit_nano_12_p8_224", "img_size": args.img_size,
                                               "num_classes": 10},
            "data": {"dataset": args.dataset, "val_fraction": 0.2},
            "train": {"epochs": args.retrain_epochs, "batch_size": 64, "lr": args.lr,
                      "warmup_epochs": args.warmup_epochs, "seed": 0, "max_steps_per_epoch": args.steps},
            "space": SPACES[args.space],
            "supernet": {"train": {"epochs": args.supernet_epochs, "lr": 2e-3}},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": args.score}, "storage": "/tmp"}


def train(cfg: dict, make_run=None) -> tuple[list[dict], dict, float]:
    """(epochs' metrics, the last checkpoint state, seconds) of one in-process run."""
    states = []

    def report(metrics, state_fn):
        if state_fn is not None:
            states.append(state_fn())

    t0 = time.perf_counter()
    history = engine.fit(cfg, engine.Dist(0, 1, torch.device("cpu")), report=report, make_run=make_run)
    return history, states[-1], time.perf_counter() - t0


def noise_floor(trials: list[dict], n_configs: int, seeds: int = 3) -> float:
    """Can the task tell configurations apart? One configuration (the median by MACs) trained under ``seeds``
    seeds, against ``n_configs`` configurations drawn at random (seed 0): the ratio of the spread across
    configurations (standard deviation of their top-1) to the seed noise (that of the one configuration's).
    A benchmark of ranking needs at least 3."""
    by_macs = sorted(range(len(trials)), key=lambda i: trials[i]["cost"]["gmacs"])
    middle = by_macs[len(by_macs) // 2]
    rng = np.random.default_rng(1)
    others = [int(i) for i in rng.choice([i for i in by_macs if i != middle], size=n_configs - 1, replace=False)]
    t0 = time.perf_counter()
    repeat = [train(fill({**trials[middle]["config"], "seed": seed}))[0][-1]["top1"] for seed in range(seeds)]
    spread = [repeat[0]] + [train(fill({**trials[i]["config"], "seed": 0}))[0][-1]["top1"] for i in others]
    noise, across = float(np.std(repeat, ddof=1)), float(np.std(spread, ddof=1))
    ratio = across / noise if noise > 0 else float("inf")
    print(f"noise floor ({time.perf_counter() - t0:.0f} s): one configuration under {seeds} seeds: top-1 "
          f"{', '.join(f'{v:.2f}' for v in repeat)} (std {noise:.2f}); {n_configs} configurations: "
          f"{min(spread):.2f} to {max(spread):.2f} (std {across:.2f}); spread / noise = {ratio:.1f} "
          f"({'at least' if ratio >= 3 else 'under'} 3)", flush=True)
    return ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--space", default="embeddings", choices=sorted(SPACES))
    p.add_argument("--supernet-epochs", type=int, default=20)
    p.add_argument("--retrain-epochs", type=int, default=10)
    p.add_argument("--steps", type=int, default=None, help="max steps per epoch (default: the whole split)")
    p.add_argument("--score", type=int, default=120)
    p.add_argument("--retrain", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--img-size", type=int, default=16, help="input side (digits_clutter: 32, its own)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--noise-configs", type=int, default=8,
                   help="configurations trained (seed 0) for the spread the noise floor is set against")
    p.add_argument("--noise-only", action="store_true", help="stop after the noise floor")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    s = load_campaign(spec(args))
    trials = candidates(s)
    noise_floor(trials, args.noise_configs)
    if args.noise_only:
        return
    plan = SupernetPlan.from_dict(supernet_plan(s))
    teacher_cfg = fill({**base_config(s), **plan.teacher, **dict(s.supernet.recipe)})
    print(f"space: {len(trials)} configurations; teacher {teacher_cfg['embedding']} width {teacher_cfg['width']} "
          f"depth {teacher_cfg['depth']}")

    history, state, supernet_s = train(teacher_cfg, functools.partial(SupernetRun, plan=plan))
    print(f"supernet: {args.supernet_epochs} epochs in {supernet_s:.1f} s; largest top-1 {history[-1]['top1']:.2f}, "
          f"smallest {history[-1]['top1_smallest']:.2f}")

    scorer = SubnetScorer(plan, state, teacher_cfg, bn_batches=2)
    rng = np.random.default_rng(0)
    drawn = rng.choice(len(trials), size=min(args.score, len(trials)), replace=False)
    t0 = time.perf_counter()
    inherited = {int(i): scorer.score(trials[i]["config"])["top1"] for i in drawn}
    score_s = time.perf_counter() - t0
    print(f"scoring: {len(drawn)} subnets in {score_s:.1f} s = {60 * len(drawn) / score_s:.1f} subnets/min")

    picked = [int(i) for i in drawn[: args.retrain]]
    standalone = {0: [], 1: []}
    retrain_s = []
    for i in picked:
        for seed in (0, 1):
            hist, _, secs = train(fill({**trials[i]["config"], "seed": seed}))
            standalone[seed].append(hist[-1]["top1"])
            retrain_s.append(secs)
    x = [inherited[i] for i in picked]
    agreement = rank_agreement(x, standalone[0])
    floor = rank_agreement(standalone[0], standalone[1])
    k = max(1, len(picked) // 3)
    mean_train = float(np.mean(retrain_s))
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| space | {len(trials)} configurations |")
    print(f"| supernet training | {supernet_s:.0f} s ({args.supernet_epochs} epochs) |")
    print(f"| subnets scored per minute | {60 * len(drawn) / score_s:.1f} |")
    print(f"| Kendall tau, inherited vs standalone ({agreement['pairs']} subnets) | {_f(agreement['tau'])} "
          f"{_ci(agreement['tau_ci'])} |")
    print(f"| Spearman rho | {_f(agreement['rho'])} |")
    print(f"| noise floor: tau, seed 0 vs seed 1 | {_f(floor['tau'])} {_ci(floor['tau_ci'])} |")
    print(f"| top-{k} overlap | {_f(top_k_overlap(x, standalone[0], k))} |")
    print(f"| standalone top-1 range (seed 0) | {min(standalone[0]):.2f} to {max(standalone[0]):.2f} |")
    print(f"| inherited top-1 range | {min(x):.2f} to {max(x):.2f} |")
    print(f"| one training from scratch | {mean_train:.1f} s |")
    print(f"| supernet + scoring {len(drawn)} vs training them all | {supernet_s + score_s:.0f} s vs "
          f"{mean_train * len(drawn):.0f} s ({(supernet_s + score_s) / (mean_train * len(drawn)):.2f}x) |")


def _f(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _ci(ci) -> str:
    return "" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


if __name__ == "__main__":
    main()
