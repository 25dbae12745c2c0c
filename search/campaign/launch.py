"""Campaign = one Ray Tune experiment whose trials each run a DDP `TorchTrainer` (see `search.campaign.driver`).

    spec --> checks --> the campaign's lease --> Ray (local, or RAY_ADDRESS) --> search.campaign.run.CampaignRun
         --> <storage>/<name>/  (Tune's experiment dir + qs_campaign.json + qs_trials/ + train_runs/)

``launch`` and ``resume`` differ only in what they check and how the campaign folder starts; each opens the
campaign once (search.campaign.opened: its spec and folder), then both go through the one run path of
search.campaign.run.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from dataclasses import asdict

# First: it sets Ray's environment for a local cluster, which Ray reads when it is imported.
from qkvsearch.search.cluster.local_ray import TRIAL_SLOT, ray_env, start_local_ray, stop_local_ray

# isort: split
import ray

from qkvsearch import ray_private
from qkvsearch.search.analysis import hv_reference
from qkvsearch.search.campaign import front_repeats
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.preflight import (
    check_local_resources,
    check_shared_storage,
    check_spec,
    check_stage_resources,
)
from qkvsearch.search.campaign.prepare import prepare_for
from qkvsearch.search.campaign.run import (
    CampaignRun,
    _Describe,  # noqa: F401  (named by tuner.pkl of campaigns launched before run.py)
    sigterm_interrupts,
)
from qkvsearch.search.campaign.tracking import check_trackers, track_more
from qkvsearch.search.cluster.capacity import (
    Cluster,
    autoscaler,
    autoscaler_can_hold,
    node_types,
    outgrows,
    plan_concurrency,
)
from qkvsearch.search.cluster.jobs import (
    dashboard_lines,
    job_config,
    job_metadata,
    submission_id,
    tag_submission,
)
from qkvsearch.search.monitor.grafana import install_dashboard
from qkvsearch.search.records.layout import CAMPAIGN_FILE, CampaignFolder, code_version, experiment_dir
from qkvsearch.search.records.lease import DriverLease
from qkvsearch.search.searchers.state import check_readable
from qkvsearch.spaces import SpecError, smoke_test
from qkvsearch.storage import exists

log = logging.getLogger(__name__)


def connect(max_concurrent: int, metadata: dict | None = None) -> Cluster:
    """Join RAY_ADDRESS's cluster, or start a local Ray bound to 127.0.0.1 with `trial_slot`s.
    metadata: the campaign's, for the dashboard's Jobs page (search.cluster.jobs)."""
    started = False
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            env = {"env_vars": ray_env()}
            ctx = ray.init(address=os.environ["RAY_ADDRESS"], runtime_env=env, log_to_driver=False,
                           job_config=job_config(metadata or {}), logging_level=logging.WARNING)
            tag_submission(metadata or {})  # under `ray job submit`, the Jobs page lists the submission
        else:
            # The dashboard stays on: Train's placement-group cleanup uses the State API.
            ctx = start_local_ray(max_concurrent, metadata=metadata)
            started = True
        url = ctx.dashboard_url
    else:
        url = _dashboard_url()
    total = ray.cluster_resources()
    return Cluster(total.get("CPU", 0.0), total.get("GPU", 0.0), total.get(TRIAL_SLOT, 0.0), url, started,
                   node_types=[] if started else node_types(), autoscaler=None if started else autoscaler())


def _dashboard_url() -> str | None:
    return ray_private.dashboard_url()


def _node_hosts() -> set[str]:
    """Addresses of the cluster's live nodes: one address, one machine and one disk."""
    return {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}


def _check_launchable(campaign: OpenedCampaign, overwrite: bool) -> list[tuple[dict, dict]]:
    """Every check that needs no Ray: storage, models of the space, dataset, an existing campaign, and
    the resources of a local machine. Writes nothing. Returns (resolved config, cost) of every model of the space."""
    spec = campaign.spec
    models = check_spec(spec, launching=True)
    _refuse_existing(campaign.exp, overwrite)
    if not os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
        check_local_resources(spec.resources)
        if spec.supernet.resources and spec.supernet.source is None:
            check_local_resources({**asdict(spec.resources), **spec.supernet.resources}, "supernet.resources",
                                  "the supernet's training")
    return models


