"""ehvi and mfehvi over a space larger than their candidate sample (search.searchers.problem.MAX_CANDIDATES, made
small here): the neighbours of the trained front (spaces.trials.neighbour_config) join the candidates, so
proposals reach configurations the sample lacks; they are configurations of the space, costed as the sample is;
a search stopped and restored from its plain state proposes what it would have; a state saved before any were
added (data/ehvi_state_sampled_space.json) restores as it was."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import optuna
import pytest

from qkvsearch.search.searchers import ehvi as ehvi_module
from qkvsearch.search.searchers import problem as problem_module
from qkvsearch.search.searchers.ehvi import EhviSearcher, config_key
from qkvsearch.search.searchers.ehvi_core import EHVICore, Settings
from qkvsearch.search.searchers.mfehvi import MFEhviSearcher
from qkvsearch.search.searchers.problem import build_trial, spec_problem
from qkvsearch.search.searchers.surrogate import encode
from qkvsearch.spaces import base_config, load_campaign, suggest_config
from qkvsearch.spaces.trials import neighbour_config, params_of

# Blocks 2 and 3 only at depth 4 (a condition); each block's embedding and width; a float range: about 1e4
# architectures times the learning rates, of which the candidates are a sample of SAMPLE.
SPEC = {"name": "sampled", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 32},
        "space": {"depth": [2, 4], "embedding": {"choice": ["linear", "sne", "psne", "fsne"], "per_block": True},
                  "hidden_width": {"choice": [0.25, 0.5, 1.0], "per_block": True}, "code_size": 8,
                  "lr": {"float": [1e-3, 1e-2], "log": True}},
        "objectives": ["top1", {"metric": "gmacs", "mode": "min"}],
        "search": {"algorithm": "ehvi", "num_trials": 40, "seed": 0, "n_startup_trials": 4}}
SAMPLE = 64
SCORE = {"linear": 0.0, "sne": 2.0, "psne": 3.0, "fsne": 4.0}
# written by EhviSearcher at commit 848fd81 (before candidates were added): _sequential(searcher, 4) over SPEC
BEFORE = Path(__file__).parent / "data" / "ehvi_state_sampled_space.json"


@pytest.fixture
def spec(monkeypatch):
    monkeypatch.setattr(problem_module, "MAX_CANDIDATES", SAMPLE)
    monkeypatch.setattr(ehvi_module, "GROW", 8)   # neighbours a proposal (each costed: the test's time)
    return load_campaign(SPEC)


def _top1(config: dict) -> float:
    """A made-up score of a configuration: the embeddings and widths of its blocks, a learning rate near 10^-2.5."""
    blocks = [k for k in config if k.startswith("embedding.")]
    return (50.0 + sum(SCORE[config[k]] for k in blocks)
            + 4.0 * sum(config.get(f"hidden_width.{k[10:]}", 0.0) for k in blocks)
            - 20.0 * abs(math.log10(config["lr"]) + 2.5))


def _complete(searcher, spec, trial_id: str, config: dict) -> None:
    cost = build_trial(base_config(spec), config)["cost"]
    searcher.on_trial_complete(trial_id, {"top1": _top1(config), **cost, "epoch": 1.0, "qs_epochs_planned": 1.0})


def _sequential(searcher, spec, n: int) -> list[dict]:
    out = []
    for i in range(n):
        out.append(searcher.suggest(f"t{i}"))
        _complete(searcher, spec, f"t{i}", out[-1])
    return out


def _two_at_a_time(searcher, spec, trials: range, configs: dict) -> None:
    """Trial i proposed, then trial i - 1 (running meanwhile) completes."""
    for i in trials:
        configs[i] = searcher.suggest(f"t{i}")
        if f"t{i - 1}" in searcher.proposed:
            _complete(searcher, spec, f"t{i - 1}", configs[i - 1])


def _drawn_by_the_space(spec, config: dict) -> bool:
    """Whether the space draws exactly ``config``: its parameters (params_of) drawn back give it, no key more."""
    found = params_of(spec.space, config)
    return found is not None and suggest_config(spec, optuna.trial.FixedTrial(found[0])) == config


def test_a_neighbour_changes_searched_dimensions_and_follows_the_conditions(spec):
    rng = np.random.default_rng(0)
    parent = {"depth": 4, "code_size": 8, "lr": 0.003, "embedding.0": "sne", "hidden_width.0": 0.5,
              "embedding.1": "linear", "embedding.2": "fsne", "hidden_width.2": 1.0, "embedding.3": "psne",
              "hidden_width.3": 0.25}
    seen = set()
    for _ in range(200):
        child = neighbour_config(spec.space, parent, rng)
        assert _drawn_by_the_space(spec, child) and child != parent
        changed = {k for k in parent.keys() & child.keys() if child[k] != parent[k]}
        assert len(changed) == 1 and "code_size" not in changed   # one searched dimension (code_size is fixed)
        if changed == {"depth"}:   # blocks 2 and 3 switched off, the others kept
            assert set(child) == set(parent) - {"embedding.2", "hidden_width.2", "embedding.3", "hidden_width.3"}
        if changed == {"embedding.1"}:   # no longer linear: its width switched on, and drawn
            assert child["hidden_width.1"] in (0.25, 0.5, 1.0)
        seen |= changed
    assert seen == set(parent) - {"code_size"}   # every searched dimension moves, the fixed one never
    shallow = {k: parent[k] for k in ("depth", "code_size", "lr", "embedding.0", "hidden_width.0", "embedding.1")}
    shallow["depth"] = 2
    deeper = [c for c in (neighbour_config(spec.space, shallow, rng, changes=2) for _ in range(100)) if c["depth"] == 4]
    assert deeper and all(_drawn_by_the_space(spec, c) and "embedding.3" in c for c in deeper)   # blocks 2, 3 drawn
    again = np.random.default_rng(0)
    assert neighbour_config(spec.space, parent, again, 2) == neighbour_config(spec.space, parent,
                                                                             np.random.default_rng(0), 2)
    assert neighbour_config(spec.space, {**parent, "lr": 1.0}, rng) is None   # not a configuration of the space


def test_only_a_sampled_space_has_neighbours(spec):
    assert spec_problem(spec).neighbour is not None
    small = load_campaign({**SPEC, "space": {"embedding": ["linear", "sne"], "hidden_width": [0.25, 0.5]}})
    assert spec_problem(small).neighbour is None   # every configuration is a candidate already


def test_ehvi_proposes_configurations_its_sample_lacks_costed_as_the_sample(spec):
    searcher = EhviSearcher(spec_problem(spec))
    proposed = _sequential(searcher, spec, 14)
    sample = {config_key(c) for c in searcher.candidates[:SAMPLE]}   # the added ones come after it
    outside = [c for c in proposed if config_key(c) not in sample]
    assert len(outside) >= 3 and all(config_key(c) in sample for c in proposed[:4])   # the start-up: the sample
    assert all(_drawn_by_the_space(spec, c) for c in proposed)
    assert len(sample) == searcher.initial == SAMPLE and len(searcher.candidates) > SAMPLE
    assert len({config_key(c) for c in proposed}) == len(proposed)
    base = base_config(spec)
    for i in range(searcher.initial, len(searcher.candidates), 25):   # an added candidate's cost: build_trial's
        cost = build_trial(base, searcher.candidates[i])["cost"]
        assert searcher.core.costs[i, 0] == cost["gmacs"] and searcher.costs[i] == cost
    assert searcher.core.features.shape[0] == len(searcher.candidates) == len(searcher.core.feasible)


def test_a_search_stopped_after_adding_candidates_proposes_what_it_would_have(spec):
    problem, configs = spec_problem(spec), {}
    searcher = EhviSearcher(problem)
    _two_at_a_time(searcher, spec, range(9), configs)
    state = json.loads(json.dumps(searcher.state()))
    assert len(state["added"]) == len(searcher.candidates) - SAMPLE > 0 and "t8" in state["proposed"]
    again = EhviSearcher(problem)
    again.restore(state)
    assert again.candidates == searcher.candidates and again.core.running == searcher.core.running
    assert np.array_equal(again.core.model.theta, searcher.core.model.theta)
    kept = dict(configs)
    _two_at_a_time(searcher, spec, range(9, 13), configs)
    _two_at_a_time(again, spec, range(9, 13), kept)
    assert kept == configs and again.candidates == searcher.candidates


def test_a_state_saved_before_candidates_were_added_restores_as_it_was(spec):
    saved = json.loads(BEFORE.read_text())
    assert "added" not in saved
    problem = spec_problem(spec)
    restored, fresh = EhviSearcher(problem), EhviSearcher(problem)
    restored.restore(saved)
    _sequential(fresh, spec, 4)
    assert restored.core.results == fresh.core.results and restored.candidates == fresh.candidates
    assert [restored.suggest(f"n{i}") for i in range(3)] == [fresh.suggest(f"n{i}") for i in range(3)]
    assert len(restored.state()["added"]) > 0   # and it goes on adding


def test_mfehvi_proposes_configurations_its_sample_lacks_and_resumes_with_them(spec):
    problem = spec_problem(spec)
    searcher = MFEhviSearcher(problem, Settings(model="additive", warp="epochs", start=4))
    configs = {}
    _two_at_a_time(searcher, spec, range(10), configs)
    sample = {config_key(c) for c in searcher.candidates[:SAMPLE]}
    outside = [c for c in configs.values() if config_key(c) not in sample]
    assert len(outside) >= 2 and all(_drawn_by_the_space(spec, c) for c in outside)
    assert searcher.core.features.shape == (len(searcher.candidates), encode(searcher.candidates)[0].shape[1] + 1)
    again = MFEhviSearcher(problem, Settings(model="additive", warp="epochs", start=4))
    again.restore(json.loads(json.dumps(searcher.state())))
    assert [again.suggest(f"n{i}") for i in range(2)] == [searcher.suggest(f"n{i}") for i in range(2)]


@pytest.mark.parametrize("model", ["columns", "keys"])
def test_candidates_encoded_anew_refit_the_model_with_as_many_hyperparameters_as_it_now_needs(model):
    configs = [{"a": a, "c": c} for a in range(6) for c in ("x", "y")]
    core = EHVICore(*encode(configs), np.zeros((12, 1)), np.ones(12, bool), True, 0, Settings(model=model, start=3))
    for _ in range(5):
        pick = core.propose()
        core.observe(pick, float(configs[pick]["a"] + (configs[pick]["c"] == "y")))
    fitted = core.model.theta.copy()
    grown = configs + [{"a": 9, "c": "z"}]   # a wider range and a third category: every row encoded anew
    core.extend(*encode(grown), np.zeros((1, 1)), [True], np.zeros((13, 0)))
    assert core.fitted_at == 0 and core.features.shape == encode(grown)[0].shape
    # columns: one length scale per column, one more column now; keys: one per key, still two, kept
    assert core.model.theta is None if model == "columns" else np.array_equal(core.model.theta, fitted)
    core.propose()
    assert len(core.model.theta) == core.model.n_groups + 2 == (encode(grown)[0].shape[1] if model == "columns"
                                                                else 2) + 2
