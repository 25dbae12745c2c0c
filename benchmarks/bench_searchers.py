"""Searchers compared by replaying tabular benchmarks (search.simulation): no training.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_search.py --searchers [--seeds 10] [--gp-seeds 5]
        [--tables nb201-cifar10 nb201-cifar100 order crossing] [--workers 2] [--only ehvi ...]

Tables: NAS-Bench-201 CIFAR-10 and CIFAR-100 (search.simulation.nasbench: 15,625 architectures, final
values only; objectives max top1, min latency_ms, min params_m) and the synthetic order and crossing
tables of bench_search.py at 243 configurations x 27 epochs (max top1, min params_m).

Searchers: the campaign's own (search.searchers.SEARCHERS: random, TPE, NSGA-II, GP; and ehvi, the
known-cost EHVI) through search.simulation.searchers, 4 trials at a time, FIFO (every trial trained to the
end).
"With constraints": params_m at most the table's median: half the table is infeasible; an infeasible
proposal takes no trial slot and the searcher learns it (Searcher.tell_infeasible). On the
synthetic tables, the multi-fidelity rows: MO-ASHA with 3 brackets (grace 1, rf 3), random and TPE.

Score: the hypervolume of the trained configurations' front after 25, 50, 100, 200 trained
configurations (MO-ASHA: once the epochs of that many full trainings were spent) as a fraction of the
whole table's front, one reference point per table (reference_point of every configuration, the same
for every searcher and seed); median and IQR over the seeds. Then, per searcher, how many random
configurations (random's median over the seeds, up to 2,000) reach the hypervolume it reaches at 50.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # GPSampler's torch: one thread per process (Optuna's advice)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_search import OBJECTIVES, synthetic  # noqa: E402

from qkvsearch.search.simulation.curves import curves_from_frame  # noqa: E402
from qkvsearch.search.simulation.nasbench import load_nb201  # noqa: E402
from qkvsearch.search.simulation.replay import Setting, simulate  # noqa: E402
from qkvsearch.spaces.schema import Constraint  # noqa: E402

BUDGETS = (25, 50, 100, 200)
TABLES = ("nb201-cifar10", "nb201-cifar100", "order", "crossing")
SEARCHERS = ("random", "tpe", "nsga2", "gp", "ehvi")
CONCURRENCY = 4
RANDOM_REACH = 2000  # random trials replayed to find how many reach a searcher's hypervolume at 50
_CURVES: dict = {}


def table(name: str):
    if name not in _CURVES:
        if name.startswith("nb201-"):
            _CURVES[name] = load_nb201(f"nb201:{name[len('nb201-'):]}")
        else:
            _CURVES[name] = curves_from_frame(synthetic(name, 243), f"{name}-243", OBJECTIVES)
    return _CURVES[name]


def constraint_of(curves) -> tuple[Constraint, ...]:
    """params_m at most the table's median."""
    params = [r[0]["params_m"] for r in curves.results if r]
    return (Constraint("params_m", max=float(np.median(params))),)


def one_run(job: tuple) -> tuple:
    """(table, searcher, scheduler, constrained, seed) -> (the job, HV fractions at BUDGETS, infeasible
    share, seconds)."""
    name, searcher, sched, constrained, seed = job
    curves = table(name)
    setting = Setting("fifo") if sched == "fifo" else Setting("moasha", 1, 3, 3)
    cons = constraint_of(curves) if constrained else ()
    trials = max(BUDGETS) if sched == "fifo" else None
    t = time.perf_counter()
    run = simulate(curves, setting, concurrency=CONCURRENCY, seed=seed, num_trials=trials, searcher=searcher,
                   constraints=cons)
    secs = time.perf_counter() - t
    if sched == "fifo":
        hv = run.hv / curves.grid_hv
        fracs = [float(hv[min(n, hv.size) - 1]) if hv.size else 0.0 for n in BUDGETS]
    else:
        fracs = [run.hv_at_epochs(n * curves.max_t) / curves.grid_hv for n in BUDGETS]
    return job, fracs, run.infeasible_share, secs


