"""The campaign's own searchers on a tabular benchmark: no training, the table answers.

The problem (search.searchers.base.Problem) is the table's: its space is the configuration columns
(``config_<key>``), each a categorical dimension over the values it holds; its costs (known before training)
are the cost columns; ehvi's candidates are its rows. A suggestion is the campaign's own searcher
(search.searchers.SEARCHERS: random, TPE, NSGA-II, GP, ehvi); the configuration it names is looked up in the
table, and the replay (search.simulation.replay) feeds that curve's epochs to the scheduler. The searcher
learns through the same hooks as in a campaign, and a proposal becomes what the campaign's proposal rules say
(search.searchers.ledger, a curve its key): a curve trained to the planned epochs is COMPLETE with its last
values, one stopped earlier PRUNED (search.searchers.outcomes); a cost constraint broken by the curve's cost
columns takes no trial slot and is told (``tell_infeasible``); a configuration evaluated or running already is
a duplicate (no slot, the known outcome told once it is known); a combination the table lacks is invalid:
FAIL. Each of these asks again, at most MAX_PROPOSALS times for one trial, after which the searcher is
finished.

``shuffle`` (the default) keeps the replay's plain order: every curve once per pass, in an order drawn
from the seed (ShuffledCurves); with constraints it passes over infeasible curves.
"""
from __future__ import annotations

import numpy as np

from qkvsearch.search.records.layout import PLANNED_KEY
from qkvsearch.search.searchers import ledger as rules
from qkvsearch.search.searchers import searcher_class
from qkvsearch.search.searchers.base import FINISHED, Problem
from qkvsearch.search.searchers.ledger import Ledger
from qkvsearch.search.simulation.curves import Curves
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.metrics import EPOCH, MEASURED_METRICS, bound_problem
from qkvsearch.spaces.schema import Constraint, violations
from qkvsearch.spaces.search_options import (
    EHVI_ALGORITHMS,
    GP_STARTUP_TRIALS,
    NSGA2_POPULATION,
    SIMULATED_SEARCHERS,
    ehvi_problem,
)

SEARCHERS = SIMULATED_SEARCHERS

MAX_PROPOSALS = 200  # proposals for one trial (duplicates, infeasible, absent) before the searcher finishes


def table_space(curves: Curves) -> dict[str, list]:
    """key -> the sorted distinct values of its config column (plain Python values)."""
    keys = list(curves.configs[0]) if curves.configs else []
    space = {}
    for k in keys:
        values = {_plain(cfg[k]) for cfg in curves.configs}
        space[k] = sorted(values, key=lambda v: (type(v).__name__, v))
    return space


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def curve_cost(curves: Curves, c: int) -> dict[str, float]:
    """The cost columns of curve c (its first recorded epoch; costs repeat on every row)."""
    first = curves.results[c][0] if curves.results[c] else {}
    return {m: float(v) for m, v in first.items() if m in curves.costs}


def parse_constraints(texts, curves: Curves) -> tuple[Constraint, ...]:
    """``METRIC:max=X`` / ``METRIC:min=X`` (both: ``METRIC:min=A,max=B``) -> Constraints on cost columns."""
    out = []
    for text in texts or ():
        metric, _, bounds = str(text).partition(":")
        values: dict = {}
        for part in filter(None, bounds.split(",")):
            side, sep, number = part.partition("=")
            try:
                values[side.strip()] = float(number) if sep and side.strip() in ("min", "max") else None
            except ValueError:
                values[side.strip()] = None
        costs = sorted({m for c in range(len(curves)) for m in curve_cost(curves, c)})
        if metric not in costs or not values or any(v is None for v in values.values()):
            raise BadInput(f"constraints: expected METRIC:max=X or METRIC:min=X with METRIC a cost column "
                           f"({', '.join(costs) or 'none in this table'}), given {text!r}")
        for side, value in values.items():
            if problem := bound_problem(metric, value, side):  # as a campaign's constraints (spaces.metrics)
                raise BadInput(f"constraints: {metric}:{side}: {problem}")
        out.append(Constraint(metric, values.get("max"), values.get("min")))
    return tuple(out)


