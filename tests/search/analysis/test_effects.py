"""The effect of a design value against its baseline at equal cost (search.analysis.effects): the gap between the two
fronts over the cost range both cover, computed by hand; its bootstrap interval over configurations and seeds, by
hand where the resamples can be counted; the verdicts; and the report opening with these lines."""
from __future__ import annotations

import numpy as np
import pytest

from qkvsearch.search.analysis import effects
from qkvsearch.search.analysis.effects import MIN_TRIALS, _Side, attainment_gap, effect_of, verdict
from qkvsearch.storage import write_json


def test_the_gap_is_the_mean_difference_of_the_two_staircases_where_both_have_points():
    # baseline (cost, top1): (1, 10), (5, 20); value: (2, 12), (3, 25), (6, 26).
    # Both fronts exist from cost 2 (the value's first point); the smaller of the two largest costs is 5.
    # On [2, 3) the value reaches 12 and the baseline 10: +2; on [3, 5) 25 against 10: +15.
    # Mean over [2, 5]: (2 * 1 + 15 * 2) / 3 = 32 / 3. The value's point at 6 lies past the baseline's last point.
    assert attainment_gap([2, 3, 6], [12, 25, 26], [1, 5], [10, 20]) == pytest.approx(32 / 3)
    # the baseline's staircase steps inside the range: value (1, 30); baseline (1, 10), (2, 40), (4, 45)
    # -> lo 1, hi max(1, min(1, 4)) = 1: the difference at cost 1, 30 - 10
    assert attainment_gap([1], [30], [1, 2, 4], [10, 40, 45]) == pytest.approx(20.0)
    # one point each, the value the dearer: compared at its cost with the best the baseline reaches by then
    assert attainment_gap([3], [50], [1], [55]) == pytest.approx(-5.0)
    # the order of the points does not matter; a dominated point changes nothing
    assert attainment_gap([6, 3, 2, 4], [26, 25, 12, 1], [5, 1], [20, 10]) == pytest.approx(32 / 3)


def test_the_interval_over_seeds_is_what_the_resamples_can_give():
    """One configuration each side at one cost, two seeds each: a resample's mean is the lower seed, the mean or the
    higher seed (1/4, 1/2, 1/4), so the difference ranges from low - high to high - low, each end with
    probability 1/16 > 2.5 %: the 95 % percentile interval is exactly those two ends."""
    value = _Side(np.array([1.0]), [np.array([60.0, 62.0])])
    base = _Side(np.array([1.0]), [np.array([50.0, 54.0])])
    gap, ci = effect_of(value, base)
    assert gap == pytest.approx(61.0 - 52.0)
    assert ci == (pytest.approx(60.0 - 54.0), pytest.approx(62.0 - 50.0))
    assert verdict(ci, "max") == "better" and verdict((-12.0, -6.0), "max") == "worse"
    assert verdict((-1.0, 3.0), "max") == "not told apart"
    assert verdict((-12.0, -6.0), "min") == "better"   # a loss that fell
    assert effect_of(value, base) == (gap, ci)   # seeded: the same interval every time


def test_a_side_of_one_trial_has_no_interval():
    value = _Side(np.array([1.0, 2.0]), [np.array([60.0]), np.array([70.0])])
    base = _Side(np.array([1.0]), [np.array([50.0])])
    assert base.trials < MIN_TRIALS
    gap, ci = effect_of(value, base)
    assert gap == pytest.approx(60.0 - 50.0) and ci is None and verdict(ci, "max") == "not told apart"


def _record(i: int, embedding: str, gmacs: float, top1: float, seed: int = 0, width: int = 0) -> dict:
    config = {"model": "xcit_nano_12_p8_224", "embedding": embedding, "width": width, "seed": seed, "epochs": 1,
              "dataset": "digits", "num_classes": 10, "img_size": 32}
    if embedding != "linear":
        config["hidden_width"] = width
    return {"trial_id": f"t{i:03d}", "trial_name": f"{embedding}-h{width}-t{i}",
            "campaign": "fx", "status": "completed",
            "config": config, "cost": {"params": 1000, "params_m": 1.0 + gmacs, "gmacs": gmacs},
            "epochs": [{"epoch": 1.0, "top1": top1, "train_s": 1.0}], "epochs_planned": 1,
            "started_at": 1.7e9 + i, "ended_at": 1.7e9 + i + 1}


SPEC = {"space": {"variants": [{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 64},
                               {"embedding": "sne", "hidden_width": 32}]},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]}


def write_effect_campaign(exp) -> None:
    """linear at 0.10 GMACs under seeds 0, 1, 2 (50, 52, 54); sne at 0.08 (h=32, one seed, 45) and at 0.12 (h=64,
    seeds 0 and 1: 60, 62). Both have points from 0.10 (linear's first) to 0.10 (linear's last): compared there,
    sne's best by 0.10 (45) against linear's mean (52)."""
    write_json(f"{exp}/qs_campaign.json", {"name": "fx", "spec": SPEC, "ended_at": 1.8e9})
    rows = [("linear", 0.10, 50.0, 0, 0), ("linear", 0.10, 52.0, 1, 0), ("linear", 0.10, 54.0, 2, 0),
            ("sne", 0.12, 60.0, 0, 64), ("sne", 0.12, 62.0, 1, 64), ("sne", 0.08, 45.0, 0, 32)]
    for i, (emb, gmacs, top1, seed, width) in enumerate(rows):
        write_json(f"{exp}/qs_trials/t{i:03d}.json", _record(i, emb, gmacs, top1, seed, width))


def test_a_campaign_s_effects_and_the_report_opening_with_them(tmp_path):
    from qkvsearch.search.analysis.front import front_info
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.analysis.results import collect

    exp = str(tmp_path / "fx")
    write_effect_campaign(exp)
    trials, _ = collect(exp)
    info = front_info(trials, SPEC["objectives"])
    (found,) = effects.design_effects(info)
    assert (found.key, found.value, found.baseline, found.cost) == ("embedding", "sne", "linear", "gmacs")
    assert found.gap == pytest.approx(45.0 - 52.0) and found.cost_range == (0.10, 0.10)
    assert (found.configs, found.trials, found.base_configs, found.base_trials) == (2, 3, 1, 3)
    low, high = found.ci
    assert low <= found.gap <= high and found.verdict == effects.verdict(found.ci, "max")
    md = open(build_report(exp, static=False)["md"]).read().splitlines()
    assert md[0] == "# Pareto report: fx" and md[2] == f"## {effects.EFFECTS_TITLE}"
    assert md[4] == f"- {found.line()}"
    assert "embedding sne vs linear: top1 -7 at equal gmacs (gmacs 0.1; 95 % bootstrap" in md[4]
