"""search.analysis.report end to end on record files: contents, the exact front, and the page in Chromium."""
import base64
import csv
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers.browser import chromium_path, render
from helpers.campaign_files import ALL_STATUSES, SPEC, tree_digest, write_campaign

from qkvsearch.search.analysis import figures
from qkvsearch.search.analysis.report import build_report
from qkvsearch.search.analysis.results import collect
from qkvsearch.spaces.errors import BadInput

PAPER_CONFIG = {"model": "xcit_nano_12_p16_224", "dataset": "imagefolder", "num_classes": 1000, "img_size": 224}


def _brute_front(trials, cols, dirs, statuses=("completed",)):
    """Trial ids of completed trials no other completed trial dominates (O(n^2) definition)."""
    rows = [r for r in trials.to_pylist() if r["status"] in statuses]
    sign = np.array([-1.0 if d == "max" else 1.0 for d in dirs])
    pts = [sign * np.array([r[c] for c in cols], dtype=float) for r in rows]
    front = set()
    for i, p in enumerate(pts):
        if not any(np.all(q <= p) and np.any(q < p) for j, q in enumerate(pts) if j != i):
            front.add(rows[i]["trial_id"])
    return front


def _flagged(page: str, table_id: str) -> tuple[set, set]:
    """(all trial ids, front trial ids) listed in one of the page's tables."""
    table = re.search(rf'<table id="{table_id}".*?</table>', page, re.S).group(0)
    rows = re.findall(r'<tr data-trial-id="([^"]+)" data-front="([01])"', table)
    return {t for t, _ in rows}, {t for t, f in rows if f == "1"}


def _plots(page: str) -> list[tuple[list, dict]]:
    """(data, layout) of each Plotly.newPlot("<div id>", data, layout, config) call in the page."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while (at := page.find("Plotly.newPlot(", at)) >= 0:
        args = []
        at += len("Plotly.newPlot(")
        for _ in range(3):  # the div id, the traces, the layout
            while page[at] in " \n,":
                at += 1
            value, at = decoder.raw_decode(page, at)
            args.append(value)
        out.append((args[1], args[2]))
    return out


def _numbers(values) -> list[float]:
    """A trace's x/y/z: a plotly.js typed array (float64, base64) or a plain list."""
    if isinstance(values, dict):
        assert values["dtype"] == "f8"
        return np.frombuffer(base64.b64decode(values["bdata"]), "<f8").tolist()
    return list(values)


def _png_colours(path) -> int:
    from PIL import Image

    with Image.open(path) as im:
        return len(set(im.convert("RGB").resize((350, 500)).getdata()))


def test_report_contains_every_trial_and_marks_exactly_the_front(tmp_path):
    exp = tmp_path / "synth"
    records = write_campaign(exp, ALL_STATUSES * 2, seed=1)
    before = tree_digest(exp, skip="report")
    paths = build_report(exp, static=False)
    assert tree_digest(exp, skip="report") == before  # the campaign's files are untouched
    assert set(paths) >= {"html", "csv", "md", "trials", "epochs"}
    assert all(Path(p).parent == exp / "report" for p in paths.values())

    trials = pq.read_table(paths["trials"])
    assert sorted(trials.column("trial_id").to_pylist()) == sorted(r["trial_id"] for r in records)
    expected = _brute_front(trials, ["final_top1", "gmacs", "params_m"], ["max", "min", "min"])
    assert 1 <= len(expected) < len(records)

    page = Path(paths["html"]).read_text()
    all_ids, all_front = _flagged(page, "trials")
    front_ids, front_flags = _flagged(page, "front")
    assert all_ids == {r["trial_id"] for r in records}
    assert all_front == expected and front_ids == expected and front_flags == expected
    for rec in records:
        assert rec["trial_name"] in page
    with open(paths["csv"]) as f:
        assert {row["trial_id"] for row in csv.DictReader(f)} == expected
    md = Path(paths["md"]).read_text()
    names = {r["trial_id"]: r["trial_name"] for r in records}
    assert all(f"| {names[t]} |" in md for t in expected)
    assert "GMACs (multiply-accumulates; the papers' 'FLOPs')" in page
    assert "<script src=" not in page  # plotly.js is inlined: loads offline
    assert page.count("plotly.js v") == 1  # once, for every figure
    assert pq.read_table(paths["trials"]).equals(collect(exp)[0])
    assert "paper (ImageNet-1k)" not in page  # CIFAR-sized campaign: no paper overlay