def table_problem(curves: Curves, seed: int, num_trials: int, constraints=(), n_startup_trials: int | None = None,
                  population_size: int | None = None, measured=()) -> Problem:
    """The problem of a table (module docstring); measured: cost columns known only once a proposal is made
    (as a campaign measures a proposal's model before it trains), not among the candidates' costs."""
    space = table_space(curves)
    configs = [{k: _plain(cfg[k]) for k in space} for cfg in curves.configs]
    costs = [{m: v for m, v in curve_cost(curves, c).items() if m not in measured} for c in range(len(curves))]

    def draw(trial) -> dict:
        return {k: trial.suggest_categorical(k, values) for k, values in space.items()}

    known = tuple(m for m in curves.costs if m not in measured)
    return Problem(objectives=tuple(curves.objectives), constraints=tuple(constraints), known=known,
                   seed=seed, num_trials=num_trials, draw=draw,
                   candidates=lambda: (configs, costs, [True] * len(configs)),
                   n_startup_trials=n_startup_trials, population_size=population_size)


class TableSearch:
    """A campaign searcher over a table's configurations, speaking Tune's Searcher protocol as the replay
    drives it; a suggestion is ``{"curve": index}``, None once finished. Counters: proposals (trials,
    infeasible ones and absent combinations), infeasible, duplicates. Each proposal has an id of its own in
    the searcher (``<trial id>#<n>``): a proposal that takes no slot is told at once under it."""

    def __init__(self, curves: Curves, algorithm: str, seed: int, num_trials: int | None = None,
                 constraints=(), n_startup_trials: int | None = None, population_size: int | None = None,
                 options: dict | None = None, measured=()):
        if algorithm not in SEARCHERS[1:]:
            raise BadInput(f"searcher: expected one of {', '.join(SEARCHERS)}, given {algorithm!r}")
        bad = [m for m in measured if m not in curves.costs or m not in MEASURED_METRICS]
        if bad:
            raise BadInput(f"measured: expected cost columns of measured metrics ({', '.join(MEASURED_METRICS)}), "
                           f"given {', '.join(bad)}")
        known = tuple(m for m in curves.costs if m not in measured)
        if algorithm in EHVI_ALGORITHMS and ehvi_problem(curves.metrics, known, tuple(measured)):
            raise BadInput(f"searcher: {ehvi_problem(curves.metrics, known, tuple(measured))}")
        self.curves, self.max_t = curves, curves.max_t
        self.num_trials = len(curves) if num_trials is None else num_trials
        self.constraints = tuple(constraints)
        # Optuna's own start-up design and population, whatever the budget (as benchmarks/bench_searchers.py
        # measured the searchers); a campaign scales them down to a small budget (spaces.search_options).
        # ehvi's start-up is its settings' unless given.
        startup = n_startup_trials or (None if algorithm in EHVI_ALGORITHMS else GP_STARTUP_TRIALS)
        problem = table_problem(curves, seed, self.num_trials, self.constraints, startup,
                                population_size or NSGA2_POPULATION, tuple(measured))
        self.searcher = searcher_class(algorithm)(problem, **(options or {}))
        self.space = table_space(curves)
        self.index = {tuple(_plain(cfg[k]) for k in self.space): c for c, cfg in enumerate(curves.configs)}
        self.trial_of: dict[str, tuple[int, str]] = {}      # trial id -> (curve, the searcher's proposal id)
        # the campaign's proposal rules (search.searchers.ledger), a curve its own key, which tell the searcher
        self.ledger = Ledger(self.constraints, share_training=False, at_once=True)
        self.suggested = self.proposals = self.duplicates = 0

    def suggest(self, trial_id: str):
        if self.suggested >= self.num_trials:
            return None
        for n in range(MAX_PROPOSALS):
            pid = f"{trial_id}#{n}"
            config = self.searcher.suggest(pid)
            if config is None or config == FINISHED:
                return None
            c = self.index.get(tuple(config.get(k) for k in self.space))
            trial = {"config": config, "cost": {}, "invalid": "not in the table"} if c is None else \
                {"config": config, "cost": curve_cost(self.curves, c)}
            rec = self.ledger.propose(pid, trial, None if c is None else str(c), None if c is None else str(c))
            if rec["kind"] == rules.DUPLICATE:   # evaluated or running already: told its outcome once known
                self.duplicates += 1
            else:
                self.proposals += 1
            if self.ledger.tell(self.searcher, rec) is not None:
                self.trial_of[trial_id] = (c, pid)
                self.suggested += 1
                return {"curve": c}
        return None

    @property
    def infeasible(self) -> int:
        return self.ledger.infeasible

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        _, pid = self.trial_of[trial_id]
        self.searcher.on_trial_result(pid, {PLANNED_KEY: float(self.max_t), **result})

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        _, pid = self.trial_of.pop(trial_id)
        result = {PLANNED_KEY: float(self.max_t), EPOCH: 0.0, **(result or {})} if result else None
        self.ledger.finish(self.searcher, pid, result, error)


