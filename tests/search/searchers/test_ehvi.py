"""search.searchers.ehvi (search.algorithm ehvi): its expected hypervolume improvement against Monte Carlo, with
known and with predicted costs; its model's gradient; its features; the exact argmax of its pruned scoring;
the campaign searcher over a space of ranges, with a measured cost, and from a state an earlier version saved."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy.optimize import approx_fprime

from qkvsearch.search.analysis.pareto import hypervolume
from qkvsearch.search.searchers.base import Problem
from qkvsearch.search.searchers.ehvi import EhviSearcher
from qkvsearch.search.searchers.ehvi_core import EHVICore, Settings
from qkvsearch.search.searchers.hvi import ehvi, ehvi_sampled
from qkvsearch.search.searchers.problem import MAX_CANDIDATES
from qkvsearch.search.searchers.surrogate import GP, AdditiveGP, encode
from qkvsearch.spaces import SpecError, load_campaign


def _monte_carlo(known, dirs, ref, draw, n: int = 4000) -> float:
    """Mean hypervolume improvement of n points draw() -> (y, *costs), by pareto.hypervolume."""
    base = hypervolume(known, dirs, ref)
    return float(np.mean([hypervolume(np.vstack([known, draw()]), dirs, ref) - base for _ in range(n)]))


@pytest.mark.parametrize("k", [1, 2])
def test_ehvi_is_the_mean_hypervolume_improvement(k):
    """Against sampling y ~ N(mu, sd) and measuring each sample's improvement with pareto.hypervolume."""
    rng = np.random.default_rng(k)
    known_y, known_costs = rng.uniform(50, 70, 6), rng.uniform(0, 1, (6, k))
    ref_y, ref_costs = 45.0, np.full(k, 1.2)
    cand = rng.uniform(0, 1, (4, k))
    mu, sd = np.array([55.0, 65.0, 72.0, 60.0]), np.array([3.0, 1.0, 4.0, 0.5])
    dirs, known = ["max"] + ["min"] * k, np.column_stack([known_y, known_costs])
    exact = ehvi(mu, sd, cand, known_y, known_costs, ref_y, ref_costs)
    for i in range(len(cand)):
        mc = _monte_carlo(known, dirs, np.concatenate([[ref_y], ref_costs]),
                          lambda i=i: [rng.normal(mu[i], sd[i]), *cand[i]])
        assert exact[i] == pytest.approx(mc, rel=0.05, abs=1e-3)


@pytest.mark.parametrize("measured", [(True,), (True, False), (True, True)])
def test_ehvi_with_predicted_costs_is_the_mean_over_cost_and_objective(measured):
    """A measured cost not measured yet is predicted (log-normal here); the improvement averaged over a fixed
    sample of the costs (closed form over y) matches Monte Carlo over both; a cost known exactly (sd 0) is
    used as it is."""
    k = len(measured)
    rng = np.random.default_rng(10 + k)
    known_y, known_costs = rng.uniform(50, 70, 6), rng.uniform(0.2, 1.0, (6, k))
    ref_y, ref_costs = 45.0, np.full(k, 1.4)
    mu, sd = np.array([62.0, 71.0]), np.array([3.0, 2.0])
    log_mean = np.log(rng.uniform(0.3, 0.8, (2, k)))
    log_sd = np.where(np.array(measured), 0.3, 0.0) * np.ones((2, 1))
    got = ehvi_sampled(mu, sd, log_mean, log_sd, known_y, known_costs, ref_y, ref_costs, to_cost=np.exp, draws=64)
    plugged = ehvi(mu, sd, np.exp(log_mean), known_y, known_costs, ref_y, ref_costs)
    dirs, known = ["max"] + ["min"] * k, np.column_stack([known_y, known_costs])
    for i in range(2):
        mc = _monte_carlo(known, dirs, np.concatenate([[ref_y], ref_costs]),
                          lambda i=i: [rng.normal(mu[i], sd[i]), *np.exp(rng.normal(log_mean[i], log_sd[i]))], 6000)
        assert got[i] == pytest.approx(mc, rel=0.06, abs=2e-3)
    assert got.shape == plugged.shape == (2,)


