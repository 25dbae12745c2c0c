"""What a cluster can hold: the resources it has now and, on an autoscaling cluster, the node types its
autoscaler can add (Ray's cluster config, as the autoscaler reported it to the GCS). One trial is refused
only when no node, present or addable, could hold one of its workers, or all of them together could not
hold the trial; otherwise the campaign plans for what the cluster can grow to and Tune waits for it."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from qkvsearch.search.preflight import ResourceError

log = logging.getLogger(__name__)
UNBOUNDED = 10**6  # "no limit" in counts of nodes or trials


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
    node_types: list[NodeType] = field(default_factory=list)  # what its autoscaler can add ([]: none)
    waiting_for: str = ""  # set by plan_concurrency: what the campaign waits for the autoscaler to add


def node_types() -> list[NodeType]:
    """The node types of the connected cluster's autoscaler config; [] without an autoscaler."""
    try:
        from ray._private.state import state  # private: the cluster config has no public accessor

        config = state.get_cluster_config()
    except Exception as exc:  # noqa: BLE001  (an older or newer Ray: plan for what is present)
        log.debug("autoscaler config not read: %s", exc)
        return []
    if config is None:
        return []
    return [NodeType(g.name, float(g.resources.get("CPU", 0)), float(g.resources.get("GPU", 0)),
                     UNBOUNDED if g.max_count < 0 else int(g.max_count))
            for g in config.node_group_configs]


def plan_concurrency(resources, cluster: Cluster) -> int:
    """How many trials can run at once (resources: spaces.schema.ResourcesSpec); fails fast when one
    trial cannot fit at all, now or once the autoscaler has added what it can."""
    workers, cpw, gpw = resources.workers_per_trial, resources.cpus_per_worker, resources.gpus_per_worker
    need_cpu, need_gpu = workers * cpw, workers * gpw
    cpus, gpus = cluster.cpus, cluster.gpus
    if need_cpu > cpus or need_gpu > gpus:
        cpus, gpus = _grown(cluster, cpw, gpw)
        if need_cpu > cpus or need_gpu > gpus:
            raise ResourceError(_refusal(resources, cluster))
        cluster.waiting_for = (
            f"waiting for the autoscaler: one trial needs {need_cpu:g} CPUs, {need_gpu:g} GPUs; the cluster has "
            f"{cluster.cpus:g} CPUs, {cluster.gpus:g} GPUs now and can add "
            + ", ".join(f"{t.name} ({t.cpus:g} CPU, {t.gpus:g} GPU)" for t in _holding(cluster, cpw, gpw)))
    fits = int(cpus // need_cpu) if need_cpu else UNBOUNDED
    if need_gpu:
        fits = min(fits, int(gpus // need_gpu))
    wanted = resources.max_concurrent_trials
    limit = fits if wanted == "auto" else min(int(wanted), fits)
    if cluster.trial_slots:
        limit = min(limit, int(cluster.trial_slots))
    return max(1, min(limit, UNBOUNDED))


def _holding(cluster: Cluster, cpw: float, gpw: float) -> list[NodeType]:
    """Node types that can hold one worker and that the autoscaler may start."""
    return [t for t in cluster.node_types if t.max_count > 0 and t.cpus >= cpw and t.gpus >= gpw]


def _grown(cluster: Cluster, cpw: float, gpw: float) -> tuple[float, float]:
    """CPUs and GPUs the cluster can reach, counting only nodes that can hold a worker."""
    types = _holding(cluster, cpw, gpw)
    return (cluster.cpus + sum(t.cpus * t.max_count for t in types),
            cluster.gpus + sum(t.gpus * t.max_count for t in types))


def _refusal(resources, cluster: Cluster) -> str:
    workers, cpw, gpw = resources.workers_per_trial, resources.cpus_per_worker, resources.gpus_per_worker
    grow = ("; its autoscaler can add " + ", ".join(f"{t.name} ({t.cpus:g} CPU, {t.gpus:g} GPU, up to {t.max_count})"
                                                    for t in cluster.node_types)
            if cluster.node_types else "")
    return (f"resources: one trial needs {workers} workers x ({cpw:g} CPU, {gpw:g} GPU) = {workers * cpw:g} CPUs, "
            f"{workers * gpw:g} GPUs, but the cluster has {cluster.cpus:g} CPUs, {cluster.gpus:g} GPUs{grow}; lower "
            f"resources.workers_per_trial or resources.cpus_per_worker / gpus_per_worker")
