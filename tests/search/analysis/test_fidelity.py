"""How well inherited accuracy ranks: the headline over the random control subnets only, beside the noise floor and
the cost proxy on the same subnets; the chosen front's figure apart, and left out when its subnets trained on from
their inherited weights (their final top-1 carries the inherited one)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau, spearmanr

from qkvsearch.search.analysis.fidelity import (
    FROM_INHERITED,
    MIN_PAIRS,
    kendall_tau_b,
    measure,
    paired_tau_difference,
    rank_agreement,
    section_lines,
)

OBJECTIVES = (("top1", "max"), ("gmacs", "min"))
CONTROL_KEYS = ("control_pairs", "control_kendall_tau", "control_kendall_tau_ci95", "control_spearman_rho",
                "noise_floor_pairs", "noise_floor_tau", "noise_floor_tau_ci95", "proxy_gmacs_tau",
                "proxy_gmacs_tau_ci95", "proxy_params_tau", "proxy_params_tau_ci95", "stronger_proxy",
                "tau_minus_proxy", "tau_minus_proxy_ci95", "verdict_vs_proxy", "control_top_k", "control_top_k_overlap")


def test_kendall_tau_b_matches_scipy_with_ties_and_batched():
    rng = np.random.default_rng(3)
    xs, ys = rng.integers(0, 4, (40, 9)).astype(float), rng.integers(0, 5, (40, 9)).astype(float)  # many ties
    expected = [kendalltau(x, y).statistic for x, y in zip(xs, ys)]
    np.testing.assert_allclose(kendall_tau_b(xs, ys), expected, rtol=0, atol=1e-12)  # one call, every row
    assert np.isnan(kendall_tau_b([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))  # a constant side has no tau


def test_rank_agreement_matches_scipy_and_is_null_below_min_pairs_or_without_variation():
    rng = np.random.default_rng(4)
    x = rng.normal(size=12)
    y = x + rng.normal(size=12)
    y[[2, 7]] = np.nan  # pairs with a missing side are left out
    ok = np.isfinite(y)
    got = rank_agreement(x, y)
    assert got["pairs"] == 10
    assert got["tau"] == pytest.approx(kendalltau(x[ok], y[ok]).statistic, abs=1e-12)
    assert got["rho"] == pytest.approx(spearmanr(x[ok], y[ok]).statistic, abs=1e-12)
    assert rank_agreement(x[:MIN_PAIRS - 1], y[:MIN_PAIRS - 1])["tau"] is None
    assert rank_agreement(x[:5], np.ones(5)) == {"pairs": 5, "tau": None, "tau_ci": None, "rho": None}


def test_the_bootstrap_interval_holds_the_estimate_and_is_fixed_by_its_seed():
    rng = np.random.default_rng(5)
    x = np.arange(16.0)
    y = x + rng.normal(scale=3.0, size=16)
    a, b, other = rank_agreement(x, y, seed=0), rank_agreement(x, y, seed=0), rank_agreement(x, y, seed=1)
    low, high = a["tau_ci"]
    assert low < a["tau"] < high and high - low > 0.05
    assert a == b and other["tau"] == a["tau"] and other["tau_ci"] != a["tau_ci"]


def _noisy(y, scale, seed):
    return y + np.random.default_rng(seed).normal(scale=scale, size=len(y))


@pytest.mark.parametrize("case, verdict", [("inherited ranks, cost runs against", "beats"),
                                           ("cost ranks, inherited runs against", "worse"),
                                           ("both rank about as well", "not told apart")])
def test_the_paired_difference_gives_each_verdict(case, verdict):
    standalone = np.arange(16.0)
    inherited, cost = {"inherited ranks, cost runs against": (standalone + 50, -standalone),
                       "cost ranks, inherited runs against": (-standalone, standalone * 0.1),
                       "both rank about as well": (_noisy(standalone, 4, 1), _noisy(standalone, 4, 2))}[case]
    got = paired_tau_difference(inherited, cost, standalone)
    expected = kendalltau(inherited, standalone).statistic - kendalltau(cost, standalone).statistic
    assert got["pairs"] == 16 and got["diff"] == pytest.approx(expected, abs=1e-12)
    assert got["verdict"] == verdict
    low, high = got["diff_ci"]
    assert low <= got["diff"] <= high
    assert {"beats": low > 0, "worse": high < 0, "not told apart": low < 0 < high}[verdict]
    assert paired_tau_difference(inherited[:2], cost[:2], standalone[:2])["verdict"] is None


def test_an_interval_that_reaches_0_does_not_tell_them_apart():
    # GMACs out of order on two subnets only: resamples that miss both rank as well as inherited top-1 does
    standalone = np.arange(9.0)
    got = paired_tau_difference(standalone, np.roll(standalone, 2), standalone)
    assert got["diff"] > 0.5 and got["diff_ci"][0] == 0.0 and got["verdict"] == "not told apart"


def _control(n: int = 9) -> pd.DataFrame:
    """Control subnets that inherited top-1 ranks exactly, GMACs exactly against, params loosely with."""
    standalone = np.linspace(40, 80, n)
    return pd.DataFrame({"top1_inherited": standalone - 20, "top1_standalone": standalone,
                         "top1_standalone_reseeded": standalone + np.tile([0.5, -0.5], n)[:n] * 30,
                         "gmacs": np.linspace(2.0, 0.5, n), "params": np.resize([3, 0, 6, 1, 4, 7, 2, 5, 8], n) * 1000,
                         "selected": "control", "retrained_from": "scratch"})


def _front(retrained_from: str, n: int = 5) -> pd.DataFrame:
    """A chosen front whose inherited top-1, standalone top-1, GMACs and params all rise together."""
    rise = np.arange(n, dtype=float)
    return pd.DataFrame({"top1_inherited": 60 + rise, "top1_standalone": 70 + rise,
                         "top1_standalone_reseeded": np.nan, "gmacs": 3 + rise, "params": 10_000 + 1000 * rise,
                         "selected": "chosen", "retrained_from": retrained_from})


def _scored(n: int = 4) -> pd.DataFrame:  # scored, neither chosen nor retrained
    return pd.DataFrame({"top1_inherited": np.linspace(10, 30, n), "top1_standalone": np.nan,
                         "top1_standalone_reseeded": np.nan, "gmacs": 1.0, "params": 5000,
                         "selected": None, "retrained_from": None})


def test_the_headline_and_the_proxies_are_over_the_control_subnets_alone():
    control = _control()
    alone = measure(control, OBJECTIVES, None)
    mixed = measure(pd.concat([_scored(), _front("scratch"), control], ignore_index=True), OBJECTIVES, None)
    # the front rises with its cost: counted in, it would lift both proxies' taus and change the verdict
    assert {k: mixed[k] for k in CONTROL_KEYS} == {k: alone[k] for k in CONTROL_KEYS}
    assert mixed["subnets_scored"] == 18 and mixed["chosen_retrained"] == 5 and mixed["control_pairs"] == 9
    assert mixed["control_kendall_tau"] == 1.0 and mixed["proxy_gmacs_tau"] == -1.0
    assert mixed["proxy_params_tau"] == pytest.approx(
        kendalltau(control["params"], control["top1_standalone"]).statistic)
    assert mixed["noise_floor_tau"] == pytest.approx(
        kendalltau(control["top1_standalone"], control["top1_standalone_reseeded"]).statistic)
    assert 0 < mixed["proxy_params_tau"] < 1 and mixed["stronger_proxy"] == "params"
    assert mixed["verdict_vs_proxy"] == "beats"
    assert mixed["control_top_k"] == 3 and mixed["control_top_k_overlap"] == 1.0


def test_the_front_is_measured_apart_and_left_out_when_it_trained_on_from_inherited_weights():
    control = _control()
    scratch = measure(pd.concat([control, _front("scratch")], ignore_index=True), OBJECTIVES, None)
    tuned = measure(pd.concat([control, _front("inherited")], ignore_index=True), OBJECTIVES, None)
    few = measure(pd.concat([control, _front("scratch", MIN_PAIRS - 1)], ignore_index=True), OBJECTIVES, None)
    assert scratch["front_pairs"] == 5 and scratch["front_kendall_tau"] == 1.0 and scratch["front_null_reason"] is None
    assert scratch["front_spearman_rho"] == pytest.approx(1.0) and scratch["front_kendall_tau_ci95"] is not None
    assert tuned["front_pairs"] == 0 and tuned["front_kendall_tau"] is None
    assert tuned["front_null_reason"] == FROM_INHERITED
    assert tuned["chosen_retrained"] == 5  # retrained all the same: only the rank figure leaves them out
    assert few["front_kendall_tau"] is None and few["front_null_reason"].startswith(f"needs {MIN_PAIRS} chosen")
    assert FROM_INHERITED in section_lines(tuned)[6]
    assert {k: tuned[k] for k in CONTROL_KEYS} == {k: scratch[k] for k in CONTROL_KEYS}


def test_the_report_says_whether_inherited_accuracy_beats_the_stronger_proxy():
    f = measure(pd.concat([_control(), _front("scratch")], ignore_index=True), OBJECTIVES, None)
    lines = section_lines(f)
    low, high = f["tau_minus_proxy_ci95"]
    assert lines[4] == (f"inherited top-1 against params, the stronger proxy (picked as the stronger on these same "
                        f"subnets): tau difference {f['tau_minus_proxy']:+.2f} (95 % paired bootstrap interval "
                        f"{low:.2f} to {high:.2f}): beats it")
    assert lines[1].startswith("Kendall tau, inherited vs standalone top-1 over the 9 control subnets: 1.00 (95 %")
    assert lines[3].startswith("cost proxy (more compute, more accuracy) vs standalone top-1 over the same control "
                               "subnets: Kendall tau of GMACs -1.00 (95 % bootstrap interval")
    worse = measure(_control().assign(top1_inherited=lambda d: -d["top1_standalone"]), OBJECTIVES, None)
    assert worse["verdict_vs_proxy"] == "worse" and section_lines(worse)[4].endswith(": worse than it")


def test_figures_without_enough_control_subnets_are_null_and_say_why():
    f = measure(pd.concat([_control(MIN_PAIRS - 1), _front("scratch")], ignore_index=True), OBJECTIVES, None)
    assert f["control_kendall_tau"] is None and f["proxy_gmacs_tau"] is None and f["tau_minus_proxy"] is None
    assert f["verdict_vs_proxy"] is None and f["front_kendall_tau"] == 1.0  # the front has its own subnets
    lines = section_lines(f)
    assert lines[1].endswith(f"n/a (needs {MIN_PAIRS} control subnets whose accuracies vary); Spearman rho n/a")
    assert lines[4] == ("inherited top-1 against the cost proxy: n/a "
                        f"(needs {MIN_PAIRS} control subnets whose accuracies vary)")
    flat = measure(_control().assign(gmacs=1.0, params=7), OBJECTIVES, None)  # no cost tells them apart
    assert flat["stronger_proxy"] is None and flat["control_kendall_tau"] == 1.0
    assert section_lines(flat)[4].endswith(f"n/a (needs {MIN_PAIRS} control subnets whose costs vary)")


PARAMS = (3, 0, 6, 1, 4, 7, 2, 5, 8, 9, 10, 11)  # loosely with top-1 over the first 8, the control sample


def _write_earlier_campaign(exp: str):
    """A campaign recorded by an earlier version: the control sample drawn among the scored subnets (8), the
    selection without retrain_from; control subnets retrained under seeds 0 and 1, chosen under 0."""
    import json

    import pyarrow as pa

    from qkvsearch.search.records import inherited

    configs = [{"embedding": e, "depth": d, "seed": 0} for e in ("linear", "sne", "psne", "fsne") for d in (2, 4, 6)]
    top1 = [50.0 + 2 * i for i in range(len(configs))]
    inherited.write_batch(exp, 0, [{"subnet_id": f"subnet_{i:06d}",
                                    "keys": {"embedding": c["embedding"], "depth": c["depth"]},
                                    "config": c, "cost": {"gmacs": 0.1 * (12 - i), "params": 1000 * PARAMS[i]},
                                    "metrics": {"top1": top1[i], "top5": 90.0, "val_loss": 1.0},
                                    "supernet": "s", "space": "h"} for i, c in enumerate(configs)])
    keys = [{"embedding": c["embedding"], "depth": c["depth"]} for c in configs]
    inherited.write_selection(exp, {"chosen": keys[9:], "control": keys[:8], "seed": 0})
    runs = [(c, top1[i] + 10) for i, c in enumerate(configs) if i != 8] \
        + [({**c, "seed": 1}, top1[i] + 10 + (3 if i % 2 else -3)) for i, c in enumerate(configs[:8])]
    return pa.table({"status": ["completed"] * len(runs), "config_json": [json.dumps(c) for c, _ in runs],
                     "final_top1": [t for _, t in runs]})


def test_a_campaign_recorded_before_reports_by_the_same_rules(tmp_path):
    from qkvsearch.search.analysis.fidelity import subnet_table

    exp = str(tmp_path / "earlier")
    df = subnet_table(exp, _write_earlier_campaign(exp))
    f = measure(df, OBJECTIVES, None)
    assert f["control_pairs"] == 8 and f["control_kendall_tau"] == 1.0 and f["noise_floor_pairs"] == 8
    assert f["proxy_gmacs_tau"] == -1.0 and f["verdict_vs_proxy"] == "beats"
    assert f["chosen_retrained"] == 3 and f["front_pairs"] == 3 and f["front_kendall_tau"] == 1.0  # read as scratch
    assert len(section_lines(f)) == 8


def test_a_selection_and_evaluations_written_before_retrain_from_and_policies_read_as_from_scratch(tmp_path):
    """A one-shot campaign recorded before: its selection says nothing of where training started (scratch),
    its evaluations carry no top1_q or size_mb (null columns)."""
    import json

    import pyarrow as pa

    from qkvsearch.search.analysis.fidelity import subnet_table
    from qkvsearch.search.records import inherited

    exp = str(tmp_path / "earlier")
    configs = [{"embedding": e, "depth": 2, "seed": 0} for e in ("linear", "sne", "psne", "fsne")]
    inherited.write_batch(exp, 0, [{"subnet_id": f"subnet_{i:06d}", "keys": {"embedding": c["embedding"]},
                                    "config": c, "cost": {"gmacs": 0.1 * (i + 1)},
                                    "metrics": {"top1": 50.0 + i, "top5": 90.0, "val_loss": 1.0},
                                    "supernet": "s", "space": "h"} for i, c in enumerate(configs)])
    inherited.write_selection(exp, {"chosen": [{"embedding": "fsne"}], "control": [{"embedding": "linear"}],
                                    "seed": 0})  # as written before retrain_from existed
    trials = pa.table({"status": ["completed"] * 3,
                       "config_json": [json.dumps(c) for c in (configs[3], configs[0], {**configs[0], "seed": 1})],
                       "final_top1": [70.0, 60.0, 61.0]})
    df = subnet_table(exp, trials)
    assert [x if isinstance(x, str) else None for x in df["retrained_from"]] == ["scratch", None, None, "scratch"]
    assert df["top1_q_inherited"].isna().all() and df["size_mb"].isna().all()
    assert list(df["top1_standalone"].dropna()) == [60.0, 70.0]
