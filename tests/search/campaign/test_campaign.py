"""End-to-end campaigns on local Ray: real Tune trials on digits. The campaign whose trials end every way a
trial can runs them with one worker each (Train's local mode in the trial's process, the cheap path); a
2-worker campaign under MO-ASHA, whose stopped trial must give its worker group back, is the one
tests/search/monitor/test_watching.py watches."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import PRESETS, TINY_MODEL, tiny_model, tiny_space
from helpers.live_campaign import named_checkpoint_epochs

from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.search.cli import main
from qkvsearch.search.monitor.status import load_records
from qkvsearch.search.records.proposals import PROPOSALS_DIR
from qkvsearch.spaces import load_campaign
from qkvsearch.spaces.keys import identity, require_filled

pytestmark = pytest.mark.slow

QUICKSTART = PRESETS / "quickstart.yaml"


def _spec(tmp: Path) -> dict:
    """A grid whose trials end every way a trial can: completed, stopped early (the learning-rate
    sweep: MO-ASHA stops the poor ones at the first rung), infeasible, diverged and failed."""
    lr_sweep = [{"embedding": "linear", "lr": lr} for lr in (3e-3, 2e-3, 1e-6, 1e-7)]
    return {
        "name": "mixed-endings",
        "model": tiny_model(),
        "data": {"dataset": "digits"},
        "train": {"epochs": 3, "batch_size": 64, "lr": 2e-3, "warmup_epochs": 0,
                  "max_steps_per_epoch": 6, "seed": 0},
        # Grid order is run order; the first result at a rung always goes on, so the crash comes first.
        "space": tiny_space({"variants": [
            {"embedding": "psne"},                                           # a crash in the worker (FAULTS)
            {"embedding": "sne"},                                            # non-finite loss (FAULTS)
            *lr_sweep,
            {"embedding": "fsne", "hidden_width": 0.25, "code_size": 4},    # the fewest MACs: on the front
            {"embedding": "fsne", "hidden_width": 4.0, "code_size": 8},     # breaks params_m max
        ]}),
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
        "constraints": {"params_m": {"max": 1.0}},  # 0.90M at width 1, 1.08M at width 4
        "search": {"algorithm": "grid"},
        # one bracket: every trial is judged at epoch 1, so the lowest learning rates are the ones stopped
        "scheduler": {"type": "moasha", "grace_epochs": 1, "reduction_factor": 2, "brackets": 1},
        # no restarts: the injected crash after epoch 1 must end its trial as failed (a restart from the
        # epoch-1 checkpoint would not crash again; tests/test_failures.py covers restarts)
        # one worker: Train's local mode in the trial's process, which Tune reuses for the next trial
        "resources": {"workers_per_trial": 1, "cpus_per_worker": 1, "max_concurrent_trials": 1, "max_failures": 0},
        "checkpoints": {"keep": "all"},  # the tests read the checkpoints as training leaves them
        "storage": str(tmp),
    }


# Injected faults reach the trials through the environment of the process that launches the campaign.
FAULTS = json.dumps([{"when": {"embedding": "psne"}, "fail_after_epoch": 1},
                     {"when": {"embedding": "sne"}, "nan_at_update": 2}])


def _run_name(record: dict) -> str:
    """A trial's Train run: <campaign>-<trial name>, so Ray's Train metrics and logs name the trial."""
    return f"{record['campaign']}-{record['trial_name']}"


@pytest.fixture(scope="module")
def campaign(ray_local, tmp_path_factory):
    from qkvsearch.search.campaign.launch import launch

    tmp = tmp_path_factory.mktemp("campaign")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKVSEARCH_FAULTS", FAULTS)
        mp.setenv("QKVSEARCH_TUNE_DEFAULTS", "1")  # Tune's result.json files: _trial_pids reads them
        exp = launch(load_campaign(_spec(tmp)))
    return Path(exp), load_records(exp)


def test_every_trial_is_recorded_with_config_status_metrics_and_cost(campaign):
    exp, records = campaign
    assert len(records) == 7  # the configuration that breaks a constraint never became a trial
    for rec in records:
        assert require_filled(rec["config"]) and rec["config"]["model"] == TINY_MODEL  # resolved once
        assert isinstance(rec["config"]["width"], int)
        assert rec["cost"]["params_m"] > 0 and rec["cost"]["gmacs"] > 0
        assert rec["status"] in ("completed", "stopped_early", "infeasible", "diverged", "failed")
        for epoch in rec["epochs"]:
            assert {"epoch", "top1", "top5", "val_loss", "train_loss", "lr", "train_s"} <= set(epoch)
            assert not set(epoch) & {"params_m", "gmacs"}  # the cost is the record's, once
            assert all(math.isfinite(v) for v in epoch.values())
        name = rec["trial_name"]
        if rec["config"]["embedding"] == "fsne":  # the name says what the config holds
            cfg = rec["config"]
            assert cfg["code_sharing"] == "shared"
            assert name.startswith(f"fsne-h{cfg['width']}-c{cfg['code_size']}-shared")
        else:
            assert rec["config"]["code_size"] is None and rec["config"]["code_sharing"] is None
    statuses = sorted(r["status"] for r in records)
    assert statuses.count("infeasible") == 0  # recorded as a proposal (test_infeasible_configuration_...)
    assert statuses.count("diverged") == 1
    assert statuses.count("failed") == 1


def test_moasha_stops_poor_trials_early_and_they_are_not_completed(campaign):
    _, records = campaign
    sweep = [r for r in records if r["config"].get("embedding") == "linear"]
    done = [r for r in sweep if r["status"] == "completed"]
    stopped = [r for r in sweep if r["status"] == "stopped_early"]
    assert done and stopped
    assert all(len(r["epochs"]) < r["epochs_planned"] for r in stopped)
    assert all(len(r["epochs"]) == r["epochs_planned"] for r in done)
    # The lowest learning rates cannot learn in 6 steps: they are the ones stopped.
    assert min(r["config"]["lr"] for r in done) > max(r["config"]["lr"] for r in stopped)
    best = max(r["epochs"][-1]["top1"] for r in done)
    assert best > 30.0, f"the best completed trial should be well above chance (10%), given {best:.1f}%"


def test_a_trial_stopped_early_frees_its_process_for_the_next_trials(campaign):
    """One worker: Train's local mode in the trial's process, which Tune reuses for the next trial."""
    exp, records = campaign
    pids = _trial_pids(exp)
    for stopped in (r for r in records if r["status"] == "stopped_early"):
        later = [r for r in records if r["started_at"] >= stopped["ended_at"] and r["trial_id"] in pids]
        assert any(pids[r["trial_id"]] == pids[stopped["trial_id"]] for r in later), stopped["trial_name"]
    assert len(set(pids.values())) < len(pids)
    for rec in (r for r in records if r["status"] == "completed"):
        assert [e["epoch"] for e in rec["epochs"]] == [1.0, 2.0, 3.0] and rec["first_step_at"] > rec["started_at"]
        kept = sorted(p.name for p in (exp / "train_runs" / _run_name(rec)).iterdir())
        assert kept == ["checkpoint_epoch_0002", "checkpoint_epoch_0003"]  # Train's num_to_keep=2
        assert rec["checkpoint_path"].endswith("checkpoint_epoch_0003")


def test_every_trial_that_trained_names_the_checkpoint_of_its_last_epoch(campaign):
    """A Train run waits in each report until Tune has decided on it: a trial MO-ASHA stopped registered no
    checkpoint past its last recorded epoch, so Train's num_to_keep kept that epoch's."""
    _, records = campaign
    named = named_checkpoint_epochs(records, ("completed", "stopped_early"))
    assert {r["status"] for r in records if r["trial_name"] in named} == {"completed", "stopped_early"}
    assert all(last == epoch for last, epoch in named.values()), named


def _trial_pids(exp: Path) -> dict[str, int]:
    """The process each trial ran in, from Tune's result.json files (the records leave Tune's keys out)."""
    pids = {}
    for path in exp.glob("*/result.json"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            pids[row["trial_id"]] = row["pid"]
    return pids


def test_infeasible_configuration_never_starts_a_trainer(campaign):
    exp, records = campaign
    assert not [r for r in records if r["status"] == "infeasible"]
    (infeasible,) = [json.loads(p.read_text()) for p in (exp / PROPOSALS_DIR).glob("*.json")]
    assert infeasible["status"] == "infeasible" and infeasible["cost"]["params_m"] > 1.0
    assert "params_m" in infeasible["error"] and infeasible["config"]["hidden_width"] == 4.0
    started = {p.name for p in (exp / "train_runs").iterdir()}
    # the proposal never started (a trial that ended before its first checkpoint has no folder: local mode)
    assert started <= {_run_name(r) for r in records}


def test_diverged_and_failed_trials_do_not_stop_the_campaign(campaign):
    _, records = campaign
    (diverged,) = [r for r in records if r["status"] == "diverged"]
    assert "epoch" in diverged["error"] and "step" in diverged["error"]
    (failed,) = [r for r in records if r["status"] == "failed"]
    assert failed["error"]
    later = [r for r in records if r["started_at"] > max(diverged["ended_at"], failed["ended_at"])]
    assert any(r["status"] == "completed" for r in later), "trials after the failures must still run"


def test_status_command_lists_every_trial(campaign, capsys):
    exp, records = campaign
    assert main(["status", str(exp)]) == 0
    out = capsys.readouterr().out
    for rec in records:
        assert rec["trial_name"] in out
    assert "7 trial(s)" in out


def test_report_marks_exactly_the_front_of_completed_trials(campaign, tmp_path):
    from qkvsearch.search.analysis.report import build_report

    exp, records = campaign
    written = build_report(str(exp), out_dir=str(tmp_path), static=False)
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    trials = pq.read_table(written["trials"]).to_pandas()
    assert len(trials) == len(records)
    done = [r for r in records if r["status"] == "completed"]
    values = np.array([[r["epochs"][-1]["top1"], r["cost"]["gmacs"]] for r in done])
    expected = {r["trial_id"] for r, on in zip(done, nondominated_mask(values, ["max", "min"])) if on}
    front_csv = pd.read_csv(written["csv"], dtype=str)
    assert set(front_csv["trial_id"]) == expected
    (fsne,) = [r for r in done if r["config"]["embedding"] == "fsne"]
    assert fsne["trial_id"] in expected  # the fewest MACs
    row = front_csv[front_csv["trial_id"] == fsne["trial_id"]].iloc[0]
    assert (row["config_code_sharing"], row["config_code_size"], row["config_width"]) == ("shared", "4", "32")
    table = pq.read_table(written["trials"])
    assert table.schema.field("config_code_size").type == pa.int64()
    assert table.schema.field("config_width").type == pa.int64()
    html = Path(written["html"]).read_text()
    assert all(r["trial_name"] in html for r in records)

    from helpers.browser import chromium_path, render

    if chromium_path() is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    errors = render(written["html"], str(tmp_path / "report.png"))
    assert errors == []


def test_quickstart_smoke_test_through_the_command_line(ray_local, tmp_path, capsys):
    # one worker per trial: the preset's 2-worker DDP trials cost ~12 s each here (2-worker campaigns:
    # test_watching, test_driver_kill)
    code = main(["launch", str(QUICKSTART), "--smoke-test", "--set", f"storage={tmp_path}",
                 "--set", "resources.workers_per_trial=1"])
    out = capsys.readouterr().out
    assert code == 0, out
    exp = next(p for p in tmp_path.iterdir() if (p / "qs_campaign.json").exists())
    records = load_records(str(exp))
    assert records, "a smoke-test campaign must run at least one trial"
    assert any(r["status"] in ("completed", "stopped_early") for r in records)
    for rec in records:
        assert rec["config"] and rec["cost"]["gmacs"] > 0
        if rec["status"] == "completed":
            assert rec["epochs"] and "top1" in rec["epochs"][-1]
    saved = json.loads((exp / "qs_campaign.json").read_text())
    assert saved["spec"]["name"] == exp.name
    assert str(exp) in out


def _small(tmp: Path, name: str, space: dict, search: dict) -> dict:
    return {"name": name, "model": tiny_model(),
            "data": {"dataset": "digits", "val_fraction": 0.1},
            "train": {"epochs": 1, "batch_size": 32, "warmup_epochs": 0, "max_steps_per_epoch": 2},
            "space": tiny_space(space),
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": search, "resources": {"workers_per_trial": 1, "max_concurrent_trials": 1},
            "checkpoints": {"keep": "all"}, "storage": str(tmp)}


def test_no_configuration_trains_twice(ray_local, tmp_path):
    """3 distinct configurations (sne at width 0.5 of d = 64 units is one model), 8 trials: 3 trainers."""
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import launch

    space = {"embedding": ["linear", "sne", "psne"], "hidden_width": [0.5, 64]}
    exp = Path(launch(load_campaign(_small(tmp_path, "dedupe", space, {"algorithm": "random", "num_trials": 8,
                                                                         "seed": 3}))))
    records = load_records(str(exp))
    trained = [r for r in records if r["status"] != "duplicate"]
    duplicates = [r for r in records if r["status"] == "duplicate"]
    assert len(records) == 8 and len(trained) == 3 and len(duplicates) == 5
    assert {r["config"]["embedding"] for r in trained} == {"linear", "sne", "psne"}
    assert sorted(p.name for p in (exp / "train_runs").iterdir() if p.is_dir()) == sorted(_run_name(r) for r in trained)
    by_id = {r["trial_id"]: r for r in trained}
    for dup in duplicates:
        original = by_id[dup["duplicate_of"]]
        assert dup["epochs"] == [] and identity(dup["config"]) == identity(original["config"])
    written = build_report(str(exp), out_dir=str(tmp_path / "report"), static=False)
    import pyarrow.parquet as pq

    table = pq.read_table(written["trials"]).to_pandas()
    plotted = table[table["final_top1"].notna() & table["gmacs"].notna()]
    assert len(plotted) == 3 and set(plotted["status"]) == {"completed"}


def test_repeats_train_each_configuration_with_successive_seeds(ray_local, tmp_path):
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import launch

    exp = Path(launch(load_campaign(_small(tmp_path, "repeats", {"embedding": ["sne"]},
                                           {"algorithm": "grid", "repeats": 2}))))
    records = load_records(str(exp))
    assert sorted(r["config"]["seed"] for r in records) == [0, 1] and {r["status"] for r in records} == {"completed"}
    md = Path(build_report(str(exp), out_dir=str(tmp_path / "report"), static=False)["md"]).read_text()
    assert "## Repeated configurations" in md and "| 0, 1 |" in md


def test_front_repeats_train_the_front_under_more_seeds_after_repeats_of_any_searcher(ray_local, tmp_path):
    """random search with repeats 2 (one configuration proposed, trained under seeds 0 and 1), then front_repeats 3:
    the front's configuration trains once more, under seed 2, through the ordinary trial path in a Tune experiment
    of its own; the campaign plans and ends with it, and the report gives the front point its mean over 3 seeds."""
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import launch
    from qkvsearch.search.monitor.progress import read_progress
    from qkvsearch.search.records.front_repeats import read_plan

    search = {"algorithm": "random", "num_trials": 2, "repeats": 2, "front_repeats": 3, "seed": 0}
    exp = Path(launch(load_campaign(_small(tmp_path, "front-repeats", {"embedding": ["sne", "psne"]}, search))))
    records = sorted(load_records(str(exp)), key=lambda r: r["config"]["seed"])
    assert [r["config"]["seed"] for r in records] == [0, 1, 2] and {r["status"] for r in records} == {"completed"}
    assert len({identity(r["config"], ignore=("seed",)) for r in records}) == 1
    plan = read_plan(str(exp))
    assert plan["front_repeats"] == 3 and [r["seed"] for r in plan["runs"]] == [2] and len(plan["front"]) == 1
    assert plan["baseline"] == []   # no linear configuration in this space
    assert (exp / "front_repeats" / "tuner.pkl").exists()
    progress = read_progress(str(exp))
    assert progress.trials_planned == 3 and progress.ended
    md = Path(build_report(str(exp), out_dir=str(tmp_path / "report"), static=False)["md"]).read_text()
    front = md.split("## Pareto front")[1].split("##")[0]
    head, _, row = front.strip().splitlines()[:3]
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    top1 = [r["epochs"][-1]["top1"] for r in records]
    assert cells["seeds"] == "3" and float(cells["top1 mean"]) == pytest.approx(np.mean(top1), abs=5e-3)
