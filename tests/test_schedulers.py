"""MOASHAScheduler: the rung rule on recorded values, the scheduler driven through Tune's callback API
with real Trial objects (no Ray needed), and a small real Tune run."""
import math
import pickle

import numpy as np
import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from qkvsearch.search.schedulers import MOASHAScheduler, crowding_distance, promotable, rung_positions

CONTINUE, STOP = TrialScheduler.CONTINUE, TrialScheduler.STOP
ACC_PARAMS = ["max", "min"]  # (top1 %, params M)


def _trial(trial_id: str) -> Trial:
    return Trial("curve", config={}, trial_id=trial_id, stub=True)  # stub: no registered trainable


def _moasha(**kw) -> MOASHAScheduler:
    kw = {"metrics": ["top1", "params_m"], "modes": ACC_PARAMS, "max_t": 9, **kw}
    return MOASHAScheduler(**kw)


def _report(sched, trial, epoch, top1, params_m):
    return sched.on_trial_result(None, trial, {"epoch": epoch, "top1": top1, "params_m": params_m})


# ---- (1) the rung rule on recorded values --------------------------------------------------------

def test_dominated_by_every_result_stops():
    rung = [[90, 5.0], [88, 4.5], [85, 4.0], [80, 3.5], [75, 3.2], [50, 6.0]]  # last: worse on both
    assert not promotable(rung, ACC_PARAMS, 3, 5)
    assert promotable(rung, ACC_PARAMS, 3, 0)


def test_unique_trade_off_continues_though_worst_on_one_objective():
    # The candidate has the worst top1 of the rung but is by far the smallest model: on the front, at
    # its end (infinite crowding distance), so it continues. Ray's ASHA on top1 stops it (below).
    rung = [[90, 5.0], [88, 4.5], [85, 4.0], [80, 3.5], [75, 3.2], [40, 0.5]]
    assert promotable(rung, ACC_PARAMS, 3, 5)
    cutoff = np.percentile([r[0] for r in rung], (1 - 1 / 3) * 100)  # ASHA's rule on top1 alone
    assert rung[5][0] < cutoff
    # and an interior front member of the same rung does not make the top third
    assert not promotable(rung, ACC_PARAMS, 3, 3)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 9, 10, 27])
@pytest.mark.parametrize("rf", [2, 3, 4, 2.5])
def test_reduction_factor_keeps_top_ceil_n_over_rf(n, rf):
    rung = [[i, i] for i in range(n)]  # a dominance chain: row i has rank i (both minimised)
    keep = [promotable(rung, ["min", "min"], rf, i) for i in range(n)]
    assert keep == [i < math.ceil(n / rf) for i in range(n)]


def test_first_result_at_a_rung_always_continues():
    assert promotable([[0.0, 1e9]], ACC_PARAMS, 3, 0)
    assert promotable([[math.nan, math.nan]], ACC_PARAMS, 3, 0)
    sched = _moasha()
    assert _report(sched, _trial("a"), 1, 1.0, 99.0) == CONTINUE  # terrible, but alone at the rung


def test_mixed_modes_decide_which_side_is_better():
    rung = [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]]  # a diagonal line
    assert list(rung_positions(rung, ["min", "min"])) == [0, 1, 2, 3]
    assert list(rung_positions(rung, ["max", "max"])) == [3, 2, 1, 0]
    # max/min: no point dominates another; ends first (inf crowding), then the interior
    pos = rung_positions(rung, ["max", "min"])
    assert pos[0] == pos[3] == 0 and set(pos[1:3]) == {2}
    assert promotable(rung, ["min", "min"], 3, 0) and not promotable(rung, ["min", "min"], 3, 3)
    assert promotable(rung, ["max", "max"], 3, 3) and not promotable(rung, ["max", "max"], 3, 0)


