"""search.searchers.mfehvi: a trial stopped early (by MO-ASHA) is learnt from the epochs it reached, at their
fidelity, and not as a final result; what was learnt survives the plain saved state."""
from __future__ import annotations

import json
import math

import numpy as np

from qkvsearch.search.searchers.base import Problem
from qkvsearch.search.searchers.mfehvi import MFEhviSearcher

PLANNED = 9


def _problem() -> Problem:
    configs = [{"a": a, "b": b} for a in range(5) for b in range(4)]
    costs = [{"params_m": 1.0 + c["a"]} for c in configs]
    return Problem(objectives=(("top1", "max"), ("params_m", "min")), known=("params_m",), seed=0, num_trials=10,
                   candidates=lambda: (configs, costs, [True] * len(configs)), n_startup_trials=3)


def _epoch(epoch: int, top1: float) -> dict:
    return {"epoch": float(epoch), "top1": top1, "qs_epochs_planned": float(PLANNED)}


def test_a_stopped_trial_is_learnt_at_the_epochs_it_reached():
    searcher = MFEhviSearcher(_problem())
    searcher.suggest("done")
    for e in range(1, PLANNED):
        searcher.on_trial_result("done", _epoch(e, 10.0 * e))
    searcher.on_trial_complete("done", {**_epoch(PLANNED, 90.0), "params_m": 1.0})
    searcher.suggest("stopped")
    stopped = searcher.proposed["stopped"]
    for e in (1, 2):
        searcher.on_trial_result("stopped", _epoch(e, 5.0 * e))
    searcher.on_trial_complete("stopped", {**_epoch(3, 15.0), "params_m": 2.0})   # stopped at epoch 3 of 9

    core = searcher.core
    assert stopped not in core.results and stopped in core.tried           # no final value: it was stopped
    assert core.epochs[stopped] == {1: 5.0, 2: 10.0, 3: 15.0} and core.planned == PLANNED
    x, y, rows, epochs = core.training_data()
    fid = x[:, -1]
    mine = np.all(x[:, :-1] == core.features[stopped, :-1], axis=1)
    # kept: epochs on the ladder 1, 3, 9 and the last reached, at fidelity log(epoch) / log(9)
    assert sorted(zip(fid[mine].round(6), y[mine])) == [(0.0, 5.0), (0.5, 15.0)]
    assert y[rows].tolist() == [90.0] and fid[rows].tolist() == [1.0]       # the completed trial's final value
    assert math.isclose(fid.max(), 1.0) and len(y) == 3 + 2                 # done: epochs 1, 3, 9
    assert sorted(epochs[mine]) == [1, 3] and epochs[rows].tolist() == [PLANNED]

    again = MFEhviSearcher(_problem())
    again.restore(json.loads(json.dumps(searcher.state())))
    assert again.core.epochs == core.epochs and again.core.results == core.results and again.core.planned == PLANNED
    for tid in ("n0", "n1"):
        assert again.suggest(tid) == searcher.suggest(tid)
