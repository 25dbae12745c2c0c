"""Campaigns an earlier version stopped while a trial trained resume with this one, that trial from its
checkpoint: tests/fixtures/mid_training/<commit>-<algorithm>/, one per saved searcher-state format (67e2551
before the `key` and architecture keys existed, 2969ba8's pickled searchers, 4525885's mfehvi settings, and
today's), each launched under MO-ASHA by that commit's code and stopped by SIGTERM once a trial had completed
and a later one had written a checkpoint (tests/fixtures/make_earlier_campaigns.py --mid-training makes them
again). Their configs and checkpoints lack the keys added since: each reader takes their absence for the value
the key had before it existed (spaces.upgrade)."""
import json
import shutil

import pytest
import torch
from helpers import REPO
from helpers.resumes import records_by_id, resume_checked

from qkvsearch.search.records.layout import FINAL_STATUSES
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.search.searchers.mfehvi import MF_DEFAULT
from qkvsearch.spaces.keys import KEYS, identity
from qkvsearch.spaces.upgrade import upgraded

MID_TRAINING = REPO / "tests" / "fixtures" / "mid_training"
FIXTURES = sorted(p.name for p in MID_TRAINING.iterdir() if p.is_dir())


def _checkpoint(exp, trial_id: str):
    (state,) = exp.glob(f"train_runs/*{trial_id}/checkpoint_*/state.pt")
    return state


def test_each_fixture_holds_a_trial_stopped_with_its_checkpoint_and_the_oldest_lacks_keys():
    assert len(FIXTURES) == 4
    for name in FIXTURES:
        exp = MID_TRAINING / name
        records = read_trial_records(exp)[0]
        stopped = [r for r in records if r["status"] not in FINAL_STATUSES]
        assert "completed" in {r["status"] for r in records} and len(stopped) == 1, name
        saved = torch.load(_checkpoint(exp, stopped[0]["trial_id"]), weights_only=True)
        assert saved["epoch"] > len(stopped[0].get("epochs") or []) - 1, name
    raw = json.loads(next((MID_TRAINING / "67e2551-random" / "qs_trials").glob("*.json")).read_text())["config"]
    assert not {"key", "attention", "depth", "quant_qkv"} & raw.keys()
    saved = json.loads(next((MID_TRAINING / "4525885-mfehvi").glob("searcher-state-*.pkl")).read_bytes())
    assert saved["searcher"]["core"]["model"]["settings"] != vars(MF_DEFAULT)   # the model settings of its time
    pickled = next((MID_TRAINING / "2969ba8-tpe").glob("searcher-state-*.pkl")).read_bytes()
    assert b"qkvsearch-searcher-state" not in pickled   # the searchers of 2969ba8 pickled their state as objects


def test_a_config_of_before_a_key_reads_as_todays_of_the_same_training():
    raw = json.loads(next((MID_TRAINING / "67e2551-random" / "qs_trials").glob("*.json")).read_text())["config"]
    now = upgraded(raw)   # a ViT's
    assert now["key"] == "shared" and now["quant_qkv"] == "fp" and now["attention"] == "softmax"
    assert now.keys() >= KEYS.keys() and identity(now) != identity(raw) and upgraded(now) == now
    assert upgraded({**raw, "model": "xcit_nano_12_p8_224"})["attention"] is None   # not a key of an XCiT


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_a_campaign_stopped_mid_training_resumes_the_trial_from_its_checkpoint(ray_local, tmp_path, name):
    from qkvsearch.search.analysis.report import build_report

    exp = tmp_path / name
    shutil.copytree(MID_TRAINING / name, exp)
    (stopped,) = [t for t, r in records_by_id(exp).items() if r["status"] not in FINAL_STATUSES]
    saved = torch.load(_checkpoint(exp, stopped), weights_only=True)

    before, after = resume_checked(exp)
    # The stopped trial went on from its checkpoint: the epochs it had reported and the one its checkpoint holds
    # are those it trained before the stop (their timings are not a rerun's), and it trained past them.
    resumed = after[stopped]
    assert resumed["status"] != "failed", resumed["error"]
    assert resumed["epochs"][:len(before[stopped]["epochs"])] == before[stopped]["epochs"]
    assert resumed["epochs"][int(saved["epoch"]) - 1]["epoch_s"] == saved["history"][-1]["epoch_s"]
    assert len(resumed["epochs"]) > saved["epoch"] or resumed["status"] == "stopped_early"
    trained = [identity(r["config"]) for r in after.values() if r["status"] != "duplicate"]
    assert len(trained) == len(set(trained))  # no configuration trained twice

    written = build_report(str(exp), static=False)
    assert "shared" in open(written["csv"]).read()   # the earlier configs' key column reads as it was then
