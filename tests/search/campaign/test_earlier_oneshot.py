"""One-shot campaigns an earlier version wrote, with and without deployment targets, resume and report with this
one: tests/fixtures/earlier_oneshot/<kind>-<phase>/, written by the code of the commit their MADE_BY names and
stopped (SIGTERM) while the supernet trained, while subnets were scored (for targets, while the second target
scored) and while the chosen subnets retrained, and each ended with the report that code wrote
(tests/fixtures/make_earlier_oneshot.py makes them again).

A copy is taken where the test runs; the paths its records hold are those of where it was written, and are
rewritten to the copy's (what a folder that had not moved would hold). Without Ray: each stopped folder is in
its phase; the campaigns this version derives from an earlier one (the supernet's, each target's) are the ones
that version derived and stored; an ended campaign reports as that version reported it. On Ray (one session,
in this process): each stopped folder resumes to its end without repeating what it recorded (the supernet's
epochs, the scored batches, the retrained subnets that ended), its live view shown every retraining (a target's
too), and reports."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import REPO
from helpers.views import Recorder

from qkvsearch.search.campaign.oneshot.plan import PLAN_FILE, supernet_spec
from qkvsearch.search.campaign.oneshot.targets import target_spec
from qkvsearch.search.campaign.opened import OpenedCampaign
from qkvsearch.search.monitor.oneshot_phases import read_phases
from qkvsearch.search.records import inherited
from qkvsearch.search.records.layout import open_campaign
from qkvsearch.search.records.readers import read_trial_records
from qkvsearch.storage import read_json

EARLIER = REPO / "tests" / "fixtures" / "earlier_oneshot"
STOPPED = ("supernet", "scoring", "retraining")
KINDS = ("oneshot", "targets")
# what each campaign plans (make_earlier_oneshot): subnets scored per folder, trainings retrained per folder
PLANNED = {"oneshot": {".": (10, 3)}, "targets": {"targets/small": (None, 2), "targets/lean": (None, 0)}}


def _written_at(fixture: Path) -> str:
    """The campaign folder the fixture was written in (its stored spec's storage and name)."""
    stored = json.loads((fixture / "qs_campaign.json").read_text())
    return f"{stored['spec']['storage'].rstrip('/')}/{stored['name']}"


def copied(fixture: Path, dest: Path) -> Path:
    """The fixture copied to ``dest``, the paths its records hold (the qs_ files, JSON and CSV) rewritten to the
    copy's. Tune's own files are left as they are: Tune restores a moved experiment by itself."""
    shutil.copytree(fixture, dest)
    old = _written_at(fixture)
    for path in [*dest.rglob("*.json"), *dest.rglob("*.csv")]:
        if any(part.startswith("qs_") for part in path.relative_to(dest).parts):
            path.write_text(path.read_text().replace(old, str(dest)))
    return dest


def _folders(kind: str, exp: Path) -> list[Path]:
    return [exp / sub for sub in PLANNED[kind]]


def _batches(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / inherited.INHERITED_DIR).glob("batch-*.json"))}


def _supernet_epochs(exp: Path) -> list[int]:
    files = list((exp / "supernet" / "qs_trials").glob("*.epochs.csv"))
    return [int(float(line.split(",")[0])) for line in files[0].read_text().splitlines()[1:]] if files else []


# ------------------------------------------------------------------------------------------------ without Ray
def test_each_fixture_was_written_by_an_earlier_commit_and_stopped_in_its_phase():
    for kind in KINDS:
        for phase in STOPPED:
            fixture = EARLIER / f"{kind}-{phase}"
            assert f"({kind}, stopped in {phase})" in (fixture / "MADE_BY").read_text()
            found = read_phases(str(fixture)).phase
            assert found == ("scoring" if phase == "scoring" and kind == "targets" else phase), (kind, phase, found)
        assert read_phases(str(EARLIER / f"{kind}-ended")).phase == "done"


@pytest.mark.parametrize("kind", KINDS)
def test_the_campaigns_derived_today_are_those_the_earlier_version_stored(kind, tmp_path):
    exp = copied(EARLIER / f"{kind}-retraining", tmp_path / kind)
    spec = open_campaign(exp, validate=True).spec
    plan = read_json(f"{exp}/supernet/{PLAN_FILE}")
    assert supernet_spec(OpenedCampaign(spec, str(exp)), plan) == open_campaign(exp / "supernet").spec
    for target in spec.targets:
        assert target_spec(spec, str(exp), target) == open_campaign(exp / "targets" / target.name).spec


