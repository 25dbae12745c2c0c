"""Replays of the campaign's searchers on tables, run once and kept: what bench_searchers.py and
bench_multifidelity.py are made of.

A run is a ``Job`` (table, searcher, its settings, seed, trials, scheduler, measured cost columns, the share of
the table ehvi starts from) replayed by search.simulation (``simulate``); its result (the hypervolume fraction
after each completed trial, the epochs spent by then, seconds, suggestions) is kept in a JSON file under the
job's text, so an interrupted sweep goes on where it stopped and a table printed again costs nothing. Jobs run
in ``workers`` processes, each with one thread (OMP_NUM_THREADS=1; set before numpy loads).
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # GPSampler's torch: one thread per process (Optuna's advice)

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONCURRENCY = 4    # trials at a time in every replay
DIGITS = Path(__file__).resolve().parent / "data" / "digits_curves.parquet"
SYNTHETIC = ("order", "crossing")
_CURVES: dict = {}


def table(name: str):
    """Curves of a packaged table (search.simulation.packaged: nb201:, hpolib:, hpobench:), a synthetic
    table of bench_search.py (order, crossing: 243 configurations x 27 epochs) or ``digits``."""
    if name not in _CURVES:
        from qkvsearch.search.simulation.curves import curves_from_frame, load_table
        from qkvsearch.search.simulation.packaged import is_packaged, load_packaged

        if is_packaged(name):
            _CURVES[name] = load_packaged(name)
        elif name in SYNTHETIC:
            from bench_search import OBJECTIVES, synthetic

            _CURVES[name] = curves_from_frame(synthetic(name, 243), f"{name}-243", OBJECTIVES)
        elif name == "digits":
            _CURVES[name] = load_table(DIGITS, (("top1", "max"), ("params_m", "min")))
        else:
            raise ValueError(f"table: unknown {name!r}")
    return _CURVES[name]


@dataclass(frozen=True)
class Job:
    """One replay. settings: ehvi_core.Settings fields (ehvi, mfehvi), () for Optuna's samplers;
    scheduler: fifo, or moasha (3 brackets, grace 1, rf 3); measured: cost columns revealed on proposal;
    sample: ehvi's candidates are that share of the table's rows, drawn with the seed (0: every row), to
    which it adds neighbours of its trained front when ``grow`` (``sampled``)."""

    table: str
    searcher: str
    seed: int
    trials: int | None
    settings: tuple = ()
    scheduler: str = "fifo"
    measured: tuple = ()
    sample: float = 0.0
    grow: bool = False

    @property
    def key(self) -> str:
        fields = asdict(self)
        if not self.sample:   # the key of a job of every row, as it was before sample and grow existed
            del fields["sample"], fields["grow"]
        return json.dumps(fields, sort_keys=True)


def run(job: Job) -> dict:
    """The job replayed: {"hv": fractions of the table's hypervolume after each completed trial, "epochs":
    epochs spent by each of them, "secs", "suggestions", "trials"}."""
    from qkvsearch.search.searchers.ehvi_core import Settings
    from qkvsearch.search.simulation.replay import Setting, simulate

    curves = table(job.table)
    setting = Setting("fifo") if job.scheduler == "fifo" else Setting("moasha", 1, 3, 3)
    options = {"settings": Settings(**dict(job.settings))} if job.settings else None
    start = time.process_time()
    with sampled(job.sample, job.grow, job.seed):
        r = simulate(curves, setting, concurrency=CONCURRENCY, seed=job.seed, num_trials=job.trials,
                     searcher=job.searcher, searcher_options=options, measured=job.measured)
    secs = time.process_time() - start
    return {"hv": (r.hv / curves.grid_hv).round(6).tolist(), "epochs": r.hv_epochs.tolist(), "secs": secs,
            "suggestions": int(getattr(r.searcher, "proposals", 0) + getattr(r.searcher, "duplicates", 0)) or r.trials,
            "trials": r.trials}


@contextmanager
def sampled(share: float, grow: bool, seed: int):
    """Within it, a table's problem (search.simulation.searchers.table_problem) offers ehvi ``share`` of its
    rows as candidates (drawn with ``seed``), as a campaign's space larger than search.searchers.problem's
    MAX_CANDIDATES offers a sample of it; with ``grow`` its neighbours are those of a space of the table's
    columns, each a choice of the values it holds (spaces.trials.neighbour_config), costed by the table (a
    combination it lacks cannot be trained)."""
    if not share:
        yield
        return
    from qkvsearch.search.searchers.ehvi import config_key
    from qkvsearch.search.simulation import searchers
    from qkvsearch.spaces.schema import Dimension, Space
    from qkvsearch.spaces.trials import neighbour_config

    whole = searchers.table_problem

    def problem(curves, *args, **kwargs):
        full = whole(curves, *args, **kwargs)
        configs, costs, _ = full.candidates()
        rows = np.sort(np.random.default_rng(seed).choice(len(configs), round(share * len(configs)), replace=False))
        by_key = {config_key(c): cost for c, cost in zip(configs, costs)}
        space = Space(tuple(Dimension(k, "choice", tuple(v)) for k, v in searchers.table_space(curves).items()))
        return replace(full,
                       candidates=lambda: ([configs[i] for i in rows], [costs[i] for i in rows], [True] * len(rows)),
                       neighbour=partial(neighbour_config, space) if grow else None,
                       costs=lambda cs: ([by_key.get(config_key(c), {}) for c in cs],
                                         [config_key(c) in by_key for c in cs]))

    searchers.table_problem = problem
    try:
        yield
    finally:
        searchers.table_problem = whole


def _run_keyed(job: Job) -> tuple[str, dict]:
    return job.key, run(job)


class Store:
    """Results by job, kept in a JSON file (written again, atomically, after every job)."""

    def __init__(self, path):
        self.path = Path(path)
        self.data: dict = json.loads(self.path.read_text()) if self.path.exists() else {}

    def __contains__(self, job: Job) -> bool:
        return job.key in self.data

    def __getitem__(self, job: Job) -> dict:
        return self.data[job.key]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)

    def run_all(self, jobs: list[Job], workers: int = 1) -> None:
        """Run the jobs not kept yet (slowest searchers first), keeping each result as it comes."""
        todo = list(dict.fromkeys(j for j in jobs if j not in self))
        if not todo:
            return
        print(f"{len(todo)} run(s) to replay", flush=True)
        start = time.perf_counter()
        if workers <= 1:
            for i, job in enumerate(todo):
                self.data[job.key] = run(job)
                self.save()
                _progress(i + 1, len(todo), start)
            return
        with ProcessPoolExecutor(workers) as pool:
            futures = [pool.submit(_run_keyed, j) for j in todo]
            for i, done in enumerate(as_completed(futures)):
                key, result = done.result()
                self.data[key] = result
                self.save()
                _progress(i + 1, len(todo), start)


def _progress(done: int, total: int, start: float) -> None:
    if done == total or done % 20 == 0:
        print(f"  {done}/{total} runs, {time.perf_counter() - start:.0f} s", flush=True)


def at(hv: list, n: int) -> float:
    """The hypervolume fraction once n trials completed (the last one when fewer did)."""
    return float(hv[min(n, len(hv)) - 1]) if hv else 0.0


def at_epochs(result: dict, budget: float) -> float:
    """The hypervolume fraction of the trials completed by the time ``budget`` epochs were spent."""
    i = int(np.searchsorted(np.asarray(result["epochs"]), budget, side="right"))
    return float(result["hv"][i - 1]) if i else 0.0


def median_iqr(values) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(np.asarray(values, float), [25, 50, 75])
    return float(med), float(q1), float(q3)


def cell(values) -> str:
    med, q1, q3 = median_iqr(values)
    return f"{med:.3f} [{q1:.3f},{q3:.3f}]"
