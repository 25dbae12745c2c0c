"""The search behind ``ehvi`` (search.searchers.ehvi) over a list of candidates, which may grow (``extend``):
which one to train next.

A model (search.searchers.surrogate) learns the training objective of the candidates trained so far; each
proposal is the candidate of largest expected hypervolume improvement (search.searchers.hvi) of the front of
(training objective, costs). Costs counted before training are exact for every candidate. A measured cost
(spaces.metrics.MEASURED) is exact for the candidates measured so far and predicted for the others by a cheap
model of the measurements (a Bayesian linear regression over the candidates' features and their counted costs,
on the log scale, fitted anew to each measurement: surrogate.Linear); the improvement then averages over that
prediction (hvi.ehvi_sampled).
Trials still running count as known at the model's mean (the kriging believer), so several trials at once do
not all pick one region. Infeasible candidates are never proposed; a candidate is proposed once.

The settings (``Settings``), each chosen on tables left out of its tuning (benchmarks/bench_searchers.py,
benchmarks/README.md "Searchers compared"):

    model   the surrogate: columns | keys | additive (GP kernels) | trees
    warp    the values the model learns (and the improvement is measured on): none | copula | epochs (the
            copula within each epoch's values: mfehvi's fidelities on one scale; ehvi has one epoch)
    start   proposals drawn before the model leads (a campaign's n_startup_trials replaces it)
    design  how they are drawn: random, or spread (each the farthest in cost from those drawn, among a
            few random ones)
    pool    candidates scored per proposal: 0 every open one; else that many drawn at random plus every
            neighbour (one key changed) of the five best trained
    draws   cost draws a predicted (measured, not yet measured) cost is averaged over (hvi.ehvi_sampled);
            1: the prediction's mean plugged in
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.search.searchers.hvi import COST_DRAWS, ehvi_sampled
from qkvsearch.search.searchers.surrogate import Linear, copula, make_model
from qkvsearch.spaces.search_options import STARTUP_TRIALS

REF_MARGIN = 0.1    # reference point: the worst value seen, 10 % of the range beyond it
REFIT_GROWTH = 1.2  # hyperparameters fitted again once the observations grew by 20 % (conditioned every time)
SPREAD_POOL = 64    # design spread: random candidates the farthest one is picked among
PRUNE_BATCH = 1024  # candidates whose EHVI is computed exactly at once, highest bound first
WARPS = ("none", "copula", "epochs")


@dataclass(frozen=True)
class Settings:
    """ehvi's settings (module docstring). The field defaults are the base a benchmark's variants change
    (benchmarks/bench_searchers.py names each variant by what it changes); DEFAULT is what campaigns and
    simulate use."""

    model: str = "keys"
    warp: str = "copula"
    start: int = 10
    design: str = "random"
    pool: int = 0
    draws: int = COST_DRAWS

    def __post_init__(self):
        if self.warp not in WARPS:
            raise ValueError(f"warp: expected one of {', '.join(WARPS)}, given {self.warp!r}")

    @property
    def label(self) -> str:
        return (f"{self.model} {self.warp} start {self.start} {self.design}"
                + (f" pool {self.pool}" if self.pool else "")
                + (f" draws {self.draws}" if self.draws != COST_DRAWS else ""))


# Chosen over every table of benchmarks/bench_searchers.py by the rule its left-out rows test (benchmarks/README.md,
# "Searchers compared"): the keys kernel, copula warping, 20 random start-up proposals, every candidate scored.
DEFAULT = Settings(start=STARTUP_TRIALS["ehvi"])


class EHVICore:
    """``propose()`` -> a candidate index, ``observe(i, y)`` once its trial ends (y None: no result: failed,
    stopped early, infeasible; never proposed again), ``learn_cost(i, values)`` once a measured cost is known.

    features (n, d) and groups (d,): surrogate.encode; costs (n, k): cost objectives, minimised, NaN where a
    measured one is not known yet; measured (k,) bool: which columns are measured (their values > 0 before
    the sign: latency, throughput, memory); signs (k,): +1 minimised, -1 maximised (to_minimise's sign);
    side (n, s): counted costs the measured-cost model also reads; feasible (n,) bool."""

    def __init__(self, features, groups, costs, feasible, maximise: bool, seed: int, settings: Settings = DEFAULT,
                 start: int | None = None, measured=None, signs=None, side=None):
        self.features, self.groups = self.inputs(features, groups)
        self.costs = np.array(costs, float)
        self.feasible = np.asarray(feasible, bool)
        self.sign = 1.0 if maximise else -1.0
        self.settings = settings
        self.start = max(2, start if start is not None else settings.start)
        self.seed, self.rng = seed, np.random.default_rng(seed)
        k = self.costs.shape[1]
        self.measured = np.zeros(k, bool) if measured is None else np.asarray(measured, bool)
        self.signs = np.ones(k) if signs is None else np.asarray(signs, float)
        self.side = np.zeros((len(self.costs), 0)) if side is None else np.asarray(side, float)
        self.results: dict[int, float] = {}   # candidate -> training objective (maximised sign)
        self.tried: set[int] = set()          # proposed (running, ended, or without a result)
        self.running: set[int] = set()
        self.model = make_model(settings.model, self.groups, seed, self.fidelity_group)
        self.fitted_at = 0                    # observations at the last hyperparameter fit
        self._codes = None

    def inputs(self, features, groups) -> tuple[np.ndarray, np.ndarray]:
        """(features, groups) the model reads of the candidates' encoding (a subclass adds columns)."""
        return np.asarray(features, float), np.asarray(groups, int)

    def extend(self, features, groups, costs, feasible, side) -> None:
        """Candidates appended after the others: features (n, d), groups and side (n, s) of every candidate,
        encoded anew with them (an encoding reads the whole list: surrogate.encode); costs (m, k) and feasible
        (m,) of the m added. Where the encoding of the earlier candidates changed, the model's hyperparameters
        are fitted again at the next proposal (from the last ones, where they still apply)."""
        before = len(self.costs)
        features, groups = self.inputs(features, groups)
        same = np.array_equal(groups, self.groups) and np.array_equal(features[:before], self.features)
        self.features, self.groups, self.side = features, groups, np.asarray(side, float)
        self.costs = np.vstack([self.costs, np.asarray(costs, float).reshape(-1, self.costs.shape[1])])
        self.feasible = np.concatenate([self.feasible, np.asarray(feasible, bool)])
        self._codes = None
        if not same:
            theta = self.model.theta
            self.model = make_model(self.settings.model, self.groups, self.seed, self.fidelity_group)
            if (theta is not None and hasattr(self.model, "default_theta")
                    and len(theta) == len(self.model.default_theta())):
                self.model.theta = theta
            self.fitted_at = 0   # _fit: optimised at the next proposal

    def front(self) -> np.ndarray:
        """The candidates trained with a result that no other such dominates in (training objective, costs)."""
        done = np.array(sorted(self.results), dtype=int)
        if not len(done):
            return done
        values = np.column_stack([[-self.results[i] for i in done], self.costs[done]])
        values[np.isnan(values)] = np.inf
        return done[nondominated_mask(values, ["min"] * values.shape[1])]

    # -- proposing -----------------------------------------------------------------------------------
    def open(self) -> np.ndarray:
        mask = self.feasible.copy()
        mask[list(self.tried)] = False
        return np.flatnonzero(mask)

    def propose(self) -> int | None:
        """The next candidate (None when every feasible one has been proposed)."""
        choices = self.open()
        if not len(choices):
            return None
        if self.observed() < self.start:
            pick = self._design(choices)
        else:
            pool = self._pool(choices)
            pick = int(pool[np.argmax(self._acquisition(pool))])
        self.tried.add(pick)
        self.running.add(pick)
        return pick

    def observe(self, index: int, value: float | None) -> None:
        self.running.discard(index)
        self.tried.add(index)
        if value is not None and math.isfinite(value):
            self.results[index] = self.sign * float(value)

    def learn_cost(self, index: int, values) -> None:
        """Measured costs of a candidate ((k,) minimised, NaN: not given); counted ones are kept as they are."""
        values = np.asarray(values, float)
        given = self.measured & ~np.isnan(values)
        self.costs[index, given] = values[given]

    def _design(self, choices: np.ndarray) -> int:
        """A start-up proposal (Settings.design)."""
        known = ~self.measured
        if self.settings.design == "random" or not known.any() or not self.tried:
            return int(self.rng.choice(choices))
        pool = self.rng.choice(choices, size=min(SPREAD_POOL, len(choices)), replace=False)
        costs = self.costs[:, known]
        span = np.nanmax(costs[self.feasible], axis=0) - np.nanmin(costs[self.feasible], axis=0)
        scaled = costs / np.where(span > 0, span, 1.0)
        tried = scaled[sorted(self.tried)]
        gaps = np.min(((scaled[pool][:, None, :] - tried[None]) ** 2).sum(-1), axis=1)
        return int(pool[np.argmax(gaps)])

    def _pool(self, choices: np.ndarray) -> np.ndarray:
        """The candidates scored (Settings.pool): all, or a random subset and the trained front's neighbours."""
        size = self.settings.pool
        if not size or len(choices) <= size:
            return choices
        picked = self.rng.choice(choices, size=size, replace=False)
        codes = self._key_codes()
        done = np.array(sorted(self.results))
        best = done[np.argsort(-np.array([self.results[i] for i in done]))[:5]]
        near = np.zeros(len(self.feasible), bool)
        for i in best:
            near |= (codes != codes[i]).sum(1) == 1
        near[list(self.tried)] = False
        near &= self.feasible
        return np.union1d(picked, np.flatnonzero(near))

    def _key_codes(self) -> np.ndarray:
        """(n, keys) the level of each candidate per key (the rows of its feature columns, numbered)."""
        if self._codes is None:
            n_keys = int(self.groups.max()) + 1 if len(self.groups) else 1
            cols = []
            for g in range(n_keys):
                _, inverse = np.unique(self.features[:, self.groups == g], axis=0, return_inverse=True)
                cols.append(inverse.reshape(-1))
            self._codes = np.column_stack(cols)
        return self._codes

    # -- the model ------------------------------------------------------------------------------------
    fidelity_group = None   # the group of the features' fidelity column (a multi-fidelity model has one)

    def observed(self) -> int:
        """Candidates the model has learnt something of (the start-up ends when START have)."""
        return len(self.results)

    def training_data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, rows, epochs) the model learns: the features of the candidates with a result and their
        values; rows: for each candidate with a result (in index order), the row of y holding its final value;
        epochs: the epoch of each value (one here: the final)."""
        done = np.array(sorted(self.results), dtype=int)
        return (self.features[done], np.array([self.results[i] for i in done]), np.arange(len(done)),
                np.zeros(len(done)))

    def prediction_inputs(self, index: np.ndarray) -> np.ndarray:
        """What the model predicts candidates' final values from (a multi-fidelity model adds the fidelity)."""
        return self.features[index]

    def _fit(self, x: np.ndarray, y: np.ndarray):
        optimise = self.model.theta is None or len(y) <= 2 * self.start or len(y) >= REFIT_GROWTH * self.fitted_at
        if optimise:
            self.fitted_at = len(y)
        return self.model.fit(x, y, optimise=optimise)

    def _warped(self, y: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        if self.settings.warp == "none":
            return y
        if self.settings.warp == "copula":
            return copula(y)
        out = np.empty(len(y))   # epochs: each epoch's values ranked among themselves
        for e in np.unique(epochs):
            out[epochs == e] = copula(y[epochs == e])
        return out

    def _acquisition(self, pool: np.ndarray) -> np.ndarray:
        """EHVI of each pooled candidate; -inf for those it cannot be largest for (pruned: below)."""
        done = np.array(sorted(self.results), dtype=int)
        x, y, rows, epochs = self.training_data()
        warped = self._warped(y, epochs)
        model = self._fit(x, warped)
        known = warped[rows]   # the trained front on the model's scale
        running = np.array(sorted(self.running), dtype=int)
        believed = model.predict(self.prediction_inputs(running))[0] if len(running) else np.zeros(0)
        known_y = np.concatenate([known, believed])
        mean, spread, to_cost = self._cost_prediction(np.concatenate([pool, done, running]))
        cand_mean, cand_sd = mean[:len(pool)], spread[:len(pool)]
        known_costs = to_cost(mean[len(pool):])
        ref_y = warped.min() - REF_MARGIN * max(warped.max() - warped.min(), 1e-9)
        # a predicted cost's reference: its upper quantile, as a measured one may turn out that bad
        ref_costs = self._ref_costs(np.vstack([to_cost(mean), to_cost(mean + 2.0 * self.signs * spread)]))

        def score(index: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
            return ehvi_sampled(mu, sd, cand_mean[index], cand_sd[index], known_y, known_costs, ref_y, ref_costs,
                                to_cost, self.settings.draws)

        inputs = self.prediction_inputs(pool)
        if model.sd_bound is None or len(pool) <= PRUNE_BATCH:
            return score(np.arange(len(pool)), *model.predict(inputs))
        # EHVI grows with the mean and the spread (the improvement is convex and increasing in y), so with an
        # upper bound of the spread it bounds the exact value from above: the exact spread (the costly part of a
        # GP's prediction) is computed for the candidates of highest bound first, until no bound is left above
        # the best exact value. The argmax is that of every candidate scored exactly.
        k = model.cross(inputs)
        mu = model.predict(inputs, sd=False, k=k)
        bound = score(np.arange(len(pool)), mu, model.sd_bound(k))
        out = np.full(len(pool), -np.inf)
        order = np.argsort(-bound, kind="stable")
        for start in range(0, len(order), PRUNE_BATCH):
            batch = order[start:start + PRUNE_BATCH]
            if out.max() >= bound[batch[0]]:
                break
            out[batch] = score(batch, *model.predict(inputs[batch], k=k[batch]))
        return out

    def _ref_costs(self, seen: np.ndarray) -> np.ndarray:
        """The cost reference: per cost, the worst of the feasible candidates (measured ones: of those
        measured or predicted here), REF_MARGIN of the range beyond it."""
        known = self.costs[self.feasible]
        worst, best = np.nanmax(known, axis=0), np.nanmin(known, axis=0)
        worst = np.where(np.isnan(worst), -np.inf, worst)
        best = np.where(np.isnan(best), np.inf, best)
        worst, best = np.maximum(worst, seen.max(axis=0)), np.minimum(best, seen.min(axis=0))
        return worst + REF_MARGIN * np.maximum(worst - best, 1e-12)

    def _cost_prediction(self, index: np.ndarray):
        """(mean, sd, to_cost) of the costs of candidates ``index`` on the scale hvi.ehvi_sampled draws on:
        counted and measured-and-known costs exact (sd 0), measured ones predicted on the log scale."""
        costs = self.costs[index].copy()
        sd = np.zeros_like(costs)
        for j in np.flatnonzero(self.measured):
            have = ~np.isnan(self.costs[:, j])
            logs = np.log(np.abs(self.costs[index, j]))
            missing = np.isnan(costs[:, j])
            if missing.any():
                if not have.any():
                    raise ValueError("ehvi: a measured cost is predicted before any was measured")
                m, s = self._cost_model(j, have).predict(self._cost_inputs(index[missing]))
                logs[missing], sd[missing, j] = m, s
            costs[:, j] = logs
        measured, signs = self.measured, self.signs

        def to_cost(values: np.ndarray) -> np.ndarray:
            out = np.array(values, float)
            out[:, measured] = signs[measured] * np.exp(out[:, measured])
            return out

        return costs, sd, to_cost

    def _cost_inputs(self, index: np.ndarray) -> np.ndarray:
        return np.hstack([self.features[index], self.side[index]])

    def _cost_model(self, j: int, have: np.ndarray) -> Linear:
        """The model of measured cost j (surrogate.Linear) on the log scale, fitted to every measurement."""
        index = np.flatnonzero(have)
        return Linear().fit(self._cost_inputs(index), np.log(np.abs(self.costs[index, j])))

    # -- state -----------------------------------------------------------------------------------------
    def state(self) -> dict:
        """By candidate index (EhviSearcher turns indices into configurations)."""
        theta = getattr(self.model, "theta", None)
        return {"results": [[int(i), float(v)] for i, v in self.results.items()], "tried": sorted(map(int, self.tried)),
                "running": sorted(map(int, self.running)), "rng": self.rng.bit_generator.state,
                "model": {"settings": vars(self.settings) | {}, "theta": None if theta is None else theta.tolist(),
                          "fitted_at": self.fitted_at},
                # the fitted kernel of the GP this searcher had before "model" (scikit-learn's): none, so a
                # qkvsearch of that time resuming this state fits its own anew (it ignores the other new keys)
                "kernel": None,
                "measured": [[int(i), [float(v) for v in self.costs[i]]] for i in sorted(self.tried)
                             if self.measured.any() and not np.isnan(self.costs[i, self.measured]).any()]}

    def restore(self, state: dict) -> None:
        self.results = {int(i): float(v) for i, v in state["results"]}
        self.tried, self.running = set(state["tried"]), set(state["running"])
        self.rng.bit_generator.state = state["rng"]
        for i, values in state.get("measured", []):
            self.learn_cost(int(i), values)
        saved = state.get("model")   # absent before this model: its "kernel" is another GP's, fitted anew
        if saved and saved.get("settings") == vars(self.settings) and saved.get("theta") is not None:
            self.model.theta, self.fitted_at = np.asarray(saved["theta"], float), int(saved["fitted_at"])
