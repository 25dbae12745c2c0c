"""One live driver per campaign, then a campaign's driver killed (SIGKILL) mid-trial, on local Ray.

While the driver runs, a second `resume` and a `launch --overwrite` exit 2 at once, naming it, and neither
trains nor deletes anything. Killed, its hold stays live until it goes stale: an early `resume` is refused,
a later one takes the hold over and finishes the campaign: no trial that ended before the kill trains again,
none is lost, every trial's epochs are 1..n once each (the interrupted one's too: its Train run goes on for a
moment after the driver died, checkpointing epochs no one recorded), MO-ASHA's rungs rebuilt from the records
hold what they held at the kill, and the searcher (Tune's trial count, NSGA-II's study and generations) goes
on where it was."""
from __future__ import annotations

import csv
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import tiny_space
from helpers.live_campaign import (
    end_ray_processes,
    folder_state,
    named_checkpoint_epochs,
    ray_temp_folder,
    remove_ray_temp_folder,
    started,
    stopped,
    tiny_spec,
    wait_for,
    wait_while_advancing,
    write_spec,
)

from qkvsearch.search.cli import EXIT_BAD_INPUT
from qkvsearch.search.records.layout import FINAL_STATUSES
from qkvsearch.search.records.lease import LEASE_FILE, STALE_ENV, read_lease
from qkvsearch.search.records.readers import read_trial_records

pytestmark = pytest.mark.slow

QKVSEARCH = str(Path(sys.executable).with_name("qkvsearch"))
NAME = "killed"
TRIALS = 3
TRAINED = ("completed", "stopped_early")
LINGER_S = 5  # a killed driver's trials and Train workers end within seconds
# The killed driver's hold on the campaign goes stale this long after its last heartbeat: long enough for a
# second driver started at once to find it still held, short enough not to wait long for it.
STALE_S = 12


def _spec(storage: Path) -> dict:
    spec = tiny_spec(storage, NAME, workers=2, epochs=4, variants=[], steps=4)
    spec["space"] = tiny_space({"embedding": {"choice": ["linear", "sne", "psne", "fsne"]},
                                "hidden_width": {"choice": [0.5, 1.0]}, "code_size": {"choice": [4, 8]}})
    spec["search"] = {"algorithm": "nsga2", "num_trials": TRIALS, "population_size": 2, "seed": 0}
    spec["scheduler"] = {"type": "moasha", "grace_epochs": 1, "reduction_factor": 2, "brackets": 1}
    return spec


class _Driver:
    """`qkvsearch <args>` in its own process with its own local Ray (its own RAY_TMPDIR: a short folder, as
    Ray's socket paths must stay under 108 characters)."""

    def __init__(self, args: list[str], cwd: Path):
        self.ray_tmp = ray_temp_folder()
        env = {**os.environ, "RAY_TMPDIR": self.ray_tmp, "PYTHONUNBUFFERED": "1", STALE_ENV: str(STALE_S)}
        env.pop("RAY_ADDRESS", None)
        self.err = cwd / f"{args[0]}.err"
        with open(cwd / f"{args[0]}.out", "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([QKVSEARCH, *args], stdout=out, stderr=err, env=env, cwd=cwd)
        started(self.proc, self.ray_tmp)

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"qkvsearch exited {self.proc.returncode}: {self.err.read_text()[-3000:]}")

    def gone(self) -> None:
        """Wait for this driver's Ray processes to end (helpers.live_campaign.end_ray_processes), then remove
        its Ray's folder."""
        end_ray_processes(self.ray_tmp, LINGER_S)
        stopped(self.proc)
        remove_ray_temp_folder(self.ray_tmp)


def _refused_beside(launch: _Driver, spec_file: Path, exp: Path, tmp: Path) -> None:
    """While `launch` runs and holds the campaign: `resume` and `launch --overwrite` (at once, side by side)
    exit 2 naming it, announce no campaign of their own, and replace or delete nothing; `status` shows the
    live driver."""
    wait_while_advancing(lambda: launch.alive() or (read_lease(exp).live and (exp / "qs_campaign.json").exists()),
                         lambda: folder_state(launch.err, exp), "the driver's hold and campaign file")
    created = json.loads((exp / "qs_campaign.json").read_text())["created_at"]
    before = set(_records(exp))
    seconds = []
    others = []
    for args in (["resume", str(exp)], ["launch", str(spec_file), "--overwrite"]):
        (tmp / args[0]).mkdir()
        others.append(_Driver(args, tmp / args[0]))
    started = time.monotonic()
    for other in others:
        assert other.proc.wait(120) == EXIT_BAD_INPUT, other.err.read_text()[-3000:]
        seconds.append(time.monotonic() - started)
        err = other.err.read_text()
        assert "campaign held by a live driver" in err and f"pid {launch.proc.pid}" in err and "last heartbeat" in err
        assert "results:" not in (other.err.parent / f"{other.err.stem}.out").read_text()
        other.gone()
    launch.alive()
    assert json.loads((exp / "qs_campaign.json").read_text())["created_at"] == created  # not replaced
    assert before <= set(_records(exp))  # no record deleted
    status = subprocess.run([QKVSEARCH, "status", str(exp)], capture_output=True, text=True, cwd=tmp)
    assert f"driver: live, host {os.uname().nodename}, pid {launch.proc.pid}" in status.stdout, status.stdout
    print(f"\nrefused at once beside a live driver: resume and launch --overwrite in {max(seconds):.1f} s")


