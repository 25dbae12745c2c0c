"""One-shot scoring on local Ray (search.campaign.oneshot): the pool of scorer actors is sized by the CPUs and GPUs
the cluster has (two logical GPUs here) and an actor no node can hold is named within a bounded wait; scoring
follows the campaign's proposal rules: a subnet whose cost breaks a constraint is never scored or chosen, and the
control sample is drawn among the feasible configurations of the space; a measured cost (latency) is an
objective, measured once per model through the measurement path; a subnet its supernet cannot hold fails alone.

One Ray for the module, one supernet checkpoint per space (its initial weights: scoring reads any checkpoint)."""
from __future__ import annotations

import math

import pytest
import ray

from qkvsearch.search.campaign.measured import CACHE_DIR, measured_key
from qkvsearch.search.campaign.oneshot.evaluation import CONTROL, Scoring
from qkvsearch.search.campaign.oneshot.plan import candidates, supernet_plan
from qkvsearch.search.campaign.oneshot.retrain import selection
from qkvsearch.search.campaign.oneshot.scorers import ScorerPool, pool_size
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.cluster.capacity import Cluster, ResourceError
from qkvsearch.search.records.proposals import read_proposals
from qkvsearch.spaces import base_config, load_campaign
from qkvsearch.spaces.keys import fill
from qkvsearch.spaces.schema import violations
from qkvsearch.trainers.supernet.plan import SupernetPlan
from qkvsearch.trainers.training.engine import STATE_FORMAT, save_state

pytestmark = pytest.mark.slow

GPUS = 2   # logical: Ray reserves them, torch sees no CUDA device behind them


@pytest.fixture(scope="module")
def gpu_ray():
    """A local Ray of 4 CPUs and 2 logical GPUs; a Ray this process kept for other tests is stopped first and
    started again after."""
    from qkvsearch.search.cluster.local_ray import start_local_ray, stop_local_ray

    kept = ray.is_initialized()
    if kept:
        stop_local_ray()
    start_local_ray(trial_slots=1, num_cpus=4, num_gpus=GPUS)
    yield
    stop_local_ray()
    if kept:
        start_local_ray(trial_slots=1, num_cpus=2)


def _spec(tmp_path, **over) -> dict:
    spec = {"name": "scoring", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
            "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 16, "seed": 0},
            "space": {"depth": {"choice": [1, 2]}, "embedding": {"choice": ["linear", "sne", "fsne"]},
                      "hidden_width": {"choice": [0.25, 1.0]}, "code_size": 4},
            "supernet": {"train": {"epochs": 1}, "bn_batches": 1, "control": 3},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 5, "seed": 0},
            "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
            "storage": str(tmp_path)}
    return {**spec, **over}


def _pool(spec, tmp_path, size: int, plan: dict | None = None, **kwargs) -> ScorerPool:
    """A pool over a supernet of ``plan`` (default: the spec's) holding its initial weights."""
    plan = plan or supernet_plan(spec)
    supernet = SupernetPlan.from_dict(plan).supernet(seed=0)
    folder = str(tmp_path / "checkpoint")
    teacher = fill({**base_config(spec), **SupernetPlan.from_dict(plan).teacher})
    save_state({"format": STATE_FORMAT, "model": supernet.state_dict(), "epoch": 1, "history": [],
                "config": teacher}, folder)
    return ScorerPool(spec, plan, folder, teacher, size, **kwargs)


GPU_RESOURCES = {"workers_per_trial": 1, "cpus_per_worker": 1, "gpus_per_worker": 1}
NARROW = {"depth": {"choice": [1, 2]}, "embedding": {"choice": ["linear", "sne", "fsne"]}, "hidden_width": 0.25,
          "code_size": 4}


@pytest.fixture(scope="module")
def narrow_pool(gpu_ray, tmp_path_factory):
    """Two actors, a GPU each, over a supernet sized for the space with hidden width 0.25 only."""
    tmp = tmp_path_factory.mktemp("narrow")
    narrow = load_campaign(_spec(tmp, space=NARROW, resources=GPU_RESOURCES))
    cluster = Cluster(cpus=4.0, gpus=float(GPUS), trial_slots=1.0, dashboard_url=None, started_here=True)
    size = pool_size(narrow.resources, cluster, concurrency=4)
    assert size == GPUS   # 4 CPUs would hold 4 actors, 2 GPUs hold 2
    with _pool(narrow, tmp, size, place_s=120) as pool:   # placing an actor starts a process: seconds under load
        yield pool


