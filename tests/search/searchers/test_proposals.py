"""Searchers as Tune drives them (search.searchers.proposals.Proposals): the grid in order with repeats, its
state across a restore, and the wrapper that turns every suggestion into a resolved trial (config, solved
width, cost) once, with duplicates, constraints and a warm start."""
from __future__ import annotations

import json

import pytest
from helpers.campaign_files import earlier_campaign
from ray.tune.search import Searcher

from qkvsearch.search.campaign.assemble import build_search
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.searchers.grid import GridSearcher
from qkvsearch.search.searchers.problem import spec_problem
from qkvsearch.spaces import dimensions, load_campaign

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
    s = load_campaign({**BASE, "train": {"epochs": 1, "seed": 7}, "space": {"embedding": ["linear", "sne"],
                       "lr": [1e-3, 2e-3]}, "search": {"algorithm": "grid", "repeats": 2}})
    grid = GridSearcher(spec_problem(s))
    configs = [c for cfg in dimensions.expand(s.space) for c in (cfg, {**cfg, "seed": 8})]
    assert drain(grid) == configs and len(configs) == 8
    assert grid.suggest("again") == Searcher.FINISHED


def test_a_grid_trains_each_distinct_configuration_once():
    # sne at d = 128: a ratio of 0.5 and 64 units are the same model; linear ignores hidden_width
    s = spec({"variants": [{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.5},
                           {"embedding": "sne", "hidden_width": 64}, {"embedding": "sne", "hidden_width": 32}]})
    searcher = build_search(s)
    trials = drain(searcher)
    assert s.search.num_trials == 4 and [t["config"]["width"] for t in trials] == [0, 64, 32]
    assert not any("duplicate_of" in t for t in trials)


def test_a_sampled_configuration_seen_before_becomes_a_duplicate_with_the_known_outcome():
    s = load_campaign({**BASE, "space": {"embedding": ["sne"], "hidden_width": [0.5, 64]},
                       "objectives": ["top1"], "search": {"algorithm": "random", "num_trials": 6, "seed": 0}})
    searcher = build_search(s)
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
    study = searcher.inner.study
    assert [t.values for t in study.trials[:2]] == [[55.0], [55.0]]  # Optuna learns the known result
    restored = build_search(s)
    restored.set_state(json.loads(json.dumps(searcher.get_state())))  # plain data
    assert restored.suggest("t3")["duplicate_of"] == "t0"


def test_grid_state_survives_save_and_restore_into_a_searcher_built_anew(tmp_path):
    s = spec({"embedding": ["linear", "sne", "psne"]})
    grid = build_search(s)
    first = grid.suggest("a")["config"]["embedding"]
    grid.save(str(tmp_path / "state.json"))
    fresh = build_search(s)
    fresh.restore(str(tmp_path / "state.json"))
    assert [first, *(t["config"]["embedding"] for t in drain(fresh))] == ["linear", "sne", "psne"]


@pytest.mark.timeout(60)  # enumerating the grid would take hours
def test_a_grid_of_10_to_the_8_points_starts_at_once():
    values = list(range(1, 101))
    s = spec({"seed": values, "batch_size": values, "checkpoint_every": values, "max_steps_per_epoch": values})
    searcher = build_search(s)
    trial = searcher.suggest("t0")
    assert s.search.num_trials == 10**8
    assert trial["config"]["seed"] == 1 and trial["config"]["max_steps_per_epoch"] == 1


def test_suggestions_become_resolved_trials_once():
    s = spec({"embedding": ["linear", "fsne"], "hidden_width": ["match"]})
    searcher = build_search(s)
    trials = drain(searcher)
    assert s.search.num_trials == len(trials) == 2
    linear, fsne = trials
    assert linear["config"]["width"] == 0 and linear["config"]["code_size"] is None
    assert fsne["config"]["code_sharing"] == "shared" and fsne["config"]["code_size"] == 8
    assert fsne["config"]["width"] > 0 and fsne["cost"]["params"] <= linear["cost"]["params"]  # "match"
    assert "width" not in fsne["cost"]  # the width is the config's, the cost holds params and MACs


