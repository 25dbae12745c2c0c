"""What the stages after pretraining do with a trained model (search.campaign.stages runs them):

- a fine-tuning starts from the pretrained weights with a new head (trainers.training.checkpoints.load_pretrained);
- ``ood_evaluation``: a fine-tuned model's top-1 on its test set and its out-of-distribution scores,
  against each OOD set (trainers.stages.ood_metrics).

Scores (higher = more in-distribution), from the logits z (B, classes):
    msp        max_c softmax(z)_c            (Hendrycks & Gimpel)
    energy     logsumexp_c z_c               (the negative free energy, temperature 1; Liu et al.)
    max_logit  max_c z_c                     (Hendrycks et al.)
"""
from __future__ import annotations

import logging

import torch

from qkvsearch.trainers.stages.ood_metrics import mean_metrics, ood_metrics
from qkvsearch.trainers.training.checkpoints import read_weights

log = logging.getLogger(__name__)

def scores(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """(B, classes) logits -> (B,) confidence scores of ``kind`` (msp | energy | max_logit)."""
    z = logits.float()
    if kind == "msp":
        return z.softmax(dim=1).amax(dim=1)
    if kind == "energy":
        return torch.logsumexp(z, dim=1)
    return z.amax(dim=1)


@torch.no_grad()
def _score_source(model, source, device, kind: str, batch: int) -> tuple[torch.Tensor, int]:
    """(N,) scores of every image of a source, and how many its labels say the model got right."""
    out, correct = [], 0
    for x, y in source.batches(source.part(1, 0), batch, device, drop_last=False):   # the whole split, in order
        logits = model(x)
        out.append(scores(logits, kind).cpu())
        correct += int((logits.argmax(dim=1) == y).sum())
    return torch.cat(out), correct


def ood_evaluation(cfg: dict, checkpoint: str, ood_sets: list[dict], kind: str) -> dict:
    """The model of a filled config with the weights at ``checkpoint``, on its dataset's test split (the
    in-distribution) and each OOD set ({"name", "format", "path"}): {"top1", "per_set": {name: metrics},
    **the metrics' means over the sets}, percent."""
    from qkvsearch.spaces.batches import eval_batch
    from qkvsearch.trainers.data.datasets import check_dataset, load_data
    from qkvsearch.trainers.data.formats import ood_source
    from qkvsearch.trainers.model.models import build_model

    check_dataset(cfg)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(cfg)
    model.load_state_dict(read_weights(checkpoint))
    model.to(device).eval()
    batch = eval_batch(cfg["batch_size"])   # one process scores the whole split: the global batch's rule
    _, id_source = load_data(cfg)
    id_scores, correct = _score_source(model, id_source, device, kind, batch)
    per_set = {}
    for s in ood_sets:
        ood_scores, _ = _score_source(model, ood_source(s["format"], s.get("path"), cfg), device, kind, batch)
        per_set[s["name"]] = ood_metrics(id_scores.numpy(), ood_scores.numpy())
    return {"top1": 100.0 * correct / max(len(id_scores), 1), "per_set": per_set, **mean_metrics(per_set)}
