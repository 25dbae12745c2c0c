"""trainers.stages.ood_metrics against pytorch-ood's OODMetrics (ID positive here, OOD positive there) and the
detection error's bound."""
import numpy as np
import pytest
import torch
from pytorch_ood.metrics import OODMetrics

from qkvsearch.trainers.stages.ood_metrics import OOD_METRIC_NAMES, mean_metrics, ood_metrics


def _reference(s_id: np.ndarray, s_ood: np.ndarray) -> dict:
    """pytorch-ood's numbers in our convention. There OOD (label < 0) is positive and a larger score means
    more OOD: with ID labelled -1 and our confidences as its scores, its FPR95TPR and AUPR-OUT are ours with
    ID positive; with OOD labelled -1 and negated confidences, its AUPR-OUT is our aupr_out."""
    scores = torch.tensor(np.r_[s_id, s_ood], dtype=torch.float64)
    id_positive = torch.tensor([-1] * len(s_id) + [0] * len(s_ood))
    ood_positive = torch.tensor([0] * len(s_id) + [-1] * len(s_ood))
    swapped = OODMetrics().update(scores, id_positive).compute()
    natural = OODMetrics().update(-scores, ood_positive).compute()
    return {"fpr95": 100 * swapped["FPR95TPR"], "auroc": 100 * natural["AUROC"],
            "aupr_in": 100 * swapped["AUPR-OUT"], "aupr_out": 100 * natural["AUPR-OUT"]}


def _brute_detection_error(s_id, s_ood) -> float:
    """min over every threshold (and "nothing is ID") of 1/2 (1 - TPR) + 1/2 FPR, in percent."""
    best = 0.5
    for t in np.unique(np.r_[s_id, s_ood]):
        best = min(best, 0.5 * (1 - np.mean(s_id >= t)) + 0.5 * np.mean(s_ood >= t))
    return 100 * best


def test_agrees_with_pytorch_ood_on_random_scores_with_ties():
    for seed in range(12):  # one test, not twelve: the suite's per-test overhead exceeds the work
        _compare(seed)


def _compare(seed):
    rng = np.random.default_rng(seed)
    n_id, n_ood = rng.integers(5, 300, size=2)
    levels = rng.integers(2, 40)  # few distinct values: many ties, inside and across the two sets
    s_id = rng.integers(0, levels, n_id) / levels + 0.3 * (seed % 3 == 0)
    s_ood = rng.integers(0, levels, n_ood) / levels
    if seed % 2:  # continuous scores, a few ties copied across
        s_id, s_ood = rng.normal(1.0, 1.0, n_id), rng.normal(0.0, 1.0, n_ood)
        s_ood[: n_ood // 4] = s_id[rng.integers(0, n_id, n_ood // 4)]
    ours, ref = ood_metrics(s_id, s_ood), _reference(s_id, s_ood)
    for name, value in ref.items():
        assert ours[name] == pytest.approx(value, abs=1e-6), name
    assert ours["det_err"] == pytest.approx(_brute_detection_error(s_id, s_ood), abs=1e-9)


def test_detection_error_is_at_most_2_5_plus_half_fpr95():
    for seed in range(500):
        rng = np.random.default_rng(1000 + seed)
        n_id, n_ood = rng.integers(1, 80, size=2)
        s_id = rng.integers(0, rng.integers(1, 10), n_id).astype(float)
        s_ood = rng.integers(0, rng.integers(1, 10), n_ood).astype(float) + rng.normal(0, 2)
        m = ood_metrics(s_id, s_ood)
        assert m["det_err"] <= 2.5 + m["fpr95"] / 2 + 1e-9, seed
        assert 0 <= m["det_err"] <= 50 and 0 <= m["auroc"] <= 100, seed


def test_separable_and_reversed_scores():
    perfect = ood_metrics([0.9, 0.8, 0.95], [0.1, 0.2])
    assert perfect == {"fpr95": 0.0, "det_err": 0.0, "auroc": 100.0, "aupr_in": 100.0, "aupr_out": 100.0}
    worst = ood_metrics([0.1, 0.2], [0.9, 0.8])
    assert worst["fpr95"] == 100.0 and worst["auroc"] == 0.0 and worst["det_err"] == 50.0


def test_bad_scores_are_refused():
    with pytest.raises(ValueError, match="expected ID and OOD scores"):
        ood_metrics([], [0.1])
    with pytest.raises(ValueError, match="finite"):
        ood_metrics([float("nan")], [0.1])


def test_mean_over_sets():
    a, b = ood_metrics([1, 2, 3], [0, 1]), ood_metrics([1, 2], [3, 0])
    mean = mean_metrics({"a": a, "b": b})
    assert set(mean) == set(OOD_METRIC_NAMES) and mean["auroc"] == pytest.approx((a["auroc"] + b["auroc"]) / 2)
