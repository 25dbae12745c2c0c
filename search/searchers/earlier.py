"""Warm start (``search.warm_start: <campaign folder or URI>``): the results of an earlier campaign whose
configurations lie in this campaign's space, so a widened or continued campaign does not retrain what is known.

An earlier trial counts when its record ended (completed, stopped early, diverged, failed, infeasible; not a
duplicate) and its configuration is one this campaign's space can draw (spaces.trials.params_of), resolving to
the same training (spaces.keys.identity of the resolved config: same model, data and recipe). The proposal
wrapper (search.searchers.proposals) makes each known to itself, so that drawn again it is a duplicate trial of
the earlier one (``duplicate_of: <earlier campaign>/<trial id>``, nothing trained), and tells its searcher
(``Searcher.tell_earlier``) before the first proposal.
"""
from __future__ import annotations

from qkvsearch.search.records.layout import FINAL_STATUSES, read_campaign
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.search.searchers.base import EarlierTrial
from qkvsearch.search.searchers.problem import build_trial
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.keys import identity
from qkvsearch.spaces.trials import params_of


def earlier_records(source: str) -> list[dict]:
    """The trial records of the campaign folder ``source``; BadInput naming search.warm_start when it is no
    readable campaign."""
    read_campaign(source)  # CampaignFileError (BadInput) naming the file when it is not a campaign folder
    try:
        records, _ = read_trial_records(source)
    except (OSError, BadInput) as err:
        raise BadInput(f"search.warm_start: expected a campaign folder with trial records, given {source} ({err})") \
            from None
    return records


def known_trials(spec, base: dict) -> list[EarlierTrial]:
    """The earlier campaign's trials this campaign could draw (module docstring)."""
    source = spec.search.warm_start.rstrip("/")
    out = []
    for rec in earlier_records(source):
        if rec.get("status") not in FINAL_STATUSES or rec.get("status") == "duplicate":
            continue
        config = rec.get("config") or {}
        drawn = params_of(spec.space, config)
        if drawn is None:
            continue
        params, _ = drawn
        sampled = {k: v for k, v in params.items() if k != "variant"}
        if "variant" in params:
            sampled.update(spec.space.variants[params["variant"]])
        trial = build_trial(base, sampled)
        if trial.get("invalid") or identity(trial["config"]) != identity(config):
            continue  # other data, recipe or model: not the same training
        last = rec["epochs"][-1] if rec.get("epochs") else {}
        out.append(EarlierTrial(key=identity(config), trial=f"{source}/{rec['trial_id']}", config=sampled,
                                status=rec["status"], values=dict(last), cost=trial["cost"]))
    return out
