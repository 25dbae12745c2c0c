"""What a one-shot campaign derives from its spec, the same at launch and at every resume: the space its supernet
serves (trainers.supernet.space.SubnetSpace: the whole space, its extremes computed), the supernet's plan
(trainers.supernet.plan), the spec of the nested campaign that trains the supernet, and a trained supernet taken
from another campaign (``supernet.from``), checked to serve this one."""
from __future__ import annotations

import json
from functools import lru_cache

from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.records.inherited import SUPERNET_DIR
from qkvsearch.spaces import base_config, load_campaign
from qkvsearch.spaces.derive import fixed_trainings
from qkvsearch.spaces.errors import BadInput, show
from qkvsearch.spaces.keys import is_policy_key, names
from qkvsearch.spaces.schema import vars_of

PLAN_FILE = "plan.json"     # <exp>/supernet/plan.json: what the supernet was trained over (``supernet.from``)
# What a supernet's weights were trained on: a supernet taken from another campaign must share every one
SAME_DATA = (*names("data"), "num_classes", "img_size", "in_chans")


def candidates(spec) -> list[dict]:
    """Every configuration of an enumerable space ({"config", "cost", "keys": space keys}), each subnet (and
    policy) once, those no model can be made of left out: what a benchmark scores or checks in full."""
    from qkvsearch.search.records.inherited import subnet_identity
    from qkvsearch.search.searchers.problem import build_trial
    from qkvsearch.spaces import dimensions

    base, out, seen = base_config(spec), [], set()
    for keys in dimensions.iterate(spec.space):
        trial = build_trial(base, keys)
        if not trial.get("invalid") and subnet_identity(trial["config"]) not in seen:
            seen.add(subnet_identity(trial["config"]))
            out.append({**trial, "keys": keys})
    return out


def subnet_space(spec):
    """The space a one-shot campaign's supernet serves (trainers.supernet.space.SubnetSpace)."""
    from qkvsearch.trainers.supernet.space import SubnetSpace

    return SubnetSpace(spec.space, base_config(spec))


def supernet_plan(spec) -> dict:
    """The plan a supernet over the spec's space is trained over (trainers.supernet.plan); made once per spec
    in a process (its extremes take seconds to search; a launch checks it before Ray starts, then uses it)."""
    return json.loads(_plan_text(json.dumps(spec.to_dict(), sort_keys=True, default=str)))


@lru_cache(maxsize=4)
def _plan_text(spec_text: str) -> str:
    from qkvsearch.trainers.supernet.plan import plan_dict

    spec = load_campaign(json.loads(spec_text))
    s = spec.supernet
    return json.dumps(plan_dict(subnet_space(spec), random_subnets=s.random_subnets, distill=s.distill))


def supernet_spec(campaign: OpenedCampaign, plan: dict):
    """The spec of the nested campaign at <exp>/supernet (exp: the campaign's folder; spaces.derive): one training,
    the teacher's configuration (in full precision) with the supernet's recipe on its own resources
    (``supernet.resources`` over the campaign's), every checkpoint kept (the supernet is what is searched). Its
    trial settings carry the plan (search.campaign.driver.TrialSettings.supernet), so it trains the supernet."""
    spec = campaign.spec
    teacher = {k: v for k, v in plan["teacher_keys"].items() if not is_policy_key(k)}
    return fixed_trainings(spec, [teacher], drop=("supernet", "stages", "constraints", "measure", "targets"),
                           name=SUPERNET_DIR, storage=campaign.exp,
                           train={**spec.train.as_dict(), **spec.supernet.recipe},
                           objectives=[{"metric": "top1", "mode": "max"}], checkpoints={"keep": "all"},
                           resources={**vars_of(spec.resources), **spec.supernet.resources, "max_concurrent_trials": 1})


def check_source(source: str, source_plan: dict, plan: dict) -> None:
    """``supernet.from``: the supernet the campaign ``source`` trained (its plan) must have been trained on this
    campaign's data, classes and image size, and hold every tensor of this campaign's space (its tensors
    sized for this plan's covers, teacher and sandwich); BadInput naming the field otherwise."""
    from qkvsearch.trainers.supernet.plan import SupernetPlan

    theirs, ours = SupernetPlan.from_dict(source_plan), SupernetPlan.from_dict(plan)
    differ = [k for k in SAME_DATA if theirs.teacher.get(k) != ours.teacher.get(k)]
    if differ:
        raise BadInput("supernet.from: expected a supernet trained on this campaign's data, classes and image size, "
                       f"given {show(source)}, trained with " + ", ".join(
                           f"{k} {theirs.teacher.get(k)!r} (this campaign: {ours.teacher.get(k)!r})" for k in differ))
    supernet = theirs.supernet(init=False)
    for cfg in (ours.teacher, ours.smallest, *(c for _, lg, sm in ours.sandwich for c in (lg, sm)), *ours.covers):
        why = supernet.serves(cfg)
        if why:
            raise BadInput(f"supernet.from: expected a supernet whose space holds this campaign's, given "
                           f"{show(source)}, which cannot run {cfg.get('embedding')} ({why})")


def space_hash(spec) -> str:
    """The space's identity: what an inherited evaluation's record says it was drawn from."""
    import hashlib

    return hashlib.sha256(json.dumps(spec.space.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]