def test_a_predicted_cost_near_the_front_is_worth_more_than_its_mean_plugged_in():
    """Behind a known point (y 70, cost 0.5), a candidate of mean cost 0.5 improves nothing below y 70 when its
    mean is plugged in; drawn over its spread, the draws cheaper than 0.5 improve the front."""
    args = (np.array([65.0]), np.array([1.0]))
    known = (np.array([70.0]), np.array([[0.5]]), 45.0, np.array([1.0]))
    plugged = ehvi(*args, np.array([[0.5]]), *known)
    drawn = ehvi_sampled(*args, np.log([[0.5]]), np.array([[0.3]]), *known, to_cost=np.exp)
    assert plugged[0] < 1e-6 and drawn[0] > 0.5   # (above y 70, 5 sd away, plugged in gains ~1e-8)


def test_the_gp_gradient_is_the_likelihoods_and_unused_keys_get_long_length_scales():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (30, 4))
    y = np.sin(3 * x[:, 0]) + x[:, 1] ** 2 + 0.05 * rng.normal(size=30)
    gp = GP(np.array([0, 0, 1, 2]))
    per_group, z = gp._pairs(x, x), (y - y.mean()) / y.std()
    theta = np.array([0.1, -0.3, 0.5, 0.2, -3.0])
    numeric = approx_fprime(theta, lambda t: gp._nll(t, z, per_group)[0], 1e-6)
    assert gp._nll(theta, z, per_group)[1] == pytest.approx(numeric, rel=1e-4, abs=1e-4)
    gp.fit(x, y)
    assert gp.theta[2] > gp.theta[0] + 1  # key 1 (column 2) does not matter here, key 0 does
    mean, sd = gp.predict(x[:5])
    assert np.abs(mean - y[:5]).max() < 0.2 and (sd < 0.2).all()


@pytest.mark.parametrize("product", [None, 3])
def test_the_additive_gp_gradient_is_the_likelihoods_and_it_carries_one_keys_effect_to_unseen_combinations(product):
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (30, 5))
    y = np.sin(3 * x[:, 0]) + x[:, 2] ** 2 + 0.05 * rng.normal(size=30)
    gp = AdditiveGP(np.array([0, 0, 1, 2, 3]), product)
    pairs, z = gp._pairs(x, x), (y - y.mean()) / y.std()
    theta = np.array([0.1, -0.3, 0.5, 0.2, 0.4, -3.0])
    numeric = approx_fprime(theta, lambda t: gp._nll(t, z, pairs)[0], 1e-6)
    assert gp._nll(theta, z, pairs)[1] == pytest.approx(numeric, rel=1e-4, abs=1e-4)

    # five keys of 3 levels, y = the sum of one effect per key's level: from 15 of the 243 combinations the
    # additive GP predicts the others; the keys kernel, needing neighbours close in every key, does not
    effects = rng.normal(0, 1, (5, 3))
    combos = list(itertools.product(range(3), repeat=5))
    feats, groups = encode([{f"k{g}": str(c[g]) for g in range(5)} for c in combos])
    truth = np.array([sum(effects[g, c[g]] for g in range(5)) for c in combos])
    seen = np.zeros(len(combos), bool)
    seen[np.random.default_rng(0).choice(len(combos), 15, replace=False)] = True
    errors = {}
    for name, model in (("additive", AdditiveGP(groups)), ("keys", GP(groups))):
        model.fit(feats[seen], truth[seen])
        errors[name] = np.abs(model.predict(feats[~seen])[0] - truth[~seen]).mean()
    assert errors["additive"] < 0.05 and errors["keys"] > 0.3, errors


def test_the_epochs_warp_ranks_each_epochs_values_among_themselves():
    core = EHVICore(np.eye(3), np.arange(3), np.zeros((3, 1)), np.ones(3, bool), True, 0, Settings(warp="epochs"))
    y, epochs = np.array([1.0, 2.0, 50.0, 10.0, 20.0, 30.0]), np.array([1, 1, 1, 9, 9, 9])
    warped = core._warped(y, epochs)
    assert warped[:3] == pytest.approx(warped[3:])   # the same ranks within each epoch, whatever the scale
    assert core._warped(y, np.zeros(6))[2] > core._warped(y, np.zeros(6))[1]
    with pytest.raises(ValueError, match="warp: expected one of none, copula, epochs, given 'rank'"):
        Settings(warp="rank")


