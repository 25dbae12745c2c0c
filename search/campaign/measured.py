"""Measured cost in a campaign (spaces.metrics.MEASURED): each configuration is measured on the kind of device
its trial's workers use, before it becomes a trial, once per (model, device, precision, batches, compile,
versions) thanks to a cache in the campaign's storage (trainers.deploy.measure.cached_measure).

Where: in a Ray task the campaign's driver starts (`Measurer`, `task_options`). While trials train, it
holds the whole device its figures describe: one whole GPU for a GPU campaign, every CPU of the largest
node for a CPU one, so that no training runs on what it measures; training of other trials runs only on
other devices. When no trial is live, nothing trains and the task runs at once on a node of the trials'
kind. On a one-machine campaign measurements therefore happen between trainings. Inside, torch uses the
threads one worker trains with (``cpus_per_worker``): the figures are those of a worker with the device
to itself.

When: the searcher's proposal waits in search.searchers.proposals.Proposals while its model is measured,
and the searcher is asked for the next proposal meanwhile (up to the campaign's concurrency of proposals
wait at once). A proposal whose measured cost breaks a constraint never becomes a trial: it is recorded
and learnt like any infeasible proposal. A measurement that fails (out of memory at the measure batch)
becomes a trial that ends "failed" with its error, without training.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.records.layout import ERROR_CHARS
from qkvsearch.spaces.batches import batch_plan
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.keys import QUANT_KEYS, identity, model_keys
from qkvsearch.spaces.measure import MeasureSpec

CACHE_DIR = "qs_measurements"   # in the campaign folder, unless measure.cache names another place
ERROR_PREFIX = "measuring: "    # a failed measurement's error, as its trial reports it


@dataclass(frozen=True)
class MeasureSettings:
    """What a campaign measures: ``metrics``, the measured metrics it needs (spaces.measure.measured_metrics; ():
    nothing is measured), and how: ``spec``, its measure section (spaces.measure.MeasureSpec), its cache in the
    campaign's folder unless the section names one. Picklable: it travels to each measurement's task."""

    metrics: tuple[str, ...] = ()
    spec: MeasureSpec = MeasureSpec()


def measure_settings(campaign: OpenedCampaign) -> MeasureSettings:
    """The campaign's measure section resolved (MeasureSettings)."""
    from qkvsearch.spaces.measure import measured_metrics

    m = campaign.spec.measure
    return MeasureSettings(measured_metrics(campaign.spec), replace(m, cache=m.cache or f"{campaign.exp}/{CACHE_DIR}"))


def measure_here(cfg: dict, how: MeasureSettings, workers: int, threads: int | None = None) -> tuple[dict, dict]:
    """(measured metrics, the measurement's record) of a filled config in this process; the training step
    at the trial's per-worker batch; threads: torch's CPU threads while measuring (None: as they are)."""
    import torch

    from qkvsearch.trainers.deploy.measure import cached_measure

    if threads:
        torch.set_num_threads(threads)
    m = how.spec
    found, hit = cached_measure(cfg, m.cache, metrics=how.metrics, batch=m.batch, latency_batch=m.latency_batch,
                                train_batch=batch_plan(cfg, workers)[0], max_s=m.max_s)
    metrics = {m: float(found[m]) for m in how.metrics if finite(found.get(m)) is not None}
    record = {"env": found.get("env"), "latency_p90_ms": found.get("latency_p90_ms"),
              "compile_s": found.get("compile_s"), "stats": found.get("stats"), "cached": hit}
    return metrics, record


def _measure_holding(cfg: dict, how: MeasureSettings, workers: int, threads: int, idle: bool) -> tuple[dict, dict]:
    """measure_here inside a Ray task; the record names what the task held and whether trials were live."""
    import time

    import ray

    began = time.time()
    metrics, record = measure_here(cfg, how, workers, threads)
    record["span"] = [began, time.time()]   # when it ran: two idle measurements never overlap (Measurer.start)
    held = ray.get_runtime_context().get_assigned_resources()
    kept = ("CPU", "GPU", *how.spec.resources)
    return metrics, {**record, "held": {k: v for k, v in held.items() if k in kept}, "idle": idle,
                     "node": ray.get_runtime_context().get_node_id()}


def placed_options(resources: Mapping, cpus_per_worker: float, idle: bool) -> dict:
    """Ray options of a measurement task on a node with ``resources`` (a deployment target's: measure.resources;
    CPU and GPU among them say what it holds). Busy (trials live): all of them. Idle (no trial live, the
    scoring actors holding the CPUs): its custom resources only, pinned to a node that has every one of them
    in all, every GPU of that node visible where it asks for a GPU (as task_options)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from qkvsearch.ray_private import all_gpus_visible

    wanted = dict(resources)
    cpus, gpus = wanted.pop("CPU", cpus_per_worker), wanted.pop("GPU", 0.0)
    if not idle:
        return {"num_cpus": cpus, "num_gpus": gpus, "resources": wanted}
    needs = {**wanted, "CPU": cpus, "GPU": gpus}
    nodes = [n for n in ray.nodes() if n.get("Alive")
             and all(n["Resources"].get(k, 0.0) >= v for k, v in needs.items() if v)]
    pinned = {"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[0]["NodeID"], soft=False)} if nodes else {}
    return {"num_cpus": 0, "num_gpus": 0, "resources": wanted,
            "runtime_env": all_gpus_visible() if gpus else None, **pinned}


def task_options(cpus_per_worker: float, gpus_per_worker: float, idle: bool) -> dict:
    """Ray options of a measurement task (module docstring). Busy (trials live): a whole GPU, or every CPU of
    the largest node. Idle (no trial live): Tune waits on the searcher and starts nothing, but the processes
    of trials that just ended keep their resources until it goes on, so the task asks for none; it is
    pinned to the node of the trials' kind (most GPUs, or most CPUs) and sees every GPU there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from qkvsearch.ray_private import all_gpus_visible

    gpu = gpus_per_worker > 0
    if gpu and not idle:
        return {"num_cpus": cpus_per_worker, "num_gpus": 1}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not idle:
        return {"num_cpus": max([cpus_per_worker, *(n["Resources"].get("CPU", 0.0) for n in nodes)]), "num_gpus": 0}
    node = max(nodes, key=lambda n: n["Resources"].get("GPU" if gpu else "CPU", 0.0))
    return {"num_cpus": 0, "num_gpus": 0, "runtime_env": all_gpus_visible() if gpu else None,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)}


