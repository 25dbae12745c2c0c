"""search.campaign.stages' choice of configurations, the checkpoints retention keeps for the stages, and the
stages' table and front (search.analysis.stages), on campaign folders written without training."""
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest
from helpers.campaign_files import write_campaign

from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.analysis.stages import stage_markdown, stage_table
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.campaign.retention import still_needed
from qkvsearch.search.campaign.stages import finetune_config, select_trials
from qkvsearch.search.records.stages import stage_key, write_selection, write_stage
from qkvsearch.spaces import base_config, load_campaign

STATUSES = ["completed", "stopped_early", "completed", "completed", "failed", "completed", "completed"]


def _spec(**stages):
    d = load_campaign("quickstart").to_dict()
    d["objectives"] = [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]
    ood = {"in_distribution": "digits_0to8", "datasets": [{"format": "noise"}]}
    d["stages"] = {"finetune": [{"dataset": "digits_0to8", "epochs": 1}, {"dataset": "digits", "epochs": 1}],
                   "ood": ood, "objectives": ["fpr95", "top1@digits"], **stages}
    return load_campaign(d)


@pytest.fixture
def exp(tmp_path):
    write_campaign(tmp_path, STATUSES)
    return str(tmp_path)


def test_the_front_of_the_completed_trials_goes_on_and_no_trial_stopped_early(exp):
    chosen = {t["trial_id"] for t in select_trials(OpenedCampaign(_spec(), exp))}
    trials, _ = collect(exp)
    df = trials.to_pandas()
    done = df[df["status"] == "completed"]
    front = nondominated_mask(done[["final_top1", "gmacs"]].to_numpy(), ["max", "min"])
    assert chosen == set(done["trial_id"][front]) and "t00001" not in chosen


def test_top_k_goes_by_non_dominated_rank(exp):
    front = {t["trial_id"] for t in select_trials(OpenedCampaign(_spec(), exp))}
    chosen = select_trials(OpenedCampaign(_spec(select="top_k", top_k=len(front) + 1), exp))
    assert len(chosen) == len(front) + 1 and front < {t["trial_id"] for t in chosen}
    assert all(t["upstream"].endswith("@epoch6") for t in chosen)
    assert len(select_trials(OpenedCampaign(_spec(select="top_k", top_k=99), exp))) == STATUSES.count("completed")


def test_as_completed_keeps_those_chosen_earlier_and_adds_the_front(exp):
    front = {t["trial_id"] for t in select_trials(OpenedCampaign(_spec(), exp))}
    assert {t["trial_id"] for t in select_trials(OpenedCampaign(_spec(select="as_completed"), exp))} == front
    trials = collect(exp)[0].to_pandas()
    dominated = next(t for t, s in zip(trials["trial_id"], trials["status"]) if s == "completed" and t not in front)
    write_selection(exp, "as_completed", [dominated, "t00001"], time.time())  # t00001 stopped early: never
    chosen = select_trials(OpenedCampaign(_spec(select="as_completed"), exp))
    assert {t["trial_id"] for t in chosen} == front | {dominated}


def test_a_stage_runs_on_its_own_resources_else_the_campaigns():
    from types import SimpleNamespace

    from qkvsearch.search.campaign.stages import stage_resources

    campaign = SimpleNamespace(workers=2, cpus_per_worker=1.0, gpus_per_worker=0.0)
    own = _spec(finetune=[{"dataset": "digits", "epochs": 1, "resources": {"gpus_per_worker": 1}}],
                ood={"in_distribution": "digits", "datasets": [{"format": "noise"}]}).stages
    assert stage_resources(own.finetune[0], campaign) == (2, 1.0, 1)
    assert stage_resources(own.ood, campaign) == (2, 1.0, 0.0)


def test_a_fine_tuning_config_is_the_trials_on_the_stages_dataset():
    trial = {**base_config(load_campaign("quickstart")), "embedding": "linear", "lr": 0.1, "epochs": 5}
    cfg = finetune_config(trial, _spec().stages.finetune[0])
    assert (cfg["dataset"], cfg["num_classes"], cfg["epochs"], cfg["lr"]) == ("digits_0to8", 9, 1, 0.1)
    assert cfg["img_size"] == trial["img_size"] and cfg["max_steps_per_epoch"] == trial["max_steps_per_epoch"]


