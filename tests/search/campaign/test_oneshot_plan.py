"""What a one-shot campaign derives from its spec (search.campaign.oneshot): its candidates, the nested campaign
that trains the supernet, the selection and the campaign the selection retrains in, and a trained supernet
taken with ``supernet.from``, checked to hold the campaign's space."""
from __future__ import annotations

import pytest

from qkvsearch.search.campaign.oneshot.phases import trained_plan
from qkvsearch.search.campaign.oneshot.plan import (
    PLAN_FILE,
    SUPERNET_DIR,
    candidates,
    supernet_plan,
    supernet_spec,
)
from qkvsearch.search.campaign.oneshot.retrain import retrain_spec, select
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.records.layout import CampaignFolder
from qkvsearch.spaces import BadInput, load_campaign
from qkvsearch.spaces.keys import identity
from qkvsearch.storage import write_json


def _spec(tmp_path, **supernet) -> dict:
    return {"name": "p", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
            "data": {"dataset": "digits"}, "train": {"epochs": 2, "batch_size": 16, "seed": 5},
            "space": {"depth": 2, "embedding": {"choice": ["linear", "sne", "fsne"]},
                      "hidden_width": {"choice": [0.5, 1.0]}, "code_size": 4},
            "supernet": {"train": {"epochs": 3, "lr": 1e-3}, **supernet},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 5, "seed": 1}, "storage": str(tmp_path)}


def test_the_candidates_are_the_distinct_models_of_the_space(tmp_path):
    trials = candidates(load_campaign(_spec(tmp_path)))
    # linear has no hidden width: its two widths are one model
    assert len(trials) == 5 == len({identity(t["config"]) for t in trials})
    assert sorted(t["config"]["embedding"] for t in trials).count("linear") == 1


def test_the_supernet_trains_as_one_trial_of_the_teacher_with_its_own_recipe(tmp_path):
    spec = load_campaign(_spec(tmp_path))
    trials = candidates(spec)
    plan = supernet_plan(spec)
    sub = supernet_spec(OpenedCampaign(spec, str(tmp_path / "p")), plan)
    assert sub.storage.rstrip("/").endswith("p") and sub.name == SUPERNET_DIR
    (variant,) = sub.space.variants
    largest = max(trials, key=lambda t: t["cost"]["gmacs"])
    assert dict(variant) == largest["keys"] and identity(plan["teacher"]) == identity(largest["config"])
    assert sub.train.epochs == 3 and sub.train.lr == 1e-3 and not sub.supernet and not sub.constraints
    assert len(plan["sandwich"]) == 3  # the embedding types: weights of their own each
    assert sub.resources.workers_per_trial == spec.resources.workers_per_trial == 1