def test_figures_carry_every_trial_value_and_the_template(tmp_path):
    exp = tmp_path / "synth"
    write_campaign(exp, ALL_STATUSES * 2, seed=1)
    paths = build_report(exp, static=False)
    trials = {r["trial_id"]: r for r in pq.read_table(paths["trials"]).to_pylist()}
    plots = _plots(Path(paths["html"]).read_text())
    assert len(plots) == 7  # 2 pairs, 3-D, learning curves, hypervolume, Optuna's parallel coordinates and slices
    shown = set()
    for (data, layout), (x, y) in zip(plots[:2], [("gmacs", "final_top1"), ("params_m", "final_top1")]):
        assert layout["template"]["layout"]["plot_bgcolor"] == "white"  # plotly_white, written out
        for trace in (t for t in data if "legendgroup" in t):  # the (embedding, status) traces
            for tid, xv, yv in zip(trace["customdata"], _numbers(trace["x"]), _numbers(trace["y"]), strict=True):
                assert (xv, yv) == (trials[tid][x], trials[tid][y])
                shown.add(tid)
    assert shown == {t for t, r in trials.items() if r["final_top1"] is not None}  # no epoch yet: no point


def test_hover_shows_errors_and_beyond_the_limit_the_config_of_front_points_only(tmp_path, monkeypatch):
    exp = tmp_path / "synth"
    records = write_campaign(exp, ALL_STATUSES * 2, seed=1)
    errors = {r["trial_id"]: r["error"] for r in records}
    for limit, config_on in ((figures.HOVER_CONFIG_LIMIT, "all"), (3, "front")):
        monkeypatch.setattr(figures, "HOVER_CONFIG_LIMIT", limit)
        paths = build_report(exp, static=False)
        page = Path(paths["html"]).read_text()
        front = _flagged(page, "front")[1]
        data, _ = _plots(page)[0]
        for trace in (t for t in data if "legendgroup" in t):
            for tid, text in zip(trace["customdata"], trace["hovertext"], strict=True):
                full = config_on == "all" or tid in front
                assert ("seed = " in text) == full
                assert ("error: " in text) == (full and errors[tid] is not None)
                assert errors[tid] is None or not full or f"error: {errors[tid]}" in text


@pytest.mark.slow
@pytest.mark.skipif(chromium_path() is None, reason="needs a Chromium browser (apt-get install chromium)")
def test_report_page_renders_in_headless_chromium_without_script_errors(tmp_path):
    exp = tmp_path / "paper"
    write_campaign(exp, ALL_STATUSES, seed=2, overrides=PAPER_CONFIG)
    paths = build_report(exp, static=False)
    page = Path(paths["html"]).read_text()
    assert "paper (ImageNet-1k)" in page and "paper F-SNE-C8*-S" in page
    shot = tmp_path / "shot.png"
    errors = render(paths["html"], shot, timeout=90)
    assert errors == []
    assert shot.stat().st_size > 20_000
    assert _png_colours(shot) > 50  # plots drawn: markers, lines, text, not a blank page

    from PIL import Image

    with Image.open(shot) as im:  # the fsne markers (#d62728 at opacity 0.85) are painted in the first plot
        pixels = np.asarray(im.convert("RGB"))[:700].astype(int)
    red = (pixels[..., 0] > 180) & (pixels[..., 1] < 110) & (pixels[..., 2] < 110)
    assert red.sum() > 30


