"""A campaign with a measured constraint on local Ray: each model is measured in a Ray task holding the whole
node before it becomes a trial, a configuration over the bound never becomes a trial (an infeasible
proposal), a model measured once is not measured again, and the measured cost reaches the records,
trials.parquet, the fronts and the report."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from qkvsearch.search.monitor.status import load_records
from qkvsearch.spaces import load_campaign

pytestmark = pytest.mark.slow

# The bound is on the training step's peak memory, which is exact on CPU (the bytes of the tensors alive at its
# peak: trainers.deploy.measure), so which models are kept does not depend on the machine's load: at batch 16 a 1-block
# model of width 128 peaks at 0.017 GB, the large one (4 blocks of width 256) at 0.12 GB. A latency bound does:
# with three test processes on two cores, a 1-block model (2 ms alone) measured over a 7 ms bound.
BOUND_GB = 0.05
LARGE = {"depth": 4, "embed_dim": 256}


def _spec(tmp: Path) -> dict:
    return {
        "name": "measured",
        "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 16, "max_steps_per_epoch": 2, "warmup_epochs": 0},
        "space": {"variants": [{"depth": 1, "lr": 1e-3}, {**LARGE, "lr": 1e-3}, {"depth": 1, "lr": 2e-3},
                               {"depth": 1, "lr": 3e-3, "embedding": "fsne"},
                               {"depth": 1, "lr": 1e-3, "embedding": "sne"}, {**LARGE, "lr": 2e-3}]},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}],
        "constraints": {"peak_mem_gb": {"max": BOUND_GB}},
        "measure": {"batch": 8, "metrics": ["train_step_ms", "peak_mem_gb"], "max_s": 1.0},
        "search": {"algorithm": "grid"},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage": str(tmp),
    }


@pytest.fixture(scope="module")
def campaign(ray_local, tmp_path_factory):
    from qkvsearch.search.campaign.launch import launch

    exp = launch(load_campaign(_spec(tmp_path_factory.mktemp("measured"))))
    records = {(r["config"]["depth"], r["config"]["lr"], r["config"]["embedding"]): r for r in load_records(exp)}
    return Path(exp), records


def test_a_configuration_over_the_bound_never_becomes_a_trial(campaign):
    from qkvsearch.search.records.proposals import read_proposals

    exp, records = campaign
    assert set(records) == {(1, 1e-3, "linear"), (1, 2e-3, "linear"), (1, 3e-3, "fsne"), (1, 1e-3, "sne")}
    for rec in records.values():
        assert rec["status"] == "completed" and len(rec["epochs"]) == 1
        assert rec["cost"]["peak_mem_gb"] <= BOUND_GB
    large = read_proposals(exp)   # the large model at both learning rates: measured once, never trained
    assert sorted(p["config"]["lr"] for p in large) == [1e-3, 2e-3]
    assert all(p["config"]["depth"] == LARGE["depth"] for p in large)
    for p in large:
        assert p["status"] == "infeasible" and p["cost"]["peak_mem_gb"] > BOUND_GB
        assert p["error"] == f"peak_mem_gb {p['cost']['peak_mem_gb']:g} > max {BOUND_GB:g}"
        assert p["measured_on"]["env"]["threads"] == 1
    assert large[0]["measured_on"] == large[1]["measured_on"]


def test_measured_cost_is_recorded_with_how_and_where_it_was_measured(campaign):
    _, records = campaign
    for rec in records.values():
        cost, how = rec["cost"], rec["measured_on"]
        assert {"latency_ms", "train_step_ms", "peak_mem_gb"} <= set(cost) and "throughput" not in cost
        assert cost["train_step_ms"] > 0 and cost["peak_mem_gb"] > 0
        env = how["env"]
        assert env["device_type"] == "cpu" and env["precision"] == "fp32" and env["compile"] is False
        # measured while no trial was live, or holding every CPU of the node; on one worker's threads
        assert (how["idle"] and how["held"] == {}) or how["held"]["CPU"] == ray_total_cpus()
        assert env["threads"] == 1
        assert env["batch"] == 8 and env["latency_batch"] == 1 and env["train_batch"] == 16
        assert how["latency_p90_ms"] >= cost["latency_ms"]
        for epoch in rec["epochs"]:  # what training saw, per epoch
            assert epoch["epoch_step_ms"] > 0 and "latency_ms" not in epoch


def test_a_model_measured_once_is_not_measured_again(campaign):
    exp, records = campaign
    first, again = records[(1, 1e-3, "linear")], records[(1, 2e-3, "linear")]   # one model, two learning rates
    assert first["measured_on"] == again["measured_on"] and first["measured_on"]["cached"] is False
    assert again["cost"]["latency_ms"] == first["cost"]["latency_ms"]
    assert len(list((exp / "qs_measurements").glob("*.json"))) == 4   # four distinct models


def test_measured_cost_reaches_trials_parquet_the_front_and_the_report(campaign, tmp_path):
    from qkvsearch.search.analysis.report import build_report

    exp, records = campaign
    paths = build_report(exp, tmp_path / "report", static=False)
    trials = pq.read_table(paths["trials"]).to_pandas().set_index("trial_id")
    for rec in records.values():
        row = trials.loc[rec["trial_id"]]
        assert row["latency_ms"] == rec["cost"]["latency_ms"] and row["peak_mem_gb"] == rec["cost"]["peak_mem_gb"]
        assert row["latency_p90_ms"] == rec["measured_on"]["latency_p90_ms"]
        assert row["measured_on"].startswith(rec["measured_on"]["env"]["device"]) and "fp32" in row["measured_on"]
    front = set(pq.read_table(paths["trials"]).to_pandas().query("status == 'completed'")["trial_id"])
    csv = Path(paths["csv"]).read_text()
    assert "latency_ms" in csv.splitlines()[0] and any(t in csv for t in front)
    md = Path(paths["md"]).read_text()
    assert "## Where MACs mislead" in md and "Spearman rank correlation of GMACs" in md
    assert "3 distinct model(s)" in md  # the trained ones and "against latency_ms:" in md
    assert "Where MACs mislead" in Path(paths["html"]).read_text()
    spec = json.loads((exp / "qs_campaign.json").read_text())["spec"]
    assert spec["measure"]["max_s"] == 1.0


def ray_total_cpus() -> float:
    import ray

    return ray.cluster_resources()["CPU"]


def test_proposals_wait_for_their_measurement_while_the_searcher_proposes_on(ray_local, tmp_path):
    """The wrapper parks a proposal whose model is being measured and asks for the next; a model measured too
    too large is rejected without a trial slot, at every learning rate; while a trial is live a measurement holds
    every CPU of the node; what was measured survives in the saved state."""
    import json
    import time

    from qkvsearch.search.campaign.assemble import build_search
    from qkvsearch.search.campaign.measured import measured_key
    from qkvsearch.search.campaign.opened import OpenedCampaign

    spec = _spec(tmp_path)
    spec["space"] = {"variants": [{"depth": 1, "lr": 1e-3}, {**LARGE, "lr": 1e-3}, {**LARGE, "lr": 2e-3},
                                  {"depth": 1, "lr": 2e-3}, {"depth": 1, "lr": 1e-3, "embedding": "sne"}]}
    searcher = build_search(OpenedCampaign(load_campaign(spec), str(tmp_path)))
    searcher.set_max_concurrency(2)
    assert searcher.suggest("t0") is None          # both first models measured at once: none is a trial yet
    waiting = searcher.ledger.parked("measuring")
    assert [r["trial"]["config"]["depth"] for r in waiting] == [1, LARGE["depth"]]

    def next_trial(trial_id: str) -> dict:
        # A bound only a hang reaches: on a loaded machine a measurement that holds the node's CPUs (idle) runs
        # its threads beside other processes' and took over 120 s with two busy loops beside it.
        deadline = time.monotonic() + 600
        while (trial := searcher.suggest(trial_id)) is None:
            assert time.monotonic() < deadline, "no measurement finished in 600 s"
            time.sleep(0.1)
        assert isinstance(trial, dict), (trial, searcher.ledger.parked("measuring"), searcher.infeasible,
                                         searcher.measurer.done)
        return trial

    first = next_trial("t0")
    assert (first["config"]["depth"], first["config"]["lr"]) == (1, 1e-3) and first["cost"]["peak_mem_gb"] <= BOUND_GB
    assert first["measured_on"]["idle"] is True and first["measured_on"]["held"] == {}  # no trial was live
    again = next_trial("t1")                       # the large model rejected twice on the way, measured once
    assert (again["config"]["depth"], again["config"]["lr"]) == (1, 2e-3) and searcher.infeasible == 2
    assert again["measured_on"] == first["measured_on"]
    sne = next_trial("t2")                         # measured while t0 and t1 are live: the whole node held
    assert sne["config"]["embedding"] == "sne" and sne["measured_on"]["idle"] is False
    assert sne["measured_on"]["held"]["CPU"] == ray_total_cpus() and sne["measured_on"]["env"]["threads"] == 1
    assert len(list(tmp_path.glob("qs_measurements/*.json"))) == 3 and searcher.ledger.parked("measuring") == []
    assert measured_key(sne["config"]) in searcher.measurer.done and searcher.live == {"t0", "t1", "t2"}
    restored = build_search(OpenedCampaign(load_campaign(spec), str(tmp_path)))
    restored.set_state(json.loads(json.dumps(searcher.get_state())))  # what was measured is plain data
    assert restored.measurer.done == searcher.measurer.done and restored.measurer._pending == {}


def test_ehvi_learns_what_waited_for_its_measurement_under_the_trial_that_trained_it(ray_local, tmp_path):
    """ehvi with a measured constraint: a proposal that waited for its measurement is learnt under the trial id
    that trained it (not left running at the GP's mean), one rejected after measuring is told and never
    proposed again, and a warm start reaches the GP while measuring is on."""
    import time

    from helpers.campaign_files import earlier_campaign

    from qkvsearch.search.campaign.assemble import build_search
    from qkvsearch.search.campaign.opened import OpenedCampaign
    from qkvsearch.search.searchers.ehvi import config_key

    spec = _spec(tmp_path)
    spec.update(space={"variants": [{"depth": depth, "embed_dim": width, "lr": lr}
                                    for depth, width in ((1, 128), (LARGE["depth"], LARGE["embed_dim"]))
                                    for lr in (1e-3, 2e-3, 3e-3)]},
                objectives=[{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}])
    earlier = earlier_campaign(tmp_path / "earlier", load_campaign(spec),
                               {"fast": ({"depth": 1, "embed_dim": 128, "lr": 3e-3}, 40.0)})
    spec["search"] = {"algorithm": "ehvi", "num_trials": 5, "n_startup_trials": 1, "seed": 0,
                      "warm_start": str(tmp_path / "earlier")}
    searcher = build_search(OpenedCampaign(load_campaign(spec), str(tmp_path)))
    searcher.set_max_concurrency(2)
    ehvi = searcher.inner

    def next_trial(trial_id: str):
        deadline = time.monotonic() + 120
        while (trial := searcher.suggest(trial_id)) is None:
            assert time.monotonic() < deadline, "no measurement finished in 120 s"
            time.sleep(0.1)
        return trial

    trials = {}
    for i in range(3):
        trial = next_trial(f"t{i}")
        if trial == searcher.FINISHED:
            break
        trials[f"t{i}"] = trial
        pick = ehvi.proposed[f"t{i}"]  # the trial that runs the proposal holds it, whatever it waited under
        assert ehvi.candidates[pick] == {k: trial["config"][k] for k in ("depth", "embed_dim", "lr")}
        searcher.on_trial_complete(f"t{i}", {"top1": 50.0 + i, **trial["cost"], "epoch": 1.0,
                                             "qs_epochs_planned": 1.0})
        assert ehvi.core.results[pick] == 50.0 + i and pick not in ehvi.core.running
    index = {config_key(c): i for i, c in enumerate(ehvi.candidates)}
    warm = index[config_key({"depth": 1, "embed_dim": 128, "lr": 3e-3})]
    assert ehvi.core.results[warm] == 40.0 and earlier["fast"]["config"]["depth"] == 1  # told before any proposal
    assert {t["config"]["depth"] for t in trials.values()} == {1} and len(trials) == 2  # the rest is too large
    large = [index[config_key({**LARGE, "lr": lr})] for lr in (1e-3, 2e-3, 3e-3)]
    assert searcher.infeasible >= 1 and all(p not in ehvi.core.running for p in large)
    told = [p for p in large if p in ehvi.core.tried]
    assert len(told) == searcher.infeasible and not ehvi.proposed and not ehvi.core.running