def test_a_configuration_no_model_can_be_made_of_is_a_trial_marked_invalid():
    s = load_campaign({**BASE, "space": {"embedding": ["sne"], "hidden_width": {"float": [0.001, 0.002]}},
                       "search": {"algorithm": "random", "num_trials": 1}})
    searcher = build_search(s)
    trial = searcher.suggest("t0")
    assert "hidden_width: expected a ratio giving a width >= 1" in trial["invalid"] and trial["cost"] == {}


# ------------------------------------------------------------------- gp, cost constraints, infeasible proposals
CONSTRAINED = {**BASE, "space": {"embedding": ["sne", "psne", "fsne"], "hidden_width": {"int": [16, 512]},
                                 "code_size": [4, 8, 16, 32]},
               "objectives": ["top1", {"metric": "params_m", "mode": "min"}],
               "constraints": {"params_m": {"max": 3.0}}}


def test_gp_is_an_algorithm_with_its_own_seed_and_startup_design():
    import optuna

    from qkvsearch.spaces import SpecError

    s = load_campaign({**CONSTRAINED, "search": {"algorithm": "gp", "num_trials": 40, "seed": 3}})
    assert s.search.n_startup_trials == 10 and load_campaign(s.to_dict()) == s
    small = load_campaign({**CONSTRAINED, "search": {"algorithm": "gp", "num_trials": 8, "n_startup_trials": 2}})
    sampler = build_search(small).inner.sampler
    assert isinstance(sampler, optuna.samplers.GPSampler) and sampler._n_startup_trials == 2
    with pytest.raises(SpecError, match="search.n_startup_trials: applies to algorithm gp, ehvi, mfehvi only, not tpe"):
        load_campaign({**CONSTRAINED, "search": {"algorithm": "tpe", "num_trials": 8, "n_startup_trials": 2}})


def test_an_infeasible_proposal_takes_no_trial_slot_is_recorded_and_learnt(tmp_path):
    from optuna.trial import TrialState

    from qkvsearch.search.records.proposals import PROPOSALS_DIR, count_proposals

    s = load_campaign({**CONSTRAINED, "search": {"algorithm": "random", "num_trials": 6, "seed": 0}})
    searcher = build_search(OpenedCampaign(s, str(tmp_path)))
    for i in range(6):
        trial = searcher.suggest(f"t{i}")
        assert not s.violations(trial["cost"]) and "invalid" not in trial  # every trial is feasible
        searcher.on_trial_complete(f"t{i}", {"top1": 50.0 + i, **trial["cost"], "epoch": 1.0,
                                             "qs_epochs_planned": 1.0})
    assert searcher.infeasible >= 3 and count_proposals(str(tmp_path)) == searcher.infeasible
    record = json.loads(next((tmp_path / PROPOSALS_DIR).iterdir()).read_text())
    assert record["status"] == "infeasible" and "params_m" in record["error"] and record["cost"]["params_m"] > 3.0
    study = searcher.inner.study
    told = [t for t in study.trials if t.constraints and t.constraints["params_m"] > 0]
    assert len(told) == searcher.infeasible and all(t.state == TrialState.COMPLETE for t in told)
    # the worst top1 seen when it was told (50.0 once the first trial completed), its exact params_m
    assert all(t.values[0] == 50.0 and t.values[1] > 3.0 for t in told[1:])
    feasible = [t for t in study.trials if t.constraints["params_m"] <= 0]
    assert len(feasible) == 6


def test_constrained_samplers_propose_fewer_infeasible_configurations_than_random():
    """Measured with seed 0 over 40 trials: random 0.77 of its proposals infeasible, TPE 0.32, NSGA-II 0.54."""
    from qkvsearch.search.campaign.assemble import infeasible_share

    s = load_campaign({**CONSTRAINED, "search": {"algorithm": "random", "num_trials": 40, "seed": 0}})
    random = infeasible_share(s, "random")
    tpe = infeasible_share(s, "tpe")
    assert random > 0.65 and tpe < 0.45 and tpe < random - 0.25