def test_crowding_distance_prefers_the_isolated_front_member():
    # front (both minimised): x = 0, 1, 2, 6, 10 on y = 10 - x, plus 4 dominated points -> n = 9
    front = [[x, 10 - x] for x in (0, 1, 2, 6, 10)]
    rung = front + [[11, 11], [12, 12], [5, 9], [9, 5]]
    ranks = np.array([0] * 5 + [2, 3, 1, 1])
    crowd = crowding_distance(rung, ["min", "min"], ranks)
    assert np.isinf(crowd[[0, 4]]).all()
    np.testing.assert_allclose(crowd[1:4], [0.4, 1.0, 1.6])  # (gap_x + gap_y) / 10
    # top ceil(9/3) = 3: both ends and x = 6, the most isolated interior member
    assert [promotable(rung, ["min", "min"], 3, i) for i in range(9)] == [
        True, False, False, True, True, False, False, False, False]


def test_non_finite_values_rank_last_without_crashing():
    rung = [[80, 3.0], [70, 2.0], [math.nan, 1.0]]
    assert list(rung_positions(rung, ACC_PARAMS)) == [0, 0, 2]
    # +inf top1 would be "best" if taken at face value; it counts as missing instead
    assert not promotable([[80, 3.0], [math.inf, 1.0]], ACC_PARAMS, 3, 1)
    assert not promotable([[80, 3.0], [-math.inf, 1.0]], ["min", "min"], 3, 1)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: promotable([[1, 2]], ACC_PARAMS, 1, 0), "reduction_factor"),
        (lambda: promotable([[1, 2]], ACC_PARAMS, 3, 1), "candidate_index"),
        (lambda: promotable([[1, 2, 3]], ACC_PARAMS, 3, 0), "rung_values"),
        (lambda: promotable([[1, 2]], ["max", "up"], 3, 0), "directions"),
        (lambda: MOASHAScheduler(["a", "b"], ["max"]), "modes"),
        (lambda: MOASHAScheduler("top1", ["max"]), "metrics"),
        (lambda: MOASHAScheduler(["a", "a"], ["max", "min"]), "metrics"),
        (lambda: MOASHAScheduler(["a"], ["max"], reduction_factor=1), "reduction_factor"),
        (lambda: MOASHAScheduler(["a"], ["max"], grace_period=0), "grace_period"),
        (lambda: MOASHAScheduler(["a"], ["max"], grace_period=4, max_t=3), "max_t"),
        (lambda: MOASHAScheduler(["a"], ["max"], time_attr=""), "time_attr"),
    ],
)
def test_bad_input_raises_value_error_naming_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


# ---- (2) the scheduler through Tune's callback API ----------------------------------------------

def test_rungs_and_decisions_at_rungs():
    sched = _moasha()
    assert sched.rungs == [1, 3]  # grace 1, rf 3, below max_t 9
    a, b, c = _trial("a"), _trial("b"), _trial("c")
    for t in (a, b, c):
        sched.on_trial_add(None, t)
    assert _report(sched, a, 1, 60.0, 3.0) == CONTINUE  # first at rung 1
    assert _report(sched, a, 2, 65.0, 3.0) == CONTINUE  # between rungs: nothing recorded
    assert _report(sched, b, 1, 50.0, 4.0) == STOP  # dominated by a
    assert _report(sched, c, 1, 55.0, 1.0) == CONTINUE  # a trade-off: front with a
    assert sched.stopped == {"b": 1}
    assert sched.recorded(1) == {"a": [60.0, 3.0], "b": [50.0, 4.0], "c": [55.0, 1.0]}
    assert _report(sched, a, 3, 70.0, 3.0) == CONTINUE
    assert _report(sched, c, 3, 56.0, 3.5) == STOP  # now dominated by a at rung 3
    assert _report(sched, a, 9, 80.0, 3.0) == STOP  # max_t: done, not an early stop
    assert sched.stopped == {"b": 1, "c": 3}
    assert _report(sched, a, 3, 70.0, 3.0) == CONTINUE  # re-sent (restore): same decision
    assert _report(sched, c, 3, 56.0, 3.5) == STOP
    assert "2 stopped early" in sched.debug_string()


