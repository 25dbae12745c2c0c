"""storage and search.records on real files: atomic writes and appends, damaged records and
epochs files, the recorder (appending epochs, resuming, older records)."""
import json
import logging
import os
from types import SimpleNamespace

import pytest
from helpers.campaign_files import write_campaign

from qkvsearch import storage
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.monitor.status import load_records, status_table
from qkvsearch.search.records import readers
from qkvsearch.search.records import recorder as recorder_module
from qkvsearch.search.records.epochs_csv import epochs_csv
from qkvsearch.search.records.layout import EPOCHS_SUFFIX, CampaignFileError, read_campaign
from qkvsearch.search.records.readers import read_trial_records, read_trials
from qkvsearch.search.records.recorder import Recorder
from qkvsearch.spaces.errors import BadInput
from qkvsearch.storage import open_location, read_json, write_bytes, write_json

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


def test_read_many_reads_whole_files_and_says_what_it_could_not(tmp_path, monkeypatch):
    big = os.urandom(200_000)  # more than one read's worth
    (tmp_path / "big").write_bytes(big)
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "folder").mkdir()
    paths = [str(tmp_path / n) for n in ("big", "empty", "missing", "folder")]
    for local in (True, False):  # False: the remote path (thread pool over pyarrow streams)
        monkeypatch.setattr(storage, "can_append", lambda fs, local=local: local)
        fs, _ = open_location(str(tmp_path))
        got = storage.read_many(fs, paths)
        assert got[:3] == [big, b"", None] and isinstance(got[3], OSError)
        assert sorted(storage.list_files(fs, str(tmp_path))) == ["big", "empty"]
        assert storage.list_files(fs, str(tmp_path / "missing")) == []


def test_append_bytes_appends_locally_and_replaces_whole_elsewhere(tmp_path, monkeypatch):
    target = tmp_path / "log.csv"
    storage.append_bytes(str(target), b"b\n", whole=lambda: b"a\nb\n")  # missing: written whole
    storage.append_bytes(str(target), b"c\n", whole=lambda: b"never used\n")
    assert target.read_bytes() == b"a\nb\nc\n"
    monkeypatch.setattr(storage, "can_append", lambda fs: False)
    storage.append_bytes(str(target), b"d\n", whole=lambda: b"a\nb\nc\nd\n")
    assert target.read_bytes() == b"a\nb\nc\nd\n" and os.listdir(tmp_path) == ["log.csv"]


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
    with pytest.raises(CampaignFileError, match="qs_campaign.json: expected a campaign folder holding "
                                                "qs_campaign.json, given .*, which has no qs_campaign.json"):
        read_campaign(tmp_path)
    with pytest.raises(CampaignFileError, match="which does not exist"):
        status_table(str(tmp_path / "nope"))
    write_campaign(tmp_path / "ok", [])
    assert read_campaign(tmp_path / "ok")["spec"]["data"]["dataset"] == "cifar10"


# ---------------------------------------------------------------------------------------- recorder
def _describe(trial):
    return {"name": f"linear-{trial.trial_id}", "config": {"embedding": "linear", "epochs": 3},
            "cost": {"params_m": 1.5, "gmacs": 0.25}, "epochs_planned": 3}


def _run(recorder, trial, epochs, top1=10.0, **extra):
    recorder.on_trial_start(0, [], trial)
    for e in epochs:
        recorder.on_trial_result(0, [], trial, {"epoch": e, "top1": top1 * e, "epoch_s": 2.5, "train_s": 2.0,
                                                "gmacs": 0.5, "qs_world_size": 2.0, "done": False, **extra})


def _record(exp, trial_id="t1"):
    """The trial's record as read back, with its epochs."""
    records, problems = read_trial_records(exp)
    assert problems == []
    return next(r for r in records if r["trial_id"] == trial_id)