class ShuffledCurves:
    """Searcher over recorded curves: each curve once per pass, in an order drawn from the seed.

    Speaks Tune's Searcher protocol (suggest / on_trial_result / on_trial_complete); a suggestion is
    ``{"curve": index}``, and ``None`` once ``num_trials`` were suggested (Searcher.FINISHED)."""

    def __init__(self, n_curves: int, seed: int, num_trials: int | None = None):
        self.n = n_curves
        self.num_trials = n_curves if num_trials is None else num_trials
        self.rng = np.random.default_rng(seed)
        self.order: list[int] = []
        self.suggested = 0

    def suggest(self, trial_id: str):
        if self.suggested >= self.num_trials:
            return None
        if not self.order:
            self.order = self.rng.permutation(self.n).tolist()[::-1]  # popped from the end
        self.suggested += 1
        return {"curve": self.order.pop()}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        pass


class FeasibleShuffle:
    """ShuffledCurves passing over curves whose cost breaks a constraint (no slot; counted)."""

    def __init__(self, curves: Curves, seed: int, num_trials: int | None, constraints=()):
        self.curves, self.constraints = curves, tuple(constraints)
        self.inner = ShuffledCurves(len(curves), seed, None)
        self.inner.num_trials = 10 ** 12  # passes without end; this class counts the trials
        self.num_trials = len(curves) if num_trials is None else num_trials
        self.suggested = self.proposals = self.infeasible = self.duplicates = 0
        self.feasible = sum(not violations(self.constraints, curve_cost(curves, c)) for c in range(len(curves)))

    def suggest(self, trial_id: str):
        if self.suggested >= self.num_trials or not self.feasible:
            return None
        while True:
            pick = self.inner.suggest(trial_id)
            self.proposals += 1
            if violations(self.constraints, curve_cost(self.curves, pick["curve"])):
                self.infeasible += 1
                continue
            self.suggested += 1
            return pick

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        pass


def make_searcher(name: str, curves: Curves, seed: int, num_trials: int | None = None, constraints=(),
                  options: dict | None = None, measured=()):
    """The replay's searcher by name (SEARCHERS); ``shuffle`` without constraints is ShuffledCurves itself.
    options: keyword arguments of the searcher's class (a benchmark's settings); measured: TableSearch's."""
    if name == "shuffle":
        if constraints:
            return FeasibleShuffle(curves, seed, num_trials, constraints)
        return ShuffledCurves(len(curves), seed, num_trials)
    return TableSearch(curves, name, seed, num_trials, constraints, options=options, measured=measured)
