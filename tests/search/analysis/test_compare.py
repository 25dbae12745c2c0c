"""`qkvsearch compare` (search.analysis.compare): fronts overlaid, hypervolume under one common reference, coverage
and the cost ranges each front leads, the compute each spent, all checked by hand on campaigns written here; and
campaigns judged otherwise refused (exit 2, naming what differs) or compared on what they share."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvsearch.search.analysis import hv_reference
from qkvsearch.search.cli import main
from qkvsearch.search.records import inherited
from qkvsearch.storage import write_json

OBJECTIVES = [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]


def _campaign(exp: str, name: str, points, *, objectives=OBJECTIVES, dataset="digits", reference=None,
              train_s=10.0) -> None:
    spec = {"data": {"dataset": dataset}, "objectives": objectives, "space": {"embedding": ["linear", "sne"]}}
    write_json(f"{exp}/qs_campaign.json", {"name": name, "spec": spec, "ended_at": 1.8e9})
    if reference is not None:
        hv_reference.write(exp, {"objectives": [[o["metric"], o["mode"]] for o in objectives],
                                 "reference": reference, "how": ["bound", "space"]})
    for i, (gmacs, top1) in enumerate(points):
        write_json(f"{exp}/qs_trials/t{i:03d}.json", {
            "trial_id": f"t{i:03d}", "trial_name": f"{name}-{i}", "campaign": name, "status": "completed",
            "config": {"model": "xcit_nano_12_p8_224", "embedding": "sne", "seed": i, "epochs": 2},
            "cost": {"gmacs": gmacs, "params_m": 1.0}, "epochs_planned": 2, "train_s_total": train_s,
            "epochs": [{"epoch": 1.0, "top1": top1 - 5, "train_s": train_s / 2},
                       {"epoch": 2.0, "top1": top1, "train_s": train_s / 2}],
            "started_at": 1.7e9 + 100 * i, "ended_at": 1.7e9 + 100 * i + 60})


def _oneshot(exp: str) -> None:
    """B as a one-shot campaign: a supernet trained in its nested campaign, three subnets scored."""
    _campaign(exp, "b", [(1.5, 55.0), (2.0, 62.0), (3.0, 65.0)], reference=[0.0, 4.0])
    write_json(f"{exp}/supernet/qs_campaign.json", {"name": "b-supernet", "spec": {}})
    write_json(f"{exp}/supernet/qs_trials/s.json", {
        "trial_id": "s", "trial_name": "supernet", "campaign": "b-supernet", "status": "completed",
        "config": {"epochs": 4}, "cost": {}, "epochs_planned": 4, "train_s_total": 400.0,
        "epochs": [{"epoch": float(e), "top1": 40.0, "train_s": 100.0} for e in range(1, 5)],
        "started_at": 1.6999e9, "ended_at": 1.6999e9 + 500})
    inherited.write_batch(exp, 0, [{"subnet_id": f"subnet_{i:06d}", "keys": {}, "config": {}, "cost": {},
                                    "metrics": {"top1": 40.0}} for i in range(3)])


def test_two_campaigns_side_by_side(tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    _campaign(a, "a", [(1.0, 50.0), (2.0, 60.0)], reference=[0.0, 3.3])
    _oneshot(b)
    assert main(["compare", a, b]) == 0
    out = tmp_path / "compare-a-b"
    assert f"html: {out}/compare.html" in capsys.readouterr().out
    result = json.loads((out / "compare.json").read_text())
    assert result["reference"] == [0.0, 4.0]   # per objective the worst of the two fixed references
    # by hand, in (gmacs, top1) to the reference (4, 0): a 1 x 50 + 2 x 60; b 0.5 x 55 + 1 x 62 + 1 x 65
    rows = {r["campaign"]: r for r in result["campaigns"]}
    assert rows["a"]["hypervolume"] == pytest.approx(170.0) and rows["b"]["hypervolume"] == pytest.approx(154.5)
    # b's (2, 62) dominates a's (2, 60); none of a's points dominates one of b's
    assert result["coverage"] == {"a": {"b": 0.0}, "b": {"a": 0.5}}
    assert result["leads"]["gmacs"] == [{"from": 1.0, "to": 1.0, "campaign": "a", "margin": None},
                                        {"from": 1.5, "to": 3.0, "campaign": "b", "margin": pytest.approx(2.0)}]
    assert (rows["a"]["train_s"], rows["a"]["epochs"], rows["a"]["wall_s"]) == (20.0, 4, 160.0)
    # b: its retrained trials and its supernet's training; from the supernet's start to the last trial's end
    assert rows["b"]["train_s"] == 430.0 and rows["b"]["supernet_train_s"] == 400.0 and rows["b"]["subnets_scored"] == 3
    assert rows["b"]["wall_s"] == pytest.approx(1.7e9 + 260 - 1.6999e9)
    page = (out / "compare.html").read_text()
    assert page.count("Plotly.newPlot(") == 1 and '"name":"a: front"' in page and '"name":"b: front"' in page
    md = (out / "compare.md").read_text()
    assert "- b's front dominates 50% of a's" in md
    assert "best top1 along gmacs: gmacs 1: a (alone); gmacs 1.5-3: b" in md


def test_campaigns_judged_otherwise_are_refused_naming_what_differs_or_compared_on_what_they_share(tmp_path, capsys):
    a, c = str(tmp_path / "a"), str(tmp_path / "c")
    _campaign(a, "a", [(1.0, 50.0), (2.0, 60.0)])
    _campaign(c, "c", [(1.0, 52.0)], objectives=[OBJECTIVES[0], {"metric": "params_m", "mode": "min"}],
              dataset="digits_clutter")
    assert main(["compare", a, c, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "objectives: a top1 max, gmacs min; c top1 max, params_m min" in err
    assert "data.dataset: a digits; c digits_clutter" in err and "--shared" in err
    assert not (tmp_path / "out").exists()   # refused before anything is written
    assert main(["compare", a, c, "--out", str(tmp_path / "out"), "--shared"]) == 0
    result = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert result["objectives"] == [["top1", "max"]] and len(result["differences"]) == 2
    assert Path(tmp_path / "out" / "compare.md").read_text().splitlines()[2].startswith("- the campaigns differ in")
    assert main(["compare", a]) == 2 and "expected two campaign folders or more" in capsys.readouterr().err