def test_worst_top1_small_model_survives_where_ray_asha_stops_it():
    results = [("a", 80.0, 4.0), ("b", 78.0, 3.5), ("c", 75.0, 3.0), ("d", 60.0, 0.5)]
    asha = ASHAScheduler(time_attr="epoch", metric="top1", mode="max", grace_period=1,
                         reduction_factor=3, max_t=9)
    mo = _moasha()
    for tid, top1, params in results:
        trial = _trial(tid)
        asha.on_trial_add(None, trial)
        mo.on_trial_add(None, trial)
        got = {"asha": asha.on_trial_result(None, trial, {"epoch": 1, "top1": top1, "params_m": params}),
               "moasha": _report(mo, trial, 1, top1, params)}
    assert got == {"asha": STOP, "moasha": CONTINUE}  # for "d", the last one


def test_missing_or_non_finite_metrics_do_not_crash():
    sched = _moasha()
    a, b, c, d = (_trial(x) for x in "abcd")
    assert sched.on_trial_result(None, a, {"top1": 1.0}) == CONTINUE  # no epoch: ignored
    assert _report(sched, a, 1, 60.0, 3.0) == CONTINUE
    assert sched.on_trial_result(None, b, {"epoch": 1, "top1": 99.0}) == STOP  # params_m missing
    assert _report(sched, c, 1, math.nan, 0.1) == STOP
    assert sched.on_trial_result(None, d, {"epoch": 1, "top1": "n/a", "params_m": 1.0}) == STOP
    assert sched.recorded(1) == {"a": [60.0, 3.0]}  # incomplete results are not recorded
    assert sched.stopped == {"b": 1, "c": 1, "d": 1}
    fresh = _moasha()
    assert _report(fresh, c, 1, math.inf, 0.1) == CONTINUE  # alone at its rung: first continues
    assert fresh.recorded(1) == {}


def test_trial_complete_records_its_last_result():
    sched = _moasha()
    a, b = _trial("a"), _trial("b")
    sched.on_trial_complete(None, a, {"epoch": 4, "top1": 70.0, "params_m": 2.0})  # ended after rung 3
    assert sched.recorded(3) == {"a": [70.0, 2.0]}
    sched.on_trial_complete(None, b, {"epoch": 4, "top1": math.nan, "params_m": 2.0})
    sched.on_trial_complete(None, b, None)
    assert sched.recorded(3) == {"a": [70.0, 2.0]} and sched.stopped == {}


def test_tune_config_metric_is_refused_and_scheduler_metric_stays_unset():
    sched = _moasha()
    assert sched.set_search_properties(None, None)
    assert not sched.set_search_properties("top1", "max")
    assert sched.metric is None  # Tune then does not require one metric in every result


def _feed_stops(sched):
    a, b = _trial("a"), _trial("b")
    _report(sched, a, 1, 60.0, 3.0)
    _report(sched, b, 1, 50.0, 4.0)
    return sched


def test_pickle_save_restore_keep_decisions(tmp_path):
    sched = _feed_stops(_moasha())
    copy = pickle.loads(pickle.dumps(sched))
    assert copy.stopped == {"b": 1} and copy.recorded(1) == sched.recorded(1)
    sched.save(str(tmp_path / "s.json"))
    other = _moasha()
    other.restore(str(tmp_path / "s.json"))
    assert other.get_state() == sched.get_state()
    assert _report(other, _trial("e"), 1, 40.0, 5.0) == STOP  # judged against the restored rung
    with pytest.raises(ValueError, match="metrics"):
        _moasha(metrics=["top1", "gmacs"]).restore(str(tmp_path / "s.json"))


def test_state_path_survives_tuner_restore_pattern(tmp_path):
    # Tune pickles the scheduler once, when the Tuner is built, and unpickles that copy on restore.
    sched = _moasha(state_path=tmp_path / "moasha.json")
    built = pickle.dumps(sched)
    _feed_stops(sched)  # the run goes on, then the driver dies
    restored = pickle.loads(built)
    assert restored.stopped == {}  # the pickled copy predates the run ...
    restored.on_trial_add(None, _trial("a"))  # ... and reloads state_path on its first callback
    assert restored.stopped == {"b": 1}
    assert _report(restored, _trial("b"), 1, 50.0, 4.0) == STOP
    assert _report(restored, _trial("a"), 1, 60.0, 3.0) == CONTINUE