def test_a_warm_start_tells_the_searcher_every_earlier_result_and_they_become_duplicates(tmp_path):
    exp = tmp_path / "earlier"
    earlier = load_campaign({**CONSTRAINED, "space": {"embedding": ["linear", "sne"], "hidden_width": [0.5]},
                             "search": {"algorithm": "grid"}})
    built = earlier_campaign(exp, earlier, {"linear": ({"embedding": "linear"}, 60.0),
                                            "sne": ({"embedding": "sne", "hidden_width": 0.5}, 70.0)})
    wider = load_campaign({**CONSTRAINED, "space": {"embedding": ["linear", "sne", "psne"], "hidden_width": [0.5]},
                           "search": {"algorithm": "random", "num_trials": 8, "seed": 0, "warm_start": str(exp)}})
    searcher = build_search(wider)
    trials = [searcher.suggest("t0")]  # the warm start is told before the first proposal
    study = searcher.inner.study
    assert [t.values for t in study.trials[:2]] == [[60.0, built["linear"]["cost"]["params_m"]],
                                                    [70.0, built["sne"]["cost"]["params_m"]]]
    assert all(t.constraints["params_m"] < 0 for t in study.trials[:2])  # feasible, told with their constraints
    trials += [searcher.suggest(f"t{i}") for i in range(1, 8)]
    known = [t for t in trials if t["config"]["embedding"] in ("linear", "sne")]
    assert known and all(t["duplicate_of"] == f"{exp}/old_{t['config']['embedding']}"
                         and t["known"]["status"] == "completed" for t in known)
    assert [t for t in trials if "duplicate_of" not in t][0]["config"]["embedding"] == "psne"
    # another recipe (two epochs): none of the earlier trainings is this campaign's
    other = load_campaign({**wider.to_dict(), "train": {**wider.to_dict()["train"], "epochs": 2}})
    fresh = build_search(other)
    fresh.suggest("t0")
    assert len(fresh.inner.study.trials) == 1 and list(fresh.ledger.first.values()) == ["t0"]


def test_another_policy_of_a_trained_configuration_waits_for_its_training_without_a_slot_then_reuses_it():
    """Two policies of one configuration: the first proposal trains; the second waits in the wrapper (no
    trial) until that training has ended, then evaluates its weights (trained_by); the same policy again
    is a duplicate of that evaluation. A state saved meanwhile holds the waiting proposal."""
    s = load_campaign({**BASE, "space": {"embedding": ["linear"], "quant_mlp": ["fp", "int8_dynamic"]},
                       "objectives": ["top1_q"], "search": {"algorithm": "random", "num_trials": 6, "seed": 1}})
    searcher = build_search(s)
    first = searcher.suggest("t0")
    assert "trained_by" not in first and "duplicate_of" not in first
    policy = "fp" if first["config"]["quant_mlp"] == "int8_dynamic" else "int8_dynamic"
    waiting = None
    for i in range(1, 20):  # same-policy proposals are duplicates of t0; the other policy waits
        trial = searcher.suggest(f"t{i}")
        if trial is None:
            waiting = i
            break
        assert trial["duplicate_of"] == "t0"
    parked = searcher.ledger.parked("waiting")
    assert waiting is not None and [r["trial"]["config"]["quant_mlp"] for r in parked] == [policy]
    assert searcher.suggest("tx") is None  # one waits, concurrency 1: nothing more until the training ends
    saved = json.loads(json.dumps(searcher.get_state()))
    saved_inner = json.loads(json.dumps(searcher.inner.state()))
    restored = build_search(s)
    restored.set_state(saved)
    restored.inner.restore(saved_inner)
    done = {"top1": 50.0, "top1_q": 50.0, "epoch": 1.0, "qs_epochs_planned": 1.0}
    for s_ in (restored, searcher):
        s_.on_trial_complete("t0", done)
        trial = s_.suggest("t9")
        assert trial["trained_by"] == "t0" and trial["config"]["quant_mlp"] == policy
        assert trial["known"]["status"] == "completed" and not s_.ledger.parked("waiting")
    searcher.on_trial_complete("t9", {"top1": 50.0, "top1_q": 49.0, "epoch": 0.0, "qs_trained_by": "t0"})
    again = next(t for i in range(10, 40) if (t := searcher.suggest(f"t{i}"))["config"]["quant_mlp"] == policy)
    assert again["duplicate_of"] == "t9" and again["known"]["metrics"]["top1_q"] == 49.0


