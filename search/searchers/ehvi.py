"""``ehvi``: expected hypervolume improvement with the cost objectives known, or measured on demand.

A campaign's counted cost objectives (parameters, MACs: trainers.model.cost) are exact before anything trains;
its measured ones (latency, throughput, training step, memory: spaces.metrics.MEASURED) are known once the
proposal's model is measured, before it trains. Only the training objective (top1, say) needs training.
Optuna's samplers model every objective, costs included, and optimise their acquisition over a sampled
space. Here a model learns the training objective alone, over a finite set of candidate configurations whose
counted costs are all computed up front, and each proposal is the candidate with the largest expected
hypervolume improvement of the front of (training objective, costs) (search.searchers.ehvi_core,
search.searchers.hvi). A measured cost is predicted for the candidates not measured yet; the proposal chosen
is measured on demand (the proposal wrapper parks it meanwhile: search.searchers.proposals), and its
measurement reaches this searcher with its cost (``constrain``; ``tell_infeasible`` when it breaks a
constraint) before it trains.

Candidates (Problem.candidates): in a campaign, every configuration of an enumerable space up to
MAX_CANDIDATES, else MAX_CANDIDATES drawn from it with the campaign's seed (search.searchers.problem); over a
table, its rows. Where they are a sample of the space (Problem.neighbour set), each proposal after the
start-up first adds up to GROW neighbours of the trained front (a trained configuration with one or two of
its dimensions drawn anew: spaces.trials.neighbour_config), costed as the others (Problem.costs), after the
candidates already there: the acquisition is maximised over the space, not over one sample of it. Every
candidate is encoded anew with them (surrogate.encode reads the whole list). Measured with
benchmarks/bench_searchers.py (benchmarks/README.md).

State: what was learnt, by each candidate's configuration (not its index, so a candidate list made anew
matches it): results, measured costs, the random generator's state and the model's fitted hyperparameters,
and the configurations added to the candidates ("added", in order; absent when none were), so a restored
searcher proposes exactly what it would have. A state saved before the measured costs and the model's
settings were kept (its "kernel": a scikit-learn GP's) is restored with its results, its model fitted anew;
the state keeps that key (null), so a qkvsearch of that time resumes a state saved now in the same way (the
format's version, search.searchers.state, is unchanged: no key changed its meaning; one that does not know
"added" warns that what was learnt of those configurations is left out).
"""
from __future__ import annotations

import json
import math
import warnings

import numpy as np

from qkvsearch.search.analysis.pareto import to_minimise
from qkvsearch.search.searchers.base import FINISHED, EarlierTrial, Problem, Searcher
from qkvsearch.search.searchers.ehvi_core import DEFAULT, EHVICore, Settings
from qkvsearch.search.searchers.outcomes import COMPLETE, earlier_state, outcome_state
from qkvsearch.search.searchers.surrogate import encode
from qkvsearch.spaces.metrics import MEASURED, MEASURED_METRICS
from qkvsearch.spaces.schema import violations
from qkvsearch.spaces.search_options import ehvi_problem

GROW = 32    # candidates added per proposal over a sample of the space (benchmarks/README.md, "ehvi over a sample")
TRIES = 4    # neighbours drawn per candidate added, at most (those already candidates are passed over)


def config_key(config: dict) -> str:
    """A candidate's configuration as text: what the state names it by."""
    return json.dumps(config, sort_keys=True, default=str)


def side_costs(costs: list[dict], metrics) -> np.ndarray:
    """(n, s) the counted costs every candidate has (positive), log-scaled to [0, 1]: what the model of a
    measured cost reads besides the features (latency follows MACs and parameters closely)."""
    cols = []
    for m in metrics:
        values = np.array([c.get(m, math.nan) for c in costs], float)
        if np.isnan(values).any() or (values <= 0).any():
            continue
        logs = np.log(values)
        span = logs.max() - logs.min()
        if span > 0:
            cols.append((logs - logs.min()) / span)
    return np.column_stack(cols) if cols else np.zeros((len(costs), 0))


