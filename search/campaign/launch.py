"""Campaign = one Ray Tune experiment whose trials each run a DDP `TorchTrainer` (see `search.campaign.driver`).

    spec --> Ray (local, or RAY_ADDRESS) --> Tuner(run_trial, searcher, scheduler, TrialRecorder)
         --> <storage>/<name>/  (Tune's experiment dir + qs_campaign.json + qs_trials/ + train_runs/)
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time

# First: it sets Ray's environment for a local cluster, which Ray reads when it is imported.
from qkvsearch.search.cluster.local_ray import TRIAL_SLOT, ray_env, start_local_ray, stop_local_ray

# isort: split
import ray
from ray import tune

from qkvsearch import ray_private
from qkvsearch.search.campaign.driver import (
    TrialSettings,
    run_trial,
    trains_in_trial_process,
    trial_name,
    trial_resources,
)
from qkvsearch.search.campaign.interrupts import CampaignInterrupted, StopSignals
from qkvsearch.search.campaign.measured import measure_settings
from qkvsearch.search.campaign.preflight import check_local_resources, check_shared_storage, check_spec
from qkvsearch.search.campaign.recording import TrialRecorder
from qkvsearch.search.campaign.searchers import build_search
from qkvsearch.search.campaign.tracking import check_trackers, study_storage, track_more, tracking_callbacks
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
from qkvsearch.search.records.layout import (
    CAMPAIGN_FILE,
    ENDED_KEY,
    INTERRUPTED_KEY,
    TRAIN_RUNS_DIR,
    code_version,
    open_campaign,
    read_campaign,
)
from qkvsearch.search.records.lease import DriverLease
from qkvsearch.spaces import SpecError, smoke_test
from qkvsearch.spaces.keys import EPOCH
from qkvsearch.storage import exists, write_json
from qkvsearch.trainers.faults import read_faults

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


def _trial_slot(cluster: Cluster, trains: bool) -> dict:
    """What a trial's process holds besides its CPUs and GPUs (search.campaign.driver.trial_resources): a trial
    slot, which caps how many trials run at once; on a cluster without slots, a driver-only trial takes a
    sliver of the head node (Tune needs some resource) and a training trial nothing more."""
    if cluster.trial_slots:
        return {TRIAL_SLOT: 1}
    return {} if trains else {"node:__internal_head__": 0.001}


def _scheduler(spec, exp: str):
    """The spec's trial scheduler: FIFO, ASHA on one metric, or MO-ASHA on the objectives. Each makes Tune
    save its experiment state whenever trials were added or ended (search.scheduling.tune_schedulers.CheckpointsTrialChanges),
    so a killed driver's campaign resumes with every trial and the searcher as they were."""
    from qkvsearch.search.scheduling.tune_schedulers import (
        CampaignASHAScheduler,
        CampaignFIFOScheduler,
        MOASHAScheduler,
    )

    sched, objectives = spec.scheduler, spec.objectives
    if sched.type == "fifo":
        return CampaignFIFOScheduler()
    common = dict(time_attr=EPOCH, grace_period=sched.grace_epochs,
                  reduction_factor=sched.reduction_factor, max_t=spec.train.epochs,
                  brackets=sched.bracket_count(spec.train.epochs))
    if sched.type == "asha":  # the loader resolved metric and mode (first objective by default)
        return CampaignASHAScheduler(metric=sched.metric, mode=sched.mode, **common)
    # Tune does not save schedulers with the experiment: a restored MO-ASHA rebuilds its rungs from the records.
    return MOASHAScheduler(metrics=[o.metric for o in objectives], modes=[o.mode for o in objectives],
                           experiment=exp, **common)


