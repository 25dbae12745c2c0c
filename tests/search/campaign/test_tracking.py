"""Experiment tracking: a campaign with MLflow, W&B (offline), TensorBoard and an Optuna journal read back with
each library's own reader; a resume continues the same runs; an unreachable tracker warns and the campaign
completes. Fast checks of the `tracking` section and the install hint need no Ray."""
from __future__ import annotations

import json
import math
import signal
import struct
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import tiny_space
from helpers.live_campaign import (
    LiveCampaign,
    auth_token,
    free_port,
    tiny_spec,
    wait_while_advancing,
    write_spec,
)

from qkvsearch.search.campaign.tracking import check_trackers
from qkvsearch.search.campaign.tracking.base import param_text
from qkvsearch.search.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, main
from qkvsearch.search.records.proposals import read_proposals
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces import SpecError, load_campaign
from qkvsearch.spaces.tracking import add_trackers

EVERY_TRACKER = {"mlflow": {}, "wandb": {"mode": "offline"}, "tensorboard": {}, "optuna": {}}


def _records(exp) -> list[dict]:
    try:
        return read_trial_records(exp)[0]
    except Exception:  # noqa: BLE001  (not written yet)
        return []


def _spec(tmp_path: Path, name: str, **over) -> dict:
    spec = tiny_spec(tmp_path / "results", name, workers=1, epochs=2, variants=[{"embedding": "linear"}], steps=2)
    spec.update(over)
    return spec


# -- fast: the tracking section, the install hint ------------------------------------------------------

def test_tracking_section_defaults_round_trip_and_refusals(tmp_path):
    spec = load_campaign(_spec(tmp_path, "t", tracking={"wandb": {"project": "qkv"}, "tensorboard": None}))
    assert dict(spec.tracking["wandb"]) == {"project": "qkv", "entity": None, "mode": "offline"}
    assert load_campaign(spec.to_dict()) == spec
    assert set(add_trackers(spec, ["optuna"]).tracking) == {"wandb", "tensorboard", "optuna"}
    with pytest.raises(SpecError, match=r'tracking\.mlfow: unknown key \(did you mean "mlflow"\?\)'):
        load_campaign(_spec(tmp_path, "t", tracking={"mlfow": {}}))
    with pytest.raises(SpecError, match=r'tracking\.wandb\.mode: expected offline \| online \| disabled, given "x"'):
        load_campaign(_spec(tmp_path, "t", tracking={"wandb": {"mode": "x"}}))
    with pytest.raises(SpecError, match=r"tracking\.mlflow\.tracking_uri: required when storage is a bucket"):
        load_campaign(_spec(tmp_path, "t", tracking={"mlflow": {}}, storage="s3://bucket/results"))