def test_the_supernet_trains_on_its_own_resources_and_the_subnets_retrain_on_the_campaigns(tmp_path):
    spec = load_campaign({**_spec(tmp_path, resources={"workers_per_trial": 2, "cpus_per_worker": 0.5}),
                          "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 2}})
    trials = candidates(spec)
    sub = supernet_spec(OpenedCampaign(spec, str(tmp_path / "p")), supernet_plan(spec))
    assert (sub.resources.workers_per_trial, sub.resources.cpus_per_worker) == (2, 0.5)
    assert sub.resources.max_concurrent_trials == 1
    retrain = retrain_spec(spec, {"chosen": [trials[0]["keys"]], "control": [], "seed": 5})
    assert (retrain.resources.workers_per_trial, retrain.resources.max_concurrent_trials) == (1, 2)


def test_a_supernet_no_node_can_hold_is_refused_naming_its_field(tmp_path, monkeypatch):
    from qkvsearch.search.campaign import preflight
    from qkvsearch.search.cluster.capacity import Cluster

    spec = load_campaign(_spec(tmp_path, resources={"workers_per_trial": 16}))
    with pytest.raises(preflight.ResourceError, match=r"^supernet\.resources\.workers_per_trial: .* = 16 CPUs"):
        preflight.check_stage_resources(spec, Cluster(8.0, 0.0, 4.0, None, False))
    from qkvsearch.search.campaign import launch

    # this machine, no cluster: no RAY_ADDRESS and no Ray attached (a Ray an earlier test of this process
    # keeps for later ones would be taken for the cluster), 2 CPUs
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(launch.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(preflight.os, "cpu_count", lambda: 2)
    with pytest.raises(preflight.ResourceError, match=r"^supernet\.resources: expected the supernet's training to fit"):
        launch._check_launchable(OpenedCampaign(spec, str(tmp_path / "p")), overwrite=False)


def _records(trials):
    return [{"keys": t["keys"], "config": t["config"], "cost": t["cost"], "metrics": {"top1": 50.0 + i}}
            for i, t in enumerate(trials)]


@pytest.mark.parametrize("how", [{"retrain": "front"}, {"retrain": "top_k", "top_k": 2}])
def test_the_selection_and_its_control_sample_are_disjoint_and_fixed_by_the_seed(tmp_path, how):
    spec = load_campaign(_spec(tmp_path, control=2, **how))
    records = _records(candidates(spec))
    chosen = select(spec, records)
    assert chosen == select(spec, records) and chosen["seed"] == 5
    assert len(chosen["control"]) == 2
    assert not {repr(k) for k in chosen["chosen"]} & {repr(k) for k in chosen["control"]}
    if how["retrain"] == "top_k":
        assert len(chosen["chosen"]) == 2
    retrain = retrain_spec(spec, chosen)
    seeds = sorted(v.get("seed") for v in retrain.space.variants if "seed" in v)
    assert len(retrain.space.variants) == len(chosen["chosen"]) + 4 and seeds == [6, 6]
    assert not retrain.supernet and retrain.search.algorithm == "grid"


def _trained_elsewhere(tmp_path, name: str, spec: dict) -> str:
    """A campaign folder holding a supernet's campaign and its plan, as a launch leaves them (``supernet.from``)."""
    other = load_campaign({**spec, "name": name})
    folder = tmp_path / name / SUPERNET_DIR
    plan = supernet_plan(other)
    CampaignFolder.create(str(folder), supernet_spec(OpenedCampaign(other, str(tmp_path / name)), plan), "test")
    write_json(str(folder / PLAN_FILE), plan)
    return str(tmp_path / name)


def test_a_supernet_from_another_campaign_must_hold_this_space(tmp_path):
    small = _trained_elsewhere(tmp_path, "small", {**_spec(tmp_path),
                                                   "space": {"depth": 2, "embedding": "sne", "hidden_width": 0.5}})
    narrow = load_campaign({**_spec(tmp_path), "space": {"depth": 2, "embedding": "sne", "hidden_width": 0.25}})
    assert trained_plan(small, narrow) == __import__("json").loads((tmp_path / "small" / SUPERNET_DIR / PLAN_FILE)
                                                                   .read_text())
    with pytest.raises(BadInput, match="supernet.from: expected a supernet whose space holds this campaign's"):
        trained_plan(small, load_campaign(_spec(tmp_path)))


def test_a_supernet_from_a_campaign_on_other_data_is_refused_naming_what_differs(tmp_path):
    source = _trained_elsewhere(tmp_path, "clutter", {**_spec(tmp_path), "data": {"dataset": "digits_clutter"}})
    with pytest.raises(BadInput, match=r"supernet.from: expected a supernet trained on this campaign's data, .*"
                                       r"dataset 'digits_clutter' \(this campaign: 'digits'\)"):
        trained_plan(source, load_campaign(_spec(tmp_path)))
    other_size = _trained_elsewhere(tmp_path, "px32", {**_spec(tmp_path), "model": {
        "name": "xcit_nano_12_p8_224", "img_size": 32, "num_classes": 10}})
    with pytest.raises(BadInput, match=r"img_size 32 \(this campaign: 16\)"):
        trained_plan(other_size, load_campaign(_spec(tmp_path)))


def test_the_retraining_runs_fifo_whatever_the_campaigns_scheduler(tmp_path):
    """Rank agreement over survivors would say nothing of the ranking: every retrained subnet trains its planned
    epochs (validate warns that the campaign's scheduler is not used: tests/spaces/test_supernet_section.py)."""
    spec = load_campaign({**_spec(tmp_path), "scheduler": {"type": "moasha", "grace_epochs": 1}})
    trials = candidates(spec)
    retrain = retrain_spec(spec, {"chosen": [trials[0]["keys"]], "control": [trials[1]["keys"]], "seed": 5})
    assert spec.scheduler.type == "moasha" and retrain.scheduler.type == "fifo"


def test_with_constraints_nothing_infeasible_is_chosen_and_the_control_sample_is_drawn_among_feasible_ones(tmp_path):
    every = candidates(load_campaign(_spec(tmp_path)))
    limit = sorted(t["cost"]["gmacs"] for t in every)[len(every) // 2]
    spec = load_campaign({**_spec(tmp_path, control=2, retrain="top_k", top_k=1),
                          "constraints": {"gmacs": {"max": limit}}})
    # scored by an earlier version, which scored infeasible subnets too: the best accuracy on the largest ones
    records = [{"keys": t["keys"], "config": t["config"], "cost": t["cost"],
                "metrics": {"top1": 100 * t["cost"]["gmacs"]}} for t in every]
    chosen = select(spec, records)
    by_keys = {repr(sorted(t["keys"].items())): t for t in every}
    picked = [by_keys[repr(sorted(k.items()))] for k in chosen["chosen"] + chosen["control"]]
    assert chosen["chosen"] and len(chosen["control"]) == 2
    assert all(t["cost"]["gmacs"] <= limit for t in picked)
    assert any(t["cost"]["gmacs"] > limit for t in every)   # there was something to leave out
