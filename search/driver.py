"""The Tune trainable: one trial = one Ray Train `TorchTrainer` run of one configuration.

The trial process is only a driver: it holds no CPU (the workers do), checks the cost constraints
before anything trains, runs the DDP training through `trainers.loop.run_trainer`, and turns the
ways a trial can end without a usable score (infeasible, diverged) into a final report that the
recorder and the searchers understand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from qkvsearch.spaces.schema import violations

# Tune's iteration counter restarts at 1 when a trial is restored; `epoch` does not.
TIME_ATTR = "epoch"


@dataclass(frozen=True)
class TrialSettings:
    """What every trial of a campaign shares (picklable: it travels to each trial's process)."""

    base_config: dict
    objectives: tuple[tuple[str, str], ...]        # ((metric, "max"|"min"), ...)
    constraints: tuple = ()                         # spaces.schema.Constraint, checked before training
    workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    placement_strategy: str = "PACK"                # SPREAD: one worker per node
    train_storage: str = ""                         # where Train runs keep checkpoints


def trial_config(settings: TrialSettings, sampled: dict) -> dict:
    """The flat trial config: the campaign's fixed keys, then what the searcher chose.

    A grid campaign samples one `qs_variant` dict per trial; Optuna samples keys directly, plus
    the index of the variant it drew (`variant`), which is not a trial key.
    """
    sampled = dict(sampled)
    variant = sampled.pop("qs_variant", None) or {}
    sampled.pop("variant", None)
    return {**settings.base_config, **variant, **sampled}


def _terminal_report(settings: TrialSettings, status: str, error: str, cost: dict) -> dict:
    """A final result for a trial without a score: objectives absent from the cost are NaN."""
    result = {"qs_status": status, "qs_error": error, TIME_ATTR: 0.0}
    for key in ("params_m", "gmacs"):
        result[key] = float(cost[key])
    for metric, _ in settings.objectives:
        result.setdefault(metric, float(cost[metric]) if metric in cost else math.nan)
    return result


class _ForwardToTune(TuneReportCallback):
    """Train -> Tune bridge that stamps each result with the planned epoch count."""

    def __init__(self, epochs_planned: int):
        super().__init__()
        self.epochs_planned = float(epochs_planned)

    def after_report(self, run_context, metrics, checkpoint):
        stamped = [{**metrics[0], "qs_epochs_planned": self.epochs_planned}, *metrics[1:]]
        super().after_report(run_context, stamped, checkpoint)


def run_trial(sampled: dict, settings: TrialSettings) -> None:
    """Tune function trainable (bound to `settings` with `tune.with_parameters`)."""
    from qkvsearch.trainers.loop import find_divergence, run_trainer

    cfg = trial_config(settings, sampled)
    if settings.constraints:  # never start a TorchTrainer for a configuration that cannot be kept
        cost = _cost(cfg)
        broken = violations(settings.constraints, cost)
        if broken:
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
            callbacks=[_ForwardToTune(cfg["epochs"])],
        )
    except Exception as exc:  # a diverged trial ends as a result, any other failure as a Tune error
        diverged = find_divergence(exc)
        if diverged is None:
            raise
        tune.report(_terminal_report(settings, "diverged", str(diverged), _cost(cfg)))


def _cost(cfg: dict) -> dict:
    # Imported here: timm's import costs seconds on the path from trial start to the first DDP step.
    from qkvsearch.trainers.cost import model_cost

    return model_cost(cfg)
