"""search.storage and search.records on real files: atomic writes, damaged records, the recorder."""
import json
import logging
import os
from types import SimpleNamespace

import pytest
from test_results import write_campaign

from qkvsearch.search.records import CampaignFileError, TrialRecorder, read_campaign, read_trial_records
from qkvsearch.search.results import collect
from qkvsearch.search.status import load_records, status_table
from qkvsearch.search.storage import open_location, read_json, write_bytes, write_json
from qkvsearch.spaces.errors import BadInput

DAMAGED = {
    "truncated": b'{"trial_id": "t9", "epochs": [{"epoch": 1, "to',
    "binary": b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00garbage",
    "a_list": b'[{"trial_id": "t9"}]',
    "no_trial_id": b'{"trial_name": "x", "config": {}, "cost": {}, "epochs": []}',
    "bad_epochs": b'{"trial_id": "t9", "config": {}, "cost": {}, "epochs": [1, 2]}',
    "empty": b"",
}


# ---------------------------------------------------------------------------------------- storage
def test_write_json_round_trips_and_creates_folders(tmp_path):
    target = tmp_path / "a" / "b" / "x.json"
    write_json(str(target), {"v": float("nan"), "n": 3})
    back = read_json(f"file://{target}")
    assert back["n"] == 3 and back["v"] != back["v"]  # NaN survives
    assert os.listdir(target.parent) == ["x.json"]


def test_open_location_makes_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert open_location("rel/x.json")[1] == str(tmp_path / "rel" / "x.json")
    assert open_location(f"file://{tmp_path}/y/")[1] == f"{tmp_path}/y"


def test_failed_serialization_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "state.json"
    write_json(str(target), {"ok": 1})
    cyclic = {"a": []}
    cyclic["a"].append(cyclic)
    with pytest.raises(ValueError, match="Circular"):
        write_json(str(target), cyclic)
    assert json.loads(target.read_text()) == {"ok": 1}
    assert os.listdir(tmp_path) == ["state.json"]


def test_failed_rename_removes_the_temp_file(tmp_path):
    (tmp_path / "taken").mkdir()  # a folder where the file goes: os.replace fails after the data is written
    with pytest.raises(OSError):
        write_bytes(str(tmp_path / "taken"), b"x" * 100_000)
    assert os.listdir(tmp_path) == ["taken"] and os.listdir(tmp_path / "taken") == []


# ---------------------------------------------------------------------------------------- reading
@pytest.mark.parametrize("kind", sorted(DAMAGED))
def test_a_damaged_record_is_named_and_the_others_are_read(tmp_path, kind, caplog):
    write_campaign(tmp_path, ["completed", "failed", "running"])
    bad = tmp_path / "qs_trials" / f"{kind}.json"
    bad.write_bytes(DAMAGED[kind])
    (tmp_path / "qs_trials" / ".hidden.json").write_text("{")
    (tmp_path / "qs_trials" / "t00000.json.damaged").write_text("{")
    (tmp_path / "qs_trials" / ".t00001.json.0a1b2c.tmp").write_text("{")

    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.records"):
        records, problems = read_trial_records(tmp_path)
    assert [r["trial_id"] for r in records] == ["t00000", "t00001", "t00002"]
    assert len(problems) == 1 and problems[0].startswith(f"{tmp_path}/qs_trials/{kind}.json: ")
    assert ": expected " in problems[0] and ", given " in problems[0]
    assert problems[0] in caplog.text

    table = status_table(str(tmp_path))
    assert table.splitlines()[-2] == f"damaged record {problems[0]}"
    assert table.splitlines()[-1].startswith("3 trial(s): ") and "1 damaged record(s) skipped" in table
    assert len(load_records(str(tmp_path))) == 3

    trials, _ = collect(tmp_path)
    assert trials.column("trial_id").to_pylist() == ["t00000", "t00001", "t00002"]


def test_problem_messages_say_what_is_wrong(tmp_path):
    write_campaign(tmp_path, [])
    for kind, data in DAMAGED.items():
        (tmp_path / "qs_trials" / f"{kind}.json").write_bytes(data)
    _, problems = read_trial_records(tmp_path)
    by_file = {p.split(": ", 1)[0].rsplit("/", 1)[-1]: p.split(": ", 1)[1] for p in problems}
    assert by_file["a_list.json"] == "expected a JSON object, given a list"
    assert by_file["no_trial_id.json"] == "trial_id: expected a string, given nothing"
    assert by_file["bad_epochs.json"] == "epochs: expected a list of objects, given a list holding 1"
    assert by_file["empty.json"] == "expected a JSON object, given an empty file"
    assert by_file["binary.json"].startswith("expected UTF-8 JSON, given bytes that are not UTF-8")
    assert by_file["truncated.json"].startswith("expected a JSON object, given invalid or truncated JSON")