def test_features_scale_numbers_mark_absent_keys_and_one_hot_the_rest():
    x, groups = encode([{"e": "sne", "w": 0.25, "lr": 1e-3}, {"e": "linear", "lr": 1e-2},
                        {"e": "fsne", "w": 1.0, "lr": 1e-1}])
    # e: 3 categories; lr: one log-scaled column; w: scaled, with a column marking where it is absent
    assert x.shape == (3, 6) and x.min() >= 0 and x.max() <= 1
    assert sorted(x[:, 3].tolist()) == [0.0, 0.5, 1.0]  # lr, log10-scaled (keys sorted: e, lr, w)
    assert groups.tolist() == [0, 0, 0, 1, 2, 2]       # the columns of each key


def _core(n: int = 400, **kw) -> tuple[EHVICore, np.ndarray]:
    """n distinct configurations of keys a, b (numbers) and c (a category)."""
    rng = np.random.default_rng(1)
    grid = [(a, b, c) for a in range(16) for b in range(16) for c in range(16)]
    configs = [{"a": a, "b": b, "c": str(c)} for a, b, c in (grid[i] for i in rng.permutation(len(grid))[:n])]
    features, groups = encode(configs)
    costs = features[:, :1] * 10 + 0.1
    value = 60 + 10 * np.sin(3 * features[:, 1]) + 5 * costs[:, 0]
    return EHVICore(features, groups, costs, costs[:, 0] < 8, True, 0, **kw), value


def test_the_core_proposes_each_feasible_candidate_once_and_learns_from_results():
    core, value = _core(60, start=4)
    seen = []
    while (pick := core.propose()) is not None:
        seen.append(pick)
        core.observe(pick, float(value[pick]))
    assert sorted(seen) == sorted(np.flatnonzero(core.feasible).tolist())
    again, _ = _core(60, start=4)
    assert [again.propose() for _ in range(4)] == seen[:4]  # the start is drawn from the seed


def test_pruned_scoring_finds_the_argmax_of_scoring_every_candidate():
    """The bound (the prior's spread) prunes most candidates; the one proposed is the exact argmax."""
    core, value = _core(3000, start=8)
    for _ in range(24):
        pick = core.propose()
        core.observe(pick, float(value[pick]))
    pool = core.open()
    pruned = core._acquisition(pool)
    full = _full_scores(core, pool)
    assert np.isinf(pruned).sum() > len(pool) // 2          # most never needed their exact spread
    assert int(np.argmax(pruned)) == int(np.argmax(full)) and pruned.max() == pytest.approx(full.max())


def _full_scores(core: EHVICore, pool: np.ndarray) -> np.ndarray:
    from qkvsearch.search.searchers import ehvi_core

    saved, ehvi_core.PRUNE_BATCH = ehvi_core.PRUNE_BATCH, 10 ** 9
    try:
        return core._acquisition(pool)
    finally:
        ehvi_core.PRUNE_BATCH = saved


