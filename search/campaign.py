"""Campaign = one Ray Tune experiment whose trials each run a DDP `TorchTrainer` (see `search.driver`).

    spec --> Ray (local, or RAY_ADDRESS) --> Tuner(run_trial, searcher, scheduler, TrialRecorder)
         --> <storage>/<name>/  (Tune's experiment dir + qs_campaign.json + qs_trials/ + train_runs/)
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass

# Set before Ray starts: a local cluster's processes inherit them.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")  # reports otherwise arrive ~2 s late

import ray
from ray import tune

from qkvsearch.search.driver import (
    TIME_ATTR,
    TrialSettings,
    run_trial,
    trains_in_trial_process,
    trial_resources,
)
from qkvsearch.search.preflight import ResourceError, check_local_resources, check_spec
from qkvsearch.search.records import CAMPAIGN_FILE, TrialRecorder, code_version, read_campaign
from qkvsearch.search.searchers import build_search
from qkvsearch.search.storage import write_json
from qkvsearch.spaces import SpecError, smoke_test
from qkvsearch.trainers.faults import read_faults

log = logging.getLogger(__name__)

# Passed on to every process of the job when set here. RAY_TRAIN_ENABLE_STATE_TRACKING=1 (Train runs at
# /api/train/v2/runs/v1) is left to the user: it starts a state actor that imports torch, and makes every
# controller report each state change to it.
_RAY_ENV = ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_ENABLE_STATE_TRACKING")
TRIAL_SLOT = "trial_slot"


@dataclass
class Cluster:
    cpus: float
    gpus: float
    trial_slots: float
    dashboard_url: str | None
    started_here: bool


def start_local_ray(trial_slots: int, num_cpus: int | None = None):
    """Start a local Ray bound to 127.0.0.1 and return its context.

    Ray processes find their own cluster through RAY_ADDRESS; without it, Train's State API calls
    fail ("Found multiple active Ray instances") whenever another Ray runs on the same machine, and
    a stopped trial's placement group is never cleaned up. So the GCS port is chosen up front and
    every process of the job is told the address.
    """
    port = _free_port()
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)
    try:
        env = _ray_env() | {
            "RAY_ADDRESS": f"127.0.0.1:{port}",
            "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # one machine: no spot preemption to watch for
        }
        return ray.init(num_cpus=num_cpus, resources={TRIAL_SLOT: trial_slots}, _node_ip_address="127.0.0.1",
                        include_dashboard=True, dashboard_host="127.0.0.1", log_to_driver=False,
                        runtime_env={"env_vars": env})
    finally:
        del os.environ["RAY_GCS_SERVER_PORT"]


def _ray_env() -> dict:
    return {k: os.environ[k] for k in _RAY_ENV if k in os.environ}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def connect(max_concurrent: int) -> Cluster:
    """Join RAY_ADDRESS's cluster, or start a local Ray bound to 127.0.0.1 with `trial_slot`s."""
    started = False
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            env = {"env_vars": _ray_env()}
            ctx = ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=env, log_to_driver=False)
        else:
            # The dashboard stays on: Train's placement-group cleanup uses the State API.
            ctx = start_local_ray(max_concurrent)
            started = True
        url = ctx.dashboard_url
    else:
        url = _dashboard_url()
    total = ray.cluster_resources()
    return Cluster(total.get("CPU", 0.0), total.get("GPU", 0.0), total.get(TRIAL_SLOT, 0.0), url, started)


def _dashboard_url() -> str | None:
    try:
        return ray._private.worker.global_worker.node.address_info.get("webui_url")
    except AttributeError:
        return None