def test_the_pool_is_sized_by_cpus_and_gpus_and_an_actor_no_node_holds_is_named(narrow_pool):
    spec = load_campaign(_spec("/tmp", resources=GPU_RESOURCES))
    assert pool_size(spec.resources, Cluster(96.0, 8.0, 6.0, None, False), 6) == 8   # 24 by CPUs, 8 by GPUs
    assert pool_size(spec.resources, Cluster(96.0, 8.0, 1.0, None, False), 1) == 4    # at most 4 per slot
    assert len(narrow_pool.get()) == GPUS
    assert [w["device"] for w in narrow_pool.where] == ["cpu", "cpu"]   # a logical GPU is no CUDA device
    narrow_pool.place_s = 5   # one actor more than the GPUs hold is never placed: refused after this wait
    try:
        with pytest.raises(ResourceError, match=r"scorer actor 3 of 3 \(1 CPU, 1 GPU.*within 5 s"):
            narrow_pool.get(GPUS + 1)
    finally:
        narrow_pool.place_s = 120
    assert len(narrow_pool.actors) == GPUS                               # the one not placed is not kept


def test_a_subnet_its_supernet_cannot_hold_fails_alone_and_the_scoring_goes_on(narrow_pool, tmp_path):
    spec = load_campaign(_spec(tmp_path, search={"algorithm": "grid"}, resources=GPU_RESOURCES))
    records = Scoring(OpenedCampaign(spec, str(tmp_path / "exp")), narrow_pool, "supernet:test", "space").search()
    failed = [r for r in records if r["status"] == "failed"]
    done = [r for r in records if r["status"] == "completed"]
    assert len(records) == len(candidates(spec))   # every subnet scored or failed, none left out
    assert failed and all("cannot run" in r["error"] for r in failed)
    assert all(r["config"].get("width") in (0, 32) for r in done)   # linear, or the width the supernet holds
    assert all(r["config"]["width"] == 128 for r in failed)


def test_constrained_scoring_with_a_measured_objective_scores_and_chooses_feasible_subnets(gpu_ray, tmp_path):
    every = candidates(load_campaign(_spec(tmp_path)))
    limit = sorted(t["cost"]["gmacs"] for t in every)[len(every) // 2]   # half the space breaks it
    spec = load_campaign(_spec(tmp_path, constraints={"gmacs": {"max": limit}},
                               objectives=[{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}],
                               measure={"batch": 4, "max_s": 0.1}))
    exp = str(tmp_path / "exp")
    campaign = OpenedCampaign(spec, exp)
    with _pool(spec, tmp_path, 1) as pool:
        scoring = Scoring(campaign, pool, "supernet:test", "space")
        records = scoring.search()
        chosen = selection(campaign, records, scoring.feasible)
        records = scoring.score_selected(chosen)
    searched = [r for r in records if r.get("selected_for") != CONTROL]
    assert len(searched) == 5 and all(r["status"] == "completed" for r in records)
    assert all(not violations(spec.constraints, r["cost"]) for r in records)      # none breaks it was scored
    assert read_proposals(exp) and all("gmacs" in p["error"] for p in read_proposals(exp))  # recorded instead
    for r in records:   # latency measured through the measurement path, once per model
        assert math.isfinite(r["cost"]["latency_ms"]) and r["measured_on"]["env"]["threads"] == 1
    models = {measured_key(r["config"]) for r in records}
    assert len(list((tmp_path / "exp" / CACHE_DIR).glob("*.json"))) == len(models)
    by_keys = {repr(sorted(r["keys"].items())): r for r in records}
    picked = [by_keys[repr(sorted(k.items()))] for k in chosen["chosen"] + chosen["control"]]
    assert chosen["chosen"] and len(chosen["control"]) == 3
    assert all(r["cost"]["gmacs"] <= limit for r in picked)   # chosen and control alike: feasible
    assert sum(1 for r in records if r.get("selected_for") == CONTROL) \
        == sum(1 for k in chosen["control"] if repr(sorted(k.items())) not in
               {repr(sorted(r["keys"].items())) for r in searched})
