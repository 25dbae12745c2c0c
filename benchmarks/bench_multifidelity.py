"""Multi-fidelity search compared on recorded learning curves: mfehvi against MO-ASHA with random proposals.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_multifidelity.py [--seeds 10] [--workers 1]
        [--store results/bench_multifidelity.json]
    python benchmarks/bench_multifidelity.py --record results/digits-curves   # remake the digits table

Tables (curves, not final values): the synthetic order and crossing tables of bench_search.py (243
configurations x 27 epochs, max top1, min params_m; on crossing, larger models learn slower and overtake
smaller ones late) and digits (benchmarks/data/digits_curves.parquet: 126 configurations of a small XCiT on
the embedded digits data, 10 epochs each, recorded by a real campaign, benchmarks/data/digits_curves.yaml;
max top1, min params_m).

Every searcher runs under MO-ASHA (3 brackets, grace 1, reduction factor 3), 4 trials at a time. Budget: N =
the epochs of 50 full trainings (50 x the planned epochs). Score: the hypervolume of the completed trials'
front, as a fraction of the whole table's, once a number of epochs was spent; median [IQR] over the seeds.
Target: mfehvi at N/2 epochs holds at least what MO-ASHA with random proposals holds at N, on a table left
out of choosing mfehvi's settings: each of VARIANTS is replayed on every table, and for each table the variant
is chosen on the other two (the larger smallest margin, median HV at N/2 minus random's median at N; ties
within 0.001 to the larger mean margin). "epochs to random's HV@N": the epochs the row needs, median over the
seeds, to hold random's median HV at N.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread per process, before numpy loads (searcher_runs)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from searcher_runs import DIGITS, Job, Store, at_epochs, cell, median_iqr, table  # noqa: E402

TABLES = ("order", "crossing", "digits")
FULL = 50   # N: the epochs of this many full trainings
KEYS, ADDITIVE = (("model", "keys"),), (("model", "additive"),)   # search.searchers.surrogate
POOLED, EPOCHS = (("warp", "copula"),), (("warp", "epochs"),)      # search.searchers.ehvi_core, warp
VARIANTS = {
    "keys copula start 5": KEYS + POOLED + (("start", 5),),
    "keys copula start 10": KEYS + POOLED + (("start", 10),),
    "keys copula start 20": KEYS + POOLED + (("start", 20),),
    "keys epochs start 10": KEYS + EPOCHS + (("start", 10),),
    "additive copula start 10": ADDITIVE + POOLED + (("start", 10),),
    "additive epochs start 5": ADDITIVE + EPOCHS + (("start", 5),),
    "additive epochs start 10": ADDITIVE + EPOCHS + (("start", 10),),
    "additive epochs start 20": ADDITIVE + EPOCHS + (("start", 20),),
}
OTHERS = ("random", "tpe", "ehvi")   # MO-ASHA with their proposals (ehvi: final values only)
DIGITS_KEYS = ("embedding", "hidden_width", "depth", "embed_dim", "lr")
DIGITS_METRICS = ("top1", "val_loss", "train_loss", "params_m", "gmacs")


def budget(name: str) -> int:
    return FULL * table(name).max_t


def mf_job(name: str, variant: str, seed: int) -> Job:
    return Job(name, "mfehvi", seed, None, VARIANTS[variant], scheduler="moasha")


def other_job(name: str, searcher: str, seed: int) -> Job:
    return Job(name, searcher, seed, None, scheduler="moasha")


def median_at(store: Store, jobs: list[Job], epochs: float) -> float:
    return median_iqr([at_epochs(store[j], epochs) for j in jobs])[0]


def margins(store: Store, variant: str, tables, seeds: int) -> np.ndarray:
    return np.array([median_at(store, [mf_job(t, variant, s) for s in range(seeds)], budget(t) / 2)
                     - median_at(store, [other_job(t, "random", s) for s in range(seeds)], budget(t))
                     for t in tables])


def choose(store: Store, tables, seeds: int) -> str:
    scored = {v: margins(store, v, tables, seeds) for v in VARIANTS}
    best = max(m.min() for m in scored.values())
    tied = [v for v, m in scored.items() if m.min() >= best - 1e-3]
    return max(tied, key=lambda v: scored[v].mean())


def epochs_to(store: Store, jobs: list[Job], target: float) -> str:
    spent = []
    for j in jobs:
        r = store[j]
        hit = np.flatnonzero(np.asarray(r["hv"]) >= target - 1e-12)
        spent.append(r["epochs"][hit[0]] if hit.size else np.inf)
    med = float(np.median(spent))
    return "never" if np.isinf(med) else f"{med:.0f}"


def record(campaign: str, out: Path = DIGITS) -> None:
    """The campaign's curves (simulate's reading of its folder) as the digits table: the searched keys
    (hidden_width 0 where the embedding has none), epoch, metrics, epoch_s."""
    import pandas as pd

    from qkvsearch.search.simulation.curves import curves_frame, load_source

    curves = load_source(campaign)
    frame = curves_frame(curves, DIGITS_METRICS)
    keep = [f"config_{k}" for k in DIGITS_KEYS]
    frame = frame[keep + ["epoch", *DIGITS_METRICS, "epoch_s"]].copy()
    # recorded as text (a width may also be "match"); here every one is a ratio of d, or none (linear)
    frame["config_hidden_width"] = pd.to_numeric(frame["config_hidden_width"]).fillna(0.0)
    frame.to_parquet(out, index=False)
    print(f"{out}: {frame.groupby(keep).ngroups} curves, {len(frame)} rows")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--store", default="results/bench_multifidelity.json")
    ap.add_argument("--record", metavar="CAMPAIGN", help="write the digits table from a campaign folder, then stop")
    args = ap.parse_args(argv)
    if args.record:
        record(args.record)
        return 0
    store, seeds = Store(args.store), args.seeds
    start = time.perf_counter()
    store.run_all([other_job(t, "random", s) for t in TABLES for s in range(seeds)]
                  + [mf_job(t, v, s) for t in TABLES for v in VARIANTS for s in range(seeds)]
                  + [other_job(t, o, s) for t in TABLES for o in OTHERS[1:] for s in range(seeds)], args.workers)
    chosen = {t: choose(store, [u for u in TABLES if u != t], seeds) for t in TABLES}
    default = choose(store, TABLES, seeds)
    print(f"\nmfehvi's variants: median HV at N/2 - random's median HV at N (N: the epochs of {FULL} full "
          f"trainings), {seeds} seeds")
    print("| variant | " + " | ".join(TABLES) + " | min | mean |\n|---|" + "---|" * (len(TABLES) + 2))
    for v in VARIANTS:
        m = margins(store, v, TABLES, seeds)
        print(f"| {v}{' (default)' if v == default else ''} | " + " | ".join(f"{x:+.3f}" for x in m)
              + f" | {m.min():+.3f} | {m.mean():+.3f} |")
    print("\nMO-ASHA (3 brackets, grace 1, rf 3), 4 trials at a time: HV of the completed front / the whole table's, "
          "median [IQR] over seeds, once N/4, N/2, N epochs were spent")
    print("| table | N | proposals | HV@N/4 | HV@N/2 | HV@N | epochs to random's HV@N | CPU s/run |")
    print("|---|---|---|---|---|---|---|---|")
    for t in TABLES:
        n = budget(t)
        target = median_at(store, [other_job(t, "random", s) for s in range(seeds)], n)
        rows = [(f"mfehvi, left out: {chosen[t]}", [mf_job(t, chosen[t], s) for s in range(seeds)])]
        if default != chosen[t]:
            rows.append((f"mfehvi default, tuned on: {default}", [mf_job(t, default, s) for s in range(seeds)]))
        rows += [(o + (" (final values only)" if o == "ehvi" else ""), [other_job(t, o, s) for s in range(seeds)])
                 for o in OTHERS]
        for label, jobs in rows:
            cells = [cell([at_epochs(store[j], b) for j in jobs]) for b in (n / 4, n / 2, n)]
            secs = np.mean([store[j]["secs"] for j in jobs])
            print(f"| {t} | {n} | {label} | " + " | ".join(cells)
                  + f" | {epochs_to(store, jobs, target)} | {secs:.1f} |")
    print(f"\n{time.perf_counter() - start:.0f} s wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