def test_retention_keeps_every_completed_trial_until_the_selection_then_those_with_stages_to_run(exp):
    spec, (trials, _) = _spec(), collect(exp)
    completed = {r for r, s in zip(trials.column("trial_id").to_pylist(), STATUSES) if s == "completed"}
    assert still_needed(OpenedCampaign(spec, exp), trials) == completed
    assert still_needed(OpenedCampaign(load_campaign("quickstart"), exp), trials) == set()  # no stages: nothing held
    chosen = ["t00000", "t00002"]
    write_selection(exp, "front", chosen, time.time())
    assert still_needed(OpenedCampaign(spec, exp), trials) == set(chosen)
    for stage in ("finetune@digits_0to8", "finetune@digits", "ood"):
        _record(exp, "t00000", stage, {})
    assert still_needed(OpenedCampaign(spec, exp), trials) == {"t00002"}


def _record(exp, tid, stage, metrics, status="completed", started=None):
    key = stage_key(tid, stage, {})
    write_stage(exp, {"key": key, "stage": stage, "trial_id": tid, "trial_name": f"name-{tid}", "status": status,
                      "metrics": metrics, "started_at": started or time.time(), "duration_s": 1.5})


def test_the_stage_table_ranks_on_the_stage_objectives(exp):
    spec = _spec(constraints={"auroc": {"min": 60}})
    write_selection(exp, "top_k", ["t00000", "t00002", "t00003", "t00005"], time.time())
    ood = {"t00000": (30.0, 90.0), "t00002": (10.0, 95.0), "t00003": (20.0, 50.0), "t00005": (5.0, 99.0)}
    top1 = {"t00000": 90.0, "t00002": 80.0, "t00003": 99.0, "t00005": 70.0}
    for tid, (fpr, auroc) in ood.items():
        _record(exp, tid, "finetune@digits_0to8", {"top1@digits_0to8": 60.0})
        if tid != "t00005":
            _record(exp, tid, "finetune@digits", {"top1@digits": top1[tid]})
        _record(exp, tid, "ood", {"fpr95": fpr, "auroc": auroc})
    trials, _ = collect(exp)
    df = stage_table(exp, spec.stages, trials)
    by_id = df.set_index("trial_id")
    assert by_id.loc["t00000", "transfer_avg"] == 75.0 and np.isnan(by_id.loc["t00005", "transfer_avg"])
    assert not by_id.loc["t00003", "feasible"]  # auroc 50 < 60
    # fpr95 (min) and top1@digits (max): t00002 (10, 80) and t00000 (30, 90) are both on the front
    assert list(df["trial_id"][:2]) == ["t00002", "t00000"] and list(df["stage_rank"][:2]) == [0, 0]
    assert np.isnan(by_id.loc["t00005", "stage_rank"])  # never reached finetune@digits
    md = stage_markdown(df, spec.stages)
    assert "## Stages" in md and "fpr95 (min), top1@digits (max)" in md
    assert pa.Table.from_pandas(df).num_rows == 4


def test_stage_data_is_checked_before_launch_naming_the_field(tmp_path):
    from qkvsearch.search.campaign.stages import check_stages
    from qkvsearch.spaces import SpecError

    (tmp_path / "empty").mkdir()
    d = load_campaign("quickstart").to_dict()
    d["stages"] = {"finetune": [{"dataset": "stl10", "path": str(tmp_path / "nowhere"), "epochs": 1},
                                {"dataset": "digits_0to8", "epochs": 1}],
                   "ood": {"in_distribution": "digits_0to8",
                           "datasets": [{"name": "lsun", "format": "imagefolder", "path": str(tmp_path / "empty")}]}}
    spec = load_campaign(d)
    trial = {**base_config(spec), "embedding": "linear"}
    with pytest.raises(SpecError) as err:
        check_stages(spec, [trial], launching=True)
    text = str(err.value)
    assert "stages.finetune[0].path: expected a folder holding STL-10's binary files" in text
    assert "stages.ood.datasets[0].path: expected images" in text and "finetune[1]" not in text
    check_stages(load_campaign({**d, "stages": {**d["stages"], "finetune": d["stages"]["finetune"][1:],
                                                "ood": None}}), [trial], launching=True)


def test_the_report_of_a_staged_campaign_has_its_stages(tmp_path):
    from qkvsearch.search.analysis.report import build_report

    spec = _spec()
    write_campaign(tmp_path, STATUSES, spec=spec.to_dict())
    write_selection(str(tmp_path), "front", ["t00000"], time.time())
    _record(str(tmp_path), "t00000", "ood", {"fpr95": 12.0, "auroc": 95.0})
    paths = build_report(str(tmp_path), static=False)
    assert "<h2>Stages</h2>" in open(paths["html"]).read() and "## Stages" in open(paths["md"]).read()
    table = pa.parquet.read_table(paths["stages_parquet"]).to_pandas()
    assert table["fpr95"].tolist() == [12.0] and table["finetune@digits_status"].tolist() == ["pending"]
    no_stages = tmp_path / "plain"
    write_campaign(no_stages, STATUSES)
    assert "stages_csv" not in build_report(str(no_stages), static=False)