class _StopWatcher:
    """What a campaign callback does: hold the scheduler and ask it at trial end."""

    def __init__(self, sched):
        self.sched = sched


def test_callback_and_scheduler_stay_linked_through_one_pickle():
    # tuner.pkl is one cloudpickle of the Tuner state (TuneConfig and RunConfig together): a
    # callback holding the scheduler still holds the very scheduler Tune uses after Tuner.restore.
    from ray import cloudpickle, tune

    sched = _moasha()
    state = {"tune_config": tune.TuneConfig(scheduler=sched),
             "run_config": tune.RunConfig(callbacks=[_StopWatcher(sched)])}
    back = cloudpickle.loads(cloudpickle.dumps(state))
    restored = back["tune_config"].scheduler
    assert back["run_config"].callbacks[0].sched is restored
    _feed_stops(restored)
    assert back["run_config"].callbacks[0].sched.stopped == {"b": 1}


# ---- (3) a real Tune run -------------------------------------------------------------------------

# trial -> (final top1, top1 gained per epoch, params): top1(epoch) = final - slope * (9 - epoch).
# F* lie on the final front; D* are dominated; X starts fast (ahead of F1 at epoch 1) and plateaus.
CURVES = {"F1": (90, 3, 4.0), "X": (72, 0.5, 4.5), "F2": (80, 1, 2.0), "D1": (60, 1, 4.0),
          "F3": (70, 1, 1.0), "D3": (65, 1, 2.5), "F4": (85, 1, 3.0), "D2": (50, 1, 3.0)}
EPOCHS = 9


@pytest.mark.slow
def test_real_tune_run_stops_dominated_trials_early(ray_local, tmp_path):
    from ray import tune

    def curves(config):  # nested: pickled by value (workers cannot import this test module)
        final, slope, params = CURVES[config["name"]]
        for epoch in range(1, EPOCHS + 1):
            tune.report({"epoch": epoch, "top1": final - slope * (EPOCHS - epoch), "params_m": params})

    sched = MOASHAScheduler(["top1", "params_m"], ACC_PARAMS, time_attr="epoch", grace_period=1,
                            reduction_factor=3, max_t=EPOCHS, state_path=tmp_path / "moasha.json")
    tuner = tune.Tuner(
        tune.with_resources(curves, {"cpu": 1, "trial_slot": 1}),
        param_space={"name": tune.grid_search(list(CURVES))},  # run one at a time, in this order
        tune_config=tune.TuneConfig(scheduler=sched, max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(name="moasha", storage_path=str(tmp_path), verbose=0),
    )
    df = tuner.fit().get_dataframe()
    epochs_run = dict(zip(df["config/name"], df["epoch"]))
    name_of = dict(zip(df["trial_id"], df["config/name"]))
    stopped = {name_of[t]: rung for t, rung in sched.stopped.items()}

    assert stopped == {"D1": 1, "D3": 1, "D2": 1, "X": 3}
    assert {n: epochs_run[n] for n in stopped} == stopped  # stopped right at their rung
    survivors = {n for n, e in epochs_run.items() if e == EPOCHS}
    assert survivors == {"F1", "F2", "F3", "F4"}  # exactly the final front of (top1, params)
    # F3 has the worst top1 of the survivors; ASHA on top1 would have cut it at epoch 3
    # (64 < the 2/3 percentile of 72, 69, 74, 64), MO-ASHA keeps it as the smallest model.
    assert min(survivors, key=lambda n: CURVES[n][0]) == "F3"
    # the persisted state agrees with the live object
    restored = MOASHAScheduler(["top1", "params_m"], ACC_PARAMS, max_t=EPOCHS)
    restored.restore(str(tmp_path / "moasha.json"))
    assert restored.stopped == sched.stopped
