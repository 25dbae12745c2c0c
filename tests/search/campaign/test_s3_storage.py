"""A campaign whose storage is a bucket: a real S3-protocol server (moto, in server mode on 127.0.0.1)
reached through pyarrow's S3 filesystem (endpoint from AWS_ENDPOINT_URL). `launch` writes Tune's
experiment, the Train checkpoints and the records to s3://; it is stopped mid-trial; `status`, `resume`,
`watch` and `report` then work from the URI, and nothing is written locally but Ray's own caches."""
from __future__ import annotations

import json
import signal

import pyarrow.fs as pafs
import pytest
from helpers.live_campaign import (
    QKVSEARCH,
    LiveCampaign,
    named_checkpoint_epochs,
    tiny_spec,
    wait_for,
    write_spec,
)

from qkvsearch.search.records.layout import ENDED_KEY, read_campaign
from qkvsearch.search.records.readers import read_trial_records

pytestmark = pytest.mark.slow
BUCKET = "qkv-campaigns"
NAME = "in-a-bucket"


def _epochs(exp: str) -> dict[str, list[int]]:
    try:
        records, _ = read_trial_records(exp)
    except Exception:  # noqa: BLE001  (not written yet)
        return {}
    return {r["trial_name"]: [int(e["epoch"]) for e in r["epochs"]] for r in records}


def _files(fs: pafs.FileSystem, prefix: str) -> list[str]:
    return [f.path for f in fs.get_file_info(pafs.FileSelector(prefix, recursive=True)) if f.type == pafs.FileType.File]


def _local_files(tmp_path) -> set[str]:
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}


def test_a_campaign_in_a_bucket_launches_stops_resumes_and_reports_from_its_uri(s3, tmp_path):
    import subprocess

    s3.create_dir(BUCKET)
    variants = [{"embedding": "linear"}, {"embedding": "fsne", "hidden_width": 0.5, "code_size": 4}]
    spec = tiny_spec(f"s3://{BUCKET}/campaigns", NAME, workers=1, epochs=3, variants=variants, steps=12)
    spec["scheduler"] = {"type": "moasha", "grace_epochs": 1, "reduction_factor": 2, "brackets": 1}
    spec_file = write_spec(tmp_path / "spec.yaml", spec)
    exp = f"s3://{BUCKET}/campaigns/{NAME}"

    with LiveCampaign(["launch", str(spec_file)], tmp_path) as run:
        wait_for(lambda: run._check_alive() or sum(map(len, _epochs(exp).values())) >= 1, 240, "an epoch in the bucket")
        run.proc.send_signal(signal.SIGTERM)
        assert run.wait(120) == 130, run.stderr()[-3000:]
    assert f"qkvsearch resume {exp}" in run.stderr()
    status = subprocess.run([*QKVSEARCH, "status", exp], capture_output=True, text=True, cwd=tmp_path)
    assert status.returncode == 0 and "interrupted" in status.stdout, status.stdout + status.stderr

    with LiveCampaign(["resume", exp], tmp_path) as run:
        assert run.wait(300) == 0, run.stderr()[-3000:]
    epochs = _epochs(exp)
    assert len(epochs) == 2 and all(e == list(range(1, len(e) + 1)) for e in epochs.values()), epochs
    assert read_campaign(exp).get(ENDED_KEY)
    records, _ = read_trial_records(exp)
    assert all(r["checkpoint_path"].startswith(f"{exp}/train_runs/") for r in records if r["status"] == "completed")
    named = named_checkpoint_epochs(records)  # read from the bucket through the URI each record names
    assert named and all(last == epoch for last, epoch in named.values()), named

    watch = subprocess.run([*QKVSEARCH, "watch", exp], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert watch.returncode == 0 and f"{NAME}: 2/2 trials done" in watch.stdout
    report = subprocess.run([*QKVSEARCH, "report", exp], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]

    stored = _files(s3, f"{BUCKET}/campaigns/{NAME}")
    names = {p.rsplit("/", 1)[-1] for p in stored}
    assert {"qs_campaign.json", "tuner.pkl", "pareto.html", "trials.parquet"} <= names
    assert any("/train_runs/" in p and p.endswith("state.pt") for p in stored), "Train checkpoints in the bucket"
    assert any("/qs_trials/" in p and p.endswith(".epochs.csv") for p in stored)
    trials = json.loads(s3.open_input_stream(f"{BUCKET}/campaigns/{NAME}/qs_campaign.json").read())
    assert trials["name"] == NAME
    # Only what the test itself wrote and the commands' logs are local: no results folder.
    assert {p for p in _local_files(tmp_path) if not p.endswith((".out", ".err"))} == {"spec.yaml"}