class _Describe:
    """Trial -> its record's description: resolved config, cost, planned epochs, readable name."""

    def __call__(self, trial) -> dict:
        cfg, cost = trial.config["config"], trial.config["cost"]
        return {"config": cfg, "cost": cost, "epochs_planned": int(cfg["epochs"]),
                "name": trial_name(cfg, trial.trial_id)}

    def name(self, trial) -> str:
        return trial_name(trial.config["config"], trial.trial_id)


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
        placement_strategy=res.placement_strategy, train_storage=f"{exp}/{TRAIN_RUNS_DIR}", experiment=exp,
        faults=tuple(read_faults()),  # trial processes do not see this process's environment
        campaign=spec.name, max_failures=res.max_failures, measure=measure_settings(spec, exp))


def _check_launchable(spec, exp: str, overwrite: bool) -> None:
    """Every check that needs no Ray: storage, models of the space, dataset, an existing campaign, and
    the resources of a local machine. Writes nothing."""
    check_spec(spec, launching=True)
    _refuse_existing(exp, overwrite)
    if not os.environ.get("RAY_ADDRESS") and not ray.is_initialized():
        check_local_resources(spec.resources)


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
        before = signal.signal(signal.SIGTERM, _sigterm_interrupts) if main else None
        try:
            yield lease
        finally:
            if main:
                signal.signal(signal.SIGTERM, before)


def _sigterm_interrupts(signum, frame):
    raise KeyboardInterrupt


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
    exp = experiment_dir(spec)
    _check_launchable(spec, exp, overwrite)
    searcher, num_samples = build_search(spec, exp)
    with _holding(exp) as lease:
        _refuse_existing(exp, overwrite)  # again under the hold: another driver may have written one since
        return _launch_held(spec, exp, lease, searcher, num_samples, overwrite=overwrite, verbose=verbose, view=view)


def _launch_held(spec, exp: str, lease, searcher, num_samples: int, *, overwrite: bool, verbose: bool, view) -> str:
    """launch() once this driver holds the campaign (search.records.lease)."""
    version = code_version()
    cluster = connect(_wanted_slots(spec.resources), job_metadata(spec, exp, num_samples, version))
    try:
        concurrency = plan_concurrency(spec.resources, cluster,
                                       ask=autoscaler_can_hold if cluster.autoscaler == "v2" else None)
        check_shared_storage(exp, _node_hosts(), can_grow=outgrows(spec.resources, cluster, concurrency))
        if overwrite and exists(f"{exp}/{CAMPAIGN_FILE}"):
            lease.clear_folder()  # only now: the new spec passed every check; the lease stays
        _announce(spec, exp, cluster, f"{num_samples} trial(s), up to {concurrency} at a time")
        if cluster.waiting_for:
            log.info(cluster.waiting_for)
        write_json(f"{exp}/{CAMPAIGN_FILE}", {"name": spec.name, "spec": spec.to_dict(),
                                                "code_version": version, "created_at": time.time()})
        describe = _Describe()
        recorder = TrialRecorder(exp, spec.name, describe)
        storage = study_storage(spec, exp)  # only now: after an overwrite cleared the folder
        if storage is not None:  # the searcher's study lives in the optuna tracker's storage
            searcher, _ = build_search(spec, exp, storage)
        tracking = tracking_callbacks(spec, exp, recorder, version, study_in_storage=storage is not None)
        early = _early_stages(spec, exp)
        with StopSignals() as stop:
            tuner = tune.Tuner(
                _trainable(spec, exp, cluster),
                tune_config=tune.TuneConfig(
                    search_alg=searcher, scheduler=_scheduler(spec, exp),
                    num_samples=num_samples, max_concurrent_trials=concurrency,
                    # A finished trial's process serves the next trial (no new process; Ray, torch and
                    # timm imported already): Tune's stop reaches every trial inside tune.report. Not when
                    # the campaign measures: Tune keeps one idle trial process (and its CPUs) for reuse,
                    # which a measurement holding the whole node would wait for (search.campaign.measured).
                    reuse_actors=searcher.measurer is None,
                    trial_name_creator=describe.name, trial_dirname_creator=describe.name),
                run_config=_run_config(spec, exp, [recorder, *tracking, stop, *early,
                                                   _retention(spec, exp, recorder)], verbose),
            )
            _fit_beside(early, tuner, exp, recorder, stop, view, verbose)
        _stages(spec, exp, recorder, early)
    finally:
        if cluster.started_here:
            stop_local_ray()
    return exp


