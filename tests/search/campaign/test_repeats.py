"""search.repeats in the report: a configuration trained with several seeds shows its mean and spread."""
from __future__ import annotations

import pytest

from qkvsearch.search.analysis.report import build_report
from qkvsearch.storage import write_json

SPEC = {"objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]}


def record(i: int, seed: int, width: int, top1: float) -> dict:
    config = {"model": "xcit_nano_12_p8_224", "embedding": "sne", "hidden_width": width, "width": width,
              "lr": 1e-3, "seed": seed, "epochs": 1}
    return {"trial_id": f"t{i}", "trial_name": f"sne-h{width}-t{i}", "campaign": "rep", "status": "completed",
            "config": config, "cost": {"params": 1000 + width, "params_m": 0.001 + width / 1e6, "gmacs": 0.1},
            "epochs": [{"epoch": 1.0, "top1": top1, "train_s": 1.0}], "epochs_planned": 1,
            "started_at": 1.7e9 + i, "ended_at": 1.7e9 + i + 1}


def test_the_report_shows_mean_and_spread_of_each_repeated_configuration(tmp_path):
    write_json(f"{tmp_path}/qs_campaign.json", {"name": "rep", "spec": SPEC})
    trials = [record(0, 0, 64, 50.0), record(1, 1, 64, 54.0), record(2, 2, 64, 58.0), record(3, 0, 32, 40.0)]
    for rec in trials:
        write_json(f"{tmp_path}/qs_trials/{rec['trial_id']}.json", rec)
    paths = build_report(str(tmp_path), out_dir=str(tmp_path / "report"), static=False)
    md = open(paths["md"]).read()
    section = md.split("## Repeated configurations")[1].split("##")[0]
    rows = [line for line in section.splitlines() if line.startswith("| sne")]
    assert len(rows) == 1  # width 64 ran with seeds 0, 1, 2; width 32 once
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    header = [c.strip() for c in section.splitlines()[2].strip("|").split("|")]
    row = dict(zip(header, cells))
    assert row["n"] == "3" and row["seeds"] == "0, 1, 2"
    assert float(row["top1 mean"]) == pytest.approx(54.0) and float(row["top1 sd"]) == pytest.approx(4.0)
    assert "Repeated configurations" in open(paths["html"]).read()
    assert open(paths["csv"]).readline().startswith("trial_id,")


def test_a_front_point_trained_under_several_seeds_carries_their_mean_and_spread(tmp_path):
    """search.front_repeats' runs in the report: the front table gives the front point its configuration's mean and
    standard deviation over its seeds, and the figure draws them as an error bar."""
    import json
    import re

    write_json(f"{tmp_path}/qs_campaign.json", {"name": "rep", "spec": SPEC})
    trials = [record(0, 0, 64, 50.0), record(1, 1, 64, 54.0), record(2, 2, 64, 58.0), record(3, 0, 32, 40.0)]
    for rec in trials:
        write_json(f"{tmp_path}/qs_trials/{rec['trial_id']}.json", rec)
    paths = build_report(str(tmp_path), out_dir=str(tmp_path / "report"), static=False)
    front = open(paths["md"]).read().split("## Pareto front")[1].split("##")[0]
    head, _, row = front.strip().splitlines()[:3]
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert cells["trial_name"] == "sne-h64-t2" and cells["seeds"] == "3"   # width 64 at 58: the front (one gmacs)
    assert float(cells["top1 mean"]) == pytest.approx(54.0) and float(cells["top1 sd"]) == pytest.approx(4.0)
    page = open(paths["html"]).read()
    trace = page[page.index('"name":"front configuration: top1 mean ± sd over its seeds"'):]
    bar = re.search(r'"error_y":\{"type":"data","array":(\[[^\]]*\])', trace)
    assert json.loads(bar.group(1)) == [pytest.approx(4.0)] and "sne-h64-t2: top1 54 ± 4 over 3 seeds" in trace
