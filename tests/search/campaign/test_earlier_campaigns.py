"""Campaigns an earlier version of qkvsearch launched resume with this one: tests/fixtures/earlier/<algorithm>/,
launched under MO-ASHA with the code of the commit its MADE_BY names and stopped by SIGTERM once a trial had
completed, while trials remained to be suggested (tests/fixtures/make_earlier_campaigns.py makes them again).
Their pickles name that version's classes: the searchers of 2969ba8 pickled their state as objects, not today's
plain data. Resumed, the searcher is asked for the trials still to come: every planned trial ends in a final
status, no trial completed before the stop trains again, and the campaign reports. A searcher whose saved state
of that commit is resumed from the middle of a trial (tests/fixtures/mid_training/<commit>-<algorithm>/:
test_mid_training_campaigns.py) has no fixture here: that resume checks all of this and more."""
import json
import shutil

import pytest
from helpers import REPO
from helpers.resumes import resume_checked

from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.spaces.search_options import ALGORITHMS

FIXTURES = REPO / "tests" / "fixtures"
EARLIER = FIXTURES / "earlier"
HERE = sorted(p.name for p in EARLIER.iterdir() if p.is_dir())
MID_TRAINING = {tuple(p.name.split("-", 1)) for p in (FIXTURES / "mid_training").iterdir() if p.is_dir()}
PICKLED_STATE = "--commit 2969ba8"   # the MADE_BY of the fixtures whose searchers pickled their state


def _tune_trials(exp) -> list[str]:
    state = json.loads(max(exp.glob("experiment_state-*.json")).read_text())
    return [json.loads(t[0])["trial_id"] for t in state["trial_data"]]


def test_every_searcher_resumes_from_a_campaign_an_earlier_version_stopped():
    assert set(ALGORITHMS) <= set(HERE) | {algorithm for _, algorithm in MID_TRAINING}
    made_by = {((EARLIER / a / "MADE_BY").read_text().split("--commit ")[1].split()[0], a) for a in HERE}
    assert not made_by & MID_TRAINING   # a saved format resumed once: each resume costs a real campaign


@pytest.mark.parametrize("algorithm", HERE)
def test_each_fixture_was_stopped_with_trials_left_to_suggest(algorithm):
    exp = EARLIER / algorithm
    planned = json.loads((exp / "qs_campaign.json").read_text())["spec"]["search"]["num_trials"]
    statuses = [r["status"] for r in read_trial_records(exp)[0]]
    assert "completed" in statuses and len(_tune_trials(exp)) < planned
    saved = next(exp.glob("searcher-state-*.pkl")).read_bytes()
    assert PICKLED_STATE in (exp / "MADE_BY").read_text()
    assert b"qkvsearch-searcher-state" not in saved  # the earlier format


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", HERE)
def test_an_earlier_campaign_resumes_and_reports(ray_local, tmp_path, algorithm):
    import pyarrow.parquet as pq

    from qkvsearch.search.analysis.report import build_report

    exp = tmp_path / algorithm
    shutil.copytree(EARLIER / algorithm, exp)
    planned = json.loads((exp / "qs_campaign.json").read_text())["spec"]["search"]["num_trials"]
    _, after = resume_checked(exp)
    trained = [r["config"]["embedding"] for r in after.values() if r["status"] != "duplicate"]
    assert len(trained) == len(set(trained))  # no configuration trained twice
    saved = json.loads(max(exp.glob("searcher-state-*.pkl")).read_text())
    assert saved["format"] == "qkvsearch-searcher-state" and saved["algorithm"] == algorithm

    written = build_report(str(exp), static=False)
    assert len(pq.read_table(written["trials"])) == planned
    assert json.loads((exp / "qs_campaign.json").read_text())["ended_at"] > 0
