"""A campaign in a bucket, stopped by SIGTERM and by Ctrl-C (SIGINT), resumed from its URI.

The storage is a real S3-protocol server (moto, in server mode on 127.0.0.1) reached through pyarrow's S3
filesystem (endpoint from AWS_ENDPOINT_URL): `launch` writes Tune's experiment, the Train checkpoints and
the records to s3://. Stopped, the driver stops what it started, exits 130, marks the running trials
interrupted (not running) and says how to resume; an interrupted trial keeps what resuming needs. `status`,
`resume`, `watch` and `report` work from the URI; the finished campaign has every trial's epochs 1..n once
each and, under the default checkpoint policy, only the front's weights; nothing is written locally but
Ray's own caches."""
from __future__ import annotations

import io
import signal

import pyarrow.fs as pafs
import pytest
from helpers.live_campaign import (
    LiveCampaign,
    ray_processes,
    tiny_spec,
    wait_for,
    wait_while_advancing,
    write_spec,
)

from qkvsearch.search.campaign.retention import NONE, RESUME_ONLY, WEIGHTS
from qkvsearch.search.cli import EXIT_INTERRUPTED, main
from qkvsearch.search.records.layout import ENDED_KEY, INTERRUPTED_KEY, WEIGHTS_DIR, read_campaign
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.storage import exists, read_bytes

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

BUCKET = "qkv-campaigns"
NAME = "in-a-bucket"


def _epochs(exp: str) -> dict[str, list[int]]:
    try:
        records, _ = read_trial_records(exp)
    except Exception:  # noqa: BLE001  (not written yet)
        return {}
    return {r["trial_id"]: [int(e["epoch"]) for e in r["epochs"]] for r in records}


def _statuses(exp: str) -> dict[str, str]:
    records, _ = read_trial_records(exp)
    return {r["trial_id"]: r["status"] for r in records}


def _files(fs: pafs.FileSystem, prefix: str) -> list[str]:
    return [f.path for f in fs.get_file_info(pafs.FileSelector(prefix, recursive=True)) if f.type == pafs.FileType.File]


def _local_files(tmp_path) -> set[str]:
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}


def _stop_after_new_epoch(run: LiveCampaign, exp: str, sig: signal.Signals) -> None:
    """Send sig once a trial has recorded an epoch more than it had."""
    before = sum(map(len, _epochs(exp).values()))
    wait_while_advancing(lambda: run._check_alive() or sum(map(len, _epochs(exp).values())) > before,
                         lambda: (run.advancing(), _epochs(exp)), "a new epoch")
    run.proc.send_signal(sig)


def _assert_stopped(run: LiveCampaign, exp: str, sig: signal.Signals) -> None:
    assert run.finish() == EXIT_INTERRUPTED, run.stderr()[-3000:]   # its output: how far the stop is
    err = run.stderr()
    assert f"stopped by {sig.name}" in err and f"qkvsearch resume {exp}" in err
    assert "next: qkvsearch report" not in run.stdout()  # not announced as finished
    statuses = _statuses(exp)
    assert "running" not in statuses.values() and "interrupted" in statuses.values(), statuses
    campaign = read_campaign(exp)
    assert campaign.get(INTERRUPTED_KEY) and ENDED_KEY not in campaign
    wait_for(lambda: not ray_processes(run.ray_tmp), 60, "the stopped driver's Ray processes to go")


def _assert_front_weights_only(exp: str, stored: list[str]) -> None:
    """Under the default policy the finished campaign keeps the front's weights (no optimizer state) and
    nothing of the other trials; no Train checkpoint is left."""
    records = {r["trial_id"]: r for r in read_trial_records(exp)[0]}
    kept = {tid: r["checkpoint_kept"] for tid, r in records.items()}
    assert set(kept.values()) <= {WEIGHTS, NONE} and WEIGHTS in kept.values(), kept
    for tid, what in kept.items():
        weights = f"{exp}/{WEIGHTS_DIR}/{tid}.pt"  # a URI in the bucket, named by the record
        assert exists(weights) == (what == WEIGHTS)
        assert records[tid]["checkpoint_path"] == (weights if what == WEIGHTS else None)
        if what == WEIGHTS:
            state = torch.load(io.BytesIO(read_bytes(weights)), weights_only=True)
            assert not set(RESUME_ONLY) & set(state)
    assert not [p for p in stored if "/train_runs/" in p and "/checkpoint_" in p]


def test_a_campaign_in_a_bucket_stopped_twice_resumes_and_reports_from_its_uri(s3, tmp_path, capsys, monkeypatch):
    s3.create_dir(BUCKET)
    variants = [{"embedding": "linear"}, {"embedding": "fsne", "hidden_width": 0.5, "code_size": 4}]
    raw = tiny_spec(f"s3://{BUCKET}/campaigns", NAME, workers=1, epochs=3, variants=variants, steps=8)
    raw.pop("checkpoints")  # the default policy: keep the front's weights
    # the baseline goes on at the rung (first there); F-SNE has the fewest MACs: both on the front
    raw["scheduler"] = {"type": "moasha", "grace_epochs": 1, "reduction_factor": 2, "brackets": 1}
    spec = write_spec(tmp_path / "spec.yaml", raw)
    exp = f"s3://{BUCKET}/campaigns/{NAME}"

    with LiveCampaign(["launch", str(spec)], tmp_path) as run:
        _stop_after_new_epoch(run, exp, signal.SIGTERM)
        _assert_stopped(run, exp, signal.SIGTERM)
    for rec in read_trial_records(exp)[0]:
        if rec["status"] == "interrupted":  # resuming needs its whole checkpoint
            assert "checkpoint_kept" not in rec and exists(f"{rec['checkpoint_path']}/state.pt"), rec
    monkeypatch.chdir(tmp_path)  # the commands below run in this process: whatever they write locally is seen
    assert main(["status", exp]) == 0
    assert "interrupted" in capsys.readouterr().out

    with LiveCampaign(["resume", exp], tmp_path) as run:
        _stop_after_new_epoch(run, exp, signal.SIGINT)
        _assert_stopped(run, exp, signal.SIGINT)

    with LiveCampaign(["resume", exp], tmp_path) as run:
        assert run.finish() == 0, run.stderr()[-3000:]
        assert f"next: qkvsearch report {exp}" in run.stdout()
    assert set(_statuses(exp).values()) == {"completed"}
    epochs = _epochs(exp)
    assert len(epochs) == 2 and all(e == [1, 2, 3] for e in epochs.values()), epochs
    assert read_campaign(exp).get(ENDED_KEY)

    capsys.readouterr()
    assert main(["watch", exp]) == 0
    assert f"{NAME}: 2/2 trials done" in capsys.readouterr().out
    assert main(["report", exp, "--no-static"]) == 0, capsys.readouterr().err[-3000:]  # png/svg: test_report

    stored = _files(s3, f"{BUCKET}/campaigns/{NAME}")
    names = {p.rsplit("/", 1)[-1] for p in stored}
    assert {"qs_campaign.json", "tuner.pkl", "pareto.html", "trials.parquet"} <= names
    assert any("/qs_trials/" in p and p.endswith(".epochs.csv") for p in stored)
    _assert_front_weights_only(exp, stored)
    # Only what the test itself wrote and the commands' logs are local: no results folder.
    assert {p for p in _local_files(tmp_path) if not p.endswith((".out", ".err"))} == {"spec.yaml"}