def test_recorder_continues_an_intact_record(tmp_path, caplog):
    trial = SimpleNamespace(trial_id="t1")
    _run(Recorder(str(tmp_path), "c", _describe), trial, [1, 2])
    resumed = Recorder(str(tmp_path), "c", _describe)  # a new driver after an interruption
    _run(resumed, trial, [2, 3], top1=11.0)  # re-reports epoch 2: the latest report wins
    with caplog.at_level(logging.INFO, logger="qkvsearch.search.records"):
        resumed.on_trial_complete(0, [], trial)
    rec = _record(tmp_path)
    assert [e["epoch"] for e in rec["epochs"]] == [1, 2, 3] and rec["train_s_total"] == 6.0
    assert [e["top1"] for e in rec["epochs"]] == [10.0, 22.0, 33.0]
    assert set(rec["epochs"][0]) == {"epoch", "top1", "epoch_s", "train_s"}  # no cost, no reserved keys
    assert rec["status"] == "completed"
    assert sorted(os.listdir(tmp_path / "qs_trials")) == ["t1.epochs.csv", "t1.json"]
    stored = json.loads((tmp_path / "qs_trials" / "t1.json").read_text())
    assert "epochs" not in stored and stored["epochs_file"] == "t1.epochs.csv"
    assert (tmp_path / "qs_trials" / "t1.epochs.csv").read_text() == (
        "epoch,top1,epoch_s,train_s\n1,10,2.5,2\n2,22,2.5,2\n3,33,2.5,2\n")


def test_a_resumed_trial_replaying_its_epochs_fills_the_gap_and_rewrites_nothing_it_had(tmp_path):
    # The driver recorded epoch 1 and died; the trial's Train run went on to checkpoint epoch 3. Resumed,
    # the trial reports its checkpoint's epochs again (trainers.ray_train.loop), then trains epoch 4.
    trial = SimpleNamespace(trial_id="t1")
    _run(Recorder(str(tmp_path), "c", _describe), trial, [1])
    epochs_file = tmp_path / "qs_trials" / "t1.epochs.csv"
    before = epochs_file.stat()
    resumed = Recorder(str(tmp_path), "c", _describe)
    _run(resumed, trial, [1])  # the same values again: the file stays as it was
    after = epochs_file.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    _run(resumed, trial, [2, 3, 1, 4])
    resumed.on_trial_complete(0, [], trial)
    rec = _record(tmp_path)
    assert [e["epoch"] for e in rec["epochs"]] == [1, 2, 3, 4] and rec["status"] == "completed"
    assert epochs_file.read_text().count("\n") == 5  # the header and one line per epoch


def test_recorder_moves_a_damaged_record_aside(tmp_path, caplog):
    trials_dir = tmp_path / "qs_trials"
    trials_dir.mkdir()
    (trials_dir / "t1.json").write_bytes(DAMAGED["truncated"])
    (trials_dir / "t1.json.damaged").write_text("an earlier one")
    trial = SimpleNamespace(trial_id="t1")
    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.records"):
        _run(Recorder(str(tmp_path), "c", _describe), trial, [1])
    assert (trials_dir / "t1.json.damaged").read_text() == "an earlier one"
    assert (trials_dir / "t1.json.damaged.1").read_bytes() == DAMAGED["truncated"]
    assert f"{trials_dir}/t1.json" in caplog.text and f"{trials_dir}/t1.json.damaged.1" in caplog.text
    rec = _record(tmp_path)
    assert [e["epoch"] for e in rec["epochs"]] == [1] and rec["trial_name"] == "linear-t1"


def test_recorder_is_a_tune_callback_that_pickles(tmp_path):
    import pickle

    from ray.tune import Callback

    from qkvsearch.search.campaign.recording import TrialRecorder

    recorder = TrialRecorder(str(tmp_path), "c", _describe)
    assert isinstance(recorder, Callback)
    copy = pickle.loads(pickle.dumps(recorder))
    assert type(copy) is TrialRecorder and copy.experiment_uri == str(tmp_path)