class EhviSearcher(Searcher):
    """``ehvi`` over the problem's candidates (Problem.candidates: configurations, their costs, whether each
    can be trained); the training objective is the one objective neither counted (Problem.known) nor
    measured. The candidates are made at the first use (a campaign's take a few seconds to cost).
    settings: ehvi_core.Settings (DEFAULT unless a benchmark compares others)."""

    name = "ehvi"

    def __init__(self, problem: Problem, settings: Settings | None = None):
        super().__init__(problem)
        measured = tuple(m for m in MEASURED_METRICS if m not in problem.known)
        why = ehvi_problem(problem.metrics, problem.known, measured)
        if why:
            raise ValueError(f"search.algorithm: {why}")
        self.settings = settings or DEFAULT
        self.cost_objectives = [(m, d) for m, d in problem.objectives if m in problem.known or m in measured]
        self.measured = [m in measured and m not in problem.known for m, _ in self.cost_objectives]
        self.train = next(i for i, (m, _) in enumerate(problem.objectives) if (m, _) not in self.cost_objectives)
        self._core: EHVICore | None = None
        self.candidates: list[dict] = []
        self.costs: list[dict] = []       # each candidate's cost (Problem.candidates)
        self.index: dict[str, int] = {}   # config_key -> candidate
        self.initial = 0                  # candidates of Problem.candidates; those after them were added

    def make_core(self, features, groups, costs, feasible, side) -> EHVICore:
        """The search over the candidates (a subclass searches otherwise)."""
        return EHVICore(features, groups, costs, feasible, self.problem.modes[self.train] == "max",
                        self.problem.seed, self.settings, self.problem.n_startup_trials, self.measured,
                        [1.0 if d == "min" else -1.0 for _, d in self.cost_objectives], side)

    @property
    def core(self) -> EHVICore:
        if self._core is None:
            configs, costs, trainable = self.problem.candidates()
            self.candidates, self.costs = [dict(c) for c in configs], list(costs)
            self.index = {config_key(c): i for i, c in enumerate(self.candidates)}
            self.initial = len(self.candidates)
            features, groups = encode(self.candidates)
            self._core = self.make_core(features, groups, self._cost_rows(costs), self._feasible(trainable, costs),
                                        side_costs(costs, self.problem.known))
        return self._core

    def _feasible(self, trainable: list[bool], costs: list[dict]) -> list[bool]:
        return [ok and not violations(self.problem.constraints, c) for ok, c in zip(trainable, costs)]

    def add(self, configs: list[dict]) -> None:
        """Candidates appended after the others (the indices known so far stay), costed by Problem.costs; the
        features of every candidate encoded anew with them."""
        core, (costs, trainable) = self.core, self.problem.costs(configs)
        self.index.update({config_key(c): len(self.candidates) + i for i, c in enumerate(configs)})
        self.candidates += [dict(c) for c in configs]
        self.costs += list(costs)
        features, groups = encode(self.candidates)
        core.extend(features, groups, self._cost_rows(costs), self._feasible(trainable, costs),
                    side_costs(self.costs, self.problem.known))

    def _grow(self) -> None:
        """Over a sample of the space (Problem.neighbour), once the start-up is over: up to GROW neighbours of
        the trained front, each a copy of one with one or two dimensions drawn anew, added to the candidates
        (those already candidates passed over), drawn from the seed and how far the search went."""
        core = self.core
        if self.problem.neighbour is None or core.observed() < core.start:
            return
        parents = [self.candidates[i] for i in core.front()]
        if not parents:
            return
        rng = np.random.default_rng([self.problem.seed, len(self.candidates), len(core.tried)])
        order = rng.permutation(len(parents))
        added: dict[str, dict] = {}
        for n in range(GROW * TRIES):
            if len(added) == GROW:
                break
            config = self.problem.neighbour(parents[order[n % len(parents)]], rng, 1 + int(rng.integers(2)))
            key = config_key(config) if config is not None else None
            if key is not None and key not in self.index and key not in added:
                added[key] = config
        if added:
            self.add(list(added.values()))

    def _cost_rows(self, costs: list[dict]) -> np.ndarray:
        """(n, k) cost objectives, minimised; a measured one not in the cost: NaN (not measured yet), a counted
        one missing: inf (no model could be made of it)."""
        rows = [[c.get(m, math.nan if measured else math.inf) for (m, _), measured
                 in zip(self.cost_objectives, self.measured)] for c in costs]
        return to_minimise(np.array(rows, float).reshape(len(costs), -1), [d for _, d in self.cost_objectives])

    def _learn_measured(self, pick: int, cost: dict) -> None:
        if any(self.measured):
            self.core.learn_cost(pick, self._cost_rows([cost])[0])

    def suggest(self, trial_id: str):
        self._grow()
        pick = self.core.propose()
        if pick is None:
            return FINISHED
        self.proposed[trial_id] = pick
        return dict(self.candidates[pick])

    def constrain(self, trial_id: str, cost: dict) -> None:
        pick = self.proposed.get(trial_id)
        if pick is not None:  # a measured cost, known now that its model was measured
            self._learn_measured(pick, cost)

    def tell_infeasible(self, trial_id: str, cost: dict) -> None:
        pick = self.proposed.pop(trial_id, None)
        if pick is not None:  # broke a constraint: never proposed again, nothing learnt of its score
            self._learn_measured(pick, cost)
            self.core.observe(pick, None)

    def tell_earlier(self, earlier: EarlierTrial) -> None:
        core = self.core  # the candidates, made at the first use
        pick = self.index.get(config_key(earlier.config))
        if pick is None:
            return
        self._learn_measured(pick, {**earlier.cost, **{m: v for m, v in earlier.values.items() if m in MEASURED}})
        state, values = earlier_state(earlier.status, [earlier.values.get(self.problem.metrics[self.train])])
        core.observe(pick, values[0] if state == COMPLETE else None)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        pick = self.proposed.pop(trial_id, None)
        if pick is None:
            return
        if result:
            self._learn_measured(pick, result)
        state, values = outcome_state(result, error, self.problem.metrics)
        self.core.observe(pick, values[self.train] if state == COMPLETE else None)

    # -- state ---------------------------------------------------------------------------------------
    def state(self) -> dict:
        if self._core is None:
            return {"core": None, "proposed": {}}
        keys = [config_key(c) for c in self.candidates]
        out = {"core": self.keyed(self._core.state(), keys),
               "proposed": {t: keys[i] for t, i in self.proposed.items()}}
        if len(self.candidates) > self.initial:   # absent: none added (every state saved before they were)
            out["added"] = self.candidates[self.initial:]
        return out

    def keyed(self, core: dict, keys: list[str]) -> dict:
        """The core's state with its candidate indices made configurations (a subclass names more)."""
        for field in ("results", "measured"):
            core[field] = [[keys[i], v] for i, v in core[field]]
        core["tried"] = [keys[i] for i in core["tried"]]
        core["running"] = [keys[i] for i in core["running"]]
        return core

    def indexed(self, core: dict, index: dict[str, int]) -> dict:
        """``keyed`` undone: configurations no longer candidates left out."""
        for field in ("results", "measured"):
            core[field] = [[index[k], v] for k, v in core.get(field, []) if k in index]
        core["tried"] = [index[k] for k in core["tried"] if k in index]
        core["running"] = [index[k] for k in core["running"] if k in index]
        return core

    def restore(self, state: dict) -> None:
        if state.get("core") is None:
            return
        core_now, core = self.core, dict(state["core"])
        if state.get("by_index"):  # converted from a pickle of an earlier version: the same candidate list
            core_now.restore(core)
            self.proposed = {t: int(i) for t, i in state["proposed"].items()}
            return
        added = [dict(c) for c in state.get("added", [])]
        if any(config_key(c) not in self.index for c in added):
            self.add([c for c in added if config_key(c) not in self.index])
        index = self.index
        lost = [k for k in [*(k for k, _ in core["results"]), *core["tried"]] if k not in index]
        if lost:
            warnings.warn(f"ehvi: {len(lost)} configuration(s) of the saved state are no longer candidates; "
                          "what was learnt of them is left out", stacklevel=2)
        core_now.restore(self.indexed(core, index))
        self.proposed = {t: index[k] for t, k in state["proposed"].items() if k in index}
