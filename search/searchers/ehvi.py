"""``ehvi``: expected hypervolume improvement with the cost objectives known.

A campaign's cost objectives (parameters, MACs: trainers.cost) are exact before anything trains; only the
training objective (top1, say) is unknown. Optuna's samplers model every objective, costs included, and
optimise their acquisition over a sampled space. Here a Gaussian process models the training objective
alone, over a finite set of candidate configurations whose costs are all computed up front, and each
proposal is the candidate with the largest expected hypervolume improvement (EHVI) of the front of
(training objective, costs): exact, in closed form, for a normal predictive distribution of one objective
and one or two known costs.

    EHVI(x) = E[ integral over t from r_y to y(x) of A_x(t) dt ],  y(x) ~ N(mu, sd)
    A_x(t)  = the area (one cost: length) of x's cost box [c(x), r_c] not dominated in cost by a
              known point with training value >= t

A_x is a step function of t (it changes at the known points' values), so EHVI is a sum over those steps of
A_j * (E[(y - t_j)+] - E[(y - t_{j+1})+]), with E[(y - t)+] = (mu - t) Phi(z) + sd phi(z), z = (mu - t)/sd.
Trials still running count as known at the GP's mean (the kriging believer), so several trials at once do
not all pick one region. Candidates breaking a cost constraint are never proposed. A configuration is
proposed once.

Candidates (Problem.candidates): in a campaign, every configuration of an enumerable space up to
MAX_CANDIDATES, else MAX_CANDIDATES drawn from it with the campaign's seed (search.searchers.problem); over a
table, its rows. The first START trials are drawn at random among them. Measured with
benchmarks/bench_searchers.py (benchmarks/README.md).

State: what was learnt, by each candidate's configuration (not its index, so a candidate list made anew
matches it), the random generator's state and the GP's fitted kernel hyperparameters, so a restored searcher
proposes exactly what it would have.
"""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
from scipy.stats import norm

from qkvsearch.search.analysis.pareto import nondominated_mask, to_minimise
from qkvsearch.search.searchers.base import FINISHED, EarlierTrial, Problem, Searcher
from qkvsearch.search.searchers.outcomes import COMPLETE, earlier_state, outcome_state
from qkvsearch.spaces.schema import violations
from qkvsearch.spaces.search_options import ehvi_problem

MAX_CANDIDATES = 4096
START = 10          # random proposals before the GP leads (at least 2 results are needed to fit it)
REF_MARGIN = 0.1    # reference point: the worst value seen, 10 % of the range beyond it
REFIT = 5           # the GP's hyperparameters are fitted again every REFIT results (each fit: about a second)


def encode(configs: list[dict]) -> np.ndarray:
    """(n, d) features of configurations for the GP: per key that varies, min-max scaled numbers (log10
    when positive and spanning 10x or more) with a column marking where the key is absent (an inactive
    dimension), or one-hot categories (absent: a category of its own)."""
    keys = sorted({k for c in configs for k in c})
    columns = []
    for k in keys:
        values = [c.get(k) for c in configs]
        if len({repr(v) for v in values}) < 2:
            continue
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            columns.append(_scaled(values))
        else:
            levels = sorted({repr(v) for v in values})
            onehot = np.zeros((len(values), len(levels)))
            onehot[np.arange(len(values)), [levels.index(repr(v)) for v in values]] = 1.0
            columns.append(onehot)
    return np.hstack(columns) if columns else np.zeros((len(configs), 1))


def _scaled(values: list) -> np.ndarray:
    """(n, 1 or 2): numbers scaled to [0, 1] (absent: 0), and an absent-marker column when any is absent."""
    absent = np.array([v is None for v in values])
    x = np.array([0.0 if v is None else float(v) for v in values])
    seen = x[~absent]
    if seen.min() > 0 and seen.max() / seen.min() >= 10:
        x[~absent] = np.log10(seen)
        seen = x[~absent]
    span = seen.max() - seen.min()
    x[~absent] = (seen - seen.min()) / span if span > 0 else 0.0
    x[absent] = 0.0
    return np.column_stack([x, absent.astype(float)]) if absent.any() else x[:, None]