def _announce(spec, exp: str, cluster: Cluster, trials: str) -> None:
    """The header: campaign, trials, workers, where results go, the dashboard and its Grafana panels."""
    res = spec.resources
    log.info(f"campaign {spec.name}: {trials}, {res.workers_per_trial} DDP worker(s) each "
             f"({res.cpus_per_worker:g} CPU, {res.gpus_per_worker:g} GPU per worker)")
    log.info(f"results: {exp}")
    for line in dashboard_lines(cluster.dashboard_url):
        log.info(line)
    if cluster.dashboard_url and install_dashboard() is not None:
        log.info("Grafana: dashboard 'qkvsearch campaign' installed (Metrics page, when Grafana runs); "
                 "`qkvsearch grafana-dashboard --out DIR` writes it for a Grafana of your own")


def _fit(tuner, exp: str, recorder, stop: StopSignals, view, verbose: bool) -> None:
    """tuner.fit() watched by the monitor's views; then the campaign file says how the driver ended."""
    from qkvsearch.search.monitor.metrics import CampaignMetrics
    from qkvsearch.search.monitor.watch import CampaignMonitor

    views = [CampaignMetrics(recorder.campaign)] + ([view] if view is not None else [])
    with CampaignMonitor(exp, views), _tune_output(verbose):
        tuner.fit()
        if stop.received:  # before the monitor's last snapshot: no trial shows as running after a stop
            interrupted = recorder.mark_interrupted()
    if stop.received:
        _mark_campaign(exp, INTERRUPTED_KEY)
        raise CampaignInterrupted(exp, stop.received, interrupted)
    _mark_campaign(exp, ENDED_KEY)


@contextlib.contextmanager
def _tune_output(verbose: bool):
    """Tune's console output: its tables with --verbose, else nothing. Tune's newer output prints an
    experiment header at any verbosity; its older reporter prints nothing at verbosity 0."""
    key, before = "RAY_AIR_NEW_OUTPUT", os.environ.get("RAY_AIR_NEW_OUTPUT")
    if not verbose:
        os.environ[key] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def _mark_campaign(exp: str, key: str | None) -> None:
    """Record in the campaign file when its driver ended (ENDED_KEY) or was stopped (INTERRUPTED_KEY);
    None: running again (resume)."""
    campaign = read_campaign(exp)
    for k in (ENDED_KEY, INTERRUPTED_KEY):
        campaign.pop(k, None)
    if key is not None:
        campaign[key] = time.time()
    write_json(f"{exp}/{CAMPAIGN_FILE}", campaign)


def _trainable(spec, exp: str, cluster: Cluster):
    settings = _settings(spec, exp)
    slot = _trial_slot(cluster, trains_in_trial_process(settings.workers))
    return tune.with_resources(tune.with_parameters(run_trial, settings=settings), trial_resources(settings, slot))


def _retention(spec, exp: str, recorder):
    """What ended trials keep of their checkpoints (spec.checkpoints): after the recorder, which it reads."""
    from qkvsearch.search.campaign.retention import retention_callback

    return retention_callback(exp, spec, recorder, _settings(spec, exp))


def _wanted_slots(resources) -> int:
    wanted = resources.max_concurrent_trials
    return int(wanted) if isinstance(wanted, int) else max(1, os.cpu_count() or 1)


def _run_config(spec, exp: str, callbacks: list, verbose: bool):
    storage, name = exp.rsplit("/", 1)
    return tune.RunConfig(
        name=name, storage_path=storage, verbose=_tune_verbosity(verbose), callbacks=callbacks,
        # A trial whose process is lost is restarted from its checkpoint; one whose training fails reports
        # it as a result (search.campaign.driver.run_trial) and is not retried.
        failure_config=tune.FailureConfig(max_failures=spec.resources.max_failures),
    )


