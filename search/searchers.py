"""Searchers: grid (Tune's variant generator over explicit configurations) and Optuna (random, TPE, NSGA-II).

Optuna samples the campaign's space define-by-run (`spaces.suggest_config`), so conditional
dimensions (`code_size` only when `embedding: fsne`) are simply not suggested when their condition
is false.
"""
from __future__ import annotations

import math
from functools import partial

import optuna
from ray import tune
from ray.tune.search.optuna import OptunaSearch

from qkvsearch.spaces import base_config, expand_space, suggest_config


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
    if result.get("qs_status") in ("infeasible", "diverged"):
        return TS.FAIL, None
    planned = result.get("qs_epochs_planned")
    if planned is not None and result.get("epoch", 0) < planned:
        return TS.PRUNED, None
    metrics = metric if isinstance(metric, list) else [metric]
    values = [result.get(m) for m in metrics]
    if any(v is None or not math.isfinite(v) for v in values):
        return TS.FAIL, None
    return TS.COMPLETE, values


def _sampler(search: dict):
    algorithm, seed = search["algorithm"], search.get("seed")
    if algorithm == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if algorithm == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if algorithm == "nsga2":
        population = search.get("population_size") or 50
        return optuna.samplers.NSGAIISampler(population_size=population, seed=seed)
    raise ValueError(f"search.algorithm: expected one of grid, random, tpe, nsga2, given {algorithm!r}")


def build_search(spec):
    """(search_alg or None, param_space, num_samples) for a campaign spec."""
    search = spec.to_dict()["search"]
    objectives = [(o["metric"], o["mode"]) for o in spec.to_dict()["objectives"]]
    if search["algorithm"] == "grid":
        base = base_config(spec)
        variants = [{k: v for k, v in cfg.items() if base.get(k, object()) != v} for cfg in expand_space(spec)]
        repeats = search.get("repeats") or 1
        return None, {"qs_variant": tune.grid_search(variants)}, repeats
    searcher = CampaignOptunaSearch(
        space=partial(suggest_config, spec),  # define-by-run: returns the keys it chose
        metric=[m for m, _ in objectives],
        mode=[d for _, d in objectives],
        sampler=_sampler(search),
        seed=None,
    )
    return searcher, {}, search["num_trials"]
