"""A campaign with a measured constraint on local Ray: each configuration is measured on the trial's device
before it trains, a configuration slower than the bound never trains, a model measured once is not measured
again, and the measured cost reaches the records, trials.parquet, the fronts and the report."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from qkvsearch.search.monitor.status import load_records
from qkvsearch.spaces import load_campaign

pytestmark = pytest.mark.slow

# One CPU thread, 16 px: a 1-block model runs in ~1.3 ms, a 12-block one in ~10 ms; the bound keeps them
# apart while other jobs slow this machine down up to 3x.
BOUND_MS = 4.0


def _spec(tmp: Path) -> dict:
    return {
        "name": "measured",
        "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 16, "max_steps_per_epoch": 2, "warmup_epochs": 0},
        "space": {"variants": [{"depth": 1, "lr": 1e-3}, {"depth": 12, "lr": 1e-3}, {"depth": 1, "lr": 2e-3},
                               {"depth": 1, "lr": 3e-3, "embedding": "fsne"}]},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}],
        "constraints": {"latency_ms": {"max": BOUND_MS}},
        "measure": {"batch": 8, "metrics": ["train_step_ms", "peak_mem_gb"], "max_s": 1.0},
        "search": {"algorithm": "grid"},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage": str(tmp),
    }


@pytest.fixture(scope="module")
def campaign(ray_local, tmp_path_factory):
    from qkvsearch.search.campaign.launch import launch

    exp = launch(load_campaign(_spec(tmp_path_factory.mktemp("measured"))))
    return Path(exp), {(r["config"]["depth"], r["config"]["lr"]): r for r in load_records(exp)}


def test_a_configuration_slower_than_the_bound_never_trains(campaign):
    _, records = campaign
    slow = records[(12, 1e-3)]
    assert slow["status"] == "infeasible" and slow["epochs"] == []
    assert f"latency_ms {slow['cost']['latency_ms']:g} > max {BOUND_MS:g}" in slow["error"]
    assert slow["cost"]["latency_ms"] > BOUND_MS
    for key in ((1, 1e-3), (1, 2e-3), (1, 3e-3)):
        assert records[key]["status"] == "completed" and len(records[key]["epochs"]) == 1
        assert records[key]["cost"]["latency_ms"] <= BOUND_MS


def test_measured_cost_is_recorded_with_how_and_where_it_was_measured(campaign):
    _, records = campaign
    for rec in records.values():
        cost, how = rec["cost"], rec["measured_on"]
        assert {"latency_ms", "train_step_ms", "peak_mem_gb"} <= set(cost) and "throughput" not in cost
        assert cost["train_step_ms"] > 0 and cost["peak_mem_gb"] > 0
        env = how["env"]
        assert env["device_type"] == "cpu" and env["precision"] == "fp32" and env["compile"] is False
        assert env["batch"] == 8 and env["latency_batch"] == 1 and env["train_batch"] == 16
        assert how["latency_p90_ms"] >= cost["latency_ms"]
        for epoch in rec["epochs"]:  # what training saw, per epoch
            assert epoch["epoch_step_ms"] > 0 and "latency_ms" not in epoch


def test_a_model_measured_once_is_not_measured_again(campaign):
    exp, records = campaign
    first, again = records[(1, 1e-3)], records[(1, 2e-3)]   # one model, two learning rates
    assert first["measured_on"]["cached"] is False and again["measured_on"]["cached"] is True
    assert again["cost"]["latency_ms"] == first["cost"]["latency_ms"]
    assert len(list((exp / "qs_measurements").glob("*.json"))) == 3   # three distinct models


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
    assert "3 distinct model(s)" in md and "against latency_ms:" in md
    assert "Where MACs mislead" in Path(paths["html"]).read_text()
    spec = json.loads((exp / "qs_campaign.json").read_text())["spec"]
    assert spec["measure"]["max_s"] == 1.0


def test_a_trial_of_several_workers_measures_in_a_ray_task_holding_one_workers_cpus(ray_local, tmp_path):
    from qkvsearch.search.campaign.measured import MeasureSettings, measure_trial
    from qkvsearch.trainers.cost import resolve_trial

    cfg, _ = resolve_trial({"model": "xcit_nano_12_p8_224", "img_size": 16, "dataset": "digits", "epochs": 1,
                            "depth": 1, "batch_size": 16})
    how = MeasureSettings(("train_step_ms",), batch=8, latency_batch=1, cache=str(tmp_path), max_s=0.3)
    measured, record = measure_trial(cfg, how, workers=2, cpus_per_worker=1, gpus_per_worker=0)
    assert set(measured) == {"train_step_ms"} and measured["train_step_ms"] > 0
    assert record["env"]["train_batch"] == 8    # the per-worker batch: 16 images over 2 workers
    assert record["env"]["threads"] == 1        # the task holds one worker's CPU (Ray sets its threads)
    assert record["cached"] is False and len(list(tmp_path.glob("*.json"))) == 1
