"""Every point can be seen and hovered: trials that coincide in a figure are drawn side by side (their exact
values in the hover text), and the baseline (linear embedding) has a marker of its own."""
import base64

import numpy as np
import pyarrow as pa
import pytest
from helpers.campaign_files import ALL_STATUSES, write_campaign

from qkvsearch.search.analysis.figures import figures
from qkvsearch.search.analysis.front import front_info
from qkvsearch.search.analysis.markers import SPREAD, spread
from qkvsearch.search.analysis.results import collect

OBJECTIVES = [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"},
              {"metric": "params_m", "mode": "min"}]


def _numbers(values) -> np.ndarray:
    return np.frombuffer(base64.b64decode(values["bdata"]), "<f8") if values else np.zeros(0)


def _drawn(fig, axes="xy") -> dict[str, tuple]:
    """trial id -> (drawn coordinates, hover text, marker symbol) over the figure's trial traces."""
    out = {}
    for trace in (t for t in fig["data"] if "legendgroup" in t):
        coords = zip(*(_numbers(trace[a]) for a in axes))
        for tid, point, text in zip(trace["customdata"], coords, trace["hovertext"], strict=True):
            assert tid not in out  # each trial once
            out[tid] = (point, text, trace["marker"]["symbol"])
    return out


def _coinciding(tmp_path):
    """The synthetic campaign's trials with one completed linear trial given a completed sne trial's objectives."""
    write_campaign(tmp_path, ALL_STATUSES * 2, seed=3)
    trials, epochs = collect(tmp_path)
    rows = trials.select(["trial_id", "status", "config_embedding"]).to_pylist()
    base = next(r["trial_id"] for r in rows if r["status"] == "completed" and r["config_embedding"] == "linear")
    other = next(r["trial_id"] for r in rows if r["status"] == "completed" and r["config_embedding"] == "sne")
    ids = trials["trial_id"].to_pylist()
    for col in ("final_top1", "gmacs", "params_m"):
        values = trials[col].to_pylist()
        values[ids.index(base)] = values[ids.index(other)]
        trials = trials.set_column(trials.schema.get_field_index(col), col, pa.array(values, pa.float64()))
    return trials, epochs, base, other


def test_coincident_trials_are_drawn_apart_and_the_baseline_has_its_own_marker(tmp_path):
    trials, epochs, base, other = _coinciding(tmp_path)
    info = front_info(trials, OBJECTIVES)
    figs = figures(info, epochs, None)
    table = trials.to_pandas().set_index("trial_id")

    pair = _drawn(figs["top1_vs_gmacs"])
    (bx, by), btext, bsymbol = pair[base]
    (ox, oy), otext, osymbol = pair[other]
    assert by == oy == table.at[other, "final_top1"] and bx != ox  # two points, side by side
    assert table.at[other, "gmacs"] in (bx, ox)  # one of them where it is
    span = np.ptp(table.loc[list(pair), "gmacs"])
    assert abs(bx - ox) == pytest.approx(SPREAD * span)
    assert "the same point as 1 other trial(s)" in btext and "the same point as 1 other trial(s)" in otext
    assert "2 points share their coordinates" in figs["top1_vs_gmacs"]["layout"]["title"]["text"]
    lone = [text for tid, (_, text, _) in pair.items() if tid not in (base, other)]
    assert lone and not any("the same point" in text for text in lone)
    assert bsymbol == "hexagram" and osymbol == "circle"  # the baseline's own marker, the status's for the rest
    linear = set(table.index[table["config_embedding"] == "linear"]) & set(pair)
    assert {pair[t][2] for t in linear} <= {"hexagram", "hexagram-open"}
    assert not any(s.startswith("hexagram") for t, (_, _, s) in pair.items() if t not in linear)
    ring = next(t for t in figs["top1_vs_gmacs"]["data"] if t["name"] == "Pareto front (all objectives)")
    for tid, x in zip(ring["customdata"], _numbers(ring["x"])):
        assert x == pair[tid][0][0]  # the front's ring around each point where it is drawn

    cube = _drawn(figs["pareto_3d"], "xyz")
    assert cube[base][0] != cube[other][0] and cube[base][0][1:] == cube[other][0][1:]
    assert cube[base][2] == "square" and cube[other][2] != "square"


def test_spread_steps_right_then_left_and_leaves_missing_and_lone_points():
    x = np.array([1.0, 1.0, 3.0, 1.0, np.nan, 1.0])
    y = np.array([5.0, 5.0, 5.0, 5.0, 5.0, 6.0])
    drawn, shared = spread([x, y])
    step = SPREAD * 2.0  # the x span of the points present
    np.testing.assert_array_equal(drawn, [1.0, 1.0 + step, 3.0, 1.0 - step, np.nan, 1.0])
    assert shared.tolist() == [2, 2, 0, 2, 0, 0]
    again, _ = spread([x, y])
    np.testing.assert_array_equal(again, drawn)  # the same tables draw the same figure
