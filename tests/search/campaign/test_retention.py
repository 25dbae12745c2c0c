"""What ended trials keep of their checkpoints (search.campaign.retention): the rule on synthetic records, its
application to real checkpoint files, and campaigns on local Ray under the default policy (launched, stopped,
resumed, reported) and under `keep: all`."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.campaign_files import ALL_STATUSES, SPEC, synthetic_record, write_campaign, write_record
from helpers.live_campaign import tiny_spec

from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.campaign.driver import TrialSettings
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.retention import NONE, STATE, WEIGHTS, Retention, decide, weights_only
from qkvsearch.search.cli import main
from qkvsearch.search.records.layout import FINAL_STATUSES, WEIGHTS_DIR
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.search.records.recorder import Recorder
from qkvsearch.spaces import load_campaign
from qkvsearch.trainers.training.engine import save_state

OBJECTIVES = SPEC["objectives"]


def _front_ids(records, objectives=OBJECTIVES) -> set[str]:
    """Completed trials on the front, from the records as a reader sees them: a cost when the record has
    one (gmacs, params_m), else the metric at the last epoch."""
    done = [r for r in records if r["status"] == "completed"]
    values = [[r["cost"][o["metric"]] if o["metric"] in r["cost"] else r["epochs"][-1][o["metric"]]
               for o in objectives] for r in done]
    mask = nondominated_mask(np.array(values, dtype=float).reshape(len(done), len(objectives)),
                             [o["mode"] for o in objectives])
    return {r["trial_id"] for r, on in zip(done, mask) if on}


# ------------------------------------------------------------------------------------------ the rule
def test_the_front_keeps_weights_the_rest_nothing_and_unended_trials_everything(tmp_path):
    records = write_campaign(tmp_path, ALL_STATUSES)
    plan = decide(collect(tmp_path)[0], OBJECTIVES, "front")
    front = _front_ids(records)
    assert front and len(front) < sum(r["status"] == "completed" for r in records)
    for rec in records:
        keep = plan[rec["trial_id"]]
        if rec["status"] not in FINAL_STATUSES:  # pending, running: resuming needs the state
            assert keep.kept == STATE, rec["status"]
        else:
            assert keep.kept == (WEIGHTS if rec["trial_id"] in front else NONE), (rec["status"], keep)
    assert all(keep.note for keep in plan.values())


def test_a_trial_a_newer_one_dominates_leaves_the_front(tmp_path):
    records = write_campaign(tmp_path, ["completed"] * 4)
    before = _front_ids(records)
    victim = next(r for r in records if r["trial_id"] in before)
    better = synthetic_record(9, "completed", rng=np.random.default_rng(1))
    better["cost"] = {**victim["cost"], "gmacs": victim["cost"]["gmacs"] / 2,
                      "params_m": victim["cost"]["params_m"] / 2}
    better["epochs"] = [{**e, "top1": e["top1"] + 5} for e in victim["epochs"]]
    write_record(tmp_path, better)
    plan = decide(collect(tmp_path)[0], OBJECTIVES, "front")
    assert plan[victim["trial_id"]].kept == NONE and "dominates" in plan[victim["trial_id"]].note
    assert plan[better["trial_id"]].kept == WEIGHTS


def test_restartable_and_still_needed_trials_keep_everything_and_the_policies_all_and_none(tmp_path):
    records = write_campaign(tmp_path, ALL_STATUSES)
    trials = collect(tmp_path)[0]
    ended = [r["trial_id"] for r in records if r["status"] in FINAL_STATUSES]
    plan = decide(trials, OBJECTIVES, "front", restartable={ended[0]}, needed={ended[1]})
    assert plan[ended[0]].kept == STATE and plan[ended[1]].kept == STATE
    assert {k.kept for k in decide(trials, OBJECTIVES, "all").values()} == {STATE}
    none = decide(trials, OBJECTIVES, "none")
    assert {none[t].kept for t in ended} == {NONE}
    assert {none[r["trial_id"]].kept for r in records if r["trial_id"] not in ended} == {STATE}


# ------------------------------------------------------------------------------ applied to real files
def _checkpoint(folder: str, seed: int) -> None:
    """A checkpoint as trainers.training.engine writes one: a model, its AdamW state after a step, the schedule."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    from qkvsearch.trainers.training.engine import STATE_FORMAT

    save_state({"format": STATE_FORMAT, "epoch": 6, "updates": 6, "model": model.state_dict(),
                "optimizer": opt.state_dict(), "scheduler": {"last": 6}, "config": {}, "history": []}, folder)