@pytest.mark.slow
@pytest.mark.skipif(chromium_path() is None, reason="needs a Chromium browser")
def test_browser_helper_reports_script_errors(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p>x</p><script>console.error('boom'); missingFn();</script></body></html>")
    errors = render(bad, tmp_path / "bad.png", timeout=60)
    assert any("boom" in e for e in errors) and any("missingFn" in e for e in errors)
    assert (tmp_path / "bad.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_spec_objectives_and_running_campaign(tmp_path):
    spec = dict(SPEC, objectives=[{"metric": "top1", "mode": "max"}, {"metric": "params_m", "mode": "min"}])
    exp = tmp_path / "two"
    write_campaign(exp, ["running", "pending", "infeasible", "completed", "completed", "completed"], spec=spec)
    out = tmp_path / "elsewhere"
    paths = build_report(exp, out_dir=out, static=False)
    assert not (exp / "report").exists() and (out / "pareto.html").exists()
    trials = pq.read_table(paths["trials"])
    page = Path(paths["html"]).read_text()
    _, front = _flagged(page, "trials")
    assert front == _brute_front(trials, ["final_top1", "params_m"], ["max", "min"])
    assert "top1 vs params_m" in page and "top1 vs gmacs" not in page  # no 3-D view for 2 objectives
    with pytest.raises(ValueError, match=r"objectives\[1\]\.metric"):
        build_report(exp, out_dir=out, static=False, objectives=[{"metric": "top1", "mode": "max"},
                                                                 {"metric": "nope", "mode": "min"}])


def test_no_completed_trial_gives_an_empty_front(tmp_path):
    exp = tmp_path / "early"
    write_campaign(exp, ["running", "pending", "failed"])
    paths = build_report(exp, static=False)
    page = Path(paths["html"]).read_text()
    assert _flagged(page, "front") == (set(), set())
    assert len(_flagged(page, "trials")[0]) == 3


def test_spec_without_objectives_uses_the_loader_default(tmp_path):
    exp = tmp_path / "plain"
    spec = {k: v for k, v in SPEC.items() if k != "objectives"}
    write_campaign(exp, ["completed", "completed", "stopped_early"], spec=spec)
    paths = build_report(exp, static=False)
    md = Path(paths["md"]).read_text()
    assert "- objectives: top1 (max)\n" in md


def test_out_pointing_at_a_file_fails_before_writing(tmp_path):
    exp = tmp_path / "exp"
    write_campaign(exp, ["completed", "completed"])
    target = tmp_path / "report.html"
    target.write_text("mine")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(BadInput, match=f'--out: expected a folder, given "{re.escape(str(target))}", which is a file'):
        build_report(exp, out_dir=target, static=False)
    assert target.read_text() == "mine" and sorted(os.listdir(tmp_path)) == before
    assert not (exp / "report").exists()


def test_a_failing_write_leaves_no_temp_file(tmp_path):
    exp = tmp_path / "exp"
    write_campaign(exp, ["completed", "completed"])
    out = tmp_path / "out"
    (out / "pareto.csv").mkdir(parents=True)  # a folder where the report's file goes: the rename fails
    with pytest.raises(OSError):
        build_report(exp, out_dir=out, static=False)
    assert sorted(os.listdir(out)) == ["pareto.csv", "pareto.html"]
    assert os.listdir(out / "pareto.csv") == []


@pytest.mark.slow
def test_static_figures_or_a_clear_note(tmp_path, caplog):
    exp = tmp_path / "static"
    write_campaign(exp, ALL_STATUSES)
    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.analysis.report"):
        paths = build_report(exp, static=True)
    pngs = [p for k, p in paths.items() if k.endswith("_png")]
    if pngs:
        assert {os.path.basename(p) for p in pngs} >= {"top1_vs_gmacs.png", "hypervolume.png"}
        for p in pngs:
            assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and _png_colours(p) > 10
        assert all(Path(p).read_text().lstrip().startswith("<svg") for k, p in paths.items() if k.endswith("_svg"))
    else:
        assert "static png/svg figures skipped" in caplog.text
