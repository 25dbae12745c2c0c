"""Out-of-distribution detection metrics, as the field defines them (numpy only: no torch, no Ray).

Convention: in-distribution (ID) samples are the positive class, and a score is a confidence: the higher,
the more a sample looks in-distribution (maximum softmax probability, negative energy, max logit). A
threshold t calls a sample ID when its score >= t. Over the thresholds t_1 > ... > t_m (the distinct
scores) and "call nothing ID" before them:

    TPR(t) = #ID with score >= t / #ID          FPR(t) = #OOD with score >= t / #OOD

- ``fpr95``: FPR at the first threshold whose TPR reaches 95 % (the fraction of OOD samples taken for ID
  while 95 % of the ID samples are kept);
- ``det_err``: detection error, min over thresholds of 1/2 (1 - TPR) + 1/2 FPR (ODIN's definition: equal
  priors of ID and OOD); "call nothing ID" counts, so it is at most 50 %;
- ``auroc``: area under the ROC curve (trapezoids: a tie counts half);
- ``aupr_in``: area under the precision-recall curve with ID positive (scores as given);
- ``aupr_out``: the same with OOD positive (scores negated);
all in percent. Equal scores enter at the same threshold, so ties are handled exactly. The areas under
the PR curves follow scikit-learn's curve (one point per threshold, ending at recall 0, precision 1) and
the trapezoid rule, as pytorch-ood's ``OODMetrics`` computes them.

At the threshold that defines fpr95, TPR >= 0.95: hence det_err <= 2.5 + fpr95 / 2 (percent), always.
"""
from __future__ import annotations

import numpy as np

from qkvsearch.spaces.metrics import (
    OOD_METRICS as OOD_METRIC_NAMES,  # the names are declared with their modes
)

TPR_LEVEL = 0.95


def _counts(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tps, fps): positives and negatives with a score >= each distinct score, highest score first."""
    order = np.argsort(-scores, kind="stable")
    ordered = scores[order]
    last = np.r_[ordered[1:] != ordered[:-1], True]  # the last sample of each run of equal scores
    tps = np.cumsum(positive[order].astype(np.int64))[last]
    fps = np.flatnonzero(last) + 1 - tps
    return tps, fps


def _area(x: np.ndarray, y: np.ndarray) -> float:
    return float(((x[1:] - x[:-1]) * (y[1:] + y[:-1])).sum() / 2)


def _aupr(tps: np.ndarray, fps: np.ndarray) -> float:
    """Area under precision(recall), one point per threshold plus (recall 0, precision 1)."""
    precision = np.r_[(tps / (tps + fps))[::-1], 1.0]
    recall = np.r_[(tps / tps[-1])[::-1], 0.0]
    return -_area(recall, precision)  # recall decreases along the points


def ood_metrics(id_scores, ood_scores) -> dict[str, float]:
    """The metrics above (percent) of confidence scores: id_scores (N_id,), ood_scores (N_ood,).
    ValueError when a side is empty or a score is not finite."""
    s_id = np.asarray(id_scores, dtype=np.float64).reshape(-1)
    s_ood = np.asarray(ood_scores, dtype=np.float64).reshape(-1)
    if not len(s_id) or not len(s_ood):
        raise ValueError(f"ood_metrics: expected ID and OOD scores, given {len(s_id)} ID and {len(s_ood)} OOD")
    if not (np.isfinite(s_id).all() and np.isfinite(s_ood).all()):
        raise ValueError("ood_metrics: expected finite scores, given NaN or infinite ones")
    scores = np.r_[s_id, s_ood]
    is_id = np.r_[np.ones(len(s_id), bool), np.zeros(len(s_ood), bool)]
    tps, fps = _counts(scores, is_id)
    tpr = np.r_[0.0, tps / len(s_id)]   # (m + 1,): "call nothing ID", then each threshold
    fpr = np.r_[0.0, fps / len(s_ood)]
    at95 = int(np.searchsorted(tpr, TPR_LEVEL))  # tpr is non-decreasing and ends at 1
    out_tps, out_fps = _counts(-scores, ~is_id)
    return {
        "fpr95": 100.0 * float(fpr[at95]),
        "det_err": 100.0 * float(np.min(0.5 * (1.0 - tpr) + 0.5 * fpr)),
        "auroc": 100.0 * _area(fpr, tpr),
        "aupr_in": 100.0 * _aupr(tps, fps),
        "aupr_out": 100.0 * _aupr(out_tps, out_fps),
    }


def mean_metrics(per_set: dict[str, dict[str, float]]) -> dict[str, float]:
    """The mean of each metric over the OOD sets ({set: metrics}), as the field's tables average them."""
    return {m: float(np.mean([v[m] for v in per_set.values()])) for m in OOD_METRIC_NAMES}
