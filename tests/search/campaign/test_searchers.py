"""Searchers as Tune drives them: the grid in order with repeats, its state across a restore, and the
wrapper that turns every suggestion into a resolved trial (config, solved width, cost) once."""
from __future__ import annotations

import pickle
import time

from ray.tune.search import Searcher

from qkvsearch.search.campaign.searchers import GridSearcher, TrialConfigs, build_search
from qkvsearch.spaces import dimensions, expand_space, load_campaign

BASE = {"name": "g", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16}, "train": {"epochs": 1}}


def spec(space, **search):
    return load_campaign({**BASE, "space": space, "search": {"algorithm": "grid", **search}})


def drain(searcher, limit=1000) -> list:
    out = []
    for i in range(limit):
        s = searcher.suggest(f"t{i}")
        if s == Searcher.FINISHED:
            return out
        out.append(s)
    return out


def test_grid_suggests_the_space_in_order_with_repeats_on_successive_seeds_then_finishes():
    s = spec({"embedding": ["linear", "sne"], "lr": [1e-3, 2e-3]}, repeats=2)
    grid = GridSearcher(s.space, 2, seed=7)
    configs = [c for cfg in dimensions.expand(s.space) for c in (cfg, {**cfg, "seed": 8})]
    assert drain(grid) == configs and len(configs) == 8
    assert grid.suggest("again") == Searcher.FINISHED


def test_a_grid_trains_each_distinct_configuration_once():
    # sne at d = 128: a ratio of 0.5 and 64 units are the same model; linear ignores hidden_width
    s = spec({"variants": [{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.5},
                           {"embedding": "sne", "hidden_width": 64}, {"embedding": "sne", "hidden_width": 32}]})
    searcher, planned = build_search(s)
    trials = drain(searcher)
    assert planned == 4 and [t["config"]["width"] for t in trials] == [0, 64, 32]
    assert not any("duplicate_of" in t for t in trials)


def test_a_sampled_configuration_seen_before_becomes_a_duplicate_with_the_known_outcome():
    s = load_campaign({**BASE, "space": {"embedding": ["sne"], "hidden_width": [0.5, 64]},
                       "objectives": ["top1"], "search": {"algorithm": "random", "num_trials": 6, "seed": 0}})
    searcher, _ = build_search(s)
    searcher.set_search_properties(None, None, {})
    first = searcher.suggest("t0")
    assert "duplicate_of" not in first
    second = searcher.suggest("t1")
    assert second["duplicate_of"] == "t0" and second["known"] is None  # t0 still runs: wait for it
    searcher.on_trial_complete("t0", {"top1": 55.0, "epoch": 1.0, "qs_epochs_planned": 1.0})
    third = searcher.suggest("t2")
    assert third["duplicate_of"] == "t0" and third["known"] == {"status": "completed",
                                                                "metrics": {"top1": 55.0, "epoch": 1.0}}
    searcher.on_trial_complete("t1", {"top1": 55.0, "epoch": 0.0, "qs_status": "duplicate",
                                      "qs_duplicate_of": "t0", "qs_original_status": "completed"})
    study = searcher.searcher._ot_study
    assert [t.values for t in study.trials[:2]] == [[55.0], [55.0]]  # Optuna learns the known result
    restored = type(searcher)(searcher.searcher, {})
    restored.set_state(searcher.get_state())
    assert restored.suggest("t3")["duplicate_of"] == "t0"


def test_grid_state_survives_save_restore_and_pickling(tmp_path):
    s = spec({"embedding": ["linear", "sne", "psne"]})
    grid = GridSearcher(s.space)
    first = grid.suggest("a")
    grid.save(str(tmp_path / "state.json"))
    fresh = pickle.loads(pickle.dumps(GridSearcher(s.space)))  # Tune pickles its search algorithm
    fresh.restore(str(tmp_path / "state.json"))
    assert [first, *drain(fresh)] == dimensions.expand(s.space)


def test_a_grid_of_10_to_the_8_points_starts_at_once():
    values = list(range(1, 101))
    s = spec({"seed": values, "batch_size": values, "checkpoint_every": values, "max_steps_per_epoch": values})
    t0 = time.perf_counter()
    searcher, n = build_search(s)
    trial = searcher.suggest("t0")
    assert n == 10**8 and time.perf_counter() - t0 < 5
    assert trial["config"]["seed"] == 1 and trial["config"]["max_steps_per_epoch"] == 1


def test_suggestions_become_resolved_trials_once():
    s = spec({"embedding": ["linear", "fsne"], "hidden_width": ["match"]})
    searcher, n = build_search(s)
    trials = drain(searcher)
    assert n == len(trials) == 2
    linear, fsne = trials
    assert linear["config"]["width"] == 0 and linear["config"]["code_size"] is None
    assert fsne["config"]["code_sharing"] == "shared" and fsne["config"]["code_size"] == 8
    assert fsne["config"]["width"] > 0 and fsne["cost"]["params"] <= linear["cost"]["params"]  # "match"
    assert "width" not in fsne["cost"]  # the width is the config's, the cost holds params and MACs


def test_a_configuration_no_model_can_be_made_of_is_a_trial_marked_invalid():
    s = load_campaign({**BASE, "space": {"embedding": ["sne"], "hidden_width": {"float": [0.001, 0.002]}},
                       "search": {"algorithm": "random", "num_trials": 1}})
    searcher, _ = build_search(s)
    searcher.set_search_properties(None, None, {})
    trial = searcher.suggest("t0")
    assert "hidden_width: expected a ratio giving a width >= 1" in trial["invalid"] and trial["cost"] == {}


def test_the_wrapper_keeps_its_state_apart_from_the_searcher():
    s = spec({"embedding": ["linear"]})
    wrapper = TrialConfigs(GridSearcher(s.space), {"model": "x"})
    state = wrapper.get_state()
    other = TrialConfigs(GridSearcher(s.space), {})
    other.set_state(state)
    assert other.base == {"model": "x"} and len(expand_space(s)) == 1