def _table_problem(measured: bool, n: int = 60) -> tuple[Problem, list[dict], np.ndarray]:
    """A problem of n configurations (a, b), top1 to maximise, latency_ms (measured unless known) and params."""
    rng = np.random.default_rng(3)
    configs = [{"a": int(i // 12), "b": int(i % 12)} for i in rng.permutation(144)[:n]]
    latency = np.array([1.0 + c["a"] + 0.2 * c["b"] for c in configs])
    costs = [{"params_m": 0.5 + c["a"] / 4, **({} if measured else {"latency_ms": float(lat)})}
             for c, lat in zip(configs, latency)]
    problem = Problem(objectives=(("top1", "max"), ("latency_ms", "min")),
                      known=("params_m",) if measured else ("params_m", "latency_ms"), seed=0, num_trials=20,
                      candidates=lambda: (configs, costs, [True] * n), n_startup_trials=4)
    return problem, configs, latency


def test_ehvi_with_a_measured_cost_learns_each_measurement_and_predicts_the_rest():
    problem, configs, latency = _table_problem(measured=True)
    searcher = EhviSearcher(problem)
    for i in range(8):
        config = searcher.suggest(f"t{i}")
        pick = searcher.proposed[f"t{i}"]
        assert np.isnan(searcher.core.costs[pick, 0])       # not measured before it was proposed
        searcher.constrain(f"t{i}", {"params_m": 1.0, "latency_ms": float(latency[pick])})   # measured on demand
        assert searcher.core.costs[pick, 0] == latency[pick]
        searcher.on_trial_complete(f"t{i}", {"top1": 50.0 + config["b"], "latency_ms": float(latency[pick]),
                                             "epoch": 1.0, "qs_epochs_planned": 1.0})
    unmeasured = np.flatnonzero(np.isnan(searcher.core.costs[:, 0]))
    mean, sd, to_cost = searcher.core._cost_prediction(unmeasured)
    assert len(unmeasured) == 60 - 8 and (sd[:, 0] > 0).all()
    assert np.corrcoef(to_cost(mean)[:, 0], latency[unmeasured])[0, 1] > 0.9  # latency follows a, which it reads
    state = json.loads(json.dumps(searcher.state()))
    again = EhviSearcher(problem)
    again.restore(state)
    assert np.array_equal(np.isnan(again.core.costs[:, 0]), np.isnan(searcher.core.costs[:, 0]))
    assert again.suggest("n") == searcher.suggest("n")   # the measured costs and the cost model come back


def test_a_state_saved_before_the_model_settings_is_restored_with_its_results_and_its_model_fitted_anew():
    problem, configs, latency = _table_problem(measured=False)
    searcher = EhviSearcher(problem, Settings())
    keys = [json.dumps(c, sort_keys=True) for c in configs]
    old = {"core": {"results": [[keys[i], 50.0 + i] for i in range(6)], "tried": keys[:7], "running": [keys[6]],
                    "rng": np.random.default_rng(5).bit_generator.state, "kernel": [0.1] * 7},
           "proposed": {"t6": keys[6]}}
    searcher.restore(old)
    assert searcher.core.results == {i: 50.0 + i for i in range(6)} and searcher.core.running == {6}
    assert searcher.core.model.theta is None and searcher.proposed == {"t6": 6}
    assert searcher.suggest("t7") not in [configs[i] for i in range(7)]
    assert searcher.state()["core"]["kernel"] is None  # what a reader of that time takes for "fit anew"


RANGES = {"name": "kc", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
          "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 32},
          "space": {"embedding": ["linear", "sne", "psne", "fsne"], "hidden_width": {"float": [0.25, 1.0]},
                    "lr": {"float": [1e-3, 1e-2], "log": True}},
          "objectives": ["top1", {"metric": "gmacs", "mode": "min"}, {"metric": "params_m", "mode": "min"}],
          "constraints": {"params_m": {"max": 3.0}},
          "search": {"num_trials": 12, "seed": 0}}


def test_ehvi_is_the_default_for_one_training_objective_and_counted_or_measured_costs():
    assert load_campaign(RANGES).search.algorithm == "ehvi"
    measured = {**RANGES, "objectives": ["top1", {"metric": "latency_ms", "mode": "min"}]}
    assert load_campaign({**measured, "search": {"algorithm": "ehvi", "num_trials": 4}}).search.algorithm == "ehvi"
    two = {**RANGES, "objectives": ["top1", "val_loss", {"metric": "gmacs", "mode": "min"}]}
    with pytest.raises(SpecError, match="search.algorithm: ehvi expects one training objective and one or two cost "
                                        "objectives counted"):
        load_campaign({**two, "search": {"algorithm": "ehvi", "num_trials": 4}})


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
    assert wrapper.inner.initial == MAX_CANDIDATES  # ranges: drawn from the space with the seed, then grown
    assert all(t["cost"]["params_m"] <= 3.0 for t in trials) and wrapper.infeasible == 0
    assert len({repr(sorted(t["config"].items())) for t in trials}) == 8
    state = json.dumps(wrapper.inner.state())
    assert len(state) < 100_000  # the sampled candidates are made again; only those added are saved
    restored = build_search(spec)
    restored.set_state(wrapper.get_state())
    restored.inner.restore(json.loads(state))
    assert [wrapper.suggest(f"n{i}")["config"] for i in range(2)] == [restored.suggest(f"n{i}")["config"]
                                                                      for i in range(2)]
    assert infeasible_share(spec, "ehvi", 6) == 0
