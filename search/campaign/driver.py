"""Trials: built once in the campaign's driver (search.searchers.problem.build_trial), run in their own
process (`run_trial`).

A trial is the dict Tune holds as the trial's config: ``{"config": resolved trial config, "cost": cost,
"kind": its proposal's kind}`` (search.searchers.ledger), or ``{"config": the raw config, "cost": {},
"invalid": message}`` when no model can be made of it; what each kind runs is ``RUNS``. A trial whose
configuration was trained already in the campaign (same `identity`) also carries ``"duplicate_of": <trial id>``
and, when that trial has ended, ``"known": its outcome``: it trains nothing.
The trial process checks the cost constraints before anything trains, runs the training through
`trainers.ray_train.loop.run_trainer`, and turns the ways a trial can end without a usable score (infeasible,
diverged) into a final report that the recorder and the searchers understand. A trial of several workers
is only a driver: it holds no CPU (its TorchTrainer's workers do) and reports to Tune what rank 0 reported
(`search.campaign.bridge`). A trial of one worker trains in its own process (Train's local mode: no controller, no
worker actors to start) and holds that worker's CPUs and GPUs itself (`trial_resources`). Either way Tune's
stop reaches the training through `tune.report`, so a trial's process can serve the next trial.
"""
from __future__ import annotations

import json
import math
import time
import traceback
from dataclasses import dataclass

from ray import tune
from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY

from qkvsearch.search.campaign.bridge import drive
from qkvsearch.search.campaign.measured import ERROR_PREFIX, MeasureSettings, measure_here
from qkvsearch.search.campaign.policies import run_policy
from qkvsearch.search.records.layout import (
    DUPLICATE_OF_KEY,
    ERROR_CHARS,
    ERROR_KEY,
    FINAL_STATUSES,
    MEASURED_ON_KEY,
    ORIGINAL_STATUS_KEY,
    PLANNED_KEY,
    STATUS_KEY,
    for_tune,
)
from qkvsearch.search.records.readers import read_trials
from qkvsearch.search.searchers import ledger as rules
from qkvsearch.spaces.blocks import block_text
from qkvsearch.spaces.checks import names_as_given
from qkvsearch.spaces.choices import EMBEDDING_CHOICES, PRECISION_CHOICES
from qkvsearch.spaces.keys import fill, identity, quant_policy
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.spaces.schema import violations
from qkvsearch.spaces.upgrade import upgraded

# Tune's time attribute is EPOCH: its iteration counter restarts at 1 when a trial is restored; the epoch does not.


@dataclass(frozen=True)
class TrialSettings:
    """What every trial of a campaign shares (picklable: it travels to each trial's process)."""

    objectives: tuple[tuple[str, str], ...]        # ((metric, "max"|"min"), ...)
    constraints: tuple = ()                         # spaces.schema.Constraint, checked before training
    workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    placement_strategy: str = "PACK"                # SPREAD: one worker per node
    train_storage: str = ""                         # where Train runs keep checkpoints
    experiment: str = ""                            # the campaign's folder (records of other trials)
    faults: tuple = ()                              # trainers.training.faults rules, read where the campaign starts
    campaign: str = ""                              # its name: Train runs are <campaign>-<trial name>
    max_failures: int = 0                           # worker-group restarts of a Train run (from its checkpoint)
    measure: MeasureSettings = MeasureSettings()    # measured cost (search.campaign.measured); none by default
    supernet: dict | None = None                    # a supernet's plan: its one trial trains it
                                                    # (search.campaign.oneshot)
    init_weights: dict | None = None                # training identity -> the weights its training starts from,
                                                    # head included (one-shot's ``retrain_from: inherited``)
    prepared: dict | None = None                    # the prepared datasets its trials read (search.campaign.prepare)


def trial_name(cfg: dict, trial_id: str) -> str:
    """`fsne-h128-c8-shared-00003`: what a person needs to tell trials apart (and the parts its quantization
    policy quantizes: `linear-qkv.a8w8-mlp.w8-00004`), then the trial index."""
    parts = [block_text(cfg, "embedding")]
    if cfg.get("width"):
        parts.append(f"h{cfg['width']}")
    if getattr(EMBEDDING_CHOICES.get(cfg.get("embedding")), "codes", False):   # its codes, as its row says
        parts += [f"c{cfg['code_size']}", str(cfg["code_sharing"]).replace("_", "")]
    parts += [f"{k.removeprefix('quant_')}.{PRECISION_CHOICES[v].tag or v}" for k, v in quant_policy(cfg).items()]
    return "-".join(parts + [trial_id.rsplit("_", 1)[-1]])


def train_run_name(settings: TrialSettings, cfg: dict, trial_id: str) -> str:
    """`quickstart-fsne-h64-c8-shared-00003`: Ray's Train metrics and logs name the campaign and the trial.
    Stable for a trial, so a restored trial resumes its Train run."""
    name = trial_name(cfg, trial_id)
    return f"{settings.campaign}-{name}" if settings.campaign else name


WAIT_POLL_S = 2.0


