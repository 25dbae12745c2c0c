"""A trial that trains nothing: another quantization policy of a configuration trained in the campaign (or in a
warm start's campaign). search.searchers.proposals makes it once that training has ended: ``{"config",
"cost", "trained_by": <trial id> or <earlier campaign>/<trial id>, "known": that training's outcome}``.

In its trial's process (search.campaign.driver.run_trial) it reads the trainer's weights from the trainer's
record (``checkpoint_path``: its Train checkpoint, or the weights it kept once ended: search.campaign.retention
keeps them while other policies may still come), quantizes them under its own policy and evaluates them on the
validation split (trainers.model.quantize.evaluate_policy): seconds. Its one result holds the trainer's final
accuracy (``top1``, ``top5``, ``val_loss``: the model in full precision) and its own ``top1_q``, at epoch 0 like a
duplicate's (no scheduler rung counts it); the recorder keeps it as the trial's one epoch, at the planned epoch
(search.records.recorder). A trainer that did not complete leaves nothing to quantize: the trial ends as the
trainer ended, saying why.
"""
from __future__ import annotations

import math

from qkvsearch.search.records.layout import ERROR_KEY, STATUS_KEY, TRAINED_BY_KEY, UNSCORED_STATUSES
from qkvsearch.search.records.readers import read_record
from qkvsearch.spaces.metrics import EPOCH

FINAL_ACCURACY = ("top1", "top5", "val_loss")   # the trainer's last epoch, the model in full precision
RETRIES = 2   # reads of the trainer's record: retention may move its checkpoint to a weights file meanwhile


def trainer_checkpoint(experiment: str, trained_by: str) -> str | None:
    """The checkpoint (folder or weights file) the trainer's record names; ``trained_by`` a trial id of this
    campaign or ``<earlier campaign>/<trial id>``."""
    exp, _, tid = trained_by.rpartition("/")
    rec = read_record(exp or experiment, tid)
    return (rec or {}).get("checkpoint_path")


def _weights(experiment: str, trained_by: str) -> dict:
    from qkvsearch.trainers.deploy.policy_eval import trained_weights
    from qkvsearch.trainers.training.errors import CheckpointError

    for attempt in range(RETRIES):
        path = trainer_checkpoint(experiment, trained_by)
        if path is None:
            raise CheckpointError(f"trial {trained_by} kept no checkpoint: no trained weights to quantize")
        try:
            return trained_weights(path)
        except (OSError, CheckpointError):
            if attempt == RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def run_policy(trial: dict, cfg: dict, objectives, experiment: str, workers: int, threads: int) -> dict:
    """The result of a ``trained_by`` trial (module docstring), for Tune; errors raise to the caller."""
    import torch

    from qkvsearch.trainers.deploy.policy_eval import evaluate_policy

    trainer, known = trial["trained_by"], trial["known"]
    result: dict = {TRAINED_BY_KEY: trainer, EPOCH: 0.0}
    if known["status"] != "completed":
        status = known["status"] if known["status"] in UNSCORED_STATUSES else "stopped_early"
        result.update({STATUS_KEY: status, ERROR_KEY: f"the training of its configuration (trial {trainer}) "
                                                      f"ended {known['status']}: no trained model to quantize"})
    else:
        torch.set_num_threads(max(1, threads))
        device = "cuda" if torch.cuda.is_available() else "cpu"   # the GPU the trial holds, if any
        quantized = evaluate_policy(cfg, _weights(experiment, trainer), device, workers)
        result.update({k: known["metrics"][k] for k in FINAL_ACCURACY if k in known["metrics"]})
        result["top1_q"] = quantized["top1"]
    for metric, _ in objectives:
        result.setdefault(metric, math.nan)
    return result
