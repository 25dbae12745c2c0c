"""The campaign's own searchers on a tabular benchmark: no training, the table answers.

The space is the table's configuration columns (``config_<key>``), each a categorical dimension over
the values it holds. A suggestion is the campaign's Optuna sampler (search.campaign.searchers.make_sampler:
random, TPE, NSGA-II, GP) asking a study; the configuration it names is looked up in the table, and the
replay (search.simulation.replay) feeds that curve's epochs to the scheduler. The searcher learns what it
reads as in a campaign (search.campaign.searchers.outcome_state): a curve trained to the planned epochs
is COMPLETE with its last values, one stopped earlier PRUNED; a cost constraint broken by the curve's
cost columns (known before training) takes no trial slot and is told as the campaign tells it
(search.campaign.searchers.Teller); a configuration evaluated or running already is a duplicate (no
slot, the known outcome told once it is known); a combination the table lacks is FAIL. Each of these
asks again, at most MAX_PROPOSALS times for one trial, after which the searcher is finished.

``shuffle`` (the default) keeps the replay's plain order: every curve once per pass, in an order drawn
from the seed (replay.ShuffledCurves); with constraints it passes over infeasible curves.
"""
from __future__ import annotations

import optuna

from qkvsearch.search.campaign.searchers import Teller, make_sampler, outcome_state
from qkvsearch.search.records.layout import PLANNED_KEY
from qkvsearch.search.simulation.curves import COST_COLUMNS, Curves
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.keys import EPOCH
from qkvsearch.spaces.loader import SIMULATED_SEARCHERS
from qkvsearch.spaces.schema import Constraint, SearchSpec, violations

SEARCHERS = SIMULATED_SEARCHERS

MAX_PROPOSALS = 200  # proposals for one trial (duplicates, infeasible, absent) before the searcher finishes

# Columns a table may constrain: known before training (a campaign's cost metrics, a benchmark's latency).
TABLE_COSTS = (*COST_COLUMNS, "latency_ms")


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
    return {m: float(v) for m, v in first.items() if m in TABLE_COSTS}


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
        out.append(Constraint(metric, values.get("max"), values.get("min")))
    return tuple(out)