def test_a_missing_tracker_package_fails_validate_with_the_install_hint(tmp_path, monkeypatch, capsys):
    path = write_spec(tmp_path / "spec.yaml", _spec(tmp_path, "t", tracking={"mlflow": {}}))
    check_trackers(load_campaign(path))  # installed: passes
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)  # as if not installed: import fails
    assert main(["validate", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "tracking.mlflow: needs the mlflow package" in err and "pip install 'qkvsearch[mlflow]'" in err
    assert main(["launch", str(path), "--track", "nope"]) == EXIT_BAD_INPUT
    assert "tracking.nope: unknown key" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_resume_track_adds_a_tracker_the_campaign_file_keeps(tmp_path):
    from helpers.campaign_files import write_campaign

    from qkvsearch.search.campaign.tracking import track_more
    from qkvsearch.search.records.layout import CampaignFolder, open_campaign

    exp = tmp_path / "results" / "t"
    spec = load_campaign(_spec(tmp_path, "t", tracking={"mlflow": {"experiment": "mine"}}))
    write_campaign(exp, ["completed"], spec=spec.to_dict(), name="t")
    assert track_more(spec, ["mlflow"]) is spec  # on already: nothing to write
    tracked = track_more(spec, ["tensorboard", "mlflow"])
    CampaignFolder.open(str(exp)).set_spec(tracked)  # as resume keeps it
    assert open_campaign(exp).spec.tracking == tracked.tracking
    assert dict(tracked.tracking["mlflow"])["experiment"] == "mine" and "tensorboard" in tracked.tracking


# -- readers: each tracker's own ---------------------------------------------------------------------

def _mlflow_runs(exp: Path, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{exp / 'tracking' / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    return client, client.search_runs([found.experiment_id], max_results=1000)


def _wandb_records(path: Path):
    """The protobuf records of a .wandb file (wandb's LevelDB-style log: 7-byte file header ':W&B' + magic
    + version, then 32 KiB blocks of chunks, each with a 7-byte header: crc32, length, type), parsed into
    wandb's own Record messages. wandb 0.31 has no Python reader for it any more (its core reads it)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, chunks = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunks = data[pos + 7:pos + 7 + length] if kind in (1, 2) else chunks + data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, or last chunk of a record
            record = pb.Record()
            record.ParseFromString(chunks)
            yield record


def _wandb_runs(exp: Path) -> dict[str, dict]:
    """run id -> {"name", "job_type", "history": [(step, {key: value})], "summary": {key: value}} over every
    offline run folder (a resumed run writes a folder of its own under the same id)."""
    runs: dict[str, dict] = defaultdict(lambda: {"history": [], "summary": {}, "folders": set()})
    for path in sorted((exp / "tracking" / "wandb" / "wandb").glob("offline-run-*/run-*.wandb")):
        run_id = None
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
                runs[run_id].update(name=record.run.display_name, job_type=record.run.job_type)
                runs[run_id]["folders"].add(path.parent.name)
            elif kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                runs[run_id]["history"].append((row["_step"], row))
            elif kind == "summary":
                for item in record.summary.update:
                    runs[run_id]["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return dict(runs)


def _epoch_table(exp: Path) -> dict[str, list[dict]]:
    """trial id -> its rows of epochs.parquet, written by `qkvsearch report` (no png/svg: not read here)."""
    assert main(["report", str(exp), "--no-static"]) == 0
    by_trial = defaultdict(list)
    for row in pq.read_table(exp / "report" / "epochs.parquet").to_pylist():
        by_trial[row["trial_id"]].append(row)
    return by_trial


METRICS = ("top1", "val_loss", "train_loss")


def _check_mlflow(exp: Path, records: list[dict], epochs: dict) -> None:
    client, runs = _mlflow_runs(exp, "tracked")
    trial_runs = [r for r in runs if r.data.tags.get("qkvsearch.kind") == "trial"]
    assert len([r for r in runs if r.data.tags.get("qkvsearch.kind") == "campaign"]) == 1
    by_trial = defaultdict(list)
    for run in trial_runs:
        by_trial[run.data.tags["qkvsearch.trial_id"]].append(run)
    assert sorted(by_trial) == sorted(r["trial_id"] for r in records)
    assert all(len(v) == 1 for v in by_trial.values()), "a trial got a second run"
    for rec in records:
        run = by_trial[rec["trial_id"]][0]
        assert run.data.params == {k: param_text(v) for k, v in rec["config"].items()}
        assert run.data.tags["qkvsearch.status"] == rec["status"] and run.info.status == "FINISHED"
        if rec["status"] == "duplicate":
            assert run.data.tags["qkvsearch.duplicate_of"] == rec["duplicate_of"]
            assert not client.get_metric_history(run.info.run_id, "top1")
            continue
        for metric in METRICS:
            history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, metric)]
            assert sorted(history) == [(row["epoch"], row[metric]) for row in epochs[rec["trial_id"]]]
        assert run.data.tags["qkvsearch.checkpoint"] == rec["checkpoint_path"]
    campaign = next(r for r in runs if r.data.tags.get("qkvsearch.kind") == "campaign")
    artifacts = {a.path for a in client.list_artifacts(campaign.info.run_id, "report")}
    assert artifacts == {"report/pareto.html", "report/pareto.csv"}
    assert client.get_metric_history(campaign.info.run_id, "hypervolume")


def _check_tensorboard(exp: Path, records: list[dict], epochs: dict) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for rec in records:
        acc = EventAccumulator(str(exp / "tracking" / "tensorboard" / rec["trial_name"]))
        acc.Reload()
        assert "config/text_summary" in acc.Tags()["tensors"]
        if rec["status"] == "duplicate":
            assert "top1" not in acc.Tags()["scalars"]
            continue
        for metric in METRICS:
            got = [(e.step, e.value) for e in acc.Scalars(metric)]
            want = [(row["epoch"], row[metric]) for row in epochs[rec["trial_id"]]]
            assert [s for s, _ in got] == [s for s, _ in want]  # each epoch once, resumed or not
            assert all(math.isclose(g, w, rel_tol=1e-6) for (_, g), (_, w) in zip(got, want))  # float32 events


def _check_wandb(exp: Path, records: list[dict], epochs: dict) -> None:
    runs = _wandb_runs(exp)
    trials = {r["summary"].get("trial_id"): r for r in runs.values() if r["job_type"] == "trial"}
    assert sorted(trials) == sorted(r["trial_id"] for r in records)
    assert len([r for r in runs.values() if r["job_type"] == "trial"]) == len(records)
    for rec in records:
        run = trials[rec["trial_id"]]
        assert run["name"] == rec["trial_name"] and run["summary"]["status"] == rec["status"]
        if rec["status"] == "duplicate":
            assert run["summary"]["duplicate_of"] == rec["duplicate_of"] and not run["history"]
            continue
        for metric in METRICS:
            assert [(s, h[metric]) for s, h in run["history"]] == [(row["epoch"], row[metric])
                                                                    for row in epochs[rec["trial_id"]]]


def _check_optuna(exp: Path, records: list[dict], epochs: dict) -> None:
    import optuna
    from optuna_dashboard._storage_url import get_storage

    journal = exp / "tracking" / "optuna.journal"
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name="tracked", storage=storage)
    by_trial = {t.user_attrs["trial_id"]: t for t in study.trials}
    assert len(study.trials) == len(records) and sorted(by_trial) == sorted(r["trial_id"] for r in records)
    for rec in records:
        trial = by_trial[rec["trial_id"]]
        assert (trial.state == optuna.trial.TrialState.COMPLETE
                and trial.params == {"embedding": rec["config"]["embedding"]}), (trial, rec)
        source = rec["duplicate_of"] if rec["status"] == "duplicate" else rec["trial_id"]
        assert trial.values == [epochs[source][-1]["top1"], rec["cost"]["gmacs"]]
        assert trial.user_attrs["status"] == rec["status"]
    assert {t.number for t in study.best_trials}  # the Pareto front the dashboard draws
    studies = get_storage(str(journal)).get_all_studies()  # optuna-dashboard's own loader
    assert [s.study_name for s in studies] == ["tracked"]


# -- slow: campaigns on Ray --------------------------------------------------------------------------

@pytest.mark.slow
def test_every_tracker_reads_back_and_a_resume_continues_the_same_runs(tmp_path):
    # Two embeddings, three trials: at least one trial repeats a configuration (a duplicate).
    # Seed 1 draws sne, sne, linear: the third trial trains, and is stopped after its first epoch.
    spec = _spec(tmp_path, "tracked", space={"embedding": {"choice": ["linear", "sne"]}},
                 search={"algorithm": "random", "num_trials": 3, "seed": 1}, tracking=EVERY_TRACKER)
    spec["train"].update(epochs=3, max_steps_per_epoch=8)  # time to stop it between epochs
    path = write_spec(tmp_path / "spec.yaml", spec)
    exp = tmp_path / "results" / "tracked"

    def one_ended_one_training():
        run._check_alive()
        recs = _records(exp)
        return (any(r["status"] in ("completed", "duplicate") for r in recs)
                and any(r["status"] == "running" and r["epochs"] for r in recs))

    with LiveCampaign(["launch", str(path)], tmp_path) as run:
        wait_while_advancing(one_ended_one_training, lambda: run.advancing(exp),
                             "a trial to end and another to train an epoch", every=0.2)
        run.proc.send_signal(signal.SIGTERM)
        assert run.finish(exp) == EXIT_INTERRUPTED, run.stderr()[-3000:]
    interrupted = [r for r in _records(exp) if r["status"] == "interrupted"]
    assert len(interrupted) == 1 and 1 <= len(interrupted[0]["epochs"]) < 3, _records(exp)
    with LiveCampaign(["resume", str(exp)], tmp_path) as run:
        assert run.finish(exp) == 0, run.stderr()[-3000:]
        assert "tracking:" not in run.stderr()  # no tracker failed
        token = auth_token(run.env).encode()
    assert len(token) > 8 and not [p for p in (exp / "tracking").rglob("*") if p.is_file() and token in p.read_bytes()]

    records = _records(exp)
    assert len(records) == 3 and {r["status"] for r in records} <= {"completed", "duplicate"}
    assert "duplicate" in {r["status"] for r in records}
    epochs = _epoch_table(exp)
    _check_mlflow(exp, records, epochs)
    _check_tensorboard(exp, records, epochs)
    _check_wandb(exp, records, epochs)
    _check_optuna(exp, records, epochs)
    # The resumed trial went on in the run it had: W&B wrote a second offline folder under the same run id.
    wandb_run = next(r for r in _wandb_runs(exp).values() if r["summary"].get("trial_id") == interrupted[0]["trial_id"])
    assert len(wandb_run["folders"]) == 2


@pytest.mark.slow
def test_an_unreachable_tracker_warns_once_and_the_others_see_every_trial_and_proposal(ray_local, tmp_path, capsys,
                                                                                        caplog):
    closed = free_port()  # nothing listens there
    spec = _spec(tmp_path, "unreachable")
    spec["train"]["epochs"] = 1
    # the third configuration breaks the parameter budget: a proposal, never a trial
    spec["space"] = tiny_space({"variants": [{"embedding": "linear"}, {"embedding": "sne"},
                                             {"embedding": "fsne", "hidden_width": 4.0, "code_size": 8}]})
    spec["constraints"] = {"params_m": {"max": 1.0}}  # 0.90M, 0.90M, 1.08M
    spec["tracking"] = {"mlflow": {"tracking_uri": f"http://127.0.0.1:{closed}"}, "tensorboard": {}}
    path = write_spec(tmp_path / "spec.yaml", spec)
    exp = tmp_path / "results" / "unreachable"

    # in this process, on the suite's Ray; a grid: a study of its own
    assert main(["launch", str(path), "--track", "optuna"]) == 0, capsys.readouterr().err[-3000:]
    warned = [r.getMessage() for r in caplog.records if "tracking: mlflow failed" in r.getMessage()]
    assert len(warned) == 1, caplog.text[-3000:]
    records = _records(exp)
    assert sorted(r["status"] for r in records) == ["completed", "completed"]
    (proposal,) = read_proposals(exp)

    import optuna

    study = optuna.load_study(study_name="unreachable", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(exp / "tracking" / "optuna.journal"))))
    assert sorted(t.params["embedding"] for t in study.trials) == ["fsne", "linear", "sne"]
    by_id = {r["trial_id"]: r for r in records}
    for trial in study.trials:
        if trial.user_attrs["trial_id"] == proposal["proposal_id"]:  # shown as what it is, never trained
            assert trial.state.name == "FAIL" and trial.user_attrs["status"] == "infeasible"
            assert "params_m" in trial.user_attrs["error"]
            continue
        rec = by_id[trial.user_attrs["trial_id"]]
        assert trial.values == [rec["epochs"][-1]["top1"], rec["cost"]["gmacs"]]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(exp / "tracking" / "tensorboard" / proposal["proposal_id"]))
    acc.Reload()
    status = acc.Tensors("status/text_summary")[0].tensor_proto.string_val[0].decode()
    scalars = acc.Tags()["scalars"]
    assert status == "infeasible" and scalars and all(t.startswith("cost/") for t in scalars)  # its cost, no epochs