# ---------------------------------------------------------------------------------------- epochs files
def test_recorder_appends_one_line_per_epoch_in_place(tmp_path):
    trial = SimpleNamespace(trial_id="t1")
    recorder = Recorder(str(tmp_path), "c", _describe)
    path = tmp_path / "qs_trials" / "t1.epochs.csv"
    _run(recorder, trial, [1])
    inode, sizes = path.stat().st_ino, [path.stat().st_size]
    for e in (2, 3):
        recorder.on_trial_result(0, [], trial, {"epoch": e, "top1": 5.0 * e, "train_s": 1.0})
        assert path.stat().st_ino == inode  # appended, not replaced
        sizes.append(path.stat().st_size)
    assert path.read_text().splitlines()[-1] == "3,15,,1" and sizes == sorted(sizes)
    assert [e["epoch"] for e in _record(tmp_path)["epochs"]] == [1, 2, 3]


def test_recorder_without_append_rewrites_the_epochs_file_whole(tmp_path, monkeypatch):
    """What an object store gets (no append): the small file replaced atomically per epoch; its
    readers go through the remote path (listing, thread pool)."""
    monkeypatch.setattr(storage, "can_append", lambda fs: False)
    trial = SimpleNamespace(trial_id="t1")
    recorder = Recorder(str(tmp_path), "c", _describe)
    path = tmp_path / "qs_trials" / "t1.epochs.csv"
    inodes = []
    for e in (1, 2, 3):
        recorder.on_trial_result(0, [], trial, {"epoch": e, "top1": 5.0 * e})
        inodes.append(path.stat().st_ino)
    assert len(set(inodes)) == 3  # a new file each time
    assert path.read_text() == "epoch,top1\n1,5\n2,10\n3,15\n"
    assert [e["top1"] for e in _record(tmp_path)["epochs"]] == [5.0, 10.0, 15.0]
    assert sorted(os.listdir(tmp_path / "qs_trials")) == ["t1.epochs.csv", "t1.json"]  # no temp left


def test_a_new_metric_rewrites_the_file_with_a_wider_header(tmp_path):
    trial = SimpleNamespace(trial_id="t1")
    recorder = Recorder(str(tmp_path), "c", _describe)
    _run(recorder, trial, [1, 2])
    recorder.on_trial_result(0, [], trial, {"epoch": 3, "top1": 1.0, "ema_top1": 2.0})
    recorder.on_trial_result(0, [], trial, {"epoch": 4, "ema_top1": 3.0})
    text = (tmp_path / "qs_trials" / "t1.epochs.csv").read_text()
    assert text.splitlines()[0] == "epoch,top1,epoch_s,train_s,ema_top1"
    assert text.splitlines()[1:] == ["1,10,2.5,2,", "2,20,2.5,2,", "3,1,,,2", "4,,,,3"]
    assert [set(e) for e in _record(tmp_path)["epochs"]][2:] == [{"epoch", "top1", "ema_top1"}, {"epoch", "ema_top1"}]


def test_a_failed_append_is_followed_by_a_whole_write(tmp_path, monkeypatch):
    trial = SimpleNamespace(trial_id="t1")
    recorder = Recorder(str(tmp_path), "c", _describe)
    _run(recorder, trial, [1])

    def full_disk(uri, data, whole):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recorder_module, "append_bytes", full_disk)
    with pytest.raises(OSError):
        recorder.on_trial_result(0, [], trial, {"epoch": 2, "top1": 20.0})
    monkeypatch.undo()
    recorder.on_trial_result(0, [], trial, {"epoch": 3, "top1": 30.0})
    assert [e["epoch"] for e in _record(tmp_path)["epochs"]] == [1, 2, 3]


DAMAGED_EPOCHS = {  # name -> (file content, what the message says, epochs still read)
    "torn": (b"epoch,top1\n1,10\n2,20\n3,3", "line 4: expected a line ending in a newline, given '3,3'", [1, 2]),
    "bad_line": (b"epoch,top1\n1,10\nnot,a,line\n3,30\n", "line 3: expected 2 comma-separated numbers", [1, 3]),
    "a_word": (b"epoch,top1\n1,10\n2,twenty\n", "line 3: expected 2 comma-separated numbers", [1]),
    "no_epoch": (b"epoch,top1\n1,10\n,20\n", "line 3: expected 2 comma-separated numbers", [1]),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00garbage", "expected a UTF-8 header line of metric names", []),
    "empty": (b"", "expected a header line of metric names, given an empty file", []),
    "no_epoch_column": (b"top1,top5\n1,2\n", "expected a header line of distinct metric names including epoch", []),
}