def test_a_state_saved_before_policies_existed_still_loads_and_knows_its_trainings():
    s = load_campaign({**BASE, "space": {"embedding": ["linear", "sne"]}, "objectives": ["top1"],
                       "search": {"algorithm": "random", "num_trials": 6, "seed": 0}})
    searcher = build_search(s)
    first = searcher.suggest("t0")
    searcher.on_trial_complete("t0", {"top1": 40.0, "epoch": 1.0, "qs_epochs_planned": 1.0})
    (rec,) = searcher.ledger.records.values()
    # the wrapper's bookkeeping as saved before the ledger and before policies: parallel maps, no variants
    old = {"first": {rec["key"]: "t0"}, "identity_of": {}, "outcomes": {rec["key"]: rec["outcome"]}, "warm": [],
           "started": True, "proposals": 1, "infeasible": 0, "waiting": [], "live": [], "costs": {},
           "measured": None}
    restored = build_search(s)
    restored.set_state(json.loads(json.dumps(old)))
    restored.inner.restore(json.loads(json.dumps(searcher.inner.state())))
    again = next(t for i in range(1, 30) if (t := restored.suggest(f"t{i}"))["config"]["embedding"]
                 == first["config"]["embedding"])
    assert again["duplicate_of"] == "t0" and again["known"]["status"] == "completed"


def test_a_trial_is_learnt_with_its_cost_whatever_its_result_holds_for_it():
    """A trial reports its metrics, not its cost (a duplicate reports NaN for every objective it lacks): the
    wrapper adds the trial's exact cost before its searcher learns the result."""
    s = load_campaign({**BASE, "space": {"embedding": ["sne"], "hidden_width": [0.5, 64]},
                       "objectives": ["top1", {"metric": "gmacs", "mode": "min"}],
                       "search": {"algorithm": "random", "num_trials": 4, "seed": 0}})
    searcher = build_search(s)
    first, second = searcher.suggest("t0"), searcher.suggest("t1")
    assert second["duplicate_of"] == "t0"
    searcher.on_trial_complete("t0", {"top1": 55.0, "epoch": 1.0, "qs_epochs_planned": 1.0})
    searcher.on_trial_complete("t1", {"top1": 55.0, "gmacs": float("nan"), "epoch": 0.0, "qs_status": "duplicate",
                                      "qs_duplicate_of": "t0", "qs_original_status": "completed"})
    assert [t.values for t in searcher.inner.study.trials[:2]] == [[55.0, first["cost"]["gmacs"]]] * 2


def test_a_trial_ended_by_the_campaigns_stop_is_learnt_only_when_it_really_ends():
    """Tune stops (or fails) what runs while a campaign stops; that trial resumes later. The searcher learns
    nothing of it then (no failure in a study others keep), and learns its real ending after the resume."""
    import optuna

    s = load_campaign({**BASE, "space": {"embedding": ["linear", "sne"]}, "objectives": ["top1"],
                       "search": {"algorithm": "random", "num_trials": 4, "seed": 0}})
    searcher = build_search(s)
    searcher.suggest("t0")
    searcher.suggest("t1")
    searcher.stopping = lambda: True
    searcher.on_trial_complete("t0", error=True)
    searcher.on_trial_complete("t1", {"top1": 40.0, "epoch": 1.0, "qs_epochs_planned": 3.0})  # stopped at 1 of 3
    assert [t.state for t in searcher.inner.study.trials] == [optuna.trial.TrialState.RUNNING] * 2
    assert searcher.live == {"t0", "t1"}
    searcher.stopping = lambda: False
    searcher.on_trial_complete("t0", {"top1": 50.0, "epoch": 3.0, "qs_epochs_planned": 3.0})
    searcher.on_trial_complete("t1", error=True)
    assert [t.state for t in searcher.inner.study.trials] == [optuna.trial.TrialState.COMPLETE,
                                                              optuna.trial.TrialState.FAIL]