def random_trace(name: str, seeds: int) -> np.ndarray:
    """(RANDOM_REACH,) random search's median HV fraction after n = 1.. trained configurations."""
    curves = table(name)
    rows = []
    for seed in range(seeds):
        hv = simulate(curves, Setting("fifo"), concurrency=CONCURRENCY, seed=seed, num_trials=RANDOM_REACH,
                      searcher="random").hv / curves.grid_hv
        rows.append(np.concatenate([hv, np.full(RANDOM_REACH - hv.size, hv[-1])]))
    return np.median(np.array(rows), axis=0)


def jobs(tables, seeds: int, gp_seeds: int, gp_everywhere: bool = False, only=SEARCHERS) -> list[tuple]:
    """Every (table, searcher, scheduler, constrained, seed) to run. GP (about 300 s a run of 200 trials
    here, 2 cores shared) only unconstrained on NAS-Bench-201 unless gp_everywhere."""
    out = []
    for name in tables:
        for constrained in (False, True):
            for searcher in only:
                n = gp_seeds if searcher == "gp" else seeds
                if searcher == "gp" and not gp_everywhere and (constrained or not name.startswith("nb201-")):
                    continue
                out += [(name, searcher, "fifo", constrained, s) for s in range(n)]
        if not name.startswith("nb201-"):
            out += [(name, searcher, "moasha", False, s) for searcher in ("random", "tpe") if searcher in only
                    for s in range(seeds)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--gp-seeds", type=int, default=5)
    ap.add_argument("--tables", nargs="+", default=list(TABLES), choices=TABLES)
    ap.add_argument("--workers", type=int, default=2, help="processes (GP runs take most of the time)")
    ap.add_argument("--gp-everywhere", action="store_true", help="GP rows with constraints and on the synthetic "
                                                                  "tables too (hours on 2 cores)")
    ap.add_argument("--only", nargs="+", default=list(SEARCHERS), choices=SEARCHERS,
                    help="these searchers' rows only (random search's reach is computed either way)")
    args = ap.parse_args(argv)
    todo = jobs(args.tables, args.seeds, args.gp_seeds, args.gp_everywhere, tuple(args.only))
    todo.sort(key=lambda j: j[1] != "gp")  # the slow GP runs first, so the workers finish together
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        done = list(pool.map(one_run, todo, chunksize=1))
    results: dict = {}
    for (name, searcher, sched, constrained, _), fracs, share, secs in done:
        results.setdefault((name, searcher, sched, constrained), []).append((fracs, share, secs))
    print(f"hypervolume of the trained front / the whole table's, median [IQR] over seeds, {CONCURRENCY} trials "
          f"at a time; constrained: params_m <= the table's median; {time.perf_counter() - start:.0f} s in all")
    for name in args.tables:
        _print_table(name, results, args.seeds)
    return 0


def _print_table(name: str, results: dict, seeds: int) -> None:
    curves = table(name)
    trace = random_trace(name, seeds)
    head = (f"{'searcher':<24} {'seeds':>5} " + " ".join(f"{'HV@' + str(n):>17}" for n in BUDGETS)
            + f" {'infeasible':>10} {'s/run':>6}  random reaches HV@50 at")
    print(f"\n{name}: {len(curves)} configurations, objectives "
          f"{', '.join(f'{d} {m}' for m, d in curves.objectives)}\n{head}\n{'-' * len(head)}")
    for (tname, searcher, sched, constrained), rows in results.items():
        if tname != name:
            continue
        fr = np.array([r[0] for r in rows])  # (seeds, budgets)
        q1, med, q3 = np.percentile(fr, [25, 50, 75], axis=0)
        cells = " ".join(f"{m:.3f} [{a:.3f},{b:.3f}]" for m, a, b in zip(med, q1, q3))
        label = searcher + (" constrained" if constrained else "") + (" MO-ASHA b3" if sched != "fifo" else "")
        at50 = med[BUDGETS.index(50)]
        reach = np.flatnonzero(trace >= at50 - 1e-12)
        reached = f"{reach[0] + 1}" if reach.size else f"> {RANDOM_REACH}"
        share = np.mean([r[1] for r in rows])
        print(f"{label:<24} {len(rows):>5} {cells} {share:>10.0%} {np.mean([r[2] for r in rows]):>6.1f}  {reached}")


if __name__ == "__main__":
    sys.exit(main())