def _records(exp) -> dict[str, dict]:
    try:
        records, _ = read_trial_records(exp)
    except Exception:  # noqa: BLE001  (not written yet)
        return {}
    return {r["trial_id"]: r for r in records}


def _kill_point(exp: Path) -> dict | None:
    """The records once a trial has ended trained and another has recorded an epoch but not ended, at best
    while that one's Train run holds a checkpoint of an epoch its record lacks (the report on its way: resumed
    from there, the trial must report that epoch again). That moment lasts a report's trip from Train to the
    recorder; when no check catches it before a second trial has ended, any point mid-trial will do (the
    killed Train run often goes on to checkpoint an epoch of its own)."""
    records = _records(exp)
    ended = [r for r in records.values() if r["status"] in TRAINED]
    running = [r for r in records.values() if r["status"] == "running" and r["epochs"]]
    if not ended or not running:
        return None
    return records if len(ended) > 1 or any(_checkpoint_ahead(exp, r) for r in running) else None


def _checkpoint_ahead(exp: Path, rec: dict) -> bool:
    run = exp / "train_runs" / f"{NAME}-{rec['trial_name']}"  # search.campaign.driver.train_run_name
    return (run / f"checkpoint_epoch_{len(rec['epochs']) + 1:04d}" / "state.pt").exists()


def _rungs(spec: dict, exp: Path, trial_ids) -> dict:
    """MO-ASHA's state rebuilt from the records at exp, as a restored campaign's scheduler rebuilds it."""
    from qkvsearch.search.campaign.opened import OpenedCampaign
    from qkvsearch.search.campaign.run import _scheduler
    from qkvsearch.spaces import load_campaign

    sched = _scheduler(OpenedCampaign(load_campaign(spec), str(exp)))
    for trial_id in trial_ids:  # one bracket: the order Tune adds trials back does not matter
        sched.on_trial_add(None, SimpleNamespace(trial_id=trial_id, experiment_tag=""))
    state = sched.get_state()
    return {"recorded": state["recorded"], "stopped": state["stopped"]}


def _searcher(exp: Path) -> tuple[int, list]:
    """Tune's trial count and NSGA-II's trials [(number, params, generation, state)] as last saved at exp."""
    import ray.cloudpickle as cloudpickle

    with open(sorted(glob.glob(f"{exp}/search_gen_state-*.json"))[-1], "rb") as f:
        counter = cloudpickle.load(f)["counter"]
    with open(sorted(glob.glob(f"{exp}/searcher-state-*.pkl"))[-1], "rb") as f:
        study = json.load(f)["searcher"]["trials"]  # search.searchers.state: plain data
    trials = [(t["number"], t["params"], next(v for k, v in t["system_attrs"].items() if k.endswith(":generation")),
               t["state"]) for t in study]
    return counter, trials


def _epochs_in_file(exp: Path, trial_id: str) -> list[int]:
    path = exp / "qs_trials" / f"{trial_id}.epochs.csv"
    if not path.exists():
        return []
    with open(path) as f:
        return [int(float(row["epoch"])) for row in csv.DictReader(f)]


def _first_step_after(records, after: float) -> float:
    """Unix time of the first training step taken after ``after``: a trial's first step (its record), or,
    for a trial resumed from a checkpoint, the first step of the process that trained on from it (each epoch
    of a checkpoint's history names it)."""
    from qkvsearch.trainers.training.engine import load_state

    starts = [rec["first_step_at"] for rec in records if rec.get("first_step_at")]
    starts += [m["qs_first_step_at"] for rec in records if rec["status"] == "completed"
               for m in load_state(rec["checkpoint_path"])["history"]]
    return min(s for s in starts if s > after)


