"""A campaign folder written before search/ had layers (tests/fixtures/flat-layout-campaign: launched with
NSGA-II and MO-ASHA, 4 trials planned, stopped while its fourth trial ran; its checkpoints left out)
still resumes and reports. Its pickles name the modules of the flat layout."""
import json
import pickletools
import shutil

import pyarrow.parquet as pq
import pytest
from helpers import REPO

from qkvsearch import _legacy
from qkvsearch.search.records.readers import read_trial_records

FIXTURE = REPO / "tests" / "fixtures" / "flat-layout-campaign"


def _pickled_globals(path) -> set[str]:
    """"module:name" of every class or function a pickle file refers to."""
    names, strings = set(), []
    for op, arg, _ in pickletools.genops(path.read_bytes()):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            names.add(f"{strings[-2]}:{strings[-1]}")
        elif op.name == "GLOBAL":
            names.add(arg.replace(" ", ":"))
    return names


def test_the_fixture_pickles_the_flat_layout_names_and_each_resolves():
    names = {n for n in _pickled_globals(FIXTURE / "tuner.pkl") if n.startswith("qkvsearch.search.")}
    assert {"qkvsearch.search.records:TrialRecorder", "qkvsearch.search.schedulers:MOASHAScheduler",
            "qkvsearch.search.searchers:TrialConfigs", "qkvsearch.search.interrupts:StopSignals",
            "qkvsearch.search.campaign:_Describe.name"} <= names
    import importlib

    for name in names:
        module, attr = name.split(":")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        assert obj is not None
    assert set(_legacy.MODULES) | set(_legacy.PACKAGES) >= {n.split(":")[0] for n in names if n.count(".") == 2} - {
        "qkvsearch.search.records", "qkvsearch.search.campaign"}


@pytest.mark.slow
def test_a_flat_layout_campaign_resumes_and_reports(ray_local, tmp_path):
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import resume

    exp = tmp_path / "legacy"
    shutil.copytree(FIXTURE, exp)
    before = {r["trial_id"]: r for r in read_trial_records(exp)[0]}
    assert sorted(r["status"] for r in before.values()) == ["completed", "completed", "duplicate", "running"]

    resume(str(exp))
    after = {r["trial_id"]: r for r in read_trial_records(exp)[0]}
    assert set(after) == set(before)  # no trial lost, none added
    assert sorted(r["status"] for r in after.values()) == ["completed", "completed", "completed", "duplicate"]
    for tid, rec in before.items():
        if rec["status"] != "running":  # finished before the stop: kept as recorded
            assert after[tid]["epochs"] == rec["epochs"] and after[tid]["status"] == rec["status"]
    resumed = next(after[t] for t, r in before.items() if r["status"] == "running")
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]

    written = build_report(str(exp), static=False)
    trials = pq.read_table(written["trials"]).to_pylist()
    assert sorted(t["status"] for t in trials) == ["completed", "completed", "completed", "duplicate"]
    assert json.loads((exp / "qs_campaign.json").read_text())["ended_at"] > 0
