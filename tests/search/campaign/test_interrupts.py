"""Stopping a campaign's driver with SIGTERM or Ctrl-C (SIGINT): it stops what it started, exits 130,
marks the running trials interrupted (not running), says how to resume, and `resume` finishes the
campaign with every trial's epochs 1..n once each. Under the default checkpoint policy an interrupted trial
keeps what resuming needs, and the finished campaign only the front's weights."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from helpers.live_campaign import LiveCampaign, ray_processes, tiny_spec, wait_for, write_spec

from qkvsearch.search.campaign.retention import NONE, RESUME_ONLY, WEIGHTS
from qkvsearch.search.cli import EXIT_INTERRUPTED
from qkvsearch.search.records.layout import ENDED_KEY, INTERRUPTED_KEY, WEIGHTS_DIR
from qkvsearch.search.records.readers import read_trial_records

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

NAME = "stopped"


def _epochs(exp) -> dict[str, list[int]]:
    try:
        records, _ = read_trial_records(exp)
    except Exception:  # noqa: BLE001  (not written yet)
        return {}
    return {r["trial_id"]: [int(e["epoch"]) for e in r["epochs"]] for r in records}


def _statuses(exp) -> dict[str, str]:
    records, _ = read_trial_records(exp)
    return {r["trial_id"]: r["status"] for r in records}


def _stop_after_new_epoch(run: LiveCampaign, exp, sig: signal.Signals) -> dict[str, list[int]]:
    """Send sig once a trial has recorded an epoch more than it had; -> the epochs then."""
    before = sum(map(len, _epochs(exp).values()))

    def trained():
        run._check_alive()
        epochs = _epochs(exp)
        return epochs if sum(map(len, epochs.values())) > before else None

    epochs = wait_for(trained, 240, "a new epoch")
    run.proc.send_signal(sig)
    return epochs


def _assert_stopped(run: LiveCampaign, exp, sig: signal.Signals) -> None:
    assert run.wait(120) == EXIT_INTERRUPTED
    err = run.stderr()
    assert f"stopped by {sig.name}" in err and f"qkvsearch resume {exp}" in err
    assert "next: qkvsearch report" not in run.stdout()  # not announced as finished
    statuses = _statuses(exp)
    assert "running" not in statuses.values() and "interrupted" in statuses.values(), statuses
    campaign = json.loads((exp / "qs_campaign.json").read_text())
    assert campaign.get(INTERRUPTED_KEY) and ENDED_KEY not in campaign
    wait_for(lambda: not ray_processes(run.ray_tmp), 60, "the stopped driver's Ray processes to go")


def test_sigterm_then_ctrl_c_then_resume_finishes_without_gaps(tmp_path):
    variants = [{"embedding": "linear"}, {"embedding": "fsne", "hidden_width": 0.5, "code_size": 4}]
    raw = tiny_spec(tmp_path / "results", NAME, workers=1, epochs=3, variants=variants, steps=12)
    raw.pop("checkpoints")  # the default policy: keep the front's weights
    spec = write_spec(tmp_path / "spec.yaml", raw)
    exp = tmp_path / "results" / NAME

    with LiveCampaign(["launch", str(spec)], tmp_path) as run:
        _stop_after_new_epoch(run, exp, signal.SIGTERM)
        _assert_stopped(run, exp, signal.SIGTERM)
    for rec in read_trial_records(exp)[0]:
        if rec["status"] == "interrupted":  # resuming needs its whole checkpoint
            assert "checkpoint_kept" not in rec and (Path(rec["checkpoint_path"]) / "state.pt").is_file(), rec

    with LiveCampaign(["resume", str(exp)], tmp_path) as run:
        _stop_after_new_epoch(run, exp, signal.SIGINT)
        _assert_stopped(run, exp, signal.SIGINT)

    with LiveCampaign(["resume", str(exp)], tmp_path) as run:
        assert run.wait(300) == 0, run.stderr()[-3000:]
        assert f"next: qkvsearch report {exp}" in run.stdout()
    assert set(_statuses(exp).values()) == {"completed"}
    epochs = _epochs(exp)
    assert len(epochs) == 2 and all(e == [1, 2, 3] for e in epochs.values()), epochs
    assert json.loads((exp / "qs_campaign.json").read_text()).get(ENDED_KEY)
    kept = {r["trial_id"]: r["checkpoint_kept"] for r in read_trial_records(exp)[0]}
    assert set(kept.values()) <= {WEIGHTS, NONE} and WEIGHTS in kept.values(), kept
    for tid, what in kept.items():
        weights = exp / WEIGHTS_DIR / f"{tid}.pt"
        assert weights.is_file() == (what == WEIGHTS)
        if what == WEIGHTS:
            assert not set(RESUME_ONLY) & set(torch.load(weights, weights_only=True))
    assert not list((exp / "train_runs").glob("*/checkpoint_*"))  # no optimizer state left behind
