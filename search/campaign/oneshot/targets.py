"""Deployment targets (the campaign file's ``targets``, spaces.targets): one supernet, trained once, serves every
target; each then has phases of its own, in its own folder (search.records.inherited.target_dir):

    <exp>/targets/<name>/   a campaign folder whose spec is the target's (``target_spec``, spaces.derive): the
                            campaign's, its supernet taken from the campaign (``supernet.from``), its objectives
                            the target's, its constraints the campaign's and the target's added up (the tighter
                            bound wins), its space cut to the target's precisions, its measurements made on the
                            target's resources and cached apart from the other targets'

and in it, one target after the other: scoring (the campaign's searcher over the target's space, the
target's proposal rules; a subnet another target scored already is recorded with that score, not scored
again), the chosen subnets' costs measured for real where they were predicted, the selection, the export, and
(``retrain: true``) the retraining of the chosen subnets. Every phase resumes from its records, as a one-shot
campaign's do.

Before anything trains: a target whose resources no node of the cluster has is refused, naming it
(``check_placeable``), and so is a counted constraint the space's smallest subnet breaks (``check_reachable``).
"""
from __future__ import annotations

import logging
from dataclasses import replace

from qkvsearch.search.campaign.measured import CACHE_DIR
from qkvsearch.search.campaign.oneshot.evaluation import Scoring, export_subnets, subnet_key
from qkvsearch.search.campaign.oneshot.plan import space_hash
from qkvsearch.search.campaign.oneshot.retrain import init_weights, none_chosen, retraining, selected_records
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.run import CampaignRun
from qkvsearch.search.cluster.capacity import ResourceError
from qkvsearch.search.records import inherited
from qkvsearch.search.records.inherited import FIDELITY_STANDALONE, PREDICTOR_FILE, TARGETS_DIR, target_dir
from qkvsearch.search.records.layout import CAMPAIGN_FILE, CampaignFolder
from qkvsearch.spaces.derive import derived
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.metrics import COUNTED_METRICS
from qkvsearch.spaces.schema import added_up, vars_of
from qkvsearch.spaces.targets import DEVICE_RESOURCES, target_space
from qkvsearch.storage import exists, write_json

log = logging.getLogger(__name__)


def target_spec(spec, exp: str, target):
    """The campaign a target's phases run as (module docstring); the same at launch and at every resume."""
    cache = f"{(spec.measure.cache or f'{exp}/{CACHE_DIR}').rstrip('/')}/{TARGETS_DIR}/{target.name}"
    supernet = replace(spec.supernet, source=spec.supernet.source or exp.rstrip("/"),
                       control=spec.supernet.control if target.retrain else 0)
    return derived(spec, drop=("targets",), name=target.name, storage=f"{exp.rstrip('/')}/{TARGETS_DIR}",
                   objectives=[vars_of(o) for o in target.objectives or spec.objectives],
                   constraints={c.metric: c.to_dict() for c in added_up(spec.constraints, target.constraints)},
                   space=target_space(spec.space, target.precisions).to_dict(),
                   measure=replace(spec.measure, cache=cache, resources=target.resources).to_dict(),
                   supernet=supernet.to_dict())


def check_placeable(targets) -> None:
    """Every target's resources are on some live node of the cluster (ResourceError naming the target, else)."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for i, target in enumerate(targets):
        wanted = {k: v for k, v in target.resources.items()}
        if not any(all(node.get(k, 0.0) >= v for k, v in wanted.items()) for node in nodes):
            names = sorted({k for node in nodes for k in node if not k.startswith("node:")
                            and k not in ("memory", "object_store_memory") and k not in DEVICE_RESOURCES})
            raise ResourceError(
                f"targets[{i}].resources: expected resources a node of the cluster has, given "
                f"{dict(wanted)} for target {target.name!r}; the nodes have "
                + "; ".join(", ".join(f"{k} {v:g}" for k, v in sorted(n.items()) if k in wanted or k in
                                      DEVICE_RESOURCES) for n in nodes)
                + f" (custom resources: {', '.join(names) or 'none'}); declare them to the node "
                  "(ray start --resources, or QKVSEARCH_RAY_RESOURCES for a local Ray)")


def check_reachable(spec, plan: dict) -> None:
    """No counted max, the campaign's or a target's, is broken by the space's smallest subnet (by counted MACs, as
    the supernet's plan finds it): a campaign or target no subnet can serve is refused, naming the constraint."""
    from qkvsearch.spaces import base_config
    from qkvsearch.spaces.keys import fill
    from qkvsearch.trainers.model.cost import model_cost

    cost = model_cost(fill({**base_config(spec), **plan["smallest"]}))
    for where, constraints in (("constraints", spec.constraints),
                               *((f"targets[{i}].constraints", t.constraints) for i, t in enumerate(spec.targets))):
        for c in constraints:
            if c.metric in COUNTED_METRICS and c.max is not None and cost.get(c.metric, -1.0) > c.max:
                raise BadInput(f"{where}.{c.metric}: expected a bound the space's smallest subnet meets, given "
                               f"{c.to_dict()}, which it breaks ({c.metric} {cost[c.metric]:.4g}): no subnet "
                               "of the space can serve it")