def _refuse_existing(exp: str, overwrite: bool) -> None:
    if not overwrite and exists(f"{exp}/{CAMPAIGN_FILE}"):
        raise SpecError([f"name: a campaign already exists at {exp}; resume it with `qkvsearch resume "
                         f"{exp}`, pick another name (--set name=...), or pass --overwrite"])


@contextlib.contextmanager
def _holding(exp: str):
    """This driver's hold on the campaign (search.records.lease: CampaignHeld when another live driver has
    it), released however the driver ends. Until Tune's handlers are in place (search.campaign.interrupts),
    SIGTERM raises KeyboardInterrupt: without that, a SIGTERM while Ray starts would end the process at
    once and leave the hold to go stale."""
    command = " ".join(["qkvsearch" if sys.argv[0].endswith(("qkvsearch", "cli.py")) else sys.argv[0],
                        *sys.argv[1:]])
    with DriverLease.acquire(exp, command, job=submission_id()) as lease:
        main = threading.current_thread() is threading.main_thread()  # only it can set signal handlers
        before = signal.signal(signal.SIGTERM, sigterm_interrupts) if main else None
        try:
            yield lease
        finally:
            if main:
                signal.signal(signal.SIGTERM, before)


def launch(spec, *, smoke: bool = False, overwrite: bool = False, verbose: bool = False, view=None) -> str:
    """Run a campaign to the end; returns its experiment dir.

    Every check that can run before Ray starts runs first (spec, models, dataset, storage, resources of
    a local machine); nothing is written, and no existing campaign removed, until they pass. Then this
    driver takes the campaign's lease (search.records.lease; CampaignHeld while another live driver holds
    it) and keeps it until it ends. Bad input raises a BadInput (SpecError, DatasetError, ResourceError,
    CampaignHeld); a stop signal, CampaignInterrupted.
    view: shows the campaign's progress while it runs (search.monitor.terminal.TerminalView; None: nothing);
    verbose: Tune's own trial tables as well.
    """
    if smoke:
        spec = smoke_test(spec)
    campaign = OpenedCampaign(spec, experiment_dir(spec))
    exp = campaign.exp
    models = _check_launchable(campaign, overwrite)
    with _holding(exp) as lease:
        _refuse_existing(exp, overwrite)  # again under the hold: another driver may have written one since
        version = code_version()
        cluster = connect(_wanted_slots(spec.resources), job_metadata(campaign, spec.search.num_trials, version))
        try:
            ask = autoscaler_can_hold if cluster.autoscaler == "v2" else None
            concurrency = plan_concurrency(spec.resources, cluster, ask=ask)
            stage_waits = check_stage_resources(spec, cluster, ask=ask)  # before clear_folder: a refusal loses nothing
            check_shared_storage(exp, _node_hosts(), can_grow=outgrows(spec.resources, cluster, concurrency))
            prepare_for(spec)  # its prepared datasets made or checked, on this Ray: a refusal loses nothing
            if overwrite and exists(f"{exp}/{CAMPAIGN_FILE}"):
                lease.clear_folder()  # only now: the new spec passed every check; the lease stays
            _announce(campaign, cluster, f"{_planned(spec)}, up to {concurrency} at a time")
            for line in [cluster.waiting_for, *stage_waits]:
                if line:
                    log.info(line)
            folder = CampaignFolder.create(exp, spec, version)
            hv_reference.write(exp, hv_reference.at_launch([(o.metric, o.mode) for o in spec.objectives],
                                                           [cost for _, cost in models]))
            _run(campaign, folder, cluster, version, concurrency, restoring=False, verbose=verbose, view=view)
        finally:
            if cluster.started_here:
                stop_local_ray()
    return exp


