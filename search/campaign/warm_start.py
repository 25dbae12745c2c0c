"""Warm start (``search.warm_start: <campaign folder or URI>``): a campaign's searcher first learns every
result of an earlier campaign whose configuration lies in this campaign's space, so a widened or
continued campaign does not retrain what is known.

An earlier trial counts when its record ended (completed, stopped early, diverged, failed, infeasible;
not a duplicate) and its configuration is one this campaign's space can draw, resolving to the same
training (spaces.keys.identity of the resolved config: same model, data and recipe). Such a
configuration becomes known to the wrapper (search.campaign.searchers.TrialConfigs): drawn again, it is
a duplicate trial of the earlier one (``duplicate_of: <earlier campaign>/<trial id>``, its outcome
reported, nothing trained), in records and reports like any duplicate. An Optuna searcher is also told
the earlier trial (``Study.add_trial``: COMPLETE with its objectives, PRUNED when stopped early, FAIL
otherwise, with its constraint values), before its first proposal.
"""
from __future__ import annotations

import logging
import math

from qkvsearch.search.campaign.driver import build_trial
from qkvsearch.search.records.layout import FINAL_STATUSES, read_campaign
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.keys import identity
from qkvsearch.spaces.schema import tagged

log = logging.getLogger(__name__)


def params_of(space, config: dict) -> tuple[dict, dict] | None:
    """The define-by-run parameters (spaces.trials.suggest_config) and Optuna distributions that draw
    ``config``, or None when the space cannot draw it."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    params, dists, chosen = {}, {}, {}
    if space.variants:
        index = next((i for i, v in enumerate(space.variants)
                      if all(tagged(config.get(k)) == tagged(val) for k, val in v.items())), None)
        if index is None:
            return None
        params["variant"], dists["variant"] = index, CategoricalDistribution(list(range(len(space.variants))))
        chosen.update(space.variants[index])
    for dim in space.dimensions:
        if not dim.active(chosen):
            continue
        value = config.get(dim.key)
        if dim.enumerable:
            if tagged(value) not in {tagged(v) for v in dim.values}:
                return None
            dist = CategoricalDistribution(list(dim.values))
        elif not isinstance(value, (int, float)) or isinstance(value, bool) or not dim.low <= value <= dim.high:
            return None
        elif dim.kind == "int":
            dist = IntDistribution(int(dim.low), int(dim.high), log=dim.log)
        else:
            dist = FloatDistribution(dim.low, dim.high, log=dim.log)
        params[dim.key], dists[dim.key], chosen[dim.key] = value, dist, value
    return params, dists


def known_trials(spec, base: dict) -> list[dict]:
    """The earlier campaign's trials this campaign could draw: {"key": identity, "trial": its id,
    "params", "dists", "status", "metrics": its last epoch's, "cost"}."""
    source = spec.search.warm_start.rstrip("/")
    read_campaign(source)  # CampaignFileError (BadInput) naming the file when it is not a campaign folder
    try:
        records, _ = read_trial_records(source)
    except (OSError, BadInput) as err:
        raise BadInput(f"search.warm_start: expected a campaign folder with trial records, given {source} ({err})") \
            from None
    out = []
    for rec in records:
        if rec.get("status") not in FINAL_STATUSES or rec.get("status") == "duplicate":
            continue
        config = rec.get("config") or {}
        drawn = params_of(spec.space, config)
        if drawn is None:
            continue
        params, dists = drawn
        sampled = {k: v for k, v in params.items() if k != "variant"}
        if "variant" in params:
            sampled.update(spec.space.variants[params["variant"]])
        trial = build_trial(base, sampled)
        if trial.get("invalid") or identity(trial["config"]) != identity(config):
            continue  # other data, recipe or model: not the same training
        last = rec["epochs"][-1] if rec.get("epochs") else {}
        out.append({"key": identity(config), "trial": f"{source}/{rec['trial_id']}", "params": params,
                    "dists": dists, "status": rec["status"], "metrics": dict(last), "cost": trial["cost"]})
    return out


def warm_start(spec, wrapper) -> int:
    """Tell ``wrapper`` (TrialConfigs) and its Optuna searcher the earlier campaign's known trials; -> how many."""
    known = known_trials(spec, wrapper.base)
    searcher = wrapper.searcher
    for k in known:
        if k["key"] in wrapper.first:
            continue
        wrapper.first[k["key"]] = k["trial"]
        wrapper.outcomes[k["key"]] = {"status": k["status"], "metrics": k["metrics"]}
        wrapper.warm.add(k["key"])
        if hasattr(searcher, "teller"):
            _tell(searcher, k)
        elif hasattr(searcher, "tell_known"):  # search.campaign.known_cost
            value = k["metrics"].get(searcher.metric[searcher.train])
            searcher.tell_known(k["key"], value if k["status"] == "completed" else None)
    log.info(f"search.warm_start: {len(known)} earlier trial(s) of {spec.search.warm_start} lie in this space")
    return len(known)


def _tell(searcher, k: dict) -> None:
    import optuna

    from qkvsearch.search.campaign.searchers import constraint_values

    teller = searcher.teller
    TS = optuna.trial.TrialState
    values = [k["metrics"].get(m, k["cost"].get(m)) for m, _ in teller.objectives]
    complete = k["status"] == "completed" and all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)
    state = TS.COMPLETE if complete else TS.PRUNED if k["status"] == "stopped_early" else TS.FAIL
    attrs = {f"constraints:{m}": v for m, v in constraint_values(teller.constraints, k["cost"]).items()}
    searcher._ot_study.add_trial(optuna.trial.create_trial(
        params=k["params"], distributions=k["dists"], values=[float(v) for v in values] if complete else None,
        state=state, system_attrs=attrs))
    if complete:
        teller.seen([float(v) for v in values])