def _outcome_of_record(experiment: str, trial_id: str) -> dict | None:
    """The outcome of a trial from its record, or None while it has not ended."""
    read = read_trials(experiment)  # the last epochs only: no object per epoch
    found = next(((r, last) for r, last in zip(read.records, read.last_epochs()) if r["trial_id"] == trial_id),
                 None)
    if found is None or found[0].get("status") not in FINAL_STATUSES:
        return None
    return {"status": found[0]["status"], "metrics": found[1]}


def _report_duplicate(settings: TrialSettings, trial: dict) -> None:
    """Report the original's outcome (waiting for it if it still runs) under this trial's name."""
    known = trial.get("known")
    while known is None:
        known = _outcome_of_record(settings.experiment, trial["duplicate_of"])
        if known is None:
            time.sleep(WAIT_POLL_S)
    result = {**known["metrics"], STATUS_KEY: "duplicate", DUPLICATE_OF_KEY: trial["duplicate_of"],
              ORIGINAL_STATUS_KEY: known["status"], EPOCH: 0.0}  # epoch 0: no scheduler rung counts it twice
    for metric, _ in settings.objectives:
        result.setdefault(metric, math.nan)
    report(settings, result)


def report(settings: TrialSettings, result: dict) -> None:
    """Hand ``result`` to Tune: the numbers its schedulers and searchers read as numbers (the objectives, the
    epoch, the planned epochs), the others packed (search.records.layout.for_tune)."""
    tune.report(for_tune(result, (*(metric for metric, _ in settings.objectives), EPOCH, PLANNED_KEY)))


def _terminal_report(settings: TrialSettings, status: str, error: str, measured: dict) -> dict:
    """A final result for a trial without a score: its objectives NaN (measured: what the trial's own process
    measured, for the record)."""
    result = {STATUS_KEY: status, ERROR_KEY: error, EPOCH: 0.0, **measured}
    for metric, _ in settings.objectives:
        result.setdefault(metric, math.nan)
    return result


def trains_in_trial_process(workers: int) -> bool:
    """One worker: the trial's own process trains (Train's local mode), so it must hold the worker's resources."""
    return workers == 1


def trial_resources(settings: TrialSettings, slot: dict) -> dict:
    """Tune resources of a trial's process; slot: what it holds besides CPUs and GPUs ({"trial_slot": 1}
    caps concurrency). A trial that only drives a TorchTrainer holds no CPU the workers need (else 2
    one-CPU workers deadlock on 2 CPUs); one that trains holds its worker's CPUs and GPUs."""
    if not trains_in_trial_process(settings.workers):
        return {"cpu": 0, **slot}
    gpu = {"gpu": settings.gpus_per_worker} if settings.gpus_per_worker else {}
    return {"cpu": settings.cpus_per_worker, **gpu, **slot}


def _report_to_tune(settings: TrialSettings, epochs_planned: int, measured: dict, run_dir: str):
    """Train -> Tune: on_report(metrics, checkpoint_path | None) in the trial's training thread, whether
    the trial trains (local mode) or drives a Train run (search.campaign.bridge). An epoch reported without a
    checkpoint names its epoch's checkpoint where the run has one (the epoch a resumed run reports again).
    tune.report there also ends the thread when Tune stops the trial (a stopped trial frees its process).

    A result is rank 0's metrics and the planned epochs (schedulers and searchers tell a stopped trial from a
    finished one by them). The trial's cost is not in it: whoever needs it has it from the trial's config
    (MO-ASHA, search.scheduling.tune_schedulers; the searcher, search.searchers.proposals), and the record
    holds it once. ``measured``: what the trial's own process measured (a campaign proposed before its driver
    measured), which reaches the record through the results."""
    from qkvsearch.trainers.ray_train.loop import epoch_checkpoint

    def on_report(metrics: dict, checkpoint_path: str | None) -> None:
        result = {**metrics, **measured, PLANNED_KEY: float(epochs_planned)}
        if checkpoint_path:  # named the way the campaign's storage is (Train's path drops a bucket's scheme)
            path = f"{run_dir}/{checkpoint_path.rstrip('/').rsplit('/', 1)[-1]}"
        else:
            path = epoch_checkpoint(run_dir, metrics[EPOCH]) if EPOCH in metrics else None
        if path:
            result[CHECKPOINT_PATH_KEY] = path
        report(settings, result)

    return on_report


def run_trial(trial: dict, settings: TrialSettings) -> None:
    """Tune function trainable (bound to `settings` with `tune.with_parameters`): what the trial's kind runs."""
    # A trial restored from a campaign launched before some keys were declared lacks them: the values they had
    # before (spaces.upgrade). Its names were checked at launch: a trial whose Train workers build the model never
    # imports timm here.
    with names_as_given():
        cfg = fill(upgraded(trial["config"]))
    RUNS[trial_kind(trial)](trial, cfg, settings)


# A trial saved by a campaign from before trials carried their ledger kind holds one of these keys instead.
SAVED_KIND_KEYS = (("duplicate_of", rules.DUPLICATE), ("trained_by", rules.POLICY), ("invalid", rules.INVALID),
                   ("measure_error", rules.MEASURE_ERROR))


