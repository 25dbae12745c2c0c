"""Report pipeline at scale: collection + fronts + HTML for 10,000 trials x 100 epochs, and the
2-D front at 10k and 100k points (O(n log n) check).

    python benchmarks/bench_report.py [--trials 10000] [--epochs 100] [--keep DIR]

Record files are written first (untimed). Timings are medians of --repeats runs after one warm-up.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from qkvsearch.search.pareto import hypervolume_trace, nondominated_mask, reference_point  # noqa: E402
from qkvsearch.search.report import build_report  # noqa: E402
from qkvsearch.search.results import collect  # noqa: E402

EMBEDDINGS = ("linear", "sne", "psne", "fsne")
STATUSES = ("completed",) * 8 + ("stopped_early", "diverged", "failed", "running")


def write_records(exp: Path, n_trials: int, n_epochs: int, seed: int = 0) -> None:
    """qs_campaign.json + one qs_trials/<id>.json per trial (records as the campaign layer writes them)."""
    rng = np.random.default_rng(seed)
    (exp / "qs_trials").mkdir(parents=True)
    spec = {"objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"},
                           {"metric": "params_m", "mode": "min"}]}
    (exp / "qs_campaign.json").write_text(json.dumps({"name": "bench", "spec": spec, "code_version": "bench",
                                                      "created_at": 1.7e9}))
    for i in range(n_trials):
        emb = EMBEDDINGS[i % 4]
        width = int(rng.choice([32, 64, 96, 128, 192, 256]))
        params_m = 2.4 + width / 200 + rng.normal(0, 0.05)
        gmacs = 0.4 + width / 1000 + rng.normal(0, 0.01)
        ceiling = 60 + 15 * (1 - math.exp(-width / 100)) + rng.normal(0, 2)
        status = STATUSES[i % len(STATUSES)]
        n_ep = n_epochs if status == "completed" else int(rng.integers(1, n_epochs))
        top1 = ceiling * (1 - np.exp(-np.arange(1, n_ep + 1) / 20))
        epochs = [{"epoch": e + 1, "train_loss": 2.0 / (e + 1), "val_loss": 2.1 / (e + 1), "top1": float(top1[e]),
                   "top5": float(top1[e]) + 15, "lr": 1e-3, "images_per_s": 1000.0, "epoch_s": 30.0,
                   "params_m": params_m, "gmacs": gmacs} for e in range(n_ep)]
        config = {"model": "xcit_nano_12_p16_224", "embedding": emb, "hidden_width": "match" if i % 7 == 0 else width,
                  "code_size": 8 if emb == "fsne" else None, "activation": "relu", "num_classes": 100,
                  "img_size": 32, "dataset": "cifar100", "epochs": n_epochs, "batch_size": 256, "lr": 1e-3, "seed": i}
        rec = {"trial_id": f"{i:06d}", "trial_name": f"{emb}-h{width}-{i:05x}", "campaign": "bench",
               "code_version": "bench", "status": status, "config": config,
               "cost": {"params": int(params_m * 1e6), "params_m": params_m, "embed_params": 1000 * width,
                        "gmacs": gmacs, "hidden_width": width},
               "epochs": epochs, "epochs_planned": n_epochs, "error": None, "checkpoint_path": None,
               "started_at": 1.7e9 + i, "ended_at": None if status == "running" else 1.7e9 + i + 3000,
               "train_s": 30.0 * n_ep}
        (exp / "qs_trials" / f"{rec['trial_id']}.json").write_text(json.dumps(rec))


def timed(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench_pipeline(exp: Path, repeats: int) -> None:
    t_collect, (trials, epochs) = timed(lambda: collect(exp), repeats)
    df = trials.to_pandas()
    done = (df["status"] == "completed").to_numpy()
    vals = df[["final_top1", "gmacs", "params_m"]].to_numpy()[done]
    dirs = ["max", "min", "min"]

    def fronts():
        mask = nondominated_mask(vals, dirs)
        hv = hypervolume_trace(vals, dirs, reference_point(vals, dirs))
        return mask, hv

    t_fronts, (mask, _) = timed(fronts, repeats)
    out = exp.parent / "report"
    t_report, paths = timed(lambda: build_report(exp, out_dir=out, static=False), repeats)
    size_mb = os.path.getsize(paths["html"]) / 1e6
    print(f"records: {trials.num_rows} trials, {epochs.num_rows} epoch rows; front {int(mask.sum())} trials")
    print(f"collect (read + parse + tables)          {t_collect:7.3f} s")
    print(f"fronts (3-D front + hypervolume trace)   {t_fronts:7.3f} s")
    print(f"build_report (collect+fronts+HTML+CSV+MD+parquet, no png/svg)  {t_report:7.3f} s  "
          f"(target < 5 s; pareto.html {size_mb:.1f} MB)")


def bench_front_2d(repeats: int) -> None:
    rng = np.random.default_rng(1)
    rows = []
    for n in (10_000, 100_000):
        vals = np.column_stack([rng.uniform(50, 80, n), rng.uniform(0.3, 5, n)])
        t, _ = timed(lambda v=vals: nondominated_mask(v, ["max", "min"]), repeats)
        rows.append((n, t))
        print(f"2-D front, n={n:>7,}: {t * 1e3:8.2f} ms")
    (n1, t1), (n2, t2) = rows
    nlogn = (n2 * math.log(n2)) / (n1 * math.log(n1))
    print(f"time ratio 100k/10k = {t2 / t1:.2f}; n log n predicts {nlogn:.2f}, n^2 would be {(n2 / n1) ** 2:.0f} "
          f"(measured / n log n = {t2 / t1 / nlogn:.2f})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="write the campaign here and keep it")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="qs-bench-")) if args.keep is None else args.keep
    exp = root / "bench"
    try:
        t = time.perf_counter()
        write_records(exp, args.trials, args.epochs)
        print(f"wrote {args.trials} records x {args.epochs} epochs in {time.perf_counter() - t:.1f} s (untimed)")
        bench_pipeline(exp, args.repeats)
        bench_front_2d(max(args.repeats, 5))
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