@pytest.mark.parametrize("kind", sorted(DAMAGED_EPOCHS))
def test_a_damaged_epochs_file_is_named_and_the_rest_is_read(tmp_path, kind, caplog, monkeypatch):
    monkeypatch.setattr(readers, "_CHUNK", 2)  # the damaged file shares a pyarrow call with others
    records = write_campaign(tmp_path, ["completed", "completed", "running", "completed", "failed"])
    content, says, kept = DAMAGED_EPOCHS[kind]
    bad = tmp_path / "qs_trials" / f"t00002{EPOCHS_SUFFIX}"
    bad.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.records"):
        read, problems = read_trial_records(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"{bad}: ") and says in problems[0]
    assert ": expected " in problems[0] and ", given " in problems[0] and problems[0] in caplog.text
    assert [r["trial_id"] for r in read] == [r["trial_id"] for r in records]  # the trial is still there
    assert [e["epoch"] for e in read[2]["epochs"]] == kept
    for got, rec in zip(read, records):
        if got["trial_id"] != "t00002":
            assert got["epochs"] == [{k: float(v) for k, v in e.items()} for e in rec["epochs"]]
    trials, epochs = collect(tmp_path)
    assert trials.column("epochs_run").to_pylist()[2] == len(kept)
    assert epochs.num_rows == sum(len(r["epochs"]) for r in records if r["trial_id"] != "t00002") + len(kept)
    assert f"damaged record {problems[0]}" in status_table(str(tmp_path)).splitlines()
    assert bad.read_bytes() == content  # readers never touch it


def test_repeated_epochs_in_a_file_keep_the_last_line_in_epoch_order(tmp_path):
    write_campaign(tmp_path, ["completed"])
    path = tmp_path / "qs_trials" / "t00000.epochs.csv"
    path.write_text("epoch,top1\n1,10\n2,20\n3,30\n2,21\n1,11\n4,40\n")
    rec = _record(tmp_path, "t00000")
    assert [(e["epoch"], e["top1"]) for e in rec["epochs"]] == [(1, 11), (2, 21), (3, 30), (4, 40)]
    _, epochs = collect(tmp_path)
    assert epochs.column("top1").to_pylist() == [11.0, 21.0, 30.0, 40.0]


def test_recorder_moves_a_damaged_epochs_file_aside_and_keeps_what_it_gives(tmp_path, caplog):
    trial = SimpleNamespace(trial_id="t1")
    _run(Recorder(str(tmp_path), "c", _describe), trial, [1, 2])
    path = tmp_path / "qs_trials" / "t1.epochs.csv"
    torn = path.read_bytes() + b"3,3"  # a driver stopped mid-append
    path.write_bytes(torn)
    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.records"):
        _run(Recorder(str(tmp_path), "c", _describe), trial, [3])
    assert (tmp_path / "qs_trials" / "t1.epochs.csv.damaged").read_bytes() == torn
    assert f"{path}: line 4: expected a line ending in a newline" in caplog.text
    assert f"{path}.damaged" in caplog.text and "kept the 2 epoch(s)" in caplog.text
    assert [e["epoch"] for e in _record(tmp_path)["epochs"]] == [1, 2, 3]
    assert path.read_text().endswith("\n2,20,2.5,2\n3,30,2.5,2\n")


def test_recorder_moves_older_records_to_the_epochs_file(tmp_path):
    """An older record (epochs inside it) continued by the recorder: the epochs file gets them all
    before the record drops its list; in between (both present) the epochs file is what is read."""
    (rec,) = write_campaign(tmp_path, ["running"], layout="older", epochs_planned=6)
    trial = SimpleNamespace(trial_id=rec["trial_id"])
    folder = tmp_path / "qs_trials"
    (folder / f"{rec['trial_id']}.epochs.csv").write_bytes(epochs_csv(rec["epochs"][:2]))
    assert len(_record(tmp_path, rec["trial_id"])["epochs"]) == 2  # the file wins over the record's list
    (folder / f"{rec['trial_id']}.epochs.csv").unlink()
    recorder = Recorder(str(tmp_path), "c", _describe)
    recorder.on_trial_start(0, [], trial)
    stored = json.loads((folder / f"{rec['trial_id']}.json").read_text())
    assert "epochs" not in stored and stored["trial_name"] == rec["trial_name"]
    recorder.on_trial_result(0, [], trial, {"epoch": 4, "top1": 50.0})
    got = _record(tmp_path, rec["trial_id"])["epochs"]
    assert [e["epoch"] for e in got] == [1, 2, 3, 4] and got[0]["top1"] == rec["epochs"][0]["top1"]