def test_retention_strips_the_front_to_weights_removes_the_rest_and_records_it(tmp_path):
    exp = str(tmp_path / "synth")
    records = write_campaign(exp, ["completed"] * 4 + ["running", "failed"])
    settings = TrialSettings(objectives=(), train_storage=f"{exp}/train_runs", campaign="synth")
    spec = load_campaign({**tiny_spec(tmp_path, "synth", workers=1, epochs=6, variants=[{"embedding": "linear"}],
                                      keep="front"), "objectives": OBJECTIVES}, check_names=False)
    retention = Retention(OpenedCampaign(spec, exp), Recorder(exp, "synth", describe=None), settings)
    for i, rec in enumerate(records):
        if rec["epochs"]:
            rec["checkpoint_path"] = f"{retention.run_dir(rec)}/checkpoint_epoch_0006"
            _checkpoint(rec["checkpoint_path"], i)
            write_record(exp, rec)
    front = _front_ids(records)

    retention.run()
    after = {r["trial_id"]: r for r in read_trial_records(exp)[0]}
    for rec in records:
        now, tid = after[rec["trial_id"]], rec["trial_id"]
        if rec["status"] == "running":  # untouched: resuming needs its state
            assert now["checkpoint_path"] == rec["checkpoint_path"] and "checkpoint_kept" not in now
            assert os.path.exists(f"{rec['checkpoint_path']}/state.pt")
        elif tid in front:
            assert now["checkpoint_kept"] == WEIGHTS and now["checkpoint_path"] == f"{exp}/{WEIGHTS_DIR}/{tid}.pt"
            state = torch.load(now["checkpoint_path"], weights_only=True)
            assert "optimizer" not in state and "scheduler" not in state and "weight" in "".join(state["model"])
            assert not os.path.exists(retention.run_dir(rec))
        else:
            assert now["checkpoint_kept"] == NONE and now["checkpoint_path"] is None and now["checkpoint_note"]
            assert not os.path.exists(retention.run_dir(rec)) and not os.path.exists(f"{exp}/{WEIGHTS_DIR}/{tid}.pt")
    stamp = {p: os.stat(p).st_mtime_ns for p in Path(exp).rglob("*") if p.is_file()}
    retention.run(final=True)  # a second pass changes nothing
    assert {p: os.stat(p).st_mtime_ns for p in Path(exp).rglob("*") if p.is_file()} == stamp


def test_weights_only_drops_exactly_what_only_resuming_needs():
    state = {"format": 1, "model": {"w": torch.zeros(1)}, "optimizer": {}, "scheduler": None, "epoch": 2,
             "config": {"a": 1}, "history": [{"epoch": 1}]}
    assert sorted(weights_only(state)) == ["config", "epoch", "format", "history", "model"]
    assert weights_only(state)["format"] != state["format"]


# ------------------------------------------------------------------------------------ campaigns on Ray
def _records(exp) -> dict[str, dict]:
    return {r["trial_id"]: r for r in read_trial_records(exp)[0]}


def _one_done_one_running(exp):
    recs = list(_records(exp).values()) if (Path(exp) / "qs_trials").is_dir() else []
    done = [r for r in recs if r["status"] == "completed"]
    running = [r for r in recs if r["status"] == "running" and r["epochs"]]
    return recs if done and running else None


def _run_dirs(exp: Path) -> list[str]:
    runs = exp / "train_runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def _assert_front_kept_as_weights_only(exp: Path, objectives) -> dict[str, dict]:
    """Every trial completed; those on the front keep their weights alone, the others nothing; no Train run left."""
    recs = _records(exp)
    assert {r["status"] for r in recs.values()} == {"completed"}
    front = _front_ids(recs.values(), objectives)
    for tid, rec in recs.items():
        if tid in front:
            assert rec["checkpoint_kept"] == WEIGHTS and rec["checkpoint_path"] == f"{exp}/{WEIGHTS_DIR}/{tid}.pt"
            state = torch.load(rec["checkpoint_path"], weights_only=True)
            assert "model" in state and not {"optimizer", "scheduler"} & set(state)
        else:
            assert rec["checkpoint_path"] is None and rec["checkpoint_kept"] == NONE
    assert sorted(p.name for p in (exp / WEIGHTS_DIR).iterdir()) == sorted(f"{t}.pt" for t in front)
    assert _run_dirs(exp) == []
    return recs


@pytest.mark.slow
def test_a_finished_campaign_under_the_default_policy_reports_and_resumes(ray_local, tmp_path, capsys):
    from qkvsearch.search.campaign.launch import launch, resume

    variants = [{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.25}, {"embedding": "psne"}]
    raw = tiny_spec(tmp_path, "front", workers=1, epochs=1, variants=variants, steps=2, keep="front")
    exp = Path(launch(load_campaign(raw)))
    recs = _assert_front_kept_as_weights_only(exp, raw["objectives"])

    assert main(["report", str(exp), "--out", str(tmp_path / "report")]) == 0  # reads records, not checkpoints
    assert (tmp_path / "report" / "pareto.csv").is_file()
    capsys.readouterr()
    assert main(["status", str(exp)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("storage: "))
    assert "of it checkpoints (checkpoints: keep front)" in line

    resume(str(exp))  # nothing to restore: the trials ended, their pruned runs are not looked for
    assert _records(exp) == recs and _run_dirs(exp) == []


@pytest.mark.slow
def test_keep_all_keeps_every_checkpoint_as_training_left_it(ray_local, tmp_path, capsys):
    from qkvsearch.search.campaign.launch import launch

    raw = tiny_spec(tmp_path, "kept", workers=1, epochs=1, steps=2,
                    variants=[{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.25}])
    exp = Path(launch(load_campaign(raw)))
    recs = _records(exp)
    assert {r["status"] for r in recs.values()} == {"completed"} and len(_run_dirs(exp)) == 2
    for rec in recs.values():
        assert "checkpoint_kept" not in rec
        state = torch.load(Path(rec["checkpoint_path"]) / "state.pt", weights_only=True)
        assert {"model", "optimizer"} <= set(state)
    assert not (exp / WEIGHTS_DIR).exists()
    assert main(["status", str(exp)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("storage: "))
    total = sum(p.stat().st_size for p in exp.rglob("*") if p.is_file() and not p.is_symlink())
    shown = line.split()[1:3]
    assert abs(float(shown[0]) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[shown[1]] - total) <= 0.01 * total, (line, total)
