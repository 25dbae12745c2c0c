"""A one-shot campaign end to end on local Ray: its supernet trained as one DDP trial (two gloo workers: its own
resources), its subnets scored by actors with the weights they inherit, the best one and a control sample
retrained on their own (one worker each: the campaign's resources), the report's fidelity; the best one
trained on from the weights it inherits, each retrained subnet written as a stand-alone checkpoint its own
model loads. Its driver is killed (SIGKILL) while subnets are scored: the resume goes on from what was recorded, and
no subnet is scored twice (a resume from each phase, and with targets, is checked on folders an earlier version
stopped: test_earlier_oneshot.py). Each block draws its own embedding and width: the per-block keys reach the
records, the Parquet columns and the exported models."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers.live_campaign import LiveCampaign, tiny_spec, wait_while_advancing, write_spec

from qkvsearch.search.monitor.oneshot_phases import read_phases
from qkvsearch.search.records import inherited
from qkvsearch.search.records.lease import STALE_ENV, read_lease
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces.keys import identity

pytestmark = pytest.mark.slow

SUBNETS = 5
SUPERNET_EPOCHS = 3
STALE_S = 4  # a killed driver's hold goes stale this long after its last heartbeat (one every 0.67 s)
ENV = {STALE_ENV: str(STALE_S)}


def _spec(storage: Path) -> dict:
    spec = tiny_spec(storage, "oneshot", workers=1, epochs=1, variants=[], steps=2)  # the subnets: 1 worker each
    # each of the 2 blocks draws its embedding and width (embedding.0, hidden_width.0, ...): 25 subnets
    spec["space"] = {"depth": 2, "embedding": {"choice": ["linear", "sne", "fsne"], "per_block": True},
                     "hidden_width": {"choice": [0.5, 1.0], "per_block": True}, "code_size": 4}
    spec["supernet"] = {"train": {"epochs": SUPERNET_EPOCHS, "max_steps_per_epoch": 3}, "retrain": "top_k",
                        "top_k": 1, "control": 1, "bn_batches": 1, "retrain_from": "inherited",
                        "resources": {"workers_per_trial": 2}}  # the supernet: one DDP run of 2 workers
    spec["search"] = {"algorithm": "random", "num_trials": SUBNETS, "seed": 0}
    return spec


def _supernet_epochs(exp: Path) -> list[int]:
    files = sorted((exp / "supernet" / "qs_trials").glob("*.epochs.csv"))
    if not files:
        return []
    return [int(float(row["epoch"])) for row in csv.DictReader(files[0].open())]


def _batches(exp: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((exp / inherited.INHERITED_DIR).glob("batch-*.json"))}


def _killed_when(run: LiveCampaign, exp: Path, done, what: str) -> None:
    """SIGKILL the driver once ``done()``, then wait for its hold on the campaign to go stale."""
    def ready():
        run._check_alive()
        return done()

    wait_while_advancing(ready, lambda: run.advancing(exp), what)
    run.kill()
    wait_while_advancing(lambda: read_lease(exp).stale, lambda: None, "the killed driver's hold to go stale",
                         stall_s=4 * STALE_S)


def test_a_one_shot_campaign_resumes_its_scoring_and_reports_its_fidelity(tmp_path):
    spec_file = write_spec(tmp_path / "oneshot.yaml", _spec(tmp_path / "results"))
    exp = tmp_path / "results" / "oneshot"

    with LiveCampaign(["launch", str(spec_file)], tmp_path, ENV) as run:  # killed once a batch of subnets is scored
        _killed_when(run, exp, lambda: _batches(exp), "a scored batch of subnets")
    before = _batches(exp)
    assert _supernet_epochs(exp) == list(range(1, SUPERNET_EPOCHS + 1))  # each epoch trained once

    with LiveCampaign(["resume", str(exp)], tmp_path, ENV) as run:
        assert run.finish(exp) == 0, run.stderr()[-3000:]

    after = _batches(exp)
    assert all(after[name] == data for name, data in before.items())  # recorded batches untouched
    evaluations = inherited.read_evaluations(exp)
    keys = [identity(e["config"]) for e in evaluations]
    searched = [e for e in evaluations if e.get("selected_for") != "control"]
    assert len(keys) == len(set(keys)) and len(searched) == SUBNETS  # none scored twice, all scored
    assert len({e["subnet_id"] for e in evaluations}) == len(evaluations)
    assert all(0 <= e["metrics"]["top1"] <= 100 and e["fidelity"] == "inherited" for e in evaluations)
    assert len({e["supernet"] for e in evaluations}) == 1
    supernet_records, _ = read_trial_records(str(exp / "supernet"))
    assert [r["fidelity"] for r in supernet_records] == ["supernet"]
    # the supernet trained through the engine's update: its students' loss, its two replicas identical
    from qkvsearch.trainers.training.engine import load_state

    (trained,) = supernet_records
    history = load_state(trained["checkpoint_path"])["history"]   # every epoch as rank 0 reported it
    assert len(history) == SUPERNET_EPOCHS
    assert all(e["qs_param_spread"] == 0.0 and e["train_loss_students"] > 0 for e in history)

    selection = inherited.read_selection(exp)
    records, _ = read_trial_records(str(exp))
    retrained = len(selection["chosen"]) + 2 * len(selection["control"])
    assert len(selection["chosen"]) == 1 and len(selection["control"]) == 1
    assert len(records) == retrained and all(r["status"] == "completed" for r in records)
    assert list(read_phases(str(exp)).texts().values()) == [   # what status, watch and the live line say
        f"supernet done: {SUPERNET_EPOCHS} of {SUPERNET_EPOCHS} epochs",
        f"scoring done: {len(evaluations)} subnets scored", "selected 1 chosen and 1 control subnet(s)",
        f"retraining done: {retrained} of {retrained}"]
    assert {r["fidelity"] for r in records} == {"standalone"}
    assert {r["supernet"] for r in records} == {evaluations[0]["supernet"]}

    from subprocess import run as sh
    done = sh([sys.executable, "-m", "qkvsearch.search.cli", "report", str(exp), "--no-static"],
              capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    subnets = pq.read_table(exp / "report" / "subnets.parquet").to_pandas()
    assert len(subnets) == len(evaluations)
    assert (subnets["selected"] == "chosen").sum() == len(selection["chosen"])
    assert subnets.loc[subnets["selected"].notna(), "top1_standalone"].notna().all()
    assert subnets.loc[subnets["selected"] == "control", "top1_standalone_reseeded"].notna().all()
    fidelity = json.loads((exp / "report" / "fidelity.json").read_text())
    # ranked over the control subnets (drawn from the space, retrained from scratch); the chosen one apart
    assert fidelity["subnets_scored"] == len(evaluations) and fidelity["control_pairs"] == len(selection["control"])
    assert fidelity["chosen_retrained"] == len(selection["chosen"])
    assert fidelity["hv_inherited"] is not None and fidelity["hv_standalone"] is not None
    assert "One-shot fidelity" in (exp / "report" / "report.md").read_text()
    oneshot = (exp / "report" / "pareto.html").read_text().split("<h2>One-shot fidelity</h2>", 1)[1]
    retrained = int((subnets["selected"].notna() & subnets["top1_inherited"].notna()).sum())
    assert f"Inherited vs stand-alone top-1 of the {retrained} retrained subnets" in oneshot  # its figure, drawn
    trials = pq.read_table(exp / "report" / "trials.parquet").to_pandas()
    assert set(trials["fidelity"]) == {"standalone"}
    for block in (0, 1):   # one column per block, typed as the key's, each trial's own value
        assert trials[f"config_embedding.{block}"].isin(["linear", "sne", "fsne"]).all()
        assert [json.loads(c)[f"embedding.{block}"] for c in trials["config_json"]] \
            == list(trials[f"config_embedding.{block}"])
    assert all("embedding.0" in e["keys"] and "embedding.1" in e["keys"] for e in evaluations)

    # the chosen subnet trained on from its exported weights, the control one from scratch
    by_keys = {json.dumps(e["keys"], sort_keys=True): e for e in evaluations}
    chosen = by_keys[json.dumps(selection["chosen"][0], sort_keys=True)]
    control = by_keys[json.dumps(selection["control"][0], sort_keys=True)]
    starts = {identity(r["config"], ignore=("seed",)): r.get("init_from") for r in records}
    assert starts[identity(chosen["config"], ignore=("seed",))] == inherited.subnet_file(str(exp), chosen["subnet_id"])
    assert starts[identity(control["config"], ignore=("seed",))] is None
    assert list(subnets.loc[subnets["selected"].notna(), "retrained_from"].sort_values()) == ["inherited", "scratch"]
    assert fidelity["front_kendall_tau"] is None
    assert fidelity["front_null_reason"].startswith("the chosen subnets trained on from their inherited weights")
    for e in (chosen, control):  # stand-alone checkpoints: build_model(cfg) loads each, every tensor
        import torch

        from qkvsearch.trainers.model.models import build_model

        saved = torch.load(inherited.subnet_file(str(exp), e["subnet_id"]), weights_only=True)
        model = build_model(saved["config"])
        model.load_state_dict(saved["model"])
        assert [type(model.blocks[b].attn.qkv).__name__.lower() for b in (0, 1)] \
            == [e["config"][f"embedding.{b}"] for b in (0, 1)]