class TableSearch:
    """An Optuna sampler over a table's configurations, speaking Tune's Searcher protocol as the replay
    drives it; a suggestion is ``{"curve": index}``, None once finished. Counters: proposals (trials,
    infeasible ones and absent combinations), infeasible, duplicates."""

    def __init__(self, curves: Curves, algorithm: str, seed: int, num_trials: int | None = None,
                 constraints=(), n_startup_trials: int | None = None, population_size: int | None = None):
        if algorithm not in SEARCHERS[1:]:
            raise BadInput(f"searcher: expected one of {', '.join(SEARCHERS)}, given {algorithm!r}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.curves, self.max_t = curves, curves.max_t
        self.space = table_space(curves)
        self.index = {tuple(_plain(cfg[k]) for k in self.space): c for c, cfg in enumerate(curves.configs)}
        self.num_trials = len(curves) if num_trials is None else num_trials
        search = SearchSpec(algorithm, self.num_trials, seed, population_size, 1, n_startup_trials)
        directions = ["maximize" if d == "max" else "minimize" for d in curves.directions]
        self.study = optuna.create_study(directions=directions, sampler=make_sampler(search))
        self.constraints = tuple(constraints)
        self.teller = Teller(curves.objectives, self.constraints)
        self.trial_of: dict[str, tuple[int, object]] = {}  # trial id -> (curve, optuna trial)
        self.known: dict[int, tuple] = {}                  # curve -> (state, values) once it ended
        self.running: set[int] = set()
        self.waiting: dict[int, list] = {}                 # curve -> duplicates told when it ends
        self.suggested = self.proposals = self.infeasible = self.duplicates = 0

    def _ask(self):
        ot = self.study.ask()
        params = tuple(ot.suggest_categorical(k, values) for k, values in self.space.items())
        return ot, self.index.get(params)

    def suggest(self, trial_id: str):
        if self.suggested >= self.num_trials:
            return None
        TS = optuna.trial.TrialState
        for _ in range(MAX_PROPOSALS):
            ot, c = self._ask()
            if c is None:  # a combination the table does not hold
                self.proposals += 1
                self.study.tell(ot, state=TS.FAIL)
                continue
            cost = curve_cost(self.curves, c)
            if c in self.known or c in self.running:
                self.duplicates += 1
                self.teller.constrain(ot, cost)
                self._tell_duplicate(ot, c)
                continue
            self.proposals += 1
            if violations(self.constraints, cost):
                self.infeasible += 1
                self.teller.tell_infeasible(self.study, ot, cost)
                continue
            self.teller.constrain(ot, cost)
            self.running.add(c)
            self.trial_of[trial_id] = (c, ot)
            self.suggested += 1
            return {"curve": c}
        return None

    def _tell_duplicate(self, ot, c: int) -> None:
        if c in self.known:
            state, values = self.known[c]
            self.study.tell(ot, values, state=state)
        else:
            self.waiting.setdefault(c, []).append(ot)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass  # several objectives: Optuna takes no intermediate values

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        c, ot = self.trial_of.pop(trial_id)
        result = {PLANNED_KEY: float(self.max_t), EPOCH: 0.0, **(result or {})} if result else None
        state, values = outcome_state(result, error, self.curves.metrics)
        self.study.tell(ot, values, state=state)
        self.known[c] = (state, values)
        self.running.discard(c)
        for waiting in self.waiting.pop(c, []):
            self.study.tell(waiting, values, state=state)
        if state == optuna.trial.TrialState.COMPLETE:
            self.teller.seen(values)


class FeasibleShuffle:
    """replay.ShuffledCurves passing over curves whose cost breaks a constraint (no slot; counted)."""

    def __init__(self, curves: Curves, seed: int, num_trials: int | None, constraints=()):
        from qkvsearch.search.simulation.replay import ShuffledCurves

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


class KnownCostTable:
    """``ehvi`` (search.campaign.known_cost) over a table: the candidates are its configurations, their
    costs its cost columns (known before training), the training objective its one other objective.
    Nothing infeasible is proposed; a configuration is proposed once."""

    def __init__(self, curves: Curves, seed: int, num_trials: int | None = None, constraints=()):
        from qkvsearch.search.analysis.pareto import to_minimise
        from qkvsearch.search.campaign.known_cost import KnownCostEHVI, encode
        from qkvsearch.spaces.loader import ehvi_problem

        problem = ehvi_problem(curves.metrics, TABLE_COSTS)
        if problem:
            raise BadInput(f"searcher: {problem}")
        self.curves, self.max_t = curves, curves.max_t
        self.train = next(i for i, m in enumerate(curves.metrics) if m not in TABLE_COSTS)
        costs = [(m, d) for m, d in curves.objectives if m in TABLE_COSTS]
        known = [curve_cost(curves, c) for c in range(len(curves))]
        cost = to_minimise([[k[m] for m, _ in costs] for k in known], [d for _, d in costs])
        feasible = [not violations(tuple(constraints), k) for k in known]
        configs = [{k: _plain(v) for k, v in cfg.items()} for cfg in curves.configs]
        self.core = KnownCostEHVI(encode(configs), cost, feasible, curves.directions[self.train] == "max", seed)
        self.num_trials = len(curves) if num_trials is None else num_trials
        self.trial_of: dict[str, int] = {}
        self.suggested = self.proposals = self.infeasible = self.duplicates = 0

    def suggest(self, trial_id: str):
        if self.suggested >= self.num_trials:
            return None
        c = self.core.propose()
        if c is None:
            return None
        self.trial_of[trial_id] = c
        self.suggested += 1
        self.proposals += 1
        return {"curve": c}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        c = self.trial_of.pop(trial_id)
        result = {PLANNED_KEY: float(self.max_t), EPOCH: 0.0, **(result or {})} if result else None
        state, values = outcome_state(result, error, self.curves.metrics)
        self.core.observe(c, values[self.train] if state == optuna.trial.TrialState.COMPLETE else None)


def make_searcher(name: str, curves: Curves, seed: int, num_trials: int | None = None, constraints=()):
    """The replay's searcher by name (SEARCHERS); ``shuffle`` without constraints is ShuffledCurves itself."""
    from qkvsearch.search.simulation.replay import ShuffledCurves

    if name == "shuffle":
        if constraints:
            return FeasibleShuffle(curves, seed, num_trials, constraints)
        return ShuffledCurves(len(curves), seed, num_trials)
    if name == "ehvi":
        return KnownCostTable(curves, seed, num_trials, constraints)
    return TableSearch(curves, name, seed, num_trials, constraints)
