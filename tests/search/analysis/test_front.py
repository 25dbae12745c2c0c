"""front_info: the report's Pareto computation done once, and the figures rendered from it."""
import base64

import numpy as np
from helpers.campaign_files import ALL_STATUSES, write_campaign

from qkvsearch.search.analysis.figures import figures
from qkvsearch.search.analysis.front import front_info
from qkvsearch.search.analysis.pareto import hypervolume
from qkvsearch.search.analysis.results import collect

OBJECTIVES = [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"},
              {"metric": "params_m", "mode": "min"}]


def _dominates(a, b, sign):
    return np.all(sign * a <= sign * b) and np.any(sign * a < sign * b)


def _numbers(arr):
    return np.frombuffer(base64.b64decode(arr["bdata"]), "<f8") if arr else np.zeros(0)


def test_front_info_holds_the_front_its_pairs_and_hypervolume(tmp_path):
    write_campaign(tmp_path, ALL_STATUSES * 2, seed=3)
    trials, epochs = collect(tmp_path)
    info = front_info(trials, OBJECTIVES)
    assert info.metrics == ["top1", "gmacs", "params_m"] and info.columns == ["final_top1", "gmacs", "params_m"]
    sign = np.array([-1.0, 1.0, 1.0])
    done = np.flatnonzero(info.eligible)
    assert set(info.trials["status"].iloc[done]) == {"completed"}
    expect = {i for i in done if not any(_dominates(info.points[j], info.points[i], sign) for j in done if j != i)}
    assert set(np.flatnonzero(info.on_front)) == expect and len(info.front) == len(expect)
    pts = info.points[info.on_front]
    assert np.isclose(info.final_hypervolume, hypervolume(pts, info.directions, info.reference))
    plane = info.pair_fronts[1]  # top1 against gmacs
    assert list(plane["gmacs"]) == sorted(plane["gmacs"])
    pair = info.points[done][:, :2]  # (top1, gmacs) of the eligible trials
    on_plane = {i for i, p in enumerate(pair) if not any(_dominates(q, p, sign[:2]) for q in pair)}
    assert sorted(map(tuple, plane[["final_top1", "gmacs"]].to_numpy())) == sorted(tuple(pair[i]) for i in on_plane)
    figs = figures(info, epochs, None)
    assert list(figs) == ["top1_vs_gmacs", "top1_vs_params_m", "pareto_3d", "learning_curves", "hypervolume"]
    stair = next(t for t in figs["top1_vs_gmacs"]["data"] if t.get("mode") == "lines")
    assert np.allclose(_numbers(stair["x"]), plane["gmacs"]) and np.allclose(_numbers(stair["y"]), plane["final_top1"])
    hv = figs["hypervolume"]["data"][0]
    assert np.isclose(_numbers(hv["y"])[-1], info.final_hypervolume)
