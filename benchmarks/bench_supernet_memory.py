"""A supernet's memory over thousands of model shapes: RSS while distinct subnets run through its forward.

Scoring or training a large space runs a new model shape nearly every time; each needs its module tree (a
skeleton: trainers.supernet.weights). The supernet keeps the SKELETONS shapes used last; this benchmark runs
``--shapes`` distinct shapes (drawn from a per-block space of 10^6 configurations, each a forward of one batch)
and reports the process's resident memory after the first 100 and at the end. Target: the end within 10 % of
the first 100. ``--compare N`` also runs N shapes with every skeleton kept (the supernet as it was before it
bounded them), each side in a process of its own, one after the other.

    python benchmarks/bench_supernet_memory.py [--shapes 4000] [--compare 1000] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SPACE = {"depth": 6, "embedding": {"choice": ["linear", "sne", "psne", "fsne"], "per_block": True},
         "hidden_width": {"choice": [0.25, 0.5, 1.0], "per_block": True}, "code_size": 8}


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run(shapes: int, keep_all: bool, threads: int) -> dict:
    """One side, in this process: RSS after the first 100 shapes and after ``shapes``."""
    import numpy as np
    import torch

    from qkvsearch.search.campaign.oneshot.plan import subnet_space, supernet_plan
    from qkvsearch.spaces import load_campaign
    from qkvsearch.trainers.supernet import weights
    from qkvsearch.trainers.supernet.plan import SupernetPlan

    torch.set_num_threads(threads)
    if keep_all:
        weights.SKELETONS = 10 ** 9
    spec = load_campaign({"name": "memory", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16,
                                                       "num_classes": 10},
                          "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 8}, "space": SPACE,
                          "supernet": {"train": {"epochs": 1}},
                          "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
                          "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp"})
    plan = SupernetPlan.from_dict(supernet_plan(spec))
    supernet = plan.supernet(seed=0).eval()
    space, rng = subnet_space(spec), np.random.default_rng(0)
    x = torch.randn(8, 3, 16, 16)
    seen, marks = set(), {}
    t0 = time.perf_counter()
    with torch.no_grad():
        while len(seen) < shapes:
            _, cfg = space.draw(rng)
            shape = weights.model_identity(cfg)
            if shape in seen:
                continue
            seen.add(shape)
            supernet(x, cfg)
            if len(seen) in (100, shapes):
                marks[len(seen)] = rss_mb()
    return {"shapes": shapes, "keep_all": keep_all, "rss_100_mb": marks[100], "rss_end_mb": marks[shapes],
            "seconds": time.perf_counter() - t0, "kept": len(supernet._shapes)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=int, default=4000)
    p.add_argument("--compare", type=int, default=1000, help="shapes run with every skeleton kept (0: none)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--side", choices=["bounded", "all"], help=argparse.SUPPRESS)   # one side, in a child
    args = p.parse_args()
    if args.side:
        print(json.dumps(run(args.shapes, args.side == "all", args.threads)))
        return
    rows = []
    for side, shapes in (("bounded", args.shapes), ("all", args.compare)):
        if shapes < 100:
            continue
        out = subprocess.run([sys.executable, __file__, "--side", side, "--shapes", str(shapes),
                              "--threads", str(args.threads)], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| skeletons kept | shapes run | RSS after 100 (MB) | RSS at the end (MB) | end / 100 | "
          "growth per shape (KB) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        growth = 1024 * (r["rss_end_mb"] - r["rss_100_mb"]) / max(1, r["shapes"] - 100)
        print(f"| {'all' if r['keep_all'] else 'the last ' + str(r['kept'])} | {r['shapes']:,} | "
              f"{r['rss_100_mb']:.0f} | {r['rss_end_mb']:.0f} | {r['rss_end_mb'] / r['rss_100_mb']:.3f} | "
              f"{growth:.0f} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