def _tune_verbosity(verbose: bool) -> int:
    return 1 if verbose else 0  # 1: Tune's trial tables; 0: only the campaign's own lines (search.monitor.terminal)


def resume(exp: str, *, verbose: bool = False, view=None, track=()) -> str:
    """Continue an interrupted campaign: finished trials stay, unfinished ones resume from checkpoints.
    view, verbose and the signals: as for `launch`; track: trackers to add (`--track`, kept for later resumes)."""
    exp = exp.rstrip("/")
    if "://" not in exp:
        exp = os.path.abspath(exp)
    open_campaign(exp, validate=True)  # not a campaign: refused before this driver writes its lease there
    with _holding(exp):
        return _resume_held(exp, verbose, view, track)


def _resume_held(exp: str, verbose: bool, view, track=()) -> str:
    """resume() once this driver holds the campaign (search.records.lease)."""
    campaign = open_campaign(exp, validate=True)
    spec = track_more(exp, campaign.spec, track)
    check_trackers(spec)
    _, num_samples = build_search(spec)
    cluster = connect(_wanted_slots(spec.resources),
                      job_metadata(spec, exp, num_samples, campaign.code_version or code_version()))
    try:
        check_shared_storage(exp, _node_hosts())
        _announce(spec, exp, cluster, f"resuming, {num_samples} trial(s) planned")
        _mark_campaign(exp, None)
        if view is not None:
            view.skip_finished(exp)  # trials that ended before this driver are not announced again
        tuner = tune.Tuner.restore(exp, trainable=_trainable(spec, exp, cluster), resume_unfinished=True,
                                   resume_errored=False)
        recorder = TrialRecorder(exp, spec.name, _Describe())
        with StopSignals() as stop:
            # Tune restores the run config pickled at launch; this driver's callbacks replace its copies.
            run_config = ray_private.restored_run_config(tuner)
            tracking = tracking_callbacks(spec, exp, recorder, campaign.code_version or code_version())
            early = _early_stages(spec, exp)
            run_config.callbacks = [recorder, *tracking, stop, *early, _retention(spec, exp, recorder)]
            run_config.verbose = _tune_verbosity(verbose)
            _fit_beside(early, tuner, exp, recorder, stop, view, verbose)
        _stages(spec, exp, recorder, early)
    finally:
        if cluster.started_here:
            stop_local_ray()
    return exp


def _early_stages(spec, exp: str) -> list:
    """[the callback that runs stages as trials complete] under stages.select as_completed, else []."""
    if not spec.stages or spec.stages.select != "as_completed":
        return []
    from qkvsearch.search.campaign.stages import StagesAsCompleted

    return [StagesAsCompleted(spec, exp, _settings(spec, exp))]


def _fit_beside(early: list, tuner, exp: str, recorder, stop, view, verbose: bool) -> None:
    """_fit; stages running beside the trials are stopped when it ends by an error or a stop signal."""
    try:
        _fit(tuner, exp, recorder, stop, view, verbose)
    except BaseException:
        for callback in early:
            callback.stop()
        raise


def _stages(spec, exp: str, recorder, early=()) -> None:
    """The stages after the trials (search.campaign.stages), once those begun beside them have run; a stop
    signal there: the campaign is interrupted."""
    from qkvsearch.search.campaign.stages import run_stages

    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _sigterm_interrupts) if main else None  # Ray's ends the process
    try:
        if spec.stages:  # the campaign ends with its last stage (`watch` follows the stages)
            _mark_campaign(exp, None)
        for callback in early:
            callback.finish()
        run_stages(spec, exp, _settings(spec, exp), _retention(spec, exp, recorder).retention)
        if spec.stages:
            _mark_campaign(exp, ENDED_KEY)
    except KeyboardInterrupt as err:
        _mark_campaign(exp, INTERRUPTED_KEY)
        raise CampaignInterrupted(exp, "a stop signal", []) from err
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)
