"""Which subnets train on their own, and the campaign they train in.

Chosen: the front of the campaign's objectives over the inherited scores of the feasible subnets scored
(``retrain: front``), or the ``top_k`` by non-dominated rank. Control: ``control`` configurations drawn
uniformly (seeded by the search's seed) from the space's feasible configurations, not from the scored ones: a
random sample of the space is what rank agreement is honest on (search.analysis.fidelity), where the scored
subnets are whatever the searcher chose to look at. Chosen and control subnets train under the campaign's
seed; the control ones also under the next seed, the noise floor against which the ranking is judged. The
selection is written once (search.records.inherited) so a resumed campaign retrains the same subnets. With
``retrain_from: inherited`` the chosen subnets start from the weights they inherit (their exported
checkpoints); the control subnets always start from scratch: they measure how well inherited accuracy predicts
a subnet's own training.

The retraining is an ordinary campaign (the trial path, records, trackers, report) whose space is the selected
configurations as variants, searched as a grid, always FIFO: every retrained subnet trains its planned epochs,
whatever the campaign's scheduler, so the rank figures are over finished trainings, not over survivors.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from qkvsearch.search.analysis.pareto import nondominated_mask, nondominated_ranks
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.run import CampaignRun
from qkvsearch.search.records import inherited
from qkvsearch.search.records.inherited import FIDELITY_STANDALONE
from qkvsearch.spaces import base_config
from qkvsearch.spaces.derive import fixed_trainings
from qkvsearch.spaces.keys import fill, identity
from qkvsearch.spaces.schema import violations
from qkvsearch.storage import exists

log = logging.getLogger(__name__)
MAX_DRAWS_PER_CONTROL = 200   # draws in a row that add none before the space is taken to hold no more feasible ones


def _objective(record: dict, metric: str) -> float:
    value = record["metrics"].get(metric, record["cost"].get(metric))
    return float("nan") if value is None else float(value)


def select(spec, records: list[dict], feasible=None) -> dict:
    """{"chosen": [space keys], "control": [space keys], "seed": the campaign's training seed, "retrain_from":
    where the chosen ones' training starts (scratch | inherited)}. feasible(keys, config, cost) -> whether a
    drawn configuration meets the constraints (measuring it where a constraint is on a measured cost); None:
    its counted cost against the constraints."""
    records = list({inherited.subnet_identity(r["config"]): r for r in records}.values())  # one per subnet and policy
    metrics, modes = [o.metric for o in spec.objectives], [o.mode for o in spec.objectives]
    values = np.array([[_objective(r, m) for m in metrics] for r in records], dtype=float).reshape(
        len(records), len(metrics))   # (subnets, objectives), also for none
    ok = ~np.isnan(values).any(axis=1) & np.array(
        [not violations(spec.constraints, {**r["cost"], **r["metrics"]}) for r in records], dtype=bool)
    idx = np.flatnonzero(ok)
    s = spec.supernet
    if s.retrain == "front":
        chosen = idx[nondominated_mask(values[ok], modes)].tolist()
    else:
        ranks = nondominated_ranks(values[ok], modes)
        order = np.lexsort((-values[ok][:, 0] if modes[0] == "max" else values[ok][:, 0], ranks))
        chosen = idx[order[: s.top_k]].tolist()
    chosen_keys = [records[i]["keys"] for i in chosen]
    return {"chosen": chosen_keys, "control": control_sample(spec, chosen_keys, feasible),
            "seed": int(base_config(spec)["seed"]), "retrain_from": s.retrain_from}


def control_sample(spec, chosen: list[dict], feasible=None) -> list[dict]:
    """``supernet.control`` space keys drawn uniformly from the space (seeded by the search's seed), each a
    feasible configuration, none a chosen one, no two the same subnet; fewer when MAX_DRAWS_PER_CONTROL draws in a
    row add none (the space holds no more)."""
    from qkvsearch.search.campaign.oneshot.plan import subnet_space

    space = subnet_space(spec)
    base = base_config(spec)
    rng = np.random.default_rng([spec.search.seed, 1])
    taken = {_subnet(base, keys) for keys in chosen}
    out: list[dict] = []
    missed = 0
    while len(out) < spec.supernet.control and missed < MAX_DRAWS_PER_CONTROL:
        missed += 1
        keys, _ = space.draw(rng)
        subnet = _subnet(base, keys)
        if subnet is None or subnet in taken:
            continue
        taken.add(subnet)
        config, cost = _resolved(base, keys)
        if (feasible(keys, config, cost) if feasible is not None else not violations(spec.constraints, cost)):
            out.append(keys)
            missed = 0
    return out


def _resolved(base: dict, keys: dict) -> tuple[dict, dict]:
    from qkvsearch.search.searchers.problem import build_trial

    trial = build_trial(base, keys)
    return trial["config"], trial["cost"]


def _subnet(base: dict, keys: dict) -> str | None:
    config, cost = _resolved(base, keys)
    return inherited.subnet_identity(config) if cost else None


def selection(campaign: OpenedCampaign, records: list[dict], feasible=None) -> dict:
    """The campaign's selection: the one written, else made now and written."""
    found = inherited.read_selection(campaign.exp)
    if found is None:
        found = select(campaign.spec, records, feasible)
        inherited.write_selection(campaign.exp, found)
    return found


def none_chosen(records: list[dict]) -> str:
    """Why a selection chose no subnet and drew no control one, in words (the campaign ends without retraining)."""
    failed = [r for r in records if r.get("status") == "failed"]
    if not records:
        return "no subnet was scored: every proposal broke a constraint, or no model can be made of it"
    if len(failed) == len(records):
        first = failed[0]
        error = (str(first.get("error") or "no error message").strip().splitlines() or ["no error message"])[-1]
        return f"every one of the {len(records)} subnet(s) scored failed; the first, {first['subnet_id']}: {error}"
    return f"none of the {len(records)} subnet(s) scored meets the constraints with every objective known"


def retraining(spec, chosen: dict, records: list[dict], where: str = ""):
    """The campaign the selection ``chosen`` retrains in (``retrain_spec``), or None when it plans no training (no
    subnet chosen, none drawn for the control sample): logged with why (``none_chosen``); the campaign ends there.
    ``where``: who it is for in the message ("target phone: ")."""
    if inherited.retrained_variants(chosen):
        return retrain_spec(spec, chosen)
    log.warning(f"{where}nothing to retrain: {none_chosen(records)}")
    return None


def retrain_spec(spec, chosen: dict):
    """The campaign the selected subnets train in: the spec's recipe over the trainings the selection plans
    (search.records.inherited.retrained_variants), each to its planned epochs (spaces.derive.fixed_trainings)."""
    return fixed_trainings(spec, inherited.retrained_variants(chosen), drop=("supernet",))


def selected_records(records: list[dict], chosen: dict) -> tuple[list[dict], list[dict]]:
    """(the chosen subnets' evaluations, the control subnets'), one per selected configuration."""
    by_keys = {inherited.keys_text(r["keys"]): r for r in records}

    def of(role: str) -> list[dict]:
        return [by_keys[k] for k in map(inherited.keys_text, chosen[role]) if k in by_keys]

    return of("chosen"), of("control")


def init_weights(chosen: dict, chosen_records: list[dict], files: dict[str, str]) -> dict[str, str]:
    """Training identity -> the exported weights it starts from: the chosen subnets' when the selection says
    ``retrain_from: inherited`` (the control subnets start from scratch), else none."""
    if chosen.get("retrain_from") != "inherited":
        return {}
    return {identity(fill(r["config"])): files[r["subnet_id"]] for r in chosen_records}



def retrain(target, supernet_id: str, cluster, version: str, *, concurrency=None, verbose=False, view=None) -> None:
    """The target's selected subnets trained on their own (search.campaign.oneshot.targets.Target: its folder's
    selection, evaluations and exported subnets), as its folder's trials; view: the live view, as a campaign's."""
    tc = target.campaign
    chosen, records = inherited.read_selection(tc.exp), inherited.read_evaluations(tc.exp)
    retrain_with = retraining(tc.spec, chosen, records, target.label)
    if retrain_with is None:   # a selection of none: no campaign to run
        return
    chosen_records, _ = selected_records(records, chosen)
    files = {r["subnet_id"]: inherited.subnet_file(tc.exp, r["subnet_id"]) for r in chosen_records}
    log.info(f"{target.label}retraining {len(chosen['chosen'])} chosen subnet(s) and {len(chosen['control'])} "
             "control subnet(s), these under two seeds")
    CampaignRun(replace(tc, spec=retrain_with), target.campaign_file(), cluster, version,
                init_weights=init_weights(chosen, chosen_records, files),
                describe={"fidelity": FIDELITY_STANDALONE, "supernet": supernet_id}).fit(
        concurrency, restoring=exists(f"{tc.exp}/tuner.pkl"), verbose=verbose, view=view)