def test_recorder_pickled_mid_trial_keeps_appending(tmp_path):
    import pickle

    trial = SimpleNamespace(trial_id="t1")
    recorder = Recorder(str(tmp_path), "c", _describe)
    _run(recorder, trial, [1, 2])
    copy = pickle.loads(pickle.dumps(recorder))
    copy.on_trial_result(0, [], trial, {"epoch": 3, "top1": 30.0})
    copy.on_trial_result(0, [], trial, {"epoch": 2, "top1": 99.0})  # a repeat: written whole
    assert [(e["epoch"], e["top1"]) for e in _record(tmp_path)["epochs"]] == [(1, 10), (2, 99), (3, 30)]


def test_read_trials_gives_columns_counts_and_last_epochs(tmp_path):
    records = write_campaign(tmp_path, ["completed", "pending", "running"], layout=["current", "older"])
    trials = read_trials(tmp_path)
    assert trials.epoch_counts() == [len(r["epochs"]) for r in records]
    assert trials.last_epochs() == [({k: float(v) for k, v in r["epochs"][-1].items()} if r["epochs"] else {})
                                    for r in records]
    cols = trials.epoch_columns()
    assert cols.names[0] == "epoch" and cols.values.shape == (sum(trials.epoch_counts()), len(cols.names))
    assert cols.counts.tolist() == trials.epoch_counts() and "epochs" not in trials.records[0]


def test_tune_gets_the_numbers_it_steers_by_and_the_records_get_every_number(tmp_path):
    """Tune keeps statistics of every numeric key of a trial's last result in the driver: a trial hands it the
    objectives, the epoch and the planned epochs as numbers and the rest packed; what the records and the
    searchers read is the whole result, packed or not."""
    from qkvsearch.search.records.layout import METRICS_KEY, PLANNED_KEY, STATUS_KEY, for_tune
    from qkvsearch.search.searchers.outcomes import outcome_of_result

    whole = {"epoch": 2.0, "top1": 22.0, "epoch_s": 2.5, "train_s": 2.0, "val_loss": float("nan"),
             "qs_world_size": 2.0, "qs_first_step_at": 1.7e9, PLANNED_KEY: 3.0, "checkpoint_path": "/c/2"}
    packed = for_tune(whole, ("top1", "epoch", PLANNED_KEY))
    numbers = {k for k, v in packed.items() if isinstance(v, float)}
    assert numbers == {"top1", "epoch", PLANNED_KEY} and packed["checkpoint_path"] == "/c/2"
    assert isinstance(packed[METRICS_KEY], str)
    assert for_tune({STATUS_KEY: "failed", "top1": 1.0}, ("top1",)) == {STATUS_KEY: "failed", "top1": 1.0}

    for result, exp in ((whole, tmp_path / "whole"), (packed, tmp_path / "packed")):
        trial = SimpleNamespace(trial_id="t1")
        recorder = Recorder(str(exp), "c", _describe)
        recorder.on_trial_start(0, [], trial)
        recorder.on_trial_result(0, [], trial, {**result, "done": False})
        recorder.on_trial_complete(0, [], trial)
    assert _record(tmp_path / "packed")["epochs"] == _record(tmp_path / "whole")["epochs"]
    assert _record(tmp_path / "packed")["first_step_at"] == 1.7e9
    as_packed, as_whole = outcome_of_result(packed, False), outcome_of_result(whole, False)
    assert as_packed["status"] == as_whole["status"] == "stopped_early"
    assert as_packed["metrics"].keys() == as_whole["metrics"].keys() == {"epoch", "top1", "epoch_s", "train_s"}
