"""``search.algorithm: ehvi``: expected hypervolume improvement with the cost objectives known.

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

Candidates: every configuration of an enumerable space up to MAX_CANDIDATES, else MAX_CANDIDATES drawn
from it (seeded); the first START trials are drawn at random among them. Measured with
benchmarks/bench_search.py --searchers (benchmarks/README.md).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from ray.tune.search import Searcher
from scipy.stats import norm

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
    from qkvsearch.search.analysis.pareto import nondominated_mask

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


def _fit(x: np.ndarray, y: np.ndarray, kernel=None):
    """A GP regression of y on x: constant x Matern-5/2 with one length scale per feature, plus noise;
    given a fitted ``kernel``, its hyperparameters are kept (no optimisation: a Cholesky solve)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    fixed = kernel is not None
    kernel = kernel or ConstantKernel(1.0) * Matern(length_scale=np.full(x.shape[1], 2.0), nu=2.5) + WhiteKernel(1e-2)
    gp = GaussianProcessRegressor(kernel, normalize_y=True, n_restarts_optimizer=0, random_state=0,
                                  optimizer=None if fixed else "fmin_l_bfgs_b")
    with warnings.catch_warnings():  # length scales at their bounds: features that do not matter
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(x, y)
    return gp


def candidate_configs(spec) -> list[dict]:
    """The space keys of the candidates: every configuration of an enumerable space of at most
    MAX_CANDIDATES, else MAX_CANDIDATES drawn from the space with the campaign's seed (duplicates dropped)."""
    import optuna

    from qkvsearch.spaces import dimensions, suggest_config

    space = spec.space
    if space.enumerable and dimensions.count(space) <= MAX_CANDIDATES:
        return list(dimensions.iterate(space))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=spec.search.seed))
    out, seen = [], set()
    for _ in range(MAX_CANDIDATES):
        config = suggest_config(spec, study.ask())
        key = repr(sorted(config.items()))
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out


class KnownCostSearch(Searcher):
    """``search.algorithm: ehvi`` in a campaign, a Tune Searcher (wrapped in
    search.campaign.searchers.TrialConfigs): candidates from the space (``candidate_configs``), their cost
    as a trial's (driver.build_trial), a suggestion their space keys. Built at the first suggestion."""

    def __init__(self, spec):
        from qkvsearch.spaces.keys import COUNTED_METRICS

        super().__init__()
        self.spec = spec
        self._metric = [o.metric for o in spec.objectives]
        self._mode = [o.mode for o in spec.objectives]
        self.costs = [o for o in spec.objectives if o.metric in COUNTED_METRICS]
        self.train = next(i for i, o in enumerate(spec.objectives) if o.metric not in COUNTED_METRICS)
        self.core: KnownCostEHVI | None = None
        self.candidates: list[dict] = []
        self.identities: dict[str, int] = {}   # trial identity (spaces.keys.identity) -> candidate
        self.trial_of: dict[str, int] = {}
        self.known: dict[str, float | None] = {}  # identity -> training objective, told before the build
        self.progress: dict | None = None         # what a pickled core had learnt (its candidates are rebuilt)

    def _build(self) -> None:
        from qkvsearch.search.analysis.pareto import to_minimise
        from qkvsearch.search.campaign.driver import build_trial
        from qkvsearch.spaces import base_config
        from qkvsearch.spaces.keys import identity
        from qkvsearch.spaces.schema import violations

        base = base_config(self.spec)
        self.candidates = candidate_configs(self.spec)
        trials = [build_trial(base, c) for c in self.candidates]
        cost = to_minimise([[t["cost"].get(o.metric, math.inf) for o in self.costs] for t in trials],
                           [o.mode for o in self.costs])
        feasible = [not t.get("invalid") and not violations(self.spec.constraints, t["cost"]) for t in trials]
        self.identities = {identity(t["config"]): i for i, t in enumerate(trials) if not t.get("invalid")}
        search = self.spec.search
        self.core = KnownCostEHVI(encode(self.candidates), cost, feasible, self.mode[self.train] == "max",
                                  search.seed, search.n_startup_trials or START)
        for key, value in self.known.items():
            if key in self.identities:
                self.core.observe(self.identities[key], value)
        if self.progress:
            self.core.__dict__.update(self.progress)
            self.progress = None

    def __getstate__(self):
        """Without the candidates, their features and costs (megabytes, saved with every Tune checkpoint):
        they are made again, identically, from the spec and its seed."""
        state = {**self.__dict__, "candidates": [], "identities": {}, "core": None}
        if self.core is not None:
            state["progress"] = {k: getattr(self.core, k) for k in ("results", "tried", "running", "rng", "kernel")}
        return state

    def tell_known(self, key: str, value: float | None) -> None:
        """An earlier campaign's result for the configuration of identity ``key`` (search.warm_start)."""
        self.known[key] = value
        if self.core is not None and key in self.identities:
            self.core.observe(self.identities[key], value)

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return True

    def suggest(self, trial_id: str):
        if self.core is None:
            self._build()
        pick = self.core.propose()
        if pick is None:
            return Searcher.FINISHED
        self.trial_of[trial_id] = pick
        return dict(self.candidates[pick])

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        pass

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        import optuna

        from qkvsearch.search.campaign.searchers import outcome_state

        pick = self.trial_of.pop(trial_id, None)
        if pick is None:
            return
        state, values = outcome_state(result, error, self.metric)
        self.core.observe(pick, values[self.train] if state == optuna.trial.TrialState.COMPLETE else None)

    def save(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__getstate__(), f)

    def restore(self, checkpoint_path: str) -> None:
        import pickle

        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))

