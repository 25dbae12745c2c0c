"""What a one-shot campaign derives from its spec, the same at launch and at every resume: its candidates
(the space's configurations, resolved and costed once: search.searchers.problem), the supernet's plan
(trainers.supernet.training.SupernetPlan), and the spec of the nested campaign that trains the supernet."""
from __future__ import annotations

import json

from qkvsearch.search.records.inherited import subnet_identity
from qkvsearch.search.searchers.problem import build_trial, candidate_configs
from qkvsearch.spaces import base_config, load_campaign
from qkvsearch.spaces.blocks import block_keys, split_block_key
from qkvsearch.spaces.choices import FULL_PRECISION
from qkvsearch.spaces.errors import SpecError
from qkvsearch.spaces.keys import APPLIES_WHEN, QUANT_KEYS, identity
from qkvsearch.spaces.supernet import BRANCH_KEYS

SUPERNET_DIR = "supernet"   # <exp>/supernet/: the nested campaign whose one trial trains the supernet


def candidates(spec) -> list[dict]:
    """The trials ({"config", "cost", "keys": space keys}) of the space's candidates that make a model."""
    base, out, seen = base_config(spec), [], set()
    for keys in candidate_configs(spec):
        trial = build_trial(base, keys)
        if trial.get("invalid") or subnet_identity(trial["config"]) in seen:
            continue
        seen.add(subnet_identity(trial["config"]))  # a subnet under each policy
        out.append({**trial, "keys": keys})
    if not out:
        raise SpecError(["space: expected configurations a model can be made of, given none"], spec.source)
    return out


def branch_of(config: dict, varying: list[str]) -> str:
    return json.dumps({k: config.get(k) for k in varying})


def full_precision(config: dict) -> dict:
    """The config with every part of its quantization policy at full precision: what the supernet trains (a
    policy changes no weight; a subnet is scored under its policy after extraction)."""
    return {**config, **{k: FULL_PRECISION for k in QUANT_KEYS if k in config}}


def _trained(trials: list[dict]) -> list[dict]:
    """One trial per configuration the supernet trains: the trials' configs at full precision, deduplicated."""
    out, seen = [], set()
    for t in trials:
        cfg = full_precision(t["config"])
        if identity(cfg) not in seen:
            seen.add(identity(cfg))
            out.append({**t, "config": cfg, "keys": {k: v for k, v in t["keys"].items() if k not in QUANT_KEYS}})
    return out


def supernet_plan(spec, trials: list[dict]) -> dict:
    """The plan a supernet of these trials is trained over (SupernetPlan.as_dict)."""
    trials = _trained(trials)
    configs = [t["config"] for t in trials]
    varying = [k for k in BRANCH_KEYS if len({repr(c.get(k)) for c in configs}) > 1 and k not in _follow_blocks(configs)]
    s = spec.supernet
    return {"configs": configs, "gmacs": [t["cost"]["gmacs"] for t in trials],
            "branches": [branch_of(c, varying) for c in configs], "random_subnets": s.random_subnets,
            "distill": s.distill}


def _follow_blocks(configs: list[dict]) -> set[str]:
    """Keys whose value only follows a per-block key (code sharing is set when some block is F-SNE): with
    embeddings drawn per block, a branch is the values of the keys drawn for the whole model, not 4^depth."""
    per_block = {split_block_key(k)[0] for c in configs for k in block_keys(c)}
    return {k for k, (on, _) in APPLIES_WHEN.items() if on in per_block}


def teacher(plan: dict) -> int:
    return max(range(len(plan["gmacs"])), key=lambda i: plan["gmacs"][i])


def supernet_spec(spec, exp: str, trials: list[dict], plan: dict):
    """The nested campaign at <exp>/supernet: one trial, the teacher's configuration trained with the supernet's
    recipe on its own resources (``supernet.resources`` over the campaign's); its trial settings carry the plan
    (search.campaign.driver.TrialSettings.supernet), so it trains the supernet; every checkpoint kept (the
    supernet is what is searched)."""
    d = spec.to_dict()
    for section in ("supernet", "stages", "constraints"):
        d.pop(section, None)
    d.update(name=SUPERNET_DIR, storage=exp, space={"variants": [_trained(trials)[teacher(plan)]["keys"]]},
             train={**d["train"], **dict(spec.supernet.recipe)}, search={"algorithm": "grid"},
             scheduler={"type": "fifo"}, objectives=[{"metric": "top1", "mode": "max"}],
             checkpoints={"keep": "all"},
             resources={**d["resources"], **dict(spec.supernet.resources), "max_concurrent_trials": 1})
    return load_campaign(d)


def space_hash(spec) -> str:
    """The space's identity: what an inherited evaluation's record says it was drawn from."""
    import hashlib

    return hashlib.sha256(json.dumps(spec.space.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]