class Measurer:
    """The campaign driver's measurements, by ``measured_key``: started as Ray tasks (task_options),
    collected without waiting. ``result(key)``: (metrics, record), an error text, or None while unknown.
    Pickled with the searcher it serves; tasks in flight are not (a restored one starts them again, and
    the cache gives back what they had finished)."""

    def __init__(self, how: MeasureSettings, workers: int, cpus_per_worker: float, gpus_per_worker: float):
        self.how, self.workers = how, workers
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.done: dict[str, tuple[dict, dict] | str] = {}
        self._pending: dict = {}  # key -> (ObjectRef, idle)
        self._queued: dict = {}   # key -> cfg: idle measurements waiting for the one under way

    def result(self, key: str):
        return self.done.get(key)

    def start(self, key: str, cfg: dict, idle: bool) -> None:
        """Measure cfg's model unless known or under way; idle: no trial is live (a busy task still waiting
        for its device is given up for an idle one). An idle task holds no CPU, so nothing but this keeps two
        from timing on the same cores at once: idle measurements run one at a time, the others queued."""
        if key in self.done or (key in self._pending and (self._pending[key][1] or not idle)):
            return
        if key in self._queued:
            if idle:
                return
            del self._queued[key]   # trials are live now: it waits for its whole device, as a busy task
        elif idle and any(i for _, i in self._pending.values()):
            self._queued[key] = cfg
            return
        import ray

        if key in self._pending:
            ray.cancel(self._pending[key][0])
        where = self.how.spec.resources
        options = placed_options(where, self.cpus_per_worker, idle) if where \
            else task_options(self.cpus_per_worker, self.gpus_per_worker, idle)
        threads = max(1, int(where.get("CPU", self.cpus_per_worker)))
        ref = ray.remote(_measure_holding).options(max_retries=1, **options).remote(
            cfg, self.how, self.workers, threads, idle)
        self._pending[key] = (ref, idle)

    def poll(self) -> None:
        """Collect the measurements that have finished, and start the next idle one queued (never waits)."""
        if not self._pending:
            return
        import ray

        refs = [ref for ref, _ in self._pending.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for key, (ref, _) in list(self._pending.items()):
            if ref not in ready:
                continue
            del self._pending[key]
            try:
                self.done[key] = ray.get(ref)
            except Exception as exc:  # noqa: BLE001  (the task's error: this configuration's failure)
                self.done[key] = ERROR_PREFIX + str(exc).strip()[-ERROR_CHARS:]
        if self._queued and not any(i for _, i in self._pending.values()):
            key = next(iter(self._queued))
            self.start(key, self._queued.pop(key), idle=True)

    def wait(self) -> None:
        """Wait for every measurement under way or queued, then collect them."""
        import ray

        while self._pending:
            refs = [ref for ref, _ in self._pending.values()]
            ray.wait(refs, num_returns=1)
            self.poll()

    def __getstate__(self):
        return {**self.__dict__, "_pending": {}, "_queued": {}}

    def __setstate__(self, state):   # a measurer pickled before the queue existed has none
        self.__dict__.update({"_queued": {}, **state})

    @staticmethod
    def key(config: dict) -> str:
        """Which measurement serves a config (``measured_key``)."""
        return measured_key(config)

    def look_up(self, trial: dict) -> tuple:
        """A proposal's measurement before it is judged (search.searchers.ledger.Ledger.propose): (what is known
        of it: (metrics, record), an error text, or None while unmeasured; the trial with its ``measured_key``)."""
        key = self.key(trial["config"])
        return self.result(key), {**trial, "measured_key": key}

    def state(self) -> dict:
        """The finished measurements as plain data (tasks in flight are started again by a restored one)."""
        return {"done": {k: v if isinstance(v, str) else list(v) for k, v in self.done.items()}}

    def restore(self, state: dict) -> None:
        self.done = {k: v if isinstance(v, str) else tuple(v) for k, v in state["done"].items()}


# What decides a trial's measured figures besides the device: its model as deployed (its quantization policy
# included), optimizer and batches.
MEASURED_BY = (*QUANT_KEYS, "width", "opt", "batch_size", "batch_per_worker")   # besides the model keys


def measured_key(config: dict) -> str:
    """Trials with one key share their measured figures (the campaign's device and settings are fixed). A
    policy all in full precision adds nothing: such a config keeps the key it had before policies existed."""
    return identity(model_keys(config, *MEASURED_BY), policy=True)

