"""search.searchers.ehvi (search.algorithm ehvi): its closed-form expected hypervolume improvement against a
Monte Carlo estimate, its features, and the campaign searcher over a space of ranges."""
from __future__ import annotations

import json

import numpy as np
import pytest

from qkvsearch.search.analysis.pareto import hypervolume
from qkvsearch.search.searchers.ehvi import KnownCostEHVI, ehvi, encode
from qkvsearch.search.searchers.problem import MAX_CANDIDATES
from qkvsearch.spaces import SpecError, load_campaign


@pytest.mark.parametrize("k", [1, 2])
def test_ehvi_is_the_mean_hypervolume_improvement(k):
    """Against sampling y ~ N(mu, sd) and measuring each sample's improvement with pareto.hypervolume."""
    rng = np.random.default_rng(k)
    known_y, known_costs = rng.uniform(50, 70, 6), rng.uniform(0, 1, (6, k))
    ref_y, ref_costs = 45.0, np.full(k, 1.2)
    cand = rng.uniform(0, 1, (4, k))
    mu, sd = np.array([55.0, 65.0, 72.0, 60.0]), np.array([3.0, 1.0, 4.0, 0.5])
    dirs = ["max"] + ["min"] * k
    ref = np.concatenate([[ref_y], ref_costs])
    base = hypervolume(np.column_stack([known_y, known_costs]), dirs, ref)
    exact = ehvi(mu, sd, cand, known_y, known_costs, ref_y, ref_costs)
    for i in range(len(cand)):
        ys = rng.normal(mu[i], sd[i], 4000)
        gains = [hypervolume(np.vstack([np.column_stack([known_y, known_costs]), [y, *cand[i]]]), dirs, ref) - base
                 for y in ys]
        assert exact[i] == pytest.approx(np.mean(gains), rel=0.05, abs=1e-3)


def test_features_scale_numbers_mark_absent_keys_and_one_hot_the_rest():
    x = encode([{"e": "sne", "w": 0.25, "lr": 1e-3}, {"e": "linear", "lr": 1e-2}, {"e": "fsne", "w": 1.0, "lr": 1e-1}])
    # e: 3 categories; lr: one log-scaled column; w: scaled, with a column marking where it is absent
    assert x.shape == (3, 6) and x.min() >= 0 and x.max() <= 1
    assert sorted(x[:, 3].tolist()) == [0.0, 0.5, 1.0]  # lr, log10-scaled (keys sorted: e, lr, w)


def test_the_core_proposes_each_feasible_candidate_once_and_learns_from_results():
    rng = np.random.default_rng(0)
    feats = rng.uniform(0, 1, (40, 3))
    costs = feats[:, :1] * 10
    feasible = costs[:, 0] < 8
    core = KnownCostEHVI(feats, costs, feasible, maximise=True, seed=0, start=4)
    seen = []
    while (pick := core.propose()) is not None:
        seen.append(pick)
        core.observe(pick, float(feats[pick, 1] * 100))
    assert sorted(seen) == sorted(np.flatnonzero(feasible).tolist())
    again = KnownCostEHVI(feats, costs, feasible, maximise=True, seed=0, start=4)
    assert [again.propose() for _ in range(4)] == seen[:4]  # the start is drawn from the seed


RANGES = {"name": "kc", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
          "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 32},
          "space": {"embedding": ["linear", "sne", "psne", "fsne"], "hidden_width": {"float": [0.25, 1.0]},
                    "lr": {"float": [1e-3, 1e-2], "log": True}},
          "objectives": ["top1", {"metric": "gmacs", "mode": "min"}, {"metric": "params_m", "mode": "min"}],
          "constraints": {"params_m": {"max": 3.0}},
          "search": {"num_trials": 12, "seed": 0}}


def test_ehvi_is_the_default_for_one_training_objective_and_counted_costs():
    assert load_campaign(RANGES).search.algorithm == "ehvi"
    measured = {**RANGES, "objectives": ["top1", {"metric": "latency_ms", "mode": "min"}]}
    assert load_campaign(measured).search.algorithm == "gp"  # a measured cost is unknown until measured
    with pytest.raises(SpecError, match="search.algorithm: ehvi expects one training objective and one or two "
                                        "objectives counted before training"):
        load_campaign({**measured, "search": {"algorithm": "ehvi", "num_trials": 4}})


def test_the_campaign_searcher_proposes_feasible_configurations_once_and_resumes_where_it_was():
    from qkvsearch.search.campaign.assemble import build_search, infeasible_share

    spec = load_campaign(RANGES)
    wrapper = build_search(spec)
    trials = []
    for i in range(8):
        trial = wrapper.suggest(f"t{i}")
        trials.append(trial)
        top1 = 50 + 10 * (trial["config"].get("hidden_width") or 0)
        wrapper.on_trial_complete(f"t{i}", {"top1": top1, **trial["cost"], "epoch": 1.0, "qs_epochs_planned": 1.0})
    assert len(wrapper.inner.candidates) == MAX_CANDIDATES  # ranges: drawn from the space with the seed
    assert all(t["cost"]["params_m"] <= 3.0 for t in trials) and wrapper.infeasible == 0
    assert len({repr(sorted(t["config"].items())) for t in trials}) == 8
    state = json.dumps(wrapper.inner.state())
    assert len(state) < 100_000  # the candidates are made again, not saved
    restored = build_search(spec)
    restored.set_state(wrapper.get_state())
    restored.inner.restore(json.loads(state))
    assert [wrapper.suggest(f"n{i}")["config"] for i in range(2)] == [restored.suggest(f"n{i}")["config"]
                                                                      for i in range(2)]
    assert infeasible_share(spec, "ehvi", 6) == 0