def test_a_killed_driver_resumes_without_losing_or_retraining_anything(tmp_path):
    spec = _spec(tmp_path / "results")
    spec_file = write_spec(tmp_path / "spec.yaml", spec)
    exp = tmp_path / "results" / NAME

    launch = _Driver(["launch", str(spec_file)], tmp_path)
    try:
        _refused_beside(launch, spec_file, exp, tmp_path)
        wait_while_advancing(lambda: launch.alive() or _kill_point(exp), lambda: folder_state(launch.err, exp),
                             "a trial mid-way after one has ended", every=0.05)
    finally:
        launch.proc.send_signal(signal.SIGKILL)
        launch.proc.wait()
    killed_at = time.time()
    (tmp_path / "early").mkdir()
    early = _Driver(["resume", str(exp)], tmp_path / "early")  # the dead driver's hold is still live
    assert early.proc.wait(120) == 2, early.err.read_text()[-3000:]
    said = early.err.read_text()
    assert f"pid {launch.proc.pid}" in said and f"goes stale {STALE_S:g} s after" in said, said
    early.gone()
    at_kill = tmp_path / "at_kill"  # what the driver had written: records and Tune's saved state
    shutil.copytree(exp, at_kill, ignore=shutil.ignore_patterns("train_runs"))
    launch.gone()

    before = _records(at_kill)
    (interrupted,) = [r["trial_id"] for r in before.values() if r["status"] == "running"]
    gap = _checkpoint_ahead(exp, before[interrupted])  # resumed from there, the epoch must be reported again
    counter, study = _searcher(at_kill)
    assert counter == len(before) == len(study), "Tune's saved state lacks a trial the driver had started"

    wait_for(lambda: read_lease(exp).stale, 2 * STALE_S, "the killed driver's hold to go stale")
    started = time.time()
    resume = _Driver(["resume", str(exp)], tmp_path)
    wait_while_advancing(lambda: resume.proc.poll() is not None, lambda: folder_state(resume.err, exp),
                         "the resumed campaign to end")
    assert resume.proc.returncode == 0, resume.err.read_text()[-3000:]
    resume.gone()
    assert "took over the stale hold" in resume.err.read_text()
    assert not (exp / LEASE_FILE).exists()  # released at the end

    after = _records(exp)
    assert len(after) == TRIALS and set(before) <= set(after)  # none lost, no more than planned
    for trial_id, rec in before.items():
        if rec["status"] in FINAL_STATUSES:  # ended before the kill: untouched
            assert after[trial_id] == rec, trial_id
    assert after[interrupted]["status"] in TRAINED
    for trial_id, rec in after.items():
        assert rec["status"] in FINAL_STATUSES, rec
        epochs = [int(e["epoch"]) for e in rec["epochs"]]
        assert epochs == _epochs_in_file(exp, trial_id) == list(range(1, len(epochs) + 1)), (rec["trial_name"], epochs)
        if rec["status"] == "completed":
            assert len(epochs) == rec["epochs_planned"]
    assert not (exp / "qs_scheduler.json").exists()
    trained = [r for r in after.values() if r["epochs"]]
    assert len(list((exp / "train_runs").iterdir())) == len(trained)  # one Train run per trained trial

    rungs_before, rungs_after = _rungs(spec, at_kill, before), _rungs(spec, exp, after)
    assert rungs_before["recorded"][0][0], "the first rung held results at the kill"
    for was, now in zip(rungs_before["recorded"][0], rungs_after["recorded"][0]):
        assert {t: now[t] for t in was} == was  # every rung entry the kill found, as it was
    assert {t: rungs_after["stopped"][t] for t in rungs_before["stopped"]} == rungs_before["stopped"]

    counter_after, study_after = _searcher(exp)
    assert counter_after == TRIALS and len(study_after) == TRIALS  # the searcher went on: no trial twice
    assert [t[:3] for t in study_after[:len(study)]] == [t[:3] for t in study]  # number, params, generation
    assert min(g for _, _, g, _ in study_after[len(study):]) >= max(g for _, _, g, _ in study)
    assert {s for *_, s in study_after} <= {"COMPLETE", "PRUNED", "FAIL"}

    for name, (last, named) in named_checkpoint_epochs(after.values()).items():
        assert named == last, f"{name}: its record names the checkpoint of epoch {named}, its last epoch is {last}"
    first_step = _first_step_after(after.values(), killed_at)
    print(f"\nkilled with a checkpoint ahead of the record: {gap}; "
          f"resume -> first new training step: {first_step - started:.1f} s")