def test_repeats_with_any_searcher_run_each_proposal_under_successive_seeds_the_searcher_learning_the_first():
    """search.repeats for tpe (search.searchers.repeated): each configuration it proposes trains under seeds 7, 8, 9
    before it is asked again; its study holds only its own proposals, learnt from the first seed; the state is plain
    data, and a searcher built anew and restored goes on with the repeats left."""
    s = load_campaign({**BASE, "train": {"epochs": 1, "seed": 7},
                       "space": {"embedding": ["sne", "psne"], "hidden_width": [0.25, 0.5, 1.0]},
                       "objectives": ["top1"],
                       "search": {"algorithm": "tpe", "num_trials": 9, "repeats": 3, "seed": 0}})
    searcher = build_search(s)
    assert searcher.inner.problem.num_trials == 3   # its proposals: num_trials counts every run
    done = {"epoch": 1.0, "qs_epochs_planned": 1.0}
    trials = []
    for i in range(5):
        trials.append(searcher.suggest(f"t{i}"))
        searcher.on_trial_complete(f"t{i}", {"top1": 50.0 + i, **done})
    assert [t["config"]["seed"] for t in trials] == [7, 8, 9, 7, 8]
    first = {k: v for k, v in trials[0]["config"].items() if k != "seed"}
    assert all({k: v for k, v in t["config"].items() if k != "seed"} == first for t in trials[:3])
    assert [t.values for t in searcher.inner.inner.study.trials] == [[50.0], [53.0]]   # each proposal's first seed
    restored = build_search(s)
    restored.set_state(json.loads(json.dumps(searcher.get_state())))
    restored.inner.restore(json.loads(json.dumps(searcher.inner.state())))
    assert restored.suggest("t5")["config"]["seed"] == 9


def test_a_refused_proposal_takes_its_repeats_with_it():
    from qkvsearch.search.searchers import make_searcher

    s = load_campaign({**BASE, "space": {"embedding": ["sne", "psne"], "hidden_width": [0.25, 0.5, 1.0]},
                       "objectives": ["top1"], "search": {"algorithm": "random", "num_trials": 6, "repeats": 2}})
    repeated = make_searcher("random", spec_problem(s))
    first = repeated.suggest("a")
    repeated.tell_infeasible("a", {"params_m": 9.0})
    second = repeated.suggest("b")
    assert "seed" not in second and repeated.suggest("c") == {**second, "seed": 1}   # b's repeat, not a's
    repeated.on_trial_complete("c", {"top1": 1.0})   # a repeat: the inner searcher never hears of it
    assert repeated.own == set() and first is not None


@pytest.mark.parametrize("search,expected", [
    ({"algorithm": "random", "num_trials": 8, "repeats": 3},
     "search.num_trials: expected a multiple of search.repeats (3)"),
    ({"algorithm": "gp", "num_trials": 8, "repeats": 2, "n_startup_trials": 4},
     "search.n_startup_trials: expected fewer than the proposals search.num_trials / search.repeats (4)"),
])
def test_repeats_of_a_searcher_are_checked_against_its_budget(search, expected):
    from qkvsearch.spaces import SpecError

    with pytest.raises(SpecError) as info:
        load_campaign({**BASE, "space": {"embedding": ["sne", "psne"], "lr": {"float": [1e-4, 1e-2]}},
                       "objectives": ["top1", "gmacs"], "search": search})
    assert [e for e in info.value.errors if e.startswith(expected)], info.value.errors


def test_a_one_shot_campaign_refuses_repeats_and_front_repeats():
    from qkvsearch.spaces import SpecError

    for key, value in (("repeats", 2), ("front_repeats", 3)):
        with pytest.raises(SpecError) as info:
            load_campaign({**BASE, "space": {"embedding": ["sne", "psne"]}, "objectives": ["top1", "gmacs"],
                           "supernet": {"train": {"epochs": 1}},
                           "search": {"algorithm": "random", "num_trials": 4, key: value}})
        assert any(e.startswith(f"search.{key}: not with a supernet") for e in info.value.errors), info.value.errors
