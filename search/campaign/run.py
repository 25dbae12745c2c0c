"""One run of a campaign's driver, launched or resumed: what both build once — the per-trial settings, the
searcher, the recorder, retention, trackers, the stages beside the trials — then Tune's fit, then the stages.

    CampaignRun(campaign, folder, cluster)   .fit(restoring=False)  a new Tuner
                                             .fit(restoring=True)   Tuner.restore, the searcher built anew
                                                                    from the spec, its saved state restored

Tune pickles its searcher and run config into ``tuner.pkl`` at launch; a resume replaces both with this run's
(search._root.ray_private: Tune has no public way to pass new ones to ``Tuner.restore``), so what a campaign
needs to go on lives in plain, versioned data (search.searchers.state), never in the pickle.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from dataclasses import replace

from ray import tune

from qkvsearch import ray_private
from qkvsearch.search.campaign.assemble import build_search
from qkvsearch.search.campaign.driver import (
    TrialSettings,
    run_trial,
    trains_in_trial_process,
    trial_name,
    trial_resources,
)
from qkvsearch.search.campaign.interrupts import CampaignInterrupted, StopSignals
from qkvsearch.search.campaign.measured import measure_settings
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.prepare import prepare_for
from qkvsearch.search.campaign.recording import TrialRecorder
from qkvsearch.search.campaign.retention import retention_callback
from qkvsearch.search.campaign.tracking import study_storage, tracking_callbacks
from qkvsearch.search.campaign.tune_settings import applied as tune_settings_applied
from qkvsearch.search.campaign.tune_settings import environment
from qkvsearch.search.cluster.capacity import Cluster
from qkvsearch.search.cluster.local_ray import TRIAL_SLOT
from qkvsearch.search.records.layout import ENDED_KEY, INTERRUPTED_KEY, TRAIN_RUNS_DIR
from qkvsearch.search.searchers.state import Unbuilt
from qkvsearch.spaces.keys import fill, identity
from qkvsearch.spaces.metrics import ranked_by
from qkvsearch.trainers.training.faults import read_faults

log = logging.getLogger(__name__)


class _Describe:
    """Trial -> its record's description: resolved config, cost (how it was measured, when it was),
    planned epochs, readable name; ``fields``: what every record of the run also says (a one-shot campaign's
    fidelity and supernet); ``init_weights``: training identity -> the weights its training starts from (the
    record's ``init_from``)."""

    def __init__(self, fields: dict | None = None, init_weights: dict | None = None):
        self.fields = dict(fields or {})
        self.init_weights = dict(init_weights or {})

    def __setstate__(self, state: dict) -> None:  # pickled by campaigns launched before records had fields
        self.__dict__.update({"fields": {}, "init_weights": {}, **state})

    def __call__(self, trial) -> dict:
        cfg, cost = trial.config["config"], trial.config["cost"]
        init = self.init_weights.get(identity(fill(cfg))) if self.init_weights else None
        return {"config": cfg, "cost": cost, "epochs_planned": int(cfg["epochs"]),
                "name": trial_name(cfg, trial.trial_id), "measured_on": trial.config.get("measured_on"),
                **({"init_from": init} if init else {}), **self.fields}

    def name(self, trial) -> str:   # the name creator tuner.pkl holds for campaigns launched before `_trial_name`
        return _trial_name(trial)


def _trial_name(trial) -> str:
    """A Tune trial's name and folder name (a function, not a bound method: Tune copies its creators into every
    trial, with the object a method is bound to)."""
    return trial_name(trial.config["config"], trial.trial_id)


def trial_settings(campaign: OpenedCampaign) -> TrialSettings:
    """What every trial of the campaign shares (built once per driver)."""
    spec, exp = campaign.spec, campaign.exp
    res = spec.resources
    return TrialSettings(
        objectives=tuple((o.metric, o.mode) for o in spec.objectives),
        constraints=tuple(spec.constraints), workers=res.workers_per_trial,
        cpus_per_worker=res.cpus_per_worker, gpus_per_worker=res.gpus_per_worker,
        placement_strategy=res.placement_strategy, train_storage=f"{exp}/{TRAIN_RUNS_DIR}", experiment=exp,
        faults=tuple(read_faults()),  # trial processes do not see this process's environment
        campaign=spec.name, max_failures=res.max_failures, measure=measure_settings(campaign))


class CampaignRun:
    """One driver's run of a campaign (module docstring). campaign: what it runs (search.campaign.opened);
    folder: its campaign file (search.records.layout.CampaignFolder), opened once by the command; cluster: the
    connected Ray (search.cluster.capacity)."""

    def __init__(self, campaign: OpenedCampaign, folder, cluster: Cluster, version: str, *,
                 supernet: dict | None = None, describe: dict | None = None, init_weights: dict | None = None,
                 tune_dir: str | None = None):
        """tune_dir: where Tune keeps this run's experiment (default: the campaign's folder; a later phase of the
        campaign, search.campaign.front_repeats, has its own, its trials recorded beside the others)."""
        self.campaign, self.folder, self.cluster = campaign, folder, cluster
        self.tune_dir = tune_dir or campaign.exp
        self.settings = replace(trial_settings(campaign), supernet=supernet, init_weights=init_weights or None,
                                prepared=prepare_for(campaign.spec))  # made or checked before any trial starts
        self.describe = _Describe(describe or {}, init_weights)
        self.recorder = TrialRecorder(campaign.exp, campaign.spec.name, self.describe)
        self.retention = retention_callback(campaign, self.recorder, self.settings)
        storage = study_storage(campaign)  # the searcher's study lives in the optuna tracker's storage
        self.searcher = build_search(campaign, storage)
        self.tracking = tracking_callbacks(campaign, self.recorder, version, study_in_storage=storage is not None)
        self.early = _early_stages(campaign, self.settings)

    def callbacks(self, stop: StopSignals) -> list:
        return [self.recorder, *self.tracking, stop, *self.early, self.retention]

    def trainable(self):
        slot = _trial_slot(self.cluster, trains_in_trial_process(self.settings.workers))
        return tune.with_resources(tune.with_parameters(run_trial, settings=self.settings),
                                   trial_resources(self.settings, slot))

    def fit(self, concurrency: int | None = None, *, restoring: bool = False, verbose: bool = False, view=None):
        """The trials (a new Tuner, or the restored one), then the stages."""
        # What Tune keeps and writes per trial (search.campaign.tune_settings), for Tuner.restore and fit alike.
        with StopSignals() as stop, tune_settings_applied():
            self.searcher.stopping = lambda: stop.received is not None  # endings then are the stop's
            if restoring:
                tuner = tune.Tuner.restore(self.tune_dir, trainable=self.trainable(), resume_unfinished=True,
                                           resume_errored=False)
                pickled = ray_private.restored_searcher(tuner)
                if isinstance(pickled, Unbuilt):
                    pickled.check(f"{self.tune_dir}/tuner.pkl")
                ray_private.replace_restored_searcher(tuner, self.searcher)
                run_config = ray_private.restored_run_config(tuner)
                run_config.callbacks = self.callbacks(stop)
                run_config.verbose = _tune_verbosity(verbose)
            else:
                tuner = tune.Tuner(
                    self.trainable(),
                    tune_config=tune.TuneConfig(
                        search_alg=self.searcher, scheduler=_scheduler(self.campaign),
                        num_samples=self.campaign.spec.search.num_trials, max_concurrent_trials=concurrency,
                        # A finished trial's process serves the next trial (no new process; Ray, torch and
                        # timm imported already): Tune's stop reaches every trial inside tune.report. Not when
                        # the campaign measures: Tune keeps one idle trial process (and its CPUs) for reuse,
                        # which a measurement holding the whole node would wait for (search.campaign.measured).
                        reuse_actors=self.searcher.measurer is None,
                        trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
                    run_config=_run_config(self.campaign, self.callbacks(stop), verbose, self.tune_dir))
            try:
                self._fit(tuner, stop, view, verbose)
            except BaseException:
                for callback in self.early:  # stages running beside the trials stop with them
                    callback.stop()
                raise
        self._stages()

    def _fit(self, tuner, stop: StopSignals, view, verbose: bool) -> None:
        """tuner.fit() watched by the monitor's views; then the campaign file says how the driver ended."""
        from qkvsearch.search.monitor.metrics import CampaignMetrics
        from qkvsearch.search.monitor.watch import CampaignMonitor

        views = [CampaignMetrics(self.recorder.campaign)] + ([view] if view is not None else [])
        ray_private.count_callbacks_by_name()  # Tune's usage tag would import mlflow and wandb to count callbacks
        with CampaignMonitor(self.campaign.exp, views), _tune_environment(verbose):
            tuner.fit()
            if stop.received:  # before the monitor's last snapshot: no trial shows as running after a stop
                interrupted = self.recorder.mark_interrupted()
        if stop.received:
            self.folder.mark(INTERRUPTED_KEY)
            raise CampaignInterrupted(self.campaign.exp, stop.received, interrupted)
        self.folder.mark(ENDED_KEY)
        self.retention.close()  # no other quantization policy can come: trainers kept for them let go

    def _stages(self) -> None:
        """The stages after the trials (search.campaign.stages), once those begun beside them have run; a stop
        signal there: the campaign is interrupted."""
        from qkvsearch.search.campaign.stages import run_stages

        main = threading.current_thread() is threading.main_thread()
        before = signal.signal(signal.SIGTERM, sigterm_interrupts) if main else None  # Ray's ends the process
        staged = bool(self.campaign.spec.stages)
        try:
            if staged:  # the campaign ends with its last stage (`watch` follows the stages)
                self.folder.mark(None)
            for callback in self.early:
                callback.finish()
            run_stages(self.campaign, self.settings, self.retention.retention)
            if staged:
                self.folder.mark(ENDED_KEY)
        except KeyboardInterrupt as err:
            self.folder.mark(INTERRUPTED_KEY)
            raise CampaignInterrupted(self.campaign.exp, "a stop signal", []) from err
        finally:
            if main:
                signal.signal(signal.SIGTERM, before)


def sigterm_interrupts(signum, frame):
    raise KeyboardInterrupt


def _trial_slot(cluster: Cluster, trains: bool) -> dict:
    """What a trial's process holds besides its CPUs and GPUs (search.campaign.driver.trial_resources): a trial
    slot, which caps how many trials run at once; on a cluster without slots, a driver-only trial takes a
    sliver of the head node (Tune needs some resource) and a training trial nothing more."""
    if cluster.trial_slots:
        return {TRIAL_SLOT: 1}
    return {} if trains else {"node:__internal_head__": 0.001}


def _scheduler(campaign: OpenedCampaign):
    """The spec's trial scheduler (spaces.sections.SCHEDULERS: its builder). Each makes Tune save its
    experiment state whenever trials were added or ended (CheckpointsTrialChanges), so a killed driver's
    campaign resumes with every trial and the searcher as they were. Tune does not save schedulers with the
    experiment: a restored MO-ASHA rebuilds its rungs from the records."""
    from qkvsearch.search.scheduling.tune_schedulers import make_scheduler

    spec = campaign.spec
    sched = spec.scheduler
    return make_scheduler(sched.type, max_t=spec.train.epochs, grace=sched.grace_epochs, rf=sched.reduction_factor,
                          brackets=sched.bracket_count(spec.train.epochs),
                          metrics=[ranked_by(o.metric) for o in spec.objectives],   # top1_q's rungs: top1
                          modes=[o.mode for o in spec.objectives],
                          metric=sched.metric, mode=sched.mode,  # asha: the loader resolved them
                          experiment=campaign.exp, section=sched)


def _run_config(campaign: OpenedCampaign, callbacks: list, verbose: bool, tune_dir: str | None = None):
    storage, name = (tune_dir or campaign.exp).rsplit("/", 1)
    return tune.RunConfig(
        name=name, storage_path=storage, verbose=_tune_verbosity(verbose), callbacks=callbacks,
        # A trial whose process is lost is restarted from its checkpoint; one whose training fails reports
        # it as a result (search.campaign.driver.run_trial) and is not retried.
        failure_config=tune.FailureConfig(max_failures=campaign.spec.resources.max_failures),
    )


def _tune_verbosity(verbose: bool) -> int:
    return 1 if verbose else 0  # 1: Tune's trial tables; 0: only the campaign's own lines (search.monitor.terminal)


# Read by Tune in the driver while it runs, the same for every campaign of this process (a scoped setting would
# leave a second campaign of the process without it): no check that each result holds every objective. A trial
# reports its metrics, not its cost, which the scheduler and the searcher take from the trial
# (search.campaign.driver); a searcher state saved by an earlier version still names every objective as Tune's
# metric.
os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"


@contextlib.contextmanager
def _tune_environment(verbose: bool):
    """Tune's console output while it runs the campaign: its tables with --verbose, else nothing (its newer
    output prints an experiment header at any verbosity; its older reporter prints nothing at verbosity 0)."""
    with environment({} if verbose else {"RAY_AIR_NEW_OUTPUT": "0"}):
        yield


def _early_stages(campaign: OpenedCampaign, settings: TrialSettings) -> list:
    """[the callback that runs stages as trials complete] under stages.select as_completed, else []."""
    stages = campaign.spec.stages
    if not stages or stages.select != "as_completed":
        return []
    from qkvsearch.search.campaign.stages import StagesAsCompleted

    return [StagesAsCompleted(campaign, settings)]
