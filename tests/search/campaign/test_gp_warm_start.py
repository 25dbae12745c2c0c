"""Live campaigns on local Ray: a constrained GP campaign whose infeasible proposals take no trial slot, and
wider campaigns warm-started from it (random search, and ehvi) that train nothing already known."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import tiny_model, tiny_space

from qkvsearch.search.cli import main
from qkvsearch.search.monitor.status import load_records
from qkvsearch.search.records.proposals import PROPOSALS_DIR, count_proposals
from qkvsearch.spaces import load_campaign
from qkvsearch.spaces.keys import identity

pytestmark = pytest.mark.slow


def _spec(tmp: Path, name: str, space: dict, search: dict) -> dict:
    return {"name": name, "model": tiny_model(),
            "data": {"dataset": "digits", "val_fraction": 0.1},
            "train": {"epochs": 1, "batch_size": 32, "warmup_epochs": 0, "max_steps_per_epoch": 2},
            "space": tiny_space(space),
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "params_m", "mode": "min"}],
            # linear (0.904 M), sne and psne at 0.5 of d are feasible; sne at 1, 2, 4 of d (1.00-1.60 M) are not
            "constraints": {"params_m": {"max": 0.95}},
            "search": search, "resources": {"workers_per_trial": 1, "max_concurrent_trials": 1},
            "storage": str(tmp)}


def test_gp_campaign_skips_infeasible_proposals_and_a_warm_start_retrains_nothing(ray_local, tmp_path, capsys):
    from qkvsearch.search.campaign.launch import launch

    first = _spec(tmp_path, "gp-first", {"embedding": ["linear", "sne"], "hidden_width": [0.5, 1.0, 2.0, 4.0]},
                  {"algorithm": "gp", "num_trials": 3, "n_startup_trials": 1, "seed": 1})
    path = tmp_path / "first.yaml"
    path.write_text(yaml.safe_dump(first))
    assert main(["launch", str(path)]) == 0
    printed = capsys.readouterr().out
    exp = tmp_path / "gp-first"
    records = load_records(str(exp))
    assert len(records) == 3 and not any(r["status"] == "infeasible" for r in records)
    assert all(r["cost"]["params_m"] <= 3.0 for r in records)
    proposals = count_proposals(str(exp))
    assert proposals >= 1 and len(list((exp / PROPOSALS_DIR).iterdir())) == proposals
    assert f"infeasible proposals: {proposals} of {proposals + 3}" in printed
    trained = {identity(r["config"]) for r in records if r["status"] == "completed"}
    assert trained

    wider = _spec(tmp_path, "gp-wider", {"embedding": ["linear", "sne", "psne"], "hidden_width": [0.5]},
                  {"algorithm": "random", "num_trials": 5, "seed": 0, "warm_start": str(exp)})
    second = load_records(launch(load_campaign(wider)))
    assert len(second) == 5
    for rec in second:
        if identity(rec["config"]) in trained:  # known from the first campaign: not trained again
            assert rec["status"] == "duplicate" and rec["duplicate_of"].startswith(f"{exp}/") and rec["epochs"] == []
    retrained = [r for r in second if r["status"] != "duplicate" and identity(r["config"]) in trained]
    assert retrained == []
    assert any(r["status"] == "completed" and r["config"]["embedding"] == "psne" for r in second)
    assert any(r["status"] == "duplicate" and r["duplicate_of"].startswith(f"{exp}/") for r in second)

    # ehvi, warm-started: what the first campaign trained is never proposed; the rest is, once each
    from qkvsearch.search.searchers.problem import build_trial
    from qkvsearch.spaces import base_config, dimensions

    known_cost = _spec(tmp_path, "ehvi-wider", {"embedding": ["linear", "sne", "psne"], "hidden_width": [0.5]},
                       {"algorithm": "ehvi", "num_trials": 3, "seed": 0, "warm_start": str(exp)})
    spec3 = load_campaign(known_cost)
    third = load_records(launch(spec3))
    space = {identity(build_trial(base_config(spec3), c)["config"]) for c in dimensions.iterate(spec3.space)}
    assert sorted(identity(r["config"]) for r in third) == sorted(space - trained)  # each once, none known
    assert all(r["status"] == "completed" for r in third)
