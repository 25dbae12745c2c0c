"""Trials: built once in the campaign's driver (`build_trial`), run in their own process (`run_trial`).

A trial is the dict Tune holds as the trial's config: ``{"config": resolved trial config, "cost": cost}``,
or ``{"config": the raw config, "cost": {}, "invalid": message}`` when no model can be made of it.
The trial process is only a driver: it holds no CPU (the workers do), checks the cost constraints before
anything trains, runs the DDP training through `trainers.loop.run_trainer`, and turns the ways a trial can
end without a usable score (infeasible, diverged) into a final report that the recorder and the
searchers understand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from qkvsearch.search.records import ERROR_KEY, PLANNED_KEY, STATUS_KEY
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.schema import violations

# Tune's iteration counter restarts at 1 when a trial is restored; `epoch` does not.
TIME_ATTR = "epoch"


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
    faults: tuple = ()                              # trainers.faults rules, read where the campaign starts


def build_trial(base: dict, sampled: dict) -> dict:
    """The campaign's fixed keys, then what the searcher chose, resolved once (trainers.cost.resolve_trial).

    Optuna also samples the index of the variant it drew (``variant``), which is not a trial key.
    """
    from qkvsearch.trainers.cost import resolve_trial  # timm: the campaign's driver only

    raw = {**base, **{k: v for k, v in sampled.items() if k != "variant"}}
    try:
        config, cost = resolve_trial(raw)
    except BadInput as err:  # e.g. a ratio drawn from a range that leaves less than one channel
        return {"config": raw, "cost": {}, "invalid": str(err)}
    return {"config": config, "cost": cost}


def _terminal_report(settings: TrialSettings, status: str, error: str, cost: dict) -> dict:
    """A final result for a trial without a score: objectives absent from the cost are NaN."""
    result = {STATUS_KEY: status, ERROR_KEY: error, TIME_ATTR: 0.0, **cost}
    for metric, _ in settings.objectives:
        result.setdefault(metric, math.nan)
    return result


class _ForwardToTune(TuneReportCallback):
    """Train -> Tune bridge: adds the trial's cost and planned epochs to each of rank 0's results."""

    def __init__(self, epochs_planned: int, cost: dict):
        super().__init__()
        self.extra = {**cost, PLANNED_KEY: float(epochs_planned)}

    def after_report(self, run_context, metrics, checkpoint):
        super().after_report(run_context, [{**metrics[0], **self.extra}, *metrics[1:]], checkpoint)


def run_trial(trial: dict, settings: TrialSettings) -> None:
    """Tune function trainable (bound to `settings` with `tune.with_parameters`)."""
    from qkvsearch.trainers.loop import find_divergence, run_trainer

    cfg, cost = trial["config"], trial["cost"]
    if trial.get("invalid"):
        tune.report(_terminal_report(settings, "infeasible", trial["invalid"], cost))
        return
    broken = violations(settings.constraints, cost)
    if broken:  # never start a TorchTrainer for a configuration that cannot be kept
        tune.report(_terminal_report(settings, "infeasible", "; ".join(broken), cost))
        return
    try:
        run_trainer(
            cfg,
            num_workers=settings.workers,
            cpus_per_worker=settings.cpus_per_worker,
            gpus_per_worker=settings.gpus_per_worker,
            placement_strategy=settings.placement_strategy,
            name=tune.get_context().get_trial_id(),  # stable name: a restored trial resumes its Train run
            storage_path=settings.train_storage,
            callbacks=[_ForwardToTune(cfg["epochs"], cost)],
            faults=settings.faults,
        )
    except Exception as exc:  # a diverged trial ends as a result, any other failure as a Tune error
        diverged = find_divergence(exc)
        if diverged is None:
            raise
        tune.report(_terminal_report(settings, "diverged", str(diverged), cost))
