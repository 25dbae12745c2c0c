"""Scheduler settings compared by replaying tabular learning curves (search.simulation): no training.

    python benchmarks/bench_search.py [--seeds 20] [--configs 81 243] [--concurrency 4] [--startup-s 30]

Benchmarks (synthetic, 27 epochs, objectives: max top1, min params_m; 3^4 = 81 configurations,
or 3^5 = 243 with weight decay as a fifth dimension):
  order     every curve has the same shape, top1(e) = final * g(e): the ranking at any epoch is the
            final ranking.
  crossing  larger models learn slower, time constant 1 + 3 * size epochs (size: params scaled to
            [0, 1]): they trail smaller models early and overtake them later. Printed: the rank
            correlation (Spearman) of top1 at epochs 1, 3 and 9 with the final top1.
  demo      results/quickstart, when it exists (a recorded campaign: its own objectives, scheduler
            grace and reduction factor, planned epochs).

Methods, each run with several seeds (the seed orders the configurations): random search with full
training (FIFO), MO-ASHA with 1, 2 and 3 brackets (3, marked "default": what a campaign gets when 3
rungs fit; bracket s takes rf^(2 s) shares of the trials, 1 : 9 : 81), and 3 brackets with equal shares
(plain round-robin, for comparison); grace 1 and reduction factor 3 (the spec's defaults) on
the synthetic benchmarks. Every configuration is tried once; a method that has tried them all stops
spending.

Why those shares: under each synthetic benchmark a line gives, for one bracket alone judging first at
epoch 1, 3 and 9, the share of the full grid's front it trains to the end and its epochs per
configuration. Early verdicts are cheap but lose much of the front, on crossing curves most of it, so
the default deals most trials to the bracket that judges last (search.scheduling gives the figures).

Score: the hypervolume of the completed trials' front as a fraction of the full grid's (every
configuration trained to the end), once 25% and 50% of the full grid's epochs were spent; mean and
minimum over seeds. Targets (the last column, on means): at 50%, >= 0.97 on order and >= 0.95 on
crossing; at 25% and 50%, never more than 0.02 below random search at the same budget.
Last: the simulator's wall time per 1,000 trials (a 1,053-curve table, 8 at a time).

``--searchers``: the searchers compared instead (ehvi, random, TPE, NSGA-II on NAS-Bench-201, HPOLib and
HPOBench, ehvi's settings chosen on tables left out): see benchmarks/bench_searchers.py; multi-fidelity
search on recorded curves: benchmarks/bench_multifidelity.py.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from qkvsearch.search.analysis.pareto import nondominated_mask  # noqa: E402
from qkvsearch.search.simulation.curves import curves_from_frame, load_source
from qkvsearch.search.simulation.replay import Setting, simulate
from qkvsearch.spaces.sections import SchedulerSpec

EPOCHS = 27
OBJECTIVES = (("top1", "max"), ("params_m", "min"))
FRACTIONS = (0.25, 0.5)
TARGETS = {"order": 0.97, "crossing": 0.95}
METHOD_W = 33  # width of the method column
BELOW_RANDOM = 0.02  # the most a scheduler may trail random search at the same budget
EMBEDDINGS = {"sne": (3.6, 1.5), "psne": (3.1, 1.2), "fsne": (2.6, 1.0)}  # params at width 1 (M), top1 bonus
WIDTHS = (0.5, 1.0, 2.0)
CODES = (8, 16, 32)
LRS = {3e-4: -3.0, 1e-3: 0.0, 3e-3: -1.5}  # top1 offset
WDS = {0.01: -0.5, 0.05: 0.0, 0.1: -1.0}
DEMO = Path(__file__).resolve().parents[1] / "results" / "quickstart"


def synthetic(kind: str, configs: int = 81, seed: int = 0) -> pd.DataFrame:
    """A tabular benchmark in search.simulation's format: config_<key>, epoch, top1, params_m, gmacs,
    epoch_s (seconds grow with the model's MACs)."""
    rng = np.random.default_rng(seed)
    wds = WDS if configs == 243 else {0.05: 0.0}
    grid = list(itertools.product(EMBEDDINGS, WIDTHS, CODES, LRS, wds))
    params = np.array([EMBEDDINGS[e][0] * (0.6 + 0.4 * w) + 0.01 * c for e, w, c, _, _ in grid])
    params += rng.normal(0, 0.05, len(grid))
    size = (params - params.min()) / (params.max() - params.min())  # (n,) in [0, 1]
    final = (55 + 25 * (1 - np.exp(-params / 2.5)) + np.array([EMBEDDINGS[e][1] for e, *_ in grid])
             + np.array([LRS[lr] + wds[wd] for *_, lr, wd in grid]) + rng.normal(0, 1.0, len(grid)))
    tau = np.full(len(grid), 2.5) if kind == "order" else 1.0 + 3.0 * size  # epochs
    e = np.arange(1, EPOCHS + 1)
    shape = (1 - np.exp(-e[None, :] / tau[:, None])) / (1 - np.exp(-EPOCHS / tau[:, None]))  # (n, E)
    top1 = final[:, None] * shape
    gmacs = 0.18 * params + rng.normal(0, 0.01, len(grid))
    rows = {
        "config_embedding": np.repeat([g[0] for g in grid], EPOCHS),
        "config_hidden_width": np.repeat([g[1] for g in grid], EPOCHS),
        "config_code_size": np.repeat([g[2] for g in grid], EPOCHS),
        "config_lr": np.repeat([g[3] for g in grid], EPOCHS),
        "config_weight_decay": np.repeat([g[4] for g in grid], EPOCHS),
        "epoch": np.tile(e, len(grid)),
        "top1": top1.reshape(-1),
        "params_m": np.repeat(params, EPOCHS),
        "gmacs": np.repeat(gmacs, EPOCHS),
        "epoch_s": np.repeat(60 + 400 * gmacs, EPOCHS),
    }
    return pd.DataFrame(rows)


def rank_correlation(df: pd.DataFrame, epochs=(1, 3, 9)) -> str:
    wide = df.pivot_table(index=[c for c in df.columns if c.startswith("config_")], columns="epoch", values="top1")
    final = wide[EPOCHS].rank()
    return ", ".join(f"e{e} {wide[e].rank().corr(final):.2f}" for e in epochs)


def methods(grace: int = 1, rf: int = 3, max_brackets: int = 3) -> list[tuple[str, Setting]]:
    """random search, MO-ASHA with 1..max_brackets brackets (default shares; max_brackets is the
    campaign's default count), and max_brackets brackets with equal shares."""
    out = [("random (full training)", Setting("fifo")), ("MO-ASHA", Setting("moasha", grace, rf, 1))]
    out += [(f"MO-ASHA, {b} brackets" + (" (default)" if b == max_brackets else ""), Setting("moasha", grace, rf, b))
            for b in range(2, max_brackets + 1)]
    if max_brackets > 1:
        equal = (1,) * max_brackets
        out.append((f"MO-ASHA, {max_brackets} brackets, equal shares",
                    Setting("moasha", grace, rf, max_brackets, shares=equal)))
    return out


def bracket_alone(curves, seeds: int, concurrency: int, startup_s: float, grace: int = 1, rf: int = 3,
                  brackets: int = 3) -> str:
    """For bracket s alone (one bracket, grace * rf**s): mean share of the grid's front trained to the
    end, and epochs spent per configuration, over the seeds."""
    front = np.flatnonzero(nondominated_mask(curves.finals, curves.directions))  # (F,) curve indices
    firsts, kept, epochs = [], [], []
    for s in range(brackets):
        firsts.append(grace * rf ** s)
        runs = [simulate(curves, Setting("moasha", firsts[-1], rf, 1), concurrency=concurrency,
                         startup_s=startup_s, seed=seed) for seed in range(seeds)]
        kept.append(np.mean([np.isin(front, r.completed_curves()).mean() for r in runs]))
        epochs.append(np.mean([r.epochs / len(curves) for r in runs]))
    return (f"one bracket alone, first judged at epoch {' / '.join(map(str, firsts))}: keeps "
            f"{' / '.join(f'{k:.2f}' for k in kept)} of the grid's front, spending "
            f"{' / '.join(f'{e:.1f}' for e in epochs)} epochs per configuration")


def evaluate(curves, settings, seeds: int, concurrency: int, startup_s: float) -> dict[str, np.ndarray]:
    """label -> (seeds, len(FRACTIONS) + 1): HV fraction at each budget fraction, and epochs spent / grid's."""
    out = {}
    for name, setting in settings:
        rows = []
        for seed in range(seeds):
            run = simulate(curves, setting, concurrency=concurrency, startup_s=startup_s, seed=seed)
            rows.append([run.hv_at_epochs(f * curves.grid_epochs) / curves.grid_hv for f in FRACTIONS]
                        + [run.epochs / curves.grid_epochs])
        out[name] = np.array(rows)
    return out


def verdict(bench: str, name: str, scores: dict[str, np.ndarray]) -> str:
    """'meets' when the mean at 50% reaches the benchmark's target and, at 25% and at 50%, the mean
    trails random search by at most BELOW_RANDOM."""
    if not name.startswith("MO-ASHA") or bench not in TARGETS:
        return ""
    mine = scores[name][:, :len(FRACTIONS)].mean(axis=0)
    random = scores["random (full training)"][:, :len(FRACTIONS)].mean(axis=0)
    ok = mine[FRACTIONS.index(0.5)] >= TARGETS[bench] and (mine >= random - BELOW_RANDOM).all()
    return "meets" if ok else "misses"


def time_per_1000(concurrency: int) -> dict[str, float]:
    """Seconds per 1,000 simulated trials on a 1,053-curve table (13 seeds of the crossing grid)."""
    parts = [synthetic("crossing", 81, seed=s).assign(config_seed=s) for s in range(13)]
    curves = curves_from_frame(pd.concat(parts, ignore_index=True), "timing", OBJECTIVES)
    out = {}
    for setting in (Setting("fifo"), Setting("asha", 1, 3), Setting("moasha", 1, 3, 1), Setting("moasha", 1, 3, 3)):
        simulate(curves, setting, concurrency=concurrency, seed=0, num_trials=50)  # warm-up (imports)
        t = time.perf_counter()
        simulate(curves, setting, concurrency=concurrency, seed=0, num_trials=1000)
        out[setting.label] = time.perf_counter() - t
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--configs", type=int, nargs="+", default=[81, 243], choices=[81, 243])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--startup-s", type=float, default=30.0)
    ap.add_argument("--searchers", action="store_true",
                    help="the searcher comparison instead (benchmarks/bench_searchers.py; its options follow)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--searchers" in argv:
        from bench_searchers import main as searchers_main

        return searchers_main([a for a in argv if a != "--searchers"])
    args = ap.parse_args(argv)

    head = (f"{'benchmark':<10} {'configs':>7}  {'method':<{METHOD_W}} {'HV@25% mean (min)':>18} "
            f"{'HV@50% mean (min)':>18}  {'epochs':>6}  target@50%")
    print(f"hypervolume of the completed front / full grid's, {args.seeds} seeds, {args.concurrency} trials at a time,"
          f" {args.startup_s:g} s start-up; epochs: spent by the end / the full grid's")
    print(head)
    print("-" * len(head))
    for n, kind in itertools.product(args.configs, ("order", "crossing")):
        df = synthetic(kind, n)
        curves = curves_from_frame(df, f"{kind}-{n}", OBJECTIVES)
        scores = evaluate(curves, methods(), args.seeds, args.concurrency, args.startup_s)
        _print_rows(kind, n, scores)
        if kind == "crossing":
            print(f"{'':<10} {'':>7}  (rank correlation of top1 with the final: {rank_correlation(df)})")
        print(f"{'':<10} {'':>7}  ({bracket_alone(curves, args.seeds, args.concurrency, args.startup_s)})")
    if DEMO.exists():
        curves = load_source(DEMO)
        sched = curves.scheduler
        grace, rf = int(sched.get("grace_epochs") or 1), int(sched.get("reduction_factor") or 3)
        fit = _fit(grace, rf, curves.max_t)
        scores = evaluate(curves, methods(grace, rf, min(3, fit)), args.seeds, curves.concurrency or 1, None)
        _print_rows("demo", len(curves), scores)
        print(f"{'':<10} {'':>7}  ({curves.max_t} epochs, grace {grace}, rf {rf}, "
              f"{curves.concurrency or 1} at a time, start-up {curves.startup_s:.0f} s from its records)")
    else:
        print(f"demo: {DEMO} not found (make demo records it)")
    print("\nsimulator wall time per 1,000 trials (1,053 curves x 27 epochs, 8 at a time):")
    for label, secs in time_per_1000(8).items():
        print(f"  {label:<18} {secs:.2f} s")
    return 0


def _fit(grace, rf, max_t) -> int:
    return max(1, len(SchedulerSpec.rung_epochs(grace, rf, max_t)))


def _print_rows(bench: str, n: int, scores: dict[str, np.ndarray]) -> None:
    for name, s in scores.items():
        cells = [f"{s[:, i].mean():.3f} ({s[:, i].min():.3f})" for i in range(len(FRACTIONS))]
        print(f"{bench:<10} {n:>7}  {name:<{METHOD_W}} {cells[0]:>18} {cells[1]:>18}  {s[:, -1].mean():>6.2f}  "
              f"{verdict(bench, name, scores)}")


if __name__ == "__main__":
    sys.exit(main())