@pytest.mark.parametrize("content, says", [
    (b'{"name": "x", "spec": {"model": {', "invalid or truncated JSON"),
    (b"name: x\nspec: {}\n", "invalid or truncated JSON"),
    (b'{"name": "\xff\xfe"}', "not UTF-8"),
    (b'{"name": "x", "code_version": "1"}', "spec: expected a mapping, given nothing"),
    (b'["x"]', "expected a JSON object, given a list"),
])
def test_read_campaign_names_a_damaged_campaign_file(tmp_path, content, says):
    (tmp_path / "qs_campaign.json").write_bytes(content)
    with pytest.raises(CampaignFileError) as err:
        read_campaign(tmp_path)
    assert isinstance(err.value, BadInput)
    assert str(err.value).startswith(f"{tmp_path}/qs_campaign.json: ") and says in str(err.value)


def test_read_campaign_names_a_missing_campaign_file(tmp_path):
    with pytest.raises(CampaignFileError, match="qs_campaign.json: expected a campaign folder holding qs_campaign.json, "
                                                "given .*, which has no qs_campaign.json"):
        read_campaign(tmp_path)
    with pytest.raises(CampaignFileError, match="which does not exist"):
        status_table(str(tmp_path / "nope"))
    write_campaign(tmp_path / "ok", [])
    assert read_campaign(tmp_path / "ok")["spec"]["data"]["dataset"] == "cifar10"


# ---------------------------------------------------------------------------------------- recorder
def _describe(trial):
    return {"name": f"linear-{trial.trial_id}", "config": {"embedding": "linear", "epochs": 3},
            "cost": {"params_m": 1.5, "gmacs": 0.25}, "epochs_planned": 3}


def _run(recorder, trial, epochs):
    recorder.on_trial_start(0, [], trial)
    for e in epochs:
        recorder.on_trial_result(0, [], trial, {"epoch": e, "top1": 10.0 * e, "epoch_s": 2.5, "train_s": 2.0,
                                                "gmacs": 0.5, "qs_world_size": 2.0, "done": False})


def test_recorder_continues_an_intact_record(tmp_path, caplog):
    trial = SimpleNamespace(trial_id="t1")
    _run(TrialRecorder(str(tmp_path), "c", _describe), trial, [1, 2])
    resumed = TrialRecorder(str(tmp_path), "c", _describe)  # a new driver after an interruption
    _run(resumed, trial, [2, 3])
    with caplog.at_level(logging.INFO, logger="qkvsearch.search.records"):
        resumed.on_trial_complete(0, [], trial)
    rec = json.loads((tmp_path / "qs_trials" / "t1.json").read_text())
    assert [e["epoch"] for e in rec["epochs"]] == [1, 2, 3] and rec["train_s_total"] == 6.0
    assert set(rec["epochs"][0]) == {"epoch", "top1", "epoch_s", "train_s"}  # no cost, no reserved keys
    assert rec["status"] == "completed"
    assert "[    completed] linear-t1 | top1 30.0%" in caplog.text  # the summary line goes to the log
    assert os.listdir(tmp_path / "qs_trials") == ["t1.json"]


def test_recorder_moves_a_damaged_record_aside(tmp_path, caplog):
    trials_dir = tmp_path / "qs_trials"
    trials_dir.mkdir()
    (trials_dir / "t1.json").write_bytes(DAMAGED["truncated"])
    (trials_dir / "t1.json.damaged").write_text("an earlier one")
    trial = SimpleNamespace(trial_id="t1")
    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.records"):
        _run(TrialRecorder(str(tmp_path), "c", _describe), trial, [1])
    assert (trials_dir / "t1.json.damaged").read_text() == "an earlier one"
    assert (trials_dir / "t1.json.damaged.1").read_bytes() == DAMAGED["truncated"]
    assert f"{trials_dir}/t1.json" in caplog.text and f"{trials_dir}/t1.json.damaged.1" in caplog.text
    rec = json.loads((trials_dir / "t1.json").read_text())
    assert [e["epoch"] for e in rec["epochs"]] == [1] and rec["trial_name"] == "linear-t1"
    records, problems = read_trial_records(tmp_path)
    assert [r["trial_id"] for r in records] == ["t1"] and problems == []


def test_recorder_is_a_tune_callback_that_pickles(tmp_path):
    import pickle

    from ray.tune import Callback

    recorder = TrialRecorder(str(tmp_path), "c", _describe)
    assert isinstance(recorder, Callback)
    copy = pickle.loads(pickle.dumps(recorder))
    assert type(copy) is TrialRecorder and copy.experiment_uri == str(tmp_path)
