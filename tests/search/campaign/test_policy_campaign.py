"""A campaign with a quantization-policy dimension on local Ray: proposals that share a configuration train it
once, the other policies quantize and evaluate that training's weights as trials of their own (trained_by),
each policy is measured as deployed (size_mb, latency_ms), the front is drawn over top1_q, size_mb and
latency_ms, its quantized members keep deployable weights, and a resume quantizes no finished policy again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_model, tiny_space

from qkvsearch.search.monitor.status import load_records
from qkvsearch.spaces import load_campaign
from qkvsearch.spaces.keys import identity, quant_policy

pytestmark = pytest.mark.slow

OBJECTIVES = [{"metric": "top1_q", "mode": "max"}, {"metric": "size_mb", "mode": "min"},
              {"metric": "latency_ms", "mode": "min"}]


def _spec(tmp: Path) -> dict:
    return {
        "name": "policies",
        "model": tiny_model(),
        "data": {"dataset": "digits"},
        "train": {"epochs": 1, "batch_size": 16, "max_steps_per_epoch": 2, "warmup_epochs": 0, "lr": 3e-3},
        # grid order is run order: linear trains first; its other policies wait for it, without a trial slot
        "space": tiny_space({"variants": [
            {"embedding": "linear"}, {"embedding": "linear", "quant_mlp": "int8_dynamic"},
            {"embedding": "sne", "hidden_width": 0.25},
            {"embedding": "linear", "quant_qkv": "int8_weight_only", "quant_mlp": "int8_dynamic"}]}),
        "objectives": OBJECTIVES,
        "measure": {"batch": 4, "max_s": 0.3},
        "search": {"algorithm": "grid"},
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1},
        "storage": str(tmp),
    }


@pytest.fixture(scope="module")
def campaign(ray_local, tmp_path_factory):
    from qkvsearch.search.campaign.launch import launch

    exp = launch(load_campaign(_spec(tmp_path_factory.mktemp("policies"))))
    return Path(exp), load_records(exp)


def test_proposals_sharing_a_configuration_train_it_once(campaign):
    _, records = campaign
    assert len(records) == 4 and {r["status"] for r in records} == {"completed"}
    trained = [r for r in records if any("train_s" in e for e in r["epochs"])]
    evaluated = [r for r in records if r.get("trained_by")]
    assert sorted(r["config"]["embedding"] for r in trained) == ["linear", "sne"]   # two trainings, not four
    assert len(evaluated) == 2 and not set(map(id, trained)) & set(map(id, evaluated))
    linear = next(r for r in trained if r["config"]["embedding"] == "linear")
    for rec in evaluated:
        assert rec["trained_by"] == linear["trial_id"] and identity(rec["config"]) == identity(linear["config"])
        assert quant_policy(rec["config"]) and rec["checkpoint_path"] is None
        assert len(rec["epochs"]) == 1 and rec["epochs"][0]["epoch"] == 1.0   # its one row, at the planned epoch
        assert rec["epochs"][0]["top1"] == linear["epochs"][-1]["top1"]     # the same trained model, in fp
        assert 0 <= rec["epochs"][0]["top1_q"] <= 100
        assert rec["started_at"] >= linear["ended_at"]   # it waited for the training, outside any trial
    for rec in trained:   # nothing quantized: top1_q is top1
        assert rec["epochs"][-1]["top1_q"] == rec["epochs"][-1]["top1"]


def test_each_policy_is_measured_as_deployed(campaign):
    _, records = campaign
    size = {json.dumps(quant_policy(r["config"])) + r["config"]["embedding"]: r["cost"]["size_mb"] for r in records}
    assert len(set(size.values())) == 4 and all(r["cost"]["latency_ms"] > 0 for r in records)
    fp = size["{}linear"]   # int8 weights: every quantized policy is smaller than the model in full precision
    assert size['{"quant_qkv": "int8_weight_only", "quant_mlp": "int8_dynamic"}linear'] < \
        size['{"quant_mlp": "int8_dynamic"}linear'] < fp


def test_the_front_is_drawn_over_top1_q_size_and_latency_and_its_quantized_members_keep_weights(campaign, tmp_path):
    import pandas as pd

    from qkvsearch.search.analysis.report import build_report

    exp, records = campaign
    written = build_report(str(exp), out_dir=str(tmp_path / "report"), static=False)
    front = pd.read_csv(written["csv"])
    assert {"final_top1_q", "size_mb", "latency_ms"} <= set(front.columns) and len(front)
    md = Path(written["md"]).read_text()
    assert "Where MACs mislead" in md and "mlp int8_dynamic" in md
    names = set(front["trial_name"])
    for rec in records:
        quantized = exp / "qs_weights" / f"{rec['trial_id']}.quantized.pt"
        if rec["trial_name"] in names and quant_policy(rec["config"]):
            state = torch.load(quantized, weights_only=False)
            assert state["config"]["quant_mlp"] == rec["config"]["quant_mlp"]
        else:
            assert not quantized.exists()
        if not rec.get("trained_by") and rec["status"] == "completed" and rec["trial_name"] not in names:
            assert rec["checkpoint_path"] is None   # the campaign ended: no other policy can come


def test_a_resume_quantizes_no_finished_policy_again(campaign):
    from qkvsearch.search.cli import main

    exp, before = campaign
    assert main(["resume", str(exp)]) == 0
    after = {r["trial_id"]: r for r in load_records(str(exp))}
    assert len(after) == len(before)
    for rec in before:
        assert after[rec["trial_id"]]["ended_at"] == rec["ended_at"]
        assert after[rec["trial_id"]]["epochs"] == rec["epochs"]