def trial_kind(trial: dict) -> str:
    """The ledger's kind of a trial Tune runs (search.searchers.ledger: new, policy, duplicate, invalid or
    measure_error); a trial saved before trials carried it is told by the key it held then."""
    if "kind" in trial:
        return trial["kind"]
    return next((kind for key, kind in SAVED_KIND_KEYS if trial.get(key)), rules.NEW)


def _run_duplicate(trial: dict, cfg: dict, settings: TrialSettings) -> None:
    _report_duplicate(settings, trial)


def _run_policy(trial: dict, cfg: dict, settings: TrialSettings) -> None:
    """Another policy of a configuration trained: quantize its weights (seconds)."""
    try:
        result = run_policy(trial, cfg, settings.objectives, settings.experiment, settings.workers,
                            int(settings.cpus_per_worker))
    except Exception as exc:  # noqa: BLE001  (Tune's stop is a SystemExit: it goes through)
        result = _terminal_report(settings, "failed", error_text(exc), {})
    report(settings, result)


def _run_invalid(trial: dict, cfg: dict, settings: TrialSettings) -> None:
    report(settings, _terminal_report(settings, "infeasible", trial["invalid"], {}))


def _run_measure_error(trial: dict, cfg: dict, settings: TrialSettings) -> None:
    report(settings, _terminal_report(settings, "failed", trial["measure_error"], {}))


def _train(trial: dict, cfg: dict, settings: TrialSettings) -> None:
    """A trial of its own: check its constraints (measuring first where it was proposed before the driver
    measured), then train it; the ways it can end without a usable score end it as a result."""
    from qkvsearch.trainers.ray_train.loop import RunSettings, find_divergence, run_trainer

    cost, measured = trial["cost"], {}
    broken = violations(settings.constraints, cost)
    if not broken and settings.measure.metrics and not trial.get("measured_on"):
        measured, broken = _measured(settings, cfg, cost)  # proposed before the driver measured (an older campaign)
        if measured is None:
            return
    if broken:  # never start a TorchTrainer for a configuration that cannot be kept
        report(settings, _terminal_report(settings, "infeasible", "; ".join(broken), measured))
        return
    local = trains_in_trial_process(settings.workers)
    run_name = train_run_name(settings, cfg, tune.get_context().get_trial_id())
    on_report = _report_to_tune(settings, cfg["epochs"], measured, f"{settings.train_storage.rstrip('/')}/{run_name}")
    init = (settings.init_weights or {}).get(identity(cfg))

    def fit(callbacks=()):
        return run_trainer(cfg, RunSettings(
            num_workers=0 if local else settings.workers, cpus_per_worker=settings.cpus_per_worker,
            gpus_per_worker=settings.gpus_per_worker, placement_strategy=settings.placement_strategy,
            name=run_name, storage_path=settings.train_storage, callbacks=callbacks,
            on_report=on_report if local else None, faults=settings.faults, max_failures=settings.max_failures,
            supernet=settings.supernet, init_from=init, init_head=init is not None, prepared=settings.prepared))

    try:
        if local:
            fit()
        else:
            drive(fit, on_report)
    except Exception as exc:  # noqa: BLE001  (Tune's stop is a SystemExit: it goes through)
        # The training's own error ends the trial as a result: diverged, or failed after Train's restarts.
        # Only a trial whose process is lost (a node gone) reaches Tune as an error, which Tune retries.
        diverged = find_divergence(exc)
        if diverged is not None:
            report(settings, _terminal_report(settings, "diverged", str(diverged), measured))
        else:
            report(settings, _terminal_report(settings, "failed", error_text(exc), measured))


# What a trial of each kind runs in its process (the kinds a proposal becomes a trial as: search.searchers.ledger).
RUNS = {rules.NEW: _train, rules.POLICY: _run_policy, rules.DUPLICATE: _run_duplicate, rules.INVALID: _run_invalid,
        rules.MEASURE_ERROR: _run_measure_error}


def _measured(settings: TrialSettings, cfg: dict, cost: dict) -> tuple[dict | None, list[str]]:
    """(the measured metrics and how they were measured, the constraints the cost with them breaks), measured
    in the trial's process; (None, []) when the measurement failed (the trial is then reported failed)."""
    try:
        metrics, how = measure_here(cfg, settings.measure, settings.workers)
    except Exception as exc:  # noqa: BLE001  (e.g. out of memory at the measure batch: this trial's failure)
        report(settings, _terminal_report(settings, "failed", ERROR_PREFIX + error_text(exc), {}))
        return None, []
    return {**metrics, MEASURED_ON_KEY: json.dumps(how)}, violations(settings.constraints, {**cost, **metrics})


def error_text(exc: BaseException) -> str:
    """The traceback of a trial's error, its last ERROR_CHARS characters (the cause is at the end)."""
    return "".join(traceback.format_exception(exc)).strip()[-ERROR_CHARS:]