def _run(campaign: OpenedCampaign, folder, cluster: Cluster, version: str, concurrency, *, restoring: bool,
         verbose: bool, view) -> None:
    """The campaign's trials, then the front's repeats (search.campaign.front_repeats), or a one-shot campaign's
    phases (search.campaign.oneshot.phases)."""
    if campaign.spec.supernet:
        from qkvsearch.search.campaign.oneshot import phases

        if concurrency is None:  # resuming: the retraining, if it starts now, runs as a launch's would
            concurrency = plan_concurrency(campaign.spec.resources, cluster,
                                           ask=autoscaler_can_hold if cluster.autoscaler == "v2" else None)
        phases.run(campaign, folder, cluster, version, concurrency=concurrency, verbose=verbose, view=view)
    else:
        CampaignRun(campaign, folder, cluster, version).fit(concurrency, restoring=restoring, verbose=verbose,
                                                            view=view)
        front_repeats.run(campaign, folder, cluster, version, concurrency=concurrency, verbose=verbose, view=view)


def _planned(spec) -> str:
    if spec.supernet:  # one-shot: the subnets scored; the retrained ones are chosen from them
        return f"one supernet, {spec.search.num_trials} subnet(s) scored with its weights"
    return f"{spec.search.num_trials} trial(s)"


def _announce(campaign: OpenedCampaign, cluster: Cluster, trials: str) -> None:
    """The header: campaign, trials, workers, where results go, the dashboard and its Grafana panels."""
    res = campaign.spec.resources
    log.info(f"campaign {campaign.spec.name}: {trials}, {res.workers_per_trial} DDP worker(s) each "
             f"({res.cpus_per_worker:g} CPU, {res.gpus_per_worker:g} GPU per worker)")
    log.info(f"results: {campaign.exp}")
    for line in dashboard_lines(cluster.dashboard_url):
        log.info(line)
    if cluster.dashboard_url and install_dashboard() is not None:
        log.info("Grafana: dashboard 'qkvsearch campaign' installed (Metrics page, when Grafana runs); "
                 "`qkvsearch grafana-dashboard --out DIR` writes it for a Grafana of your own")


def _wanted_slots(resources) -> int:
    wanted = resources.max_concurrent_trials
    return int(wanted) if isinstance(wanted, int) else max(1, os.cpu_count() or 1)


def resume(exp: str, *, verbose: bool = False, view=None, track=()) -> str:
    """Continue an interrupted campaign: finished trials stay, unfinished ones resume from checkpoints.
    view, verbose and the signals: as for `launch`; track: trackers to add (`--track`, kept for later resumes).
    Everything that can refuse the campaign is checked before this driver writes anything there."""
    exp = exp.rstrip("/")
    if "://" not in exp:
        exp = os.path.abspath(exp)
    folder = CampaignFolder.open(exp)  # not a campaign: refused before this driver writes its lease there
    spec = track_more(folder.campaign.spec, track)
    campaign = OpenedCampaign(spec, exp)
    check_trackers(spec)
    check_readable(exp)
    if not spec.supernet and not exists(f"{exp}/tuner.pkl"):  # a one-shot campaign has none until it retrains
        raise SpecError([f"{exp}: expected the Tune experiment a launch leaves (tuner.pkl), given a folder "
                         "without it; the campaign cannot be resumed (its records still report)"])
    with _holding(exp):
        version = folder.campaign.code_version or code_version()
        cluster = connect(_wanted_slots(spec.resources), job_metadata(campaign, spec.search.num_trials, version))
        try:
            stage_waits = check_stage_resources(spec, cluster,
                                                ask=autoscaler_can_hold if cluster.autoscaler == "v2" else None)
            check_shared_storage(exp, _node_hosts())
            _announce(campaign, cluster, f"resuming, {_planned(spec)} planned")
            for line in stage_waits:
                log.info(line)
            if spec is not folder.campaign.spec:
                folder.set_spec(spec)
            folder.mark(None)
            if view is not None:
                view.skip_finished(exp)  # trials that ended before this driver are not announced again
            _run(campaign, folder, cluster, version, None, restoring=True, verbose=verbose, view=view)
        finally:
            if cluster.started_here:
                stop_local_ray()
    return exp