def _report_tables(folder: Path, moved: tuple[str, str] = ("", "")) -> dict[str, list[dict]]:
    """The report's tables of a folder, each row by its columns, NaN as None, the paths ``moved`` (from, to)
    rewritten as the records were (comparable across two reports)."""
    out = {}
    for name in ("subnets", "trials", "targets"):
        path = folder / "report" / f"{name}.parquet"
        if path.exists():
            out[name] = pq.read_table(path).to_pandas().to_json(orient="records")
    fidelity = folder / "report" / "fidelity.json"
    if fidelity.exists():
        out["fidelity"] = f"[{fidelity.read_text()}]"
    return {name: json.loads(text.replace(*moved) if moved[0] else text) for name, text in out.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_an_ended_earlier_campaign_reports_as_that_version_reported_it(kind, tmp_path):
    from qkvsearch.search.analysis.report import build_report

    exp = copied(EARLIER / f"{kind}-ended", tmp_path / kind)
    folders = [exp, *(exp / "targets" / t for t in ("small", "lean"))] if kind == "targets" else [exp]
    moved = (_written_at(EARLIER / f"{kind}-ended").replace("/", "\\/"), str(exp).replace("/", "\\/"))
    before = {f: _report_tables(f, moved) for f in folders}
    build_report(str(exp), static=False)
    for folder in folders:
        after = _report_tables(folder)
        for name, rows in before[folder].items():
            assert len(after[name]) == len(rows), (folder, name)
            for old, new in zip(rows, after[name]):   # the columns it had: the same values (new columns may come)
                assert _columns(new, old) == _columns(old, old), (folder, name)


def _columns(row: dict, old: dict) -> dict:
    """``row``'s values of ``old``'s columns (times left out), its config_json as far as ``old``'s keys go (a trial
    key added since is read with the value it had before it existed: spaces.upgrade)."""
    out = {k: row.get(k) for k in old if not k.endswith(("_at", "_time"))}
    if isinstance(old.get("config_json"), str) and isinstance(row.get("config_json"), str):
        config = json.loads(row["config_json"])
        out["config_json"] = {k: config.get(k) for k in json.loads(old["config_json"])}
    return out


# ------------------------------------------------------------------------------------------------- on Ray
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("phase", STOPPED)
def test_an_earlier_campaign_stopped_in_each_phase_resumes_and_reports(ray_local, tmp_path, kind, phase):
    from qkvsearch.search.analysis.report import build_report
    from qkvsearch.search.campaign.launch import resume

    exp = copied(EARLIER / f"{kind}-{phase}", tmp_path / kind)
    folders = _folders(kind, exp)
    epochs, batches = _supernet_epochs(exp), {f: _batches(f) for f in folders}
    ended = {f: {r["trial_id"]: r for r in read_trial_records(f)[0] if r["status"] == "completed"} for f in folders}

    view = Recorder()
    resume(str(exp), view=view)

    assert read_phases(str(exp)).phase == "done"
    # the live view is shown each retraining as it runs (a target's too: its campaign's name)
    retraining = {p.name for p in view.seen if p.oneshot is None or p.oneshot.begun("retraining")}
    assert retraining >= ({"small"} if kind == "targets" else {"earlier-oneshot"}), retraining
    assert _supernet_epochs(exp) == list(range(1, 4)) and _supernet_epochs(exp)[:len(epochs)] == epochs
    for folder, (subnets, retrained) in zip(folders, PLANNED[kind].values()):
        after = _batches(folder)
        assert all(after[n] == b for n, b in batches[folder].items())        # what was scored: kept, not again
        evaluations = inherited.read_evaluations(folder)
        keys = [inherited.subnet_identity(e["config"]) for e in evaluations]
        assert len(keys) == len(set(keys)) and (subnets is None or len(keys) == subnets)
        records = {r["trial_id"]: r for r in read_trial_records(folder)[0]}
        assert len(records) == retrained and all(r["status"] == "completed" for r in records.values())
        for tid, rec in ended[folder].items():   # a retraining that had ended: kept as recorded, not again
            assert records[tid]["started_at"] == rec["started_at"] and records[tid]["epochs"] == rec["epochs"]
    written = build_report(str(exp), static=False)
    assert "report" in written or written
    if kind == "targets":
        table = pq.read_table(exp / "report" / "targets.parquet").to_pandas()
        assert list(table["target"]) == ["small", "lean"]
    else:
        assert json.loads((exp / "report" / "fidelity.json").read_text())["chosen_retrained"] == 1
