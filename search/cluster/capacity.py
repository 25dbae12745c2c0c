"""What a cluster can hold: the resources it has now and, on an autoscaling cluster, what its autoscaler
can add. One trial is refused only when no node, present or addable, could hold it; otherwise the campaign
plans for what the cluster can grow to, Tune waits for it, and the campaign says in one line what it waits for.

What an autoscaler can add is known three ways, best first:
- its node types, where the autoscaler reported its config to Ray's GCS (`node_types`; hosted platforms);
- its own verdict: Ray's v2 autoscaler (KubeRay, `ray up` with `RAY_enable_autoscaler_v2=1`) answers a
  resource request with "infeasible" when no node type it may add can hold it (`autoscaler_can_hold`);
- nothing: Ray's v1 autoscaler adds nodes but reports nothing a driver can read of what it could add.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from qkvsearch import ray_private
from qkvsearch.spaces.errors import BadInput

log = logging.getLogger(__name__)
UNBOUNDED = 10**6        # "no limit" in counts of nodes or trials
VERDICT_TIMEOUT_S = 60.0  # how long `launch` waits for the autoscaler to judge one trial (it runs every 5 s)


class ResourceError(BadInput):
    """The campaign asks for more per trial than the machine (or the cluster) has."""


@dataclass(frozen=True)
class NodeType:
    name: str
    cpus: float
    gpus: float
    max_count: int          # nodes of this type the autoscaler may run (UNBOUNDED: no limit)


@dataclass
class Cluster:
    cpus: float
    gpus: float
    trial_slots: float
    dashboard_url: str | None
    started_here: bool
    node_types: list[NodeType] = field(default_factory=list)  # what its autoscaler can add, where known
    autoscaler: str | None = None  # "v2", "v1": an autoscaler runs and may add nodes; None: the nodes are all
    waiting_for: str = ""  # set by plan_concurrency: what the campaign waits for the autoscaler to add


def trial_bundles(resources) -> list[dict]:
    """One trial's workers as resource bundles (resources: spaces.schema.ResourcesSpec); STRICT_PACK puts
    them on one node, so they must fit one node together."""
    one = {k: v for k, v in (("CPU", resources.cpus_per_worker), ("GPU", resources.gpus_per_worker)) if v}
    if resources.placement_strategy.upper() == "STRICT_PACK":
        return [{k: v * resources.workers_per_trial for k, v in one.items()}]
    return [dict(one) for _ in range(resources.workers_per_trial)]


def plan_concurrency(resources, cluster: Cluster, ask=None) -> int:
    """How many trials can run at once; fails fast when one trial cannot fit at all, now or once the
    autoscaler has added what it can. ask(bundles) -> True | False | None: the autoscaler's verdict on
    one trial (autoscaler_can_hold), asked only when the trial does not fit what is present and the
    cluster's node types are not known; None: it gave none."""
    workers, cpw, gpw = resources.workers_per_trial, resources.cpus_per_worker, resources.gpus_per_worker
    need_cpu, need_gpu = workers * cpw, workers * gpw
    cpus, gpus = cluster.cpus, cluster.gpus
    if cluster.node_types:
        cpus, gpus = _grown(cluster, cpw, gpw)
    if need_cpu > cluster.cpus or need_gpu > cluster.gpus:  # not now: can the cluster grow to hold it?
        verdict = None
        if cluster.node_types:
            holds = need_cpu <= cpus and need_gpu <= gpus
        elif cluster.autoscaler is None:
            holds = False
        else:
            verdict = ask(trial_bundles(resources)) if ask is not None else None
            holds = verdict is not False
        if not holds:
            raise ResourceError(_refusal(resources, cluster, judged=verdict is False))
        cluster.waiting_for = _waiting(resources, cluster, cpw, gpw, verdict)
    fits = int(cpus // need_cpu) if need_cpu else UNBOUNDED
    if need_gpu:
        fits = min(fits, int(gpus // need_gpu))
    wanted = resources.max_concurrent_trials
    if wanted == "auto":
        limit = max(1, fits)  # node types unknown: what fits now (at least the trial the autoscaler makes room for)
    elif cluster.autoscaler is not None and not cluster.node_types:
        limit = int(wanted)  # an autoscaler that says nothing of its size: as many as asked, Tune waits
    else:
        limit = min(int(wanted), fits)
    if cluster.trial_slots:
        limit = min(limit, int(cluster.trial_slots))
    return max(1, min(limit, UNBOUNDED))


def outgrows(resources, cluster: Cluster, concurrency: int) -> bool:
    """Whether `concurrency` trials at once need more than the nodes present: the autoscaler adds nodes."""
    need_cpu = concurrency * resources.workers_per_trial * resources.cpus_per_worker
    need_gpu = concurrency * resources.workers_per_trial * resources.gpus_per_worker
    return need_cpu > cluster.cpus or need_gpu > cluster.gpus


def _holding(cluster: Cluster, cpw: float, gpw: float) -> list[NodeType]:
    """Node types that can hold one worker and that the autoscaler may start."""
    return [t for t in cluster.node_types if t.max_count > 0 and t.cpus >= cpw and t.gpus >= gpw]


def _grown(cluster: Cluster, cpw: float, gpw: float) -> tuple[float, float]:
    """CPUs and GPUs the cluster can reach, counting only nodes that can hold a worker."""
    types = _holding(cluster, cpw, gpw)
    return (cluster.cpus + sum(t.cpus * t.max_count for t in types),
            cluster.gpus + sum(t.gpus * t.max_count for t in types))


def _needs(resources) -> str:
    workers, cpw, gpw = resources.workers_per_trial, resources.cpus_per_worker, resources.gpus_per_worker
    return (f"one trial needs {workers} workers x ({cpw:g} CPU, {gpw:g} GPU) = {workers * cpw:g} CPUs, "
            f"{workers * gpw:g} GPUs")


def _waiting(resources, cluster: Cluster, cpw: float, gpw: float, verdict: bool | None) -> str:
    line = (f"waiting for the autoscaler: {_needs(resources)}; the cluster has {cluster.cpus:g} CPUs, "
            f"{cluster.gpus:g} GPUs now")
    if cluster.node_types:
        return line + " and can add " + ", ".join(f"{t.name} ({t.cpus:g} CPU, {t.gpus:g} GPU)"
                                                  for t in _holding(cluster, cpw, gpw))
    if verdict:
        return line + "; its autoscaler says it can make room"
    return line + ("; its autoscaler does not say what it can add: if no node type can hold a worker, the "
                   "campaign waits until stopped")


def _refusal(resources, cluster: Cluster, judged: bool = False) -> str:
    if cluster.node_types:
        grow = "; its autoscaler can add " + ", ".join(f"{t.name} ({t.cpus:g} CPU, {t.gpus:g} GPU, up to {t.max_count})"
                                                       for t in cluster.node_types)
    elif judged:
        grow = "; its autoscaler reports that no node type it may add can make room for one trial"
    else:
        grow = ""
    return (f"resources: {_needs(resources)}, but the cluster has {cluster.cpus:g} CPUs, {cluster.gpus:g} GPUs"
            f"{grow}; lower resources.workers_per_trial or resources.cpus_per_worker / gpus_per_worker")


# ------------------------------------------------------------------------------------------- Ray's side
def node_types() -> list[NodeType]:
    """The node types of the connected cluster's autoscaler config, where its autoscaler reported it to the
    GCS; [] otherwise."""
    try:
        config = ray_private.cluster_config()
    except Exception as exc:  # noqa: BLE001  (an older or newer Ray: plan for what is present)
        log.debug("autoscaler config not read: %s", exc)
        return []
    if config is None:
        return []
    return [NodeType(g.name, float(g.resources.get("CPU", 0)), float(g.resources.get("GPU", 0)),
                     UNBOUNDED if g.max_count < 0 else int(g.max_count))
            for g in config.node_group_configs]


def autoscaler() -> str | None:
    """Which autoscaler runs on the connected cluster: "v2" (it reports its state to the GCS; one that may
    add nothing says so when asked: autoscaler_can_hold), "v1" (one started with an autoscaling config), or
    None. Every head runs a v1 monitor; without an autoscaling config it only mirrors the nodes started by
    hand, each its own node type named after the node: that one adds nothing."""
    try:
        if _autoscaling_state().autoscaler_state_version > 0:
            return "v2"
    except Exception as exc:  # noqa: BLE001  (private API of another Ray: try v1's status)
        log.debug("v2 autoscaler state not read: %s", exc)
    try:
        types, format_readonly_node_type = ray_private.v1_autoscaler_node_types()
        if types and any(t != format_readonly_node_type(node) for node, t in types.items()):
            return "v1"
    except Exception as exc:  # noqa: BLE001
        log.debug("v1 autoscaler status not read: %s", exc)
    return None


def autoscaler_can_hold(bundles: list[dict], timeout_s: float = VERDICT_TIMEOUT_S) -> bool | None:
    """Ask the v2 autoscaler whether it can make room for `bundles` at once (Ray's public
    `request_resources`), wait for its next round to judge the request, then withdraw it: Tune's trials ask
    for what they need themselves. True or False: its verdict; None: none came within timeout_s."""
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)
    try:
        asked_at = _cluster_status().cluster_resource_state.cluster_resource_state_version
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            state = _autoscaling_state()
            if state.last_seen_cluster_resource_state_version > asked_at:  # a round that saw the request
                return not state.infeasible_cluster_resource_constraints
            time.sleep(0.5)
        return None
    finally:
        request_resources(bundles=[])


def _cluster_status():
    return ray_private.cluster_status()


def _autoscaling_state():
    return ray_private.cluster_status().autoscaling_state
