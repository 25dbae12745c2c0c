"""A campaign's search problem (search.searchers.base.Problem) made from its spec, and a suggestion made into
the trial Tune holds (``build_trial``): the one place a drawn configuration is resolved and costed.

A trial is ``{"config": resolved trial config, "cost": cost}``, or ``{"config": the raw config, "cost": {},
"invalid": message}`` when no model can be made of it (search.campaign.driver runs it).
"""
from __future__ import annotations

from functools import partial

from qkvsearch.search.searchers.base import Problem
from qkvsearch.spaces import base_config, dimensions, suggest_config
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.metrics import COUNTED_METRICS
from qkvsearch.spaces.trials import neighbour_config, params_of

MAX_CANDIDATES = 4096   # ehvi: candidates drawn from a space of ranges (or from a grid larger than this)


def build_trial(base: dict, sampled: dict) -> dict:
    """The campaign's fixed keys, then what the searcher chose, resolved once (trainers.model.cost.resolve_trial).
    Optuna also samples the index of the variant it drew (``variant``), which is not a trial key."""
    from qkvsearch.trainers.model.cost import resolve_trial  # timm: the campaign's driver only

    raw = {**base, **{k: v for k, v in sampled.items() if k != "variant"}}
    try:
        config, cost = resolve_trial(raw)
    except BadInput as err:  # e.g. a ratio drawn from a range that leaves less than one channel
        return {"config": raw, "cost": {}, "invalid": str(err)}
    return {"config": config, "cost": cost}


def candidate_configs(spec) -> list[dict]:
    """The space keys of ehvi's candidates: every configuration of an enumerable space of at most
    MAX_CANDIDATES, else MAX_CANDIDATES drawn from the space with the campaign's seed (duplicates dropped), a
    sample ehvi then grows by the neighbours of its best (Problem.neighbour, search.searchers.ehvi)."""
    space = spec.space
    if not samples_space(spec):
        return list(dimensions.iterate(space))
    import optuna  # only to draw from a space too large to enumerate

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


def samples_space(spec) -> bool:
    """Whether ehvi's candidates are a sample of the space (candidate_configs), not every configuration."""
    space = spec.space
    return not (space.enumerable and dimensions.count(space) <= MAX_CANDIDATES)


def _costs(base: dict, configs: list[dict]) -> tuple[list[dict], list[bool]]:
    trials = [build_trial(base, c) for c in configs]
    return [t["cost"] for t in trials], [not t.get("invalid") for t in trials]


def _candidates(spec, base: dict) -> tuple[list[dict], list[dict], list[bool]]:
    configs = candidate_configs(spec)
    return (configs, *_costs(base, configs))


def spec_problem(spec, storage=None) -> Problem:
    """The problem of a campaign's spec; storage: an Optuna storage its study is to live in (a tracker's)."""
    base, search = base_config(spec), spec.search
    return Problem(
        objectives=tuple((o.metric, o.mode) for o in spec.objectives), constraints=tuple(spec.constraints),
        known=COUNTED_METRICS, seed=search.seed, num_trials=search.num_trials,
        draw=partial(suggest_config, spec), params_of=partial(params_of, spec.space),
        configurations=partial(dimensions.iterate, spec.space), candidates=partial(_candidates, spec, base),
        neighbour=partial(neighbour_config, spec.space) if samples_space(spec) else None, costs=partial(_costs, base),
        repeats=search.repeats, train_seed=base["seed"], population_size=search.population_size,
        n_startup_trials=search.n_startup_trials, storage=storage,
        study_name=spec.name if storage is not None else None)
