"""Searchers: grid (the space's configurations in order) and Optuna (random, TPE, NSGA-II), each wrapped
in `TrialConfigs`, which turns a suggestion into the trial's resolved config and cost, once.

Optuna samples the campaign's space define-by-run (`spaces.suggest_config`), so conditional
dimensions (`code_size` only when `embedding: fsne`) are simply not suggested when their condition
is false.
"""
from __future__ import annotations

import itertools
import math
from functools import partial

import optuna
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from qkvsearch.search.campaign.driver import build_trial, outcome_of_result
from qkvsearch.search.records.layout import ORIGINAL_STATUS_KEY
from qkvsearch.spaces import base_config, dimensions, suggest_config
from qkvsearch.spaces.keys import identity
from qkvsearch.storage import read_json, write_json


class GridSearcher(Searcher):
    """Suggests each configuration of an enumerable space in order, ``repeats`` times with successive
    seeds, then FINISHED.

    Configurations are generated as they are suggested (spaces.dimensions.iterate): a grid of 10^8 points
    costs no memory. Its state is the number suggested so far.
    """

    def __init__(self, space, repeats: int = 1, seed: int = 0):
        super().__init__()
        self.space, self.repeats, self.seed = space, repeats, seed
        self.next = 0
        self._pending = None  # iterator over the configurations not yet suggested

    def _repeated(self):
        """Each configuration, then its repeats with the next seeds (seed + 1, ...): distinct trainings."""
        for cfg in dimensions.iterate(self.space):
            seed = cfg.get("seed", self.seed)
            yield cfg
            for k in range(1, self.repeats):
                yield {**cfg, "seed": seed + k}

    def suggest(self, trial_id: str):
        if self._pending is None:
            self._pending = itertools.islice(self._repeated(), self.next, None)
        config = next(self._pending, None)
        if config is None:
            return Searcher.FINISHED
        self.next += 1
        return config

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass

    def __getstate__(self):  # Tune pickles its search algorithm (tuner.pkl): iterators do not pickle
        return {**self.__dict__, "_pending": None}

    def save(self, checkpoint_path: str):
        write_json(checkpoint_path, {"next": self.next})

    def restore(self, checkpoint_path: str):
        self.next, self._pending = read_json(checkpoint_path)["next"], None


class TrialConfigs(Searcher):
    """A searcher whose suggestions are trials: {"config": resolved config, "cost": cost} (driver.build_trial).

    Defaults, the solved width and the cost are computed here, once per trial, in the campaign's driver;
    the trial's process, its workers and the records take them from the trial's config.

    No configuration trains twice: a suggestion whose identity (spaces.keys.identity) was suggested before
    becomes a duplicate trial that reuses that trial's outcome (driver.run_trial), which the wrapped
    searcher then learns as this trial's result. An enumerating searcher (grid) skips such suggestions:
    a grid runs each distinct configuration once.
    """

    def __init__(self, searcher: Searcher, base: dict, skip_duplicates: bool = False):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.base = base
        self.skip_duplicates = skip_duplicates
        self.first: dict[str, str] = {}     # identity -> the trial that trains it
        self.identity_of: dict[str, str] = {}  # trial id -> identity (trials that train)
        self.outcomes: dict[str, dict] = {}    # identity -> outcome, once its trial has ended

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return self.searcher.set_max_concurrency(max_concurrent)

    def suggest(self, trial_id: str):
        while True:
            sampled = self.searcher.suggest(trial_id)
            if sampled is None or sampled == Searcher.FINISHED:
                return sampled
            trial = build_trial(self.base, sampled)
            if trial.get("invalid"):
                return trial
            key = identity(trial["config"])
            if key not in self.first:
                self.first[key] = trial_id
                self.identity_of[trial_id] = key
                return trial
            if not self.skip_duplicates:
                return {**trial, "duplicate_of": self.first[key], "known": self.outcomes.get(key)}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        if trial_id in self.identity_of:
            self.outcomes[self.identity_of[trial_id]] = outcome_of_result(result, error)
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    # Tune saves a wrapper's state (it has a .searcher) apart from the searcher it wraps.
    def get_state(self) -> dict:
        return {k: getattr(self, k) for k in ("base", "skip_duplicates", "first", "identity_of", "outcomes")}

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str):
        self.searcher.save(checkpoint_path)

    def restore(self, checkpoint_path: str):
        self.searcher.restore(checkpoint_path)

    def on_pause(self, trial_id: str):
        self.searcher.on_pause(trial_id)

    def on_unpause(self, trial_id: str):
        self.searcher.on_unpause(trial_id)


class CampaignOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna the truth about trials without a final score.

    Stock OptunaSearch reports an early-stopped trial's last (partial) metrics as a completed
    result. Here a trial that stopped before its planned epochs is PRUNED, and an infeasible or
    diverged one is FAIL, so neither biases the sampler.
    """

    def on_trial_complete(self, trial_id, result=None, error=False):
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return super().on_trial_complete(trial_id, result=result, error=error)
        state, values = _outcome(result, error, self.metric)
        if state is optuna.trial.TrialState.COMPLETE:
            return super().on_trial_complete(trial_id, result=result, error=error)
        try:
            self._ot_study.tell(self._ot_trials[trial_id], values, state=state)
        except (ValueError, RuntimeError) as exc:  # e.g. the trial was already told
            optuna.logging.get_logger(__name__).warning(str(exc))
        self._completed_trials.add(trial_id)


def _outcome(result, error, metric):
    """Optuna state for a finished trial's last result, and the values to tell with it."""
    TS = optuna.trial.TrialState
    if error or not result:
        return TS.FAIL, None
    status = outcome_of_result(result, error)["status"]
    if status == "duplicate":  # the outcome of the trial that trained this configuration
        status = result.get(ORIGINAL_STATUS_KEY)
    if status == "stopped_early":
        return TS.PRUNED, None
    if status in ("infeasible", "diverged", "failed"):
        return TS.FAIL, None
    metrics = metric if isinstance(metric, list) else [metric]
    values = [result.get(m) for m in metrics]
    if any(v is None or not math.isfinite(v) for v in values):
        return TS.FAIL, None
    return TS.COMPLETE, values


def _sampler(search):
    algorithm, seed = search.algorithm, search.seed
    if algorithm == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if algorithm == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if algorithm == "nsga2":
        population = search.population_size or 50
        return optuna.samplers.NSGAIISampler(population_size=population, seed=seed)
    raise ValueError(f"search.algorithm: expected one of grid, random, tpe, nsga2, given {algorithm!r}")


def build_search(spec) -> tuple[TrialConfigs, int]:
    """(search algorithm, number of trials) for a campaign spec."""
    search = spec.search
    base = base_config(spec)
    if search.algorithm == "grid":
        grid = GridSearcher(spec.space, search.repeats, base["seed"])
        return TrialConfigs(grid, base, skip_duplicates=True), dimensions.count(spec.space) * search.repeats
    searcher = CampaignOptunaSearch(
        space=partial(suggest_config, spec),  # define-by-run: returns the keys it chose
        metric=[o.metric for o in spec.objectives],
        mode=[o.mode for o in spec.objectives],
        sampler=_sampler(search),
        seed=None,
    )
    return TrialConfigs(searcher, base), search.num_trials