def _above(mu: np.ndarray, sd: np.ndarray, t: float) -> np.ndarray:
    """E[(y - t)+] for y ~ N(mu, sd) (0 for t = +inf)."""
    if math.isinf(t):
        return np.zeros_like(mu)
    z = (mu - t) / sd
    return (mu - t) * norm.cdf(z) + sd * norm.pdf(z)


def _undominated(box: np.ndarray, known: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """(n,) measure of each candidate's cost box [box_i, ref] not dominated by the known cost points
    (m, k), k = 1 (a length) or 2 (an area, through the known points' staircase)."""
    whole = np.prod(np.clip(ref - box, 0, None), axis=1)
    if not len(known):
        return whole
    if box.shape[1] == 1:
        return np.clip(np.minimum(ref[0], known[:, 0].min()) - box[:, 0], 0, None)
    stair, best = [], math.inf   # the known points' front in cost, by the first cost ascending
    for x, y in sorted(map(tuple, known)):
        if y < best:
            stair.append((x, y))
            best = y
    covered = np.zeros(len(box))
    for r, (x, y) in enumerate(stair):
        x_next = stair[r + 1][0] if r + 1 < len(stair) else ref[0]
        width = np.clip(np.minimum(x_next, ref[0]) - np.maximum(box[:, 0], x), 0, None)
        covered += width * np.clip(ref[1] - np.maximum(box[:, 1], y), 0, None)
    return whole - covered


def ehvi(mu, sd, cand_costs, known_y, known_costs, ref_y: float, ref_costs) -> np.ndarray:
    """Expected hypervolume improvement of each candidate (module docstring). The training objective is
    maximised, costs minimised: mu, sd (n,); cand_costs (n, k); known_y (m,), known_costs (m, k)."""
    mu, sd = np.asarray(mu, float), np.maximum(np.asarray(sd, float), 1e-12)
    known_y, known_costs = np.asarray(known_y, float), np.asarray(known_costs, float).reshape(len(known_y), -1)
    ref_costs = np.asarray(ref_costs, float)
    if len(known_y):  # a known point another dominates never uncovers anything: the front alone matters
        front = nondominated_mask(np.column_stack([known_y, known_costs]), ["max"] + ["min"] * known_costs.shape[1])
        known_y, known_costs = known_y[front], known_costs[front]
    steps = np.concatenate([[ref_y], np.unique(known_y[known_y > ref_y]), [math.inf]])
    total = np.zeros_like(mu)
    for lo, hi in zip(steps[:-1], steps[1:]):
        area = _undominated(cand_costs, known_costs[known_y >= hi], ref_costs)
        total += area * (_above(mu, sd, lo) - _above(mu, sd, hi))
    return total


class KnownCostEHVI:
    """The search over a fixed candidate list: ``propose()`` -> a candidate index, ``observe(i, y)`` once
    its trial ends (y None: no result: failed, stopped early; never proposed again).

    costs: (n, k) cost objectives, minimised (k = 1 or 2); feasible: (n,) bool, candidates that may be
    proposed; maximise: whether the training objective is maximised."""

    def __init__(self, features: np.ndarray, costs: np.ndarray, feasible, maximise: bool, seed: int,
                 start: int = START):
        self.features, self.costs = np.asarray(features, float), np.asarray(costs, float)
        self.feasible = np.asarray(feasible, bool)
        self.sign = 1.0 if maximise else -1.0
        self.start, self.rng = max(2, start), np.random.default_rng(seed)
        self.results: dict[int, float] = {}   # candidate -> training objective (maximised sign)
        self.kernel = None                    # the GP's fitted kernel, refitted every REFIT results
        self.tried: set[int] = set()          # proposed (running, ended, or without a result)
        self.running: set[int] = set()
        cost_ok = self.costs[self.feasible]
        span = cost_ok.max(axis=0) - cost_ok.min(axis=0) if len(cost_ok) else np.zeros(self.costs.shape[1])
        self.ref_costs = (cost_ok.max(axis=0) + REF_MARGIN * span) if len(cost_ok) else self.costs.max(axis=0)

    def open(self) -> np.ndarray:
        mask = self.feasible.copy()
        mask[list(self.tried)] = False
        return np.flatnonzero(mask)

    def propose(self) -> int | None:
        """The next candidate (None when every feasible one has been proposed)."""
        choices = self.open()
        if not len(choices):
            return None
        if len(self.results) < self.start:
            pick = int(self.rng.choice(choices))
        else:
            pick = int(choices[np.argmax(self._acquisition(choices))])
        self.tried.add(pick)
        self.running.add(pick)
        return pick

    def observe(self, index: int, value: float | None) -> None:
        self.running.discard(index)
        self.tried.add(index)
        if value is not None and math.isfinite(value):
            self.results[index] = self.sign * float(value)

    def state(self) -> dict:
        """By candidate index (EhviSearcher turns indices into configurations)."""
        return {"results": [[int(i), float(v)] for i, v in self.results.items()], "tried": sorted(map(int, self.tried)),
                "running": sorted(map(int, self.running)), "rng": self.rng.bit_generator.state,
                "kernel": None if self.kernel is None else [float(t) for t in self.kernel.theta]}

    def restore(self, state: dict) -> None:
        self.results = {int(i): float(v) for i, v in state["results"]}
        self.tried, self.running = set(state["tried"]), set(state["running"])
        self.rng.bit_generator.state = state["rng"]
        self.kernel = None if state["kernel"] is None else _kernel(self.features.shape[1]).clone_with_theta(
            np.asarray(state["kernel"], float))

    def _acquisition(self, choices: np.ndarray) -> np.ndarray:
        done = np.array(sorted(self.results))
        y = np.array([self.results[i] for i in done])
        refit = self.kernel is None or len(done) <= 2 * self.start or len(done) % REFIT == 0
        gp = _fit(self.features[done], y, None if refit else self.kernel)
        self.kernel = gp.kernel_
        mu, sd = gp.predict(self.features[choices], return_std=True)
        running = np.array(sorted(self.running), dtype=int)
        believed = gp.predict(self.features[running]) if len(running) else np.zeros(0)
        known_y = np.concatenate([y, believed])
        known_costs = np.vstack([self.costs[done], self.costs[running]])
        ref_y = y.min() - REF_MARGIN * max(y.max() - y.min(), 1e-9)
        return ehvi(mu, sd, self.costs[choices], known_y, known_costs, ref_y, self.ref_costs)


def _kernel(features: int):
    """The GP's kernel before fitting: constant x Matern-5/2 with one length scale per feature, plus noise."""
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    return ConstantKernel(1.0) * Matern(length_scale=np.full(features, 2.0), nu=2.5) + WhiteKernel(1e-2)


def _fit(x: np.ndarray, y: np.ndarray, kernel=None):
    """A GP regression of y on x: constant x Matern-5/2 with one length scale per feature, plus noise;
    given a fitted ``kernel``, its hyperparameters are kept (no optimisation: a Cholesky solve)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor

    fixed = kernel is not None
    kernel = kernel or _kernel(x.shape[1])
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=0, random_state=0,
                                  optimizer=None if fixed else "fmin_l_bfgs_b")
    with warnings.catch_warnings():  # length scales at their bounds: features that do not matter
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x, y)
    return gp


def config_key(config: dict) -> str:
    """A candidate's configuration as text: what the state names it by."""
    return json.dumps(config, sort_keys=True, default=str)


class EhviSearcher(Searcher):
    """``ehvi`` over the problem's candidates (Problem.candidates: configurations, their costs, whether each
    can be trained); the training objective is the one objective the costs do not hold. The candidates are
    made at the first use (a campaign's take a few seconds to cost)."""

    name = "ehvi"

    def __init__(self, problem: Problem):
        super().__init__(problem)
        why = ehvi_problem(problem.metrics, problem.known)
        if why:
            raise ValueError(f"search.algorithm: {why}")
        self.train = next(i for i, m in enumerate(problem.metrics) if m not in problem.known)
        self._core: KnownCostEHVI | None = None
        self.candidates: list[dict] = []
        self.index: dict[str, int] = {}   # config_key -> candidate

    @property
    def core(self) -> KnownCostEHVI:
        if self._core is None:
            configs, costs, trainable = self.problem.candidates()
            objectives = [(m, d) for m, d in self.problem.objectives if m in self.problem.known]
            cost = to_minimise([[c.get(m, math.inf) for m, _ in objectives] for c in costs], [d for _, d in objectives])
            feasible = [ok and not violations(self.problem.constraints, c) for ok, c in zip(trainable, costs)]
            self.candidates = [dict(c) for c in configs]
            self.index = {config_key(c): i for i, c in enumerate(self.candidates)}
            self._core = KnownCostEHVI(encode(self.candidates), cost, feasible,
                                       self.problem.modes[self.train] == "max", self.problem.seed,
                                       self.problem.n_startup_trials or START)
        return self._core

    def suggest(self, trial_id: str):
        pick = self.core.propose()
        if pick is None:
            return FINISHED
        self.proposed[trial_id] = pick
        return dict(self.candidates[pick])

    def tell_infeasible(self, trial_id: str, cost: dict) -> None:
        pick = self.proposed.pop(trial_id, None)
        if pick is not None:  # broke a measured constraint: never proposed again, nothing learnt of its score
            self.core.observe(pick, None)

    def tell_earlier(self, earlier: EarlierTrial) -> None:
        core = self.core  # the candidates, made at the first use
        pick = self.index.get(config_key(earlier.config))
        if pick is None:
            return
        state, values = earlier_state(earlier.status, [earlier.values.get(self.problem.metrics[self.train])])
        core.observe(pick, values[0] if state == COMPLETE else None)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        pick = self.proposed.pop(trial_id, None)
        if pick is None:
            return
        state, values = outcome_state(result, error, self.problem.metrics)
        self.core.observe(pick, values[self.train] if state == COMPLETE else None)

    def state(self) -> dict:
        if self._core is None:
            return {"core": None, "proposed": {}}
        keys = [config_key(c) for c in self.candidates]
        core = self._core.state()
        core["results"] = [[keys[i], v] for i, v in core["results"]]
        core["tried"] = [keys[i] for i in core["tried"]]
        core["running"] = [keys[i] for i in core["running"]]
        return {"core": core, "proposed": {t: keys[i] for t, i in self.proposed.items()}}

    def restore(self, state: dict) -> None:
        if state.get("core") is None:
            return
        core_now, core, index = self.core, dict(state["core"]), self.index
        if state.get("by_index"):  # converted from a pickle of an earlier version: the same candidate list
            core_now.restore(core)
            self.proposed = {t: int(i) for t, i in state["proposed"].items()}
            return
        lost = [k for k in [*(k for k, _ in core["results"]), *core["tried"]] if k not in index]
        if lost:
            warnings.warn(f"ehvi: {len(lost)} configuration(s) of the saved state are no longer candidates; "
                          "what was learnt of them is left out", stacklevel=2)
        core["results"] = [[index[k], v] for k, v in core["results"] if k in index]
        core["tried"] = [index[k] for k in core["tried"] if k in index]
        core["running"] = [index[k] for k in core["running"] if k in index]
        core_now.restore(core)
        self.proposed = {t: index[k] for t, k in state["proposed"].items() if k in index}