def score_targets(campaign: OpenedCampaign, scorers, supernet_id: str, version: str) -> list:
    """Every target's scoring, selection and export, one target after the other (module docstring); scorers:
    the pool over the trained supernet (search.campaign.oneshot.scorers.ScorerPool); -> [(target, its opened
    campaign)]."""
    spec, exp = campaign.spec, campaign.exp
    known: dict = {}
    opened = []
    for target in spec.targets:
        tspec, tdir = target_spec(spec, exp, target), target_dir(exp, target.name)
        if not exists(f"{tdir}/{CAMPAIGN_FILE}"):
            CampaignFolder.create(tdir, tspec, version)
        opened.append((target, OpenedCampaign(tspec, tdir)))
        _learn(known, inherited.read_evaluations(tdir), tdir)
    for target, tc in opened:
        log.info(f"target {target.name}: scoring subnets under its constraints ({tc.exp})")
        scoring = Scoring(tc, scorers, supernet_id, space_hash(tc.spec), known)
        chosen, records = scoring.choose()
        if scoring.predictor is not None:
            write_json(f"{tc.exp}/{PREDICTOR_FILE}", {"target": target.name, **scoring.predictor_report()})
        _learn(known, records, tc.exp)
        chosen_records, control_records = selected_records(records, chosen)
        export_subnets(tc.exp, scorers, supernet_id, chosen_records + control_records)
        if chosen["chosen"]:
            log.info(f"target {target.name}: {len(chosen['chosen'])} subnet(s) chosen and exported")
        else:
            log.warning(f"target {target.name}: no subnet chosen: {none_chosen(records)}")
    return opened


def retrain_targets(opened: list, supernet_id: str, cluster, version: str, *, concurrency=None,
                    verbose=False, view=None) -> None:
    """The chosen subnets of every target with ``retrain: true``, each target's as its folder's campaign."""
    for target, tc in opened:
        if target.retrain:
            _retrain(tc, supernet_id, cluster, version, concurrency, verbose, view)


def _learn(known: dict, records: list[dict], folder: str) -> None:
    """Scores another target may take: those this folder scored itself (not taken from another)."""
    for r in records:
        if r.get("status", "completed") == "completed" and not r.get("scored_in"):
            known.setdefault(subnet_key(r["config"]), (r["metrics"], folder))


def _retrain(tc: OpenedCampaign, supernet_id: str, cluster, version: str, concurrency, verbose, view) -> None:
    chosen = inherited.read_selection(tc.exp)
    records = inherited.read_evaluations(tc.exp)
    retrain_with = retraining(tc.spec, chosen, records, f"target {tc.spec.name}: ")
    if retrain_with is None:   # a selection of none: no campaign to run
        return
    chosen_records, _ = selected_records(records, chosen)
    files = {r["subnet_id"]: inherited.subnet_file(tc.exp, r["subnet_id"]) for r in chosen_records}
    log.info(f"target {tc.spec.name}: retraining {len(chosen['chosen'])} chosen subnet(s)")
    CampaignRun(replace(tc, spec=retrain_with), CampaignFolder.open(tc.exp), cluster, version,
                init_weights=init_weights(chosen, chosen_records, files),
                describe={"fidelity": FIDELITY_STANDALONE, "supernet": supernet_id}).fit(
        concurrency, restoring=exists(f"{tc.exp}/tuner.pkl"), verbose=verbose, view=view)
