"""Another quantization policy of a trained model, evaluated without training: the trainer's weights read from
its checkpoint (``trained_weights``), quantized under a config's policy (trainers.model.quantize) and evaluated over the
validation split as training evaluates (``evaluate_policy``). search.campaign.policies runs it in a trial's
process; search.campaign.retention quantizes a front member's weights from the same files.
"""
from __future__ import annotations

import io

import torch

from qkvsearch.spaces.batches import batch_plan, eval_batch
from qkvsearch.storage import read_bytes
from qkvsearch.trainers.data import datasets as qdata
from qkvsearch.trainers.model.quantize import quantize_model
from qkvsearch.trainers.training.engine import Dist, autocast_context, evaluate, load_state

__all__ = ["evaluate_policy", "trained_weights"]


def trained_weights(path: str) -> dict:
    """The model weights of a trial's checkpoint: a Train checkpoint folder (state.pt), or a weights file kept
    once it ended (search.campaign.retention: ``qs_weights/<trial_id>.pt``); a local path or a URI."""
    if not path.endswith(".pt"):
        return load_state(path)["model"]
    return torch.load(io.BytesIO(read_bytes(path)), map_location="cpu", weights_only=True)["model"]


def evaluate_policy(cfg: dict, weights: dict, device, workers: int = 1) -> dict:
    """{"top1", "top5", "val_loss"} of the filled config's model with trained ``weights`` (another trial's,
    of the same training identity), quantized under the config's policy, over the validation split on
    ``device``, at the evaluation batch its training used (spaces.batches.eval_batch)."""
    from qkvsearch.trainers.model.models import build_model

    device = torch.device(device)
    model = build_model(cfg)
    model.load_state_dict(weights)
    model = quantize_model(model.to(device).eval(), cfg, device)
    _, val = qdata.load_data(cfg)
    bpw, _ = batch_plan(cfg, max(1, workers))
    return evaluate(model, val, Dist(0, 1, device), batch_size=eval_batch(bpw),
                    autocast=autocast_context(cfg, device))
