"""The metric vocabulary, declared once: what a trial, a measurement or a stage reports, and the natural
optimisation mode of each (objectives and constraints name these; the trial keys are spaces.keys).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# metric -> natural optimisation mode
METRICS: dict[str, str] = {
    "top1": "max", "top5": "max", "val_loss": "min", "train_loss": "min",     # per epoch
    "images_per_s": "max", "epoch_s": "min", "train_s": "min",                # per epoch
    "train_s_total": "min",                                                   # per trial: sum of train_s
    "gmacs": "min", "params_m": "min", "params": "min", "embed_params": "min",  # cost, before training
    "epoch_step_ms": "min", "epoch_peak_mem_gb": "min",                       # per epoch, as training saw them
    "top1_q": "max",   # per trial, once it has trained: top-1 of its model under its quantization policy
}
# A metric known only once a trial has completed -> the per-epoch metric schedulers rank its rungs by.
RANKED_BY = {"top1_q": "top1"}
# Cost measured on the trials' device before training (trainers.deploy.measure): metric -> (mode, unit, what).
MEASURED: dict[str, tuple[str, str, str]] = {
    "latency_ms": ("min", "ms", "inference of measure.latency_batch images (median; p90 kept)"),
    "throughput": ("max", "images/s", "inference at measure.batch images a forward"),
    "train_step_ms": ("min", "ms", "forward, backward and optimizer step at the trial's per-worker batch"),
    "peak_mem_gb": ("min", "GB", "peak memory of that training step"),
    "size_mb": ("min", "MB", "the weights as stored under the quantization policy: bytes of the state_dict's "
                             "tensors (int8 data and scales of a quantized linear), 1e6 bytes"),
}
METRICS.update({name: mode for name, (mode, _, _) in MEASURED.items()})
MEASURED_METRICS = tuple(MEASURED)
COUNTED_METRICS = ("params", "params_m", "embed_params", "gmacs")     # from the config alone (trainers.model.cost)
# What scoring a subnet with the weights it inherits from a supernet gives (trainers.supernet.scoring): its
# validation figures, its top-1 under its quantization policy, and its weights' size under that policy.
INHERITED_METRICS = ("top1", "top5", "val_loss", "top1_q")
SCORED_METRICS = (*INHERITED_METRICS, "size_mb")
COST_METRICS = COUNTED_METRICS + MEASURED_METRICS                     # known before training
EPOCH = "epoch"   # the epoch number's key: in a trial's results (Tune's time attribute), its epochs file and tables
FINETUNE_METRIC = "top1@"                                             # + the stage's dataset: max


@dataclass(frozen=True)
class StageMetric:
    """A metric of the stages after training (spaces.stages, search.campaign.stages), in percent: an objective
    or constraint of the stages' final front and a column of stages.parquet, never learnt by the searcher.
    stage: the stage that measures it (finetune: from every fine-tuning; ood: the OOD stage); default: the
    stages' objective for that stage when the campaign file names none."""

    name: str
    mode: str
    stage: str
    doc: str
    default: bool = False


TRANSFER_AVG = "transfer_avg"
STAGE_METRIC_LIST = (
    StageMetric(TRANSFER_AVG, "max", "finetune",
                f"the mean of the `{FINETUNE_METRIC}` columns; null until every fine-tuning has completed", True),
    StageMetric("fpr95", "min", "ood", "false-positive rate at 95 % true-positive rate", True),
    StageMetric("det_err", "min", "ood", "detection error: min over thresholds of (FPR + FNR) / 2"),
    StageMetric("auroc", "max", "ood", "area under the ROC curve"),
    StageMetric("aupr_in", "max", "ood", "area under the precision-recall curve, in-distribution positive"),
    StageMetric("aupr_out", "max", "ood", "area under the precision-recall curve, OOD positive"),
)
STAGE_METRICS: dict[str, str] = {m.name: m.mode for m in STAGE_METRIC_LIST}   # metric -> mode
OOD_METRICS = tuple(m.name for m in STAGE_METRIC_LIST if m.stage == "ood")   # an OOD stage's, in this order
SCHEDULER_METRICS = ("top1", "top5", "val_loss", "train_loss")        # change from epoch to epoch
# What a metric can never go past, where that is known: its hypervolume reference (search.analysis.hv_reference)
# is then that bound, and an objective's or constraint's bound outside it is refused. Every metric here is
# >= 0 (metric_bounds), so a metric maximised is bounded below by 0. Accuracies and stage metrics are percents.
PERCENT = (0.0, 100.0)
BOUNDS: dict[str, tuple[float, float]] = {"top1": PERCENT, "top5": PERCENT, "top1_q": PERCENT,
                                          **{m.name: PERCENT for m in STAGE_METRIC_LIST}}
# Metrics every model has above their low bound (it has weights, does work, takes time and memory): a max at or
# below that bound holds for no configuration. (embed_params is 0 for a model without q/k/v maps.)
ABOVE_LOW = ("params", "params_m", "gmacs", *MEASURED_METRICS)


def ranked_by(metric: str) -> str:
    """The metric a scheduler ranks ``metric`` by at its rungs (itself, or its per-epoch stand-in: RANKED_BY)."""
    return RANKED_BY.get(metric, metric)


def metric_bounds(metric: str) -> tuple[float, float]:
    """[low, high] of a metric's values: its BOUNDS (a fine-tuning's top1@<dataset> is a top1), else [0, inf)."""
    if metric.startswith(FINETUNE_METRIC):
        return BOUNDS["top1"]
    return BOUNDS.get(metric, (0.0, math.inf))


def bound_problem(metric: str, value: float, side: str | None = None) -> str | None:
    """Why ``value`` cannot bound ``metric`` ("expected ..., given ..."): it lies outside what the metric can
    take, or (``side`` "max") at or below the low bound of a metric every model is above (ABOVE_LOW), so the
    constraint would hold for every configuration or for none. None when it can."""
    low, high = metric_bounds(metric)
    if side == "max" and metric in ABOVE_LOW and value == low:
        return (f"expected a number > {low:g} (every model's {metric} is above {low:g}: a max of {value:g} holds "
                f"for none), given {value:g}")
    if low <= value <= high:
        return None
    what = (f"in [{low:g}, {high:g}] ({metric} is a percentage)" if (low, high) == PERCENT
            else f">= {low:g} ({metric} cannot be negative)" if high == math.inf else f"in [{low:g}, {high:g}]")
    return f"expected a number {what}, given {value:g}"
