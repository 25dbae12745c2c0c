"""Deployment targets (the campaign file's ``targets``, spaces.targets): one supernet, trained once, serves every
target; each then has phases of its own, in a folder of its own (search.records.inherited.target_dir). A campaign
without targets is one target: the campaign itself, in its own folder, whose chosen subnets retrain.

    <exp>/targets/<name>/   a campaign folder whose spec is the target's (``target_spec``, spaces.derive): the
                            campaign's, its supernet taken from the campaign (``supernet.from``), its objectives
                            the target's, its constraints the campaign's and the target's added up (the tighter
                            bound wins), its space cut to the target's precisions, its measurements made on the
                            target's resources and cached apart from the other targets'

In each folder, one target after the other (search.campaign.oneshot.phases): scoring, the chosen subnets' costs
measured for real where they were predicted, the selection and the export (search.campaign.oneshot.evaluation);
then, for each target that retrains, the retraining (search.campaign.oneshot.retrain). Every phase resumes from
its records.

Before anything trains: a target whose resources no node of the cluster has is refused, naming it
(``check_placeable``), and so is a counted constraint the space's smallest subnet breaks (``check_reachable``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from qkvsearch.search.campaign.measured import CACHE_DIR
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.cluster.capacity import ResourceError
from qkvsearch.search.records.inherited import TARGETS_DIR, target_dir
from qkvsearch.search.records.layout import CAMPAIGN_FILE, CampaignFolder
from qkvsearch.spaces.derive import derived
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.metrics import COUNTED_METRICS
from qkvsearch.spaces.schema import FrozenMap, added_up, vars_of
from qkvsearch.spaces.targets import DEVICE_RESOURCES, target_space
from qkvsearch.storage import exists


@dataclass(frozen=True)
class Target:
    """Where one target's phases run: ``name`` (None: the campaign itself), its campaign (the spec its phases run
    as, and its folder), whether its chosen subnets retrain, and its folder's campaign file where it is open
    already (the campaign's own; a target's is opened when it retrains: ``campaign_file``)."""

    name: str | None
    campaign: OpenedCampaign
    retrains: bool
    folder: CampaignFolder | None = None

    def campaign_file(self) -> CampaignFolder:
        return self.folder if self.folder is not None else CampaignFolder.open(self.campaign.exp)

    @property
    def label(self) -> str:
        """What a log line about it starts with."""
        return "" if self.name is None else f"target {self.name}: "


def campaign_targets(campaign: OpenedCampaign, folder: CampaignFolder, version: str) -> list[Target]:
    """The campaign's targets, each folder made the first time (module docstring); folder: the campaign's own."""
    spec, exp = campaign.spec, campaign.exp
    if not spec.targets:
        return [Target(None, campaign, True, folder)]
    out = []
    for target in spec.targets:
        tspec, tdir = target_spec(spec, exp, target), target_dir(exp, target.name)
        if not exists(f"{tdir}/{CAMPAIGN_FILE}"):
            CampaignFolder.create(tdir, tspec, version)
        out.append(Target(target.name, OpenedCampaign(tspec, tdir), target.retrain))
    return out


def target_spec(spec, exp: str, target):
    """The campaign a target's phases run as (module docstring); the same at launch and at every resume."""
    cache = f"{(spec.measure.cache or f'{exp}/{CACHE_DIR}').rstrip('/')}/{TARGETS_DIR}/{target.name}"
    supernet = replace(spec.supernet, source=spec.supernet.source or exp.rstrip("/"),
                       control=spec.supernet.control if target.retrain else 0)
    return derived(spec, drop=("targets",), name=target.name, storage=f"{exp.rstrip('/')}/{TARGETS_DIR}",
                   objectives=[vars_of(o) for o in target.objectives or spec.objectives],
                   constraints={c.metric: c.to_dict() for c in added_up(spec.constraints, target.constraints)},
                   space=target_space(spec.space, target.precisions).to_dict(),
                   measure=replace(spec.measure, cache=cache, resources=FrozenMap(target.node_resources())).to_dict(),
                   supernet=supernet.to_dict())


def check_placeable(targets) -> None:
    """Every target's resources are on some live node of the cluster (ResourceError naming the target, else)."""
    if not targets:
        return
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for i, target in enumerate(targets):
        wanted = target.node_resources()
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