def plan_concurrency(resources, cluster: Cluster) -> int:
    """How many trials can run at once (resources: spaces.schema.ResourcesSpec); fails fast when one
    trial cannot fit at all."""
    workers = resources.workers_per_trial
    need_cpu = workers * resources.cpus_per_worker
    need_gpu = workers * resources.gpus_per_worker
    if need_cpu > cluster.cpus or need_gpu > cluster.gpus:
        raise ResourceError(
            f"resources: one trial needs {workers} workers x ({resources.cpus_per_worker} CPU, "
            f"{resources.gpus_per_worker} GPU) = {need_cpu:g} CPUs, {need_gpu:g} GPUs, but the cluster "
            f"has {cluster.cpus:g} CPUs, {cluster.gpus:g} GPUs; lower resources.workers_per_trial or "
            f"resources.cpus_per_worker / gpus_per_worker")
    fits = int(cluster.cpus // need_cpu) if need_cpu else 10**6
    if need_gpu:
        fits = min(fits, int(cluster.gpus // need_gpu))
    wanted = resources.max_concurrent_trials
    limit = fits if wanted == "auto" else min(int(wanted), fits)
    if cluster.trial_slots:
        limit = min(limit, int(cluster.trial_slots))
    return max(1, limit)


def _trial_slot(cluster: Cluster, trains: bool) -> dict:
    """What a trial's process holds besides its CPUs and GPUs (search.driver.trial_resources): a trial
    slot, which caps how many trials run at once; on a cluster without slots, a driver-only trial takes a
    sliver of the head node (Tune needs some resource) and a training trial nothing more."""
    if cluster.trial_slots:
        return {TRIAL_SLOT: 1}
    return {} if trains else {"node:__internal_head__": 0.001}


def _scheduler(spec, exp: str):
    """The spec's trial scheduler (None for fifo): ASHA on one metric, or MO-ASHA on the objectives."""
    sched, objectives = spec.scheduler, spec.objectives
    if sched.type == "fifo":
        return None
    common = dict(time_attr=TIME_ATTR, grace_period=sched.grace_epochs,
                  reduction_factor=sched.reduction_factor, max_t=spec.train.epochs,
                  brackets=sched.bracket_count(spec.train.epochs))
    if sched.type == "asha":  # the loader resolved metric and mode (first objective by default)
        return tune.schedulers.ASHAScheduler(metric=sched.metric, mode=sched.mode, **common)
    from qkvsearch.search.schedulers import MOASHAScheduler

    # Tune does not save schedulers with the experiment: MO-ASHA keeps its rungs in a file of its own.
    state = None if "://" in exp else f"{exp}/qs_scheduler.json"
    return MOASHAScheduler(metrics=[o.metric for o in objectives], modes=[o.mode for o in objectives],
                           state_path=state, **common)


class _Describe:
    """Trial -> its record's description: resolved config, cost, planned epochs, readable name."""

    def __call__(self, trial) -> dict:
        cfg, cost = trial.config["config"], trial.config["cost"]
        return {"config": cfg, "cost": cost, "epochs_planned": int(cfg["epochs"]),
                "name": trial_name(cfg, trial.trial_id)}

    def name(self, trial) -> str:
        return trial_name(trial.config["config"], trial.trial_id)


def trial_name(cfg: dict, trial_id: str) -> str:
    """`fsne-h128-c8-shared-00003`: what a person needs to tell trials apart, then the trial index."""
    parts = [str(cfg.get("embedding"))]
    if cfg.get("width"):
        parts.append(f"h{cfg['width']}")
    if cfg.get("embedding") == "fsne":
        parts += [f"c{cfg['code_size']}", str(cfg["code_sharing"]).replace("_", "")]
    return "-".join(parts + [trial_id.rsplit("_", 1)[-1]])


def experiment_dir(spec) -> str:
    storage = spec.storage
    if "://" not in storage:
        storage = os.path.abspath(storage)
    return f"{storage.rstrip('/')}/{spec.name}"


def _settings(spec, exp: str) -> TrialSettings:
    res = spec.resources
    return TrialSettings(
        objectives=tuple((o.metric, o.mode) for o in spec.objectives),
        constraints=tuple(spec.constraints), workers=res.workers_per_trial,
        cpus_per_worker=res.cpus_per_worker, gpus_per_worker=res.gpus_per_worker,
        placement_strategy=res.placement_strategy, train_storage=f"{exp}/train_runs", experiment=exp,
        faults=tuple(read_faults()))  # trial processes do not see this process's environment


def _check_launchable(spec, exp: str, overwrite: bool) -> None:
    """Every check that needs no Ray: storage, models of the space, dataset, an existing campaign, and
    the resources of a local machine. Writes nothing."""
    check_spec(spec, launching=True)
    if "://" not in exp and os.path.exists(os.path.join(exp, CAMPAIGN_FILE)) and not overwrite:
        raise SpecError([f"name: a campaign already exists at {exp}; resume it with `qkvsearch resume "
                         f"{exp}`, pick another name (--set name=...), or pass --overwrite"])
    if not os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
        check_local_resources(spec.resources)


def launch(spec, *, smoke: bool = False, overwrite: bool = False) -> str:
    """Run a campaign to the end; returns its experiment dir.

    Every check that can run before Ray starts runs first (spec, models, dataset, storage, resources of
    a local machine); nothing is written, and no existing campaign removed, until they pass. Bad input
    raises a BadInput (SpecError, DatasetError, ResourceError).
    """
    if smoke:
        spec = smoke_test(spec)
    exp = experiment_dir(spec)
    _check_launchable(spec, exp, overwrite)
    searcher, num_samples = build_search(spec)
    if overwrite and "://" not in exp and os.path.exists(os.path.join(exp, CAMPAIGN_FILE)):
        shutil.rmtree(exp)  # only now: the new spec passed every check

    cluster = connect(_wanted_slots(spec.resources))
    try:
        concurrency = plan_concurrency(spec.resources, cluster)
        log.info(f"campaign {spec.name}: {num_samples} trial(s), up to {concurrency} at a time, "
                 f"{spec.resources.workers_per_trial} DDP workers each")
        if cluster.dashboard_url:
            log.info(f"Ray dashboard: http://{cluster.dashboard_url.removeprefix('http://')}")
        log.info(f"results: {exp}")
        write_json(f"{exp}/{CAMPAIGN_FILE}", {"name": spec.name, "spec": spec.to_dict(),
                                                "code_version": code_version(), "created_at": time.time()})
        describe = _Describe()
        tuner = tune.Tuner(
            _trainable(spec, exp, cluster),
            tune_config=tune.TuneConfig(
                search_alg=searcher, scheduler=_scheduler(spec, exp),
                num_samples=num_samples, max_concurrent_trials=concurrency,
                reuse_actors=_reuse_actors(spec.resources),
                trial_name_creator=describe.name, trial_dirname_creator=describe.name),
            run_config=_run_config(spec, exp, describe),
        )
        tuner.fit()
    finally:
        if cluster.started_here:
            ray.shutdown()
    log.info(f"done: {exp}")
    return exp


def _trainable(spec, exp: str, cluster: Cluster):
    settings = _settings(spec, exp)
    slot = _trial_slot(cluster, trains_in_trial_process(settings.workers))
    return tune.with_resources(tune.with_parameters(run_trial, settings=settings), trial_resources(settings, slot))


def _reuse_actors(resources) -> bool:
    """Reuse a finished trial's process for the next trial (no new process, torch and timm imported
    already) when the trial trains in it. Tune stops or reuses a function trainable by setting an event
    that its training thread sees only inside tune.report; a trial that drives a TorchTrainer waits in
    fit() instead, so a trial stopped early would keep its Train run, workers and CPUs, and the next trial's
    reset would fail after TUNE_FUNCTION_THREAD_TIMEOUT_S."""
    return trains_in_trial_process(resources.workers_per_trial)


def _wanted_slots(resources) -> int:
    wanted = resources.max_concurrent_trials
    return int(wanted) if isinstance(wanted, int) else max(1, os.cpu_count() or 1)


def _run_config(spec, exp: str, describe: _Describe):
    storage, name = exp.rsplit("/", 1)
    return tune.RunConfig(
        name=name, storage_path=storage, verbose=1,
        callbacks=[TrialRecorder(exp, spec.name, describe)],
        failure_config=tune.FailureConfig(max_failures=0),  # a failed trial is recorded, never retried
    )


def resume(exp: str) -> str:
    """Continue an interrupted campaign: finished trials stay, unfinished ones resume from checkpoints."""
    from qkvsearch.spaces import load_campaign

    exp = exp.rstrip("/")
    if "://" not in exp:
        exp = os.path.abspath(exp)
    spec = load_campaign(read_campaign(exp)["spec"])
    cluster = connect(_wanted_slots(spec.resources))
    try:
        log.info(f"resuming {exp}")
        tune.Tuner.restore(exp, trainable=_trainable(spec, exp, cluster), resume_unfinished=True,
                           resume_errored=False).fit()
    finally:
        if cluster.started_here:
            ray.shutdown()
    log.info(f"done: {exp}")
    return exp
