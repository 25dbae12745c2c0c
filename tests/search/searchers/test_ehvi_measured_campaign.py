"""ehvi with a measured cost objective in a real campaign on local Ray: each proposal's model is measured
before it trains, the searcher learns the measurement with the proposal's cost and predicts the cost of the
models not measured yet; what it learnt is in its saved state."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvsearch.spaces import load_campaign

pytestmark = pytest.mark.slow


def _spec(tmp: Path, algorithm: str | None = "ehvi") -> dict:
    search = {"num_trials": 3, "n_startup_trials": 2, "seed": 0}
    return {
        "name": "ehvi-measured",
        "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 16, "max_steps_per_epoch": 1, "warmup_epochs": 0},
        "space": {"depth": [1, 2, 3], "lr": {"float": [1e-3, 3e-3], "log": True}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "latency_ms", "mode": "min"}],
        "measure": {"batch": 8, "max_s": 0.5},
        "search": {**search, "algorithm": algorithm} if algorithm else search,
        "scheduler": {"type": "fifo"},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage": str(tmp),
    }


def test_ehvi_learns_each_measured_cost_before_its_trial_trains(ray_local, tmp_path):
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.search.monitor.status import load_records
    from qkvsearch.search.searchers import state as saved
    from qkvsearch.search.searchers.ehvi import config_key

    spec = load_campaign(_spec(tmp_path))
    exp = launch(spec)
    records = [r for r in load_records(exp) if r["status"] == "completed"]
    assert len(records) == 3
    searched = [{"depth": r["config"]["depth"], "lr": r["config"]["lr"]} for r in records]
    assert len({json.dumps(s, sort_keys=True) for s in searched}) == 3        # each configuration once
    state = json.loads(Path(saved.newest(exp)).read_text())["searcher"]["core"]
    measured = {k: row[0] for k, row in state["measured"]}
    for rec, config in zip(records, searched):   # measured before training: the record's figure, learnt
        assert rec["cost"]["latency_ms"] > 0 and measured[config_key(config)] == rec["cost"]["latency_ms"]
    assert {k for k, _ in state["results"]} == {config_key(c) for c in searched}
    assert state["model"]["settings"]["model"] and len(measured) == 3
