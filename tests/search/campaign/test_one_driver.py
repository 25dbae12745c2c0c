"""One live driver per campaign (search.records.lease), with real drivers on their own local Rays: while a
`launch` runs, a second `resume` and a `launch --overwrite` exit 2 at once, naming it, and neither trains
nor deletes anything. (A SIGKILLed driver's hold, its refusal of an early `resume` and the stale takeover:
tests/search/campaign/test_driver_kill.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from helpers.live_campaign import QKVSEARCH, LiveCampaign, tiny_spec, wait_for, write_spec

from qkvsearch.search.cli import EXIT_BAD_INPUT
from qkvsearch.search.records.lease import LEASE_FILE, read_lease
from qkvsearch.search.records.readers import read_trial_records

pytestmark = pytest.mark.slow

VARIANTS = [{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.5}]


def _records(exp) -> list[dict]:
    try:
        return read_trial_records(exp)[0]
    except Exception:  # noqa: BLE001  (not written yet)
        return []


def _train_runs(exp) -> list[str]:
    return sorted(os.listdir(exp / "train_runs")) if (exp / "train_runs").exists() else []


def _refused(args: list[str], tmp, driver_pid: int) -> float:
    """Run `qkvsearch <args>` beside the live driver: it must exit 2 naming it; -> seconds it took."""
    tmp.mkdir()
    started = time.monotonic()
    with LiveCampaign(args, tmp) as second:
        assert second.wait(120) == EXIT_BAD_INPUT, second.stderr()[-3000:]
    took = time.monotonic() - started
    err = second.stderr()
    assert "campaign held by a live driver" in err and f"pid {driver_pid}" in err and "last heartbeat" in err, err
    assert "results:" not in second.stdout()  # it announced no campaign of its own
    return took


def _finished_once_each(exp) -> None:
    records = _records(exp)
    assert len(records) == len(VARIANTS) and {r["status"] for r in records} == {"completed"}, records
    for rec in records:
        assert [int(e["epoch"]) for e in rec["epochs"]] == list(range(1, rec["epochs_planned"] + 1)), rec["epochs"]
    assert len(_train_runs(exp)) == len(VARIANTS)  # one Train run per trial: none trained twice


def test_a_second_resume_or_overwrite_is_refused_while_a_driver_runs(tmp_path):
    spec_file = write_spec(tmp_path / "spec.yaml",
                           tiny_spec(tmp_path / "results", "held", workers=1, epochs=2, variants=VARIANTS, steps=2))
    exp = tmp_path / "results" / "held"
    with LiveCampaign(["launch", str(spec_file)], tmp_path) as first:
        wait_for(lambda: first._check_alive() or (exp / "qs_campaign.json").exists(), 120, "the campaign file")
        created = json.loads((exp / "qs_campaign.json").read_text())["created_at"]
        before = {r["trial_id"] for r in _records(exp)}
        resume_s = _refused(["resume", str(exp)], tmp_path / "resume", first.proc.pid)
        overwrite_s = _refused(["launch", str(spec_file), "--overwrite"], tmp_path / "overwrite", first.proc.pid)
        assert json.loads((exp / "qs_campaign.json").read_text())["created_at"] == created  # not replaced
        assert before <= {r["trial_id"] for r in _records(exp)}  # no record deleted
        status = subprocess.run([*QKVSEARCH, "status", str(exp)], capture_output=True, text=True, cwd=tmp_path)
        assert f"driver: live, host {os.uname().nodename}, pid {first.proc.pid}" in status.stdout, status.stdout
        assert first.wait(300) == 0, first.stderr()[-3000:]
    _finished_once_each(exp)
    assert not (exp / LEASE_FILE).exists() and read_lease(exp).line() == "driver: none"
    print(f"\nrefused at once: resume {resume_s:.1f} s, launch --overwrite {overwrite_s:.1f} s")
