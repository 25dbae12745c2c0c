"""MOASHAScheduler: the rung rule on recorded values, the scheduler driven through Tune's callback API
with real Trial objects (no Ray needed), and a small real Tune run."""
import math
import pickle

import numpy as np
import pytest
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from qkvsearch.search.scheduling.moasha import (
    candidate_position,
    crowding_distance,
    default_shares,
    next_bracket,
    promotable,
    rung_positions,
)
from qkvsearch.search.scheduling.tune_schedulers import CampaignFIFOScheduler, MOASHAScheduler

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


# ---- (2b) brackets (asynchronous Hyperband) ------------------------------------------------------

# Recorded metrics: trial -> (top1 per epoch 1..27, params M). "late" is the largest model and learns
# slowest: last of all at epoch 1, first from epoch 9 on.
def _curve(final, tau, epochs=27):
    e = np.arange(1, epochs + 1)
    return (final * (1 - np.exp(-e / tau)) / (1 - np.exp(-epochs / tau))).tolist()


RECORDED = {"fast": (_curve(70, 1.0), 2.0), "mid": (_curve(74, 2.0), 3.0), "late": (_curve(80, 4.0), 4.0),
            "weak": (_curve(60, 1.0), 3.5), "small": (_curve(65, 1.0), 1.0), "fat": (_curve(66, 2.0), 5.0)}


def _replay(sched, names, upto=27, add=True):
    """Feed the recorded epochs round by round (every trial's epoch e before any epoch e + 1), as
    trials running side by side report them; returns {(name, epoch): decision} up to each stop."""
    trials = {n: _trial(n) for n in names}
    if add:
        for t in trials.values():
            sched.on_trial_add(None, t)
    decisions, live = {}, list(names)
    for epoch in range(1, upto + 1):
        for n in list(live):
            top1, params = RECORDED[n]
            d = _report(sched, trials[n], epoch, top1[epoch - 1], params)
            decisions[(n, epoch)] = d
            if d == STOP:
                live.remove(n)
    return decisions


EQUAL = (1, 1, 1)  # equal shares: plain round-robin, so the tests below know each trial's bracket


def test_bracket_s_skips_the_first_s_rungs_and_equal_shares_deal_round_robin():
    sched = _moasha(max_t=27, brackets=3, bracket_shares=EQUAL)
    assert sched.rungs == [1, 3, 9] and sched.bracket_rungs == [[1, 3, 9], [3, 9], [9]]
    names = [f"t{i}" for i in range(7)]
    for n in names:
        sched.on_trial_add(None, _trial(n))
    assert [sched.bracket_of(n) for n in names] == [0, 1, 2, 0, 1, 2, 0]
    sched.on_trial_add(None, _trial("t1"))  # added again (a restore): stays where it is
    assert sched.bracket_of("t1") == 1 and sched.bracket_of("unseen") is None
    _report(sched, _trial("u"), 1, 50.0, 1.0)  # a trial never added joins on its first result
    assert sched.bracket_of("u") == 1


def test_default_shares_grow_by_rf_squared_per_bracket():
    sched = _moasha(max_t=27, brackets=3)  # rf 3: shares 1 : 9 : 81
    assert default_shares(3, 3) == [1, 9, 81] and default_shares(2, 2.5) == [1, 6.25]
    names = [f"t{i}" for i in range(91)]
    for n in names:
        sched.on_trial_add(None, _trial(n))
    dealt = [sched.bracket_of(n) for n in names]
    assert dealt[:7] == [2, 2, 2, 2, 1, 2, 2]
    assert [dealt.count(b) for b in range(3)] == [1, 9, 81]  # 91 trials: the shares exactly


@pytest.mark.parametrize("shares, most", [((1, 1, 1), 1), ((1, 3, 9), 1), ((1, 2.5, 6.25), 1), ((2, 1), 1),
                                          ((0.1, 0.3), 1), ((1, 9, 81, 729), 1.5), ((1, 3, 9, 27, 81, 243), 1.5)])
def test_next_bracket_keeps_every_bracket_close_to_its_share(shares, most):
    counts = [0] * len(shares)
    total = sum(shares)
    for k in range(1, 1000):
        counts[next_bracket(counts, shares)] += 1
        assert all(abs(c - k * w / total) < most for c, w in zip(counts, shares)), (k, counts)


def test_next_bracket_ties_go_to_the_lowest_index():
    assert next_bracket([0, 0, 0], [1, 1, 1]) == 0
    assert next_bracket([1, 0, 0], [1, 1, 1]) == 1
    assert next_bracket([1, 0, 0], [2, 1, 1]) == 1  # brackets 1 and 2 equally behind: the lower wins
    assert next_bracket([0, 0, 4], [1, 9, 81]) == 1  # 45 / 91 of a trial behind against 41 / 91 for bracket 2
    assert next_bracket([1, 0], [2.5, 2.5]) == 1 and next_bracket([1, 1], [2.5, 2.5]) == 0
    with pytest.raises(ValueError, match="counts"):
        next_bracket([0, 0], [1, 1, 1])


@pytest.mark.parametrize("shares", [(1, 1), (1, 0, 1), (1, -1, 1), (1, float("nan"), 1), "111", 3, (1, True, 1)])
def test_bracket_shares_must_be_one_positive_number_per_bracket(shares):
    with pytest.raises(ValueError, match="bracket_shares"):
        _moasha(max_t=27, brackets=3, bracket_shares=shares)


def test_a_trial_is_judged_only_at_its_own_brackets_rungs():
    sched = _moasha(max_t=27, brackets=3, bracket_shares=EQUAL)
    a, b, c, d = (_trial(x) for x in "abcd")  # brackets 0, 1, 2, 0
    for t in (a, b, c, d):
        sched.on_trial_add(None, t)
    assert _report(sched, a, 1, 60.0, 3.0) == CONTINUE  # bracket 0: first at rung 1
    assert _report(sched, d, 1, 50.0, 4.0) == STOP  # bracket 0: dominated by a
    for epoch in (1, 2):  # bracket 1 has no rung before epoch 3; bracket 2 none before 9
        assert _report(sched, b, epoch, 10.0, 9.0) == CONTINUE
        assert _report(sched, c, epoch, 10.0, 9.0) == CONTINUE
    assert sched.recorded(1) == {"a": [60.0, 3.0], "d": [50.0, 4.0]}
    assert _report(sched, b, 3, 10.0, 9.0) == CONTINUE  # first at bracket 1's rung 3, whatever a did
    assert sched.recorded(3, bracket=1) == {"b": [10.0, 9.0]} and sched.recorded(3) == {}
    e = _trial("e")  # bracket 1
    sched.on_trial_add(None, e)
    assert _report(sched, e, 3, 9.0, 9.5) == STOP  # dominated by b in bracket 1
    assert sched.stopped == {"d": 1, "e": 3}
    for epoch in range(3, 9):
        assert _report(sched, c, epoch, 10.0, 9.0) == CONTINUE
    assert _report(sched, c, 9, 10.0, 9.0) == CONTINUE  # judged at 9, first there
    assert sched.recorded(9, bracket=2) == {"c": [10.0, 9.0]}
    with pytest.raises(ValueError, match="milestone"):
        sched.recorded(1, bracket=1)
    assert "bracket 2: epoch 9: 1" in sched.debug_string()


def test_bracket_zero_alone_gives_the_one_bracket_decisions():
    names = list(RECORDED)
    hb = _moasha(max_t=27, brackets=3, bracket_shares=EQUAL)
    mixed = _replay(hb, names)
    zero = [n for n in names if hb.bracket_of(n) == 0]
    assert zero == ["fast", "weak"]
    alone = _replay(_moasha(max_t=27), zero)
    assert {k: v for k, v in mixed.items() if k[0] in zero} == alone
    one = _moasha(max_t=27)
    _replay(one, zero)
    assert hb.get_state()["recorded"][0] == one.get_state()["recorded"][0]


def test_late_bloomer_survives_only_in_a_later_bracket():
    # one bracket: "late" (worst top1 at epoch 1, largest model) is dominated at rung 1 and stopped;
    # in bracket 2 (first rung at epoch 9) it is already ahead and trains to the end.
    names = ["fast", "mid", "small", "weak", "fat", "late"]
    one = _moasha(max_t=27)
    assert _replay(one, names)[("late", 1)] == STOP
    three = _moasha(max_t=27, brackets=3, bracket_shares=EQUAL)
    decisions = _replay(three, names)
    assert three.bracket_of("late") == 2
    assert decisions[("late", 9)] == CONTINUE and decisions[("late", 27)] == STOP  # 27 = max_t: done
    assert "late" not in three.stopped


def test_brackets_survive_save_restore_and_pickle(tmp_path):
    sched = _moasha(max_t=27, brackets=3)
    _replay(sched, ["fast", "mid", "late", "weak"], upto=9)
    copy = pickle.loads(pickle.dumps(sched))
    assert copy.get_state() == sched.get_state()
    dealt = list(sched.get_state()["bracket_of"].values())
    counts = [dealt.count(b) for b in range(3)]
    for s in (sched, copy):  # both go on dealing from the same counts
        s.on_trial_add(None, _trial("new"))
    assert sched.bracket_of("new") == copy.bracket_of("new") == next_bracket(counts, default_shares(3, 3))
    other = _moasha(max_t=27, brackets=3)
    sched.save(str(tmp_path / "copy.json"))
    other.restore(str(tmp_path / "copy.json"))
    assert other.get_state() == sched.get_state()
    with pytest.raises(ValueError, match="brackets"):
        _moasha(max_t=27, brackets=2).restore(str(tmp_path / "copy.json"))


def test_a_one_bracket_state_of_the_previous_format_loads_into_bracket_zero():
    old = {"format": "qkvsearch.moasha/1", "metrics": ["top1", "params_m"], "modes": ACC_PARAMS,
           "time_attr": "epoch", "milestones": [1, 3],
           "recorded": [{"a": [60.0, 3.0], "b": [50.0, 4.0]}, {"a": [70.0, 3.0]}], "stopped": {"b": 1}}
    one = _moasha()
    one.set_state(old)
    assert one.recorded(1) == {"a": [60.0, 3.0], "b": [50.0, 4.0]} and one.stopped == {"b": 1}
    assert _report(one, _trial("c"), 1, 40.0, 5.0) == STOP
    two = _moasha(max_t=27, brackets=2)
    with pytest.raises(ValueError, match="milestones"):
        two.set_state(old)  # rungs 1, 3, 9 here: not the saved scheduler's
    two = _moasha(max_t=9, brackets=2)
    two.set_state(old)
    assert two.bracket_of("a") == two.bracket_of("b") == 0
    two.on_trial_add(None, _trial("c"))
    assert two.bracket_of("c") == 1  # the bracket furthest behind its share


def test_a_scheduler_pickled_before_brackets_existed_unpickles_as_one_bracket(tmp_path):
    # tuner.pkl of an older campaign holds the scheduler's __dict__ in the one-bracket layout.
    sched = _feed_stops(_moasha())
    old = {k: v for k, v in sched.__dict__.items() if k not in ("_brackets", "_recorded", "_bracket_of", "_counts")}
    old.update(_milestones=[1, 3], _recorded=sched.get_state()["recorded"][0])
    back = MOASHAScheduler.__new__(MOASHAScheduler)
    back.__setstate__(old)
    assert back.bracket_rungs == [[1, 3]] and back.recorded(1) == sched.recorded(1)
    assert back.bracket_of("a") == 0 and back.stopped == {"b": 1}
    assert _report(back, _trial("e"), 1, 40.0, 5.0) == STOP


def test_a_scheduler_pickled_before_shares_existed_deals_with_the_default_shares():
    sched = _moasha(max_t=27, brackets=3)
    for n in ("a", "b", "c"):
        sched.on_trial_add(None, _trial(n))
    old = {k: v for k, v in sched.__dict__.items() if k != "_shares"}
    back = MOASHAScheduler.__new__(MOASHAScheduler)
    back.__setstate__(old)
    for s in (sched, back):
        s.on_trial_add(None, _trial("d"))
    assert back.bracket_of("d") == sched.bracket_of("d") and back.get_state() == sched.get_state()


# ---- (2b') restored from the campaign's records ---------------------------------------------------

def _numbered(name: str, n: int) -> Trial:
    """A trial as Tune makes it: tagged with its number in the campaign (1, 2, ...)."""
    return Trial("curve", config={}, trial_id=name, experiment_tag=f"{n}_name={name}", stub=True)


class _Campaign:
    """A scheduler and the campaign's recorder fed each result as Tune feeds them (the scheduler, then the
    callbacks; a STOP ends the trial). params_m rides along each result, as the cost does in a campaign."""

    def __init__(self, sched, exp: str):
        from qkvsearch.search.campaign.recording import TrialRecorder

        self.sched, self.trials = sched, {}
        self.recorder = TrialRecorder(exp, "restored", self._describe)

    @staticmethod
    def _describe(trial) -> dict:
        return {"config": {}, "cost": {"params_m": RECORDED[trial.trial_id][1]}, "epochs_planned": 27,
                "name": trial.trial_id}

    def add(self, name: str) -> None:
        self.trials[name] = trial = _numbered(name, len(self.trials) + 1)
        self.sched.on_trial_add(None, trial)
        self.recorder.on_trial_start(0, [], trial)

    def report(self, name: str, epoch: int, record: bool = True) -> str:
        trial, (top1, params) = self.trials[name], RECORDED[name]
        result = {"epoch": float(epoch), "top1": top1[epoch - 1], "params_m": params}
        decision = self.sched.on_trial_result(None, trial, result)
        if record:
            self.recorder.on_trial_result(0, [], trial, result)
        if decision == STOP and record:
            self.sched.on_trial_complete(None, trial, result)
            self.recorder.on_trial_complete(0, [], trial)
        return decision


@pytest.mark.parametrize("uri", [False, True], ids=["path", "uri"])
def test_a_restored_scheduler_rebuilds_rungs_brackets_and_stops_from_the_records(tmp_path, uri):
    exp = f"file://{tmp_path}" if uri else str(tmp_path)
    live = _moasha(max_t=27, brackets=3, bracket_shares=EQUAL, experiment=exp)
    built = pickle.dumps(live)  # tuner.pkl: the scheduler as the Tuner was built
    run = _Campaign(live, exp)
    names = list(RECORDED)
    for name in names:
        run.add(name)
    live_ones = list(names)
    for epoch in range(1, 11):  # round by round, then the driver dies
        for name in list(live_ones):
            if run.report(name, epoch) == STOP:
                live_ones.remove(name)
    assert live.stopped and len(live_ones) >= 2 and len({live.bracket_of(n) for n in names}) == 3
    assert not (tmp_path / "qs_scheduler.json").exists()  # no file of its own

    restored = pickle.loads(built)
    for name in reversed(names):  # Tune adds the restored trials back in an order of its own
        restored.on_trial_add(None, _numbered(name, names.index(name) + 1))
    assert restored.get_state() == live.get_state()
    assert restored.recorded(9, bracket=2) == live.recorded(9, bracket=2) != {}

    for sched in (live, restored):  # both go on alike: the next trial's bracket, the next decisions
        sched.on_trial_add(None, _numbered("late2", len(names) + 1))
    assert restored.bracket_of("late2") == live.bracket_of("late2")
    for name in live_ones:
        top1, params = RECORDED[name]
        assert (_report(restored, _trial(name), 11, top1[10], params)
                == _report(live, _trial(name), 11, top1[10], params))


def test_a_result_judged_but_never_recorded_is_judged_again_alike(tmp_path):
    live = _moasha(max_t=27, experiment=str(tmp_path))
    built = pickle.dumps(live)
    run = _Campaign(live, str(tmp_path))
    for name in ("fast", "weak"):
        run.add(name)
        run.report(name, 1)
    run.report("weak", 2, record=False)  # the driver dies before the recorder writes these two
    decision = run.report("weak", 3, record=False)  # judged at rung 3
    restored = pickle.loads(built)
    for n, name in enumerate(("fast", "weak"), start=1):
        restored.on_trial_add(None, _numbered(name, n))
    assert restored.recorded(3) == {}  # not recorded: not rebuilt ...
    top1, params = RECORDED["weak"]  # ... until the resumed trial reports it again
    assert _report(restored, _trial("weak"), 3, top1[2], params) == decision
    assert restored.get_state() == live.get_state()


def test_a_trial_stopped_early_stays_stopped_and_its_number_gives_its_bracket(tmp_path):
    live = _moasha(max_t=27, experiment=str(tmp_path))
    run = _Campaign(live, str(tmp_path))
    for name in ("fast", "small", "weak"):
        run.add(name)
    for name in ("fast", "small", "weak"):
        run.report(name, 1)
    assert live.stopped == {"weak": 1}
    restored = _moasha(max_t=27, experiment=str(tmp_path))
    restored.on_trial_add(None, _numbered("weak", 3))
    assert restored.stopped == {"weak": 1} and restored.recorded(1) == {"weak": live.recorded(1)["weak"]}
    top1, params = RECORDED["weak"]
    assert _report(restored, _trial("weak"), 1, top1[0], params) == STOP  # a re-sent result keeps the decision


@pytest.mark.parametrize("tag, number", [("1_name=a", 0), ("12_lr=0.1", 11), ("", None), ("0_x", None),
                                         ("x_1", None), (None, None)])
def test_trial_number_comes_from_tunes_tag(tag, number):
    from types import SimpleNamespace

    from qkvsearch.search.scheduling.tune_schedulers import _trial_number

    assert _trial_number(SimpleNamespace(trial_id="t", experiment_tag=tag)) == number


def test_a_scheduler_pickled_with_a_state_file_rebuilds_from_the_records_beside_it(tmp_path):
    # tuner.pkl of an older campaign: the scheduler kept its state in <experiment>/qs_scheduler.json.
    live = _moasha(experiment=str(tmp_path))
    run = _Campaign(live, str(tmp_path))
    for name in ("fast", "weak"):
        run.add(name)
        run.report(name, 1)
    old = {k: v for k, v in _moasha().__dict__.items() if k not in ("_experiment", "_deal", "_deal_counts")}
    old["_state_path"] = str(tmp_path / "qs_scheduler.json")
    back = MOASHAScheduler.__new__(MOASHAScheduler)
    back.__setstate__(old)
    for n, name in enumerate(("fast", "weak"), start=1):
        back.on_trial_add(None, _numbered(name, n))
    assert back.get_state() == live.get_state()


class _Controller:
    """Tune's controller as a scheduler sees it (wrapped): trials, and checkpoint(force, wait)."""

    def __init__(self):
        self.saves = []

    def get_trials(self):
        return []

    def checkpoint(self, force=False, wait=False):
        self.saves.append((force, wait))


@pytest.mark.parametrize("make", [_moasha, CampaignFIFOScheduler], ids=["moasha", "fifo"])
def test_tune_saves_its_experiment_before_a_trial_starts_once_trials_were_added_or_ended(make):
    from ray.tune.execution.tune_controller import TrialRunnerWrapper

    sched, tc = make(), _Controller()
    wrapped = TrialRunnerWrapper(tc, trial_executor=None, runner_whitelist_attr={"get_trials"})  # as Tune hands it
    sched.choose_trial_to_run(wrapped)
    assert tc.saves == []  # nothing changed yet
    sched.on_trial_add(wrapped, _numbered("a", 1))
    sched.on_trial_add(wrapped, _numbered("b", 2))
    sched.choose_trial_to_run(wrapped)
    sched.choose_trial_to_run(wrapped)
    assert tc.saves == [(True, True)]  # once for both additions, waiting for the copy to storage
    sched.on_trial_complete(wrapped, _numbered("a", 1), {"epoch": 1.0, "top1": 1.0, "params_m": 1.0})
    sched.choose_trial_to_run(wrapped)
    assert len(tc.saves) == 2


@pytest.mark.parametrize("brackets", [0, 4, True, 1.5, "2"])
def test_brackets_outside_the_rungs_are_refused(brackets):
    with pytest.raises(ValueError, match="brackets"):
        _moasha(max_t=27, brackets=brackets)  # rungs 1, 3, 9: at most 3


def test_grace_at_max_t_leaves_one_empty_bracket():
    sched = _moasha(grace_period=9, max_t=9)
    assert sched.bracket_rungs == [[]]
    assert _report(sched, _trial("a"), 9, 1.0, 1.0) == STOP  # done, not stopped early
    assert sched.stopped == {}


def test_candidate_position_matches_ordering_the_whole_rung():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n, k = int(rng.integers(1, 25)), int(rng.integers(1, 4))
        rung = rng.integers(0, 4, size=(n, k)).astype(float)  # ties and duplicates on purpose
        rung[rng.random((n, k)) < 0.05] = np.nan
        dirs = list(rng.choice(["min", "max"], size=k))
        full = rung_positions(rung, dirs)
        assert [candidate_position(rung, dirs, i) for i in range(n)] == full.tolist()


# ---- (2c) the spec's scheduler section ------------------------------------------------------------

def _spec(**scheduler):
    from qkvsearch.spaces import load_campaign

    return load_campaign({"name": "t", "model": {"name": "xcit_nano_12_p16_224", "img_size": 32, "num_classes": 10},
                          "data": {"dataset": "digits"}, "train": {"epochs": 9, "batch_size": 8},
                          "space": {"embedding": {"choice": ["linear", "sne"]}}, "scheduler": scheduler})


@pytest.mark.parametrize("scheduler, message", [
    ({"type": "moasha", "brackets": 3},
     "scheduler.brackets: expected at most 2 (one per rung below train.epochs 9: epochs 1, 3), given 3"),
    ({"type": "asha", "grace_epochs": 3, "brackets": 2},
     "scheduler.brackets: expected at most 1 (one per rung below train.epochs 9: epochs 3), given 2"),
    ({"type": "fifo", "brackets": 2},
     "scheduler.brackets: expected no brackets for type fifo (they apply to asha and moasha), given 2"),
    ({"type": "moasha", "brackets": 0}, "scheduler.brackets: expected a positive int, given 0"),
    ({"type": "moasha", "brackets": "two"}, 'scheduler.brackets: expected a positive int, given "two"'),
])
def test_spec_brackets_mistakes(scheduler, message):
    from qkvsearch.spaces import SpecError

    with pytest.raises(SpecError) as info:
        _spec(**scheduler)
    assert info.value.errors == [message]


def test_spec_brackets_default_and_what_the_campaign_builds(tmp_path):
    from qkvsearch.search.campaign.opened import OpenedCampaign
    from qkvsearch.search.campaign.run import _scheduler
    from qkvsearch.spaces import load_campaign, smoke_test

    spec = _spec(type="moasha")
    assert spec.scheduler.brackets is None and spec.scheduler.bracket_count(9) == 2  # 3, at most the 2 rungs
    assert load_campaign(spec.to_dict()) == spec
    assert _scheduler(OpenedCampaign(spec, str(tmp_path))).bracket_rungs == [[1, 3], [3]]
    assert smoke_test(spec).scheduler.bracket_count(2) == 1  # shrunk epochs: the default shrinks too
    assert _spec(type="moasha", brackets=1).scheduler.bracket_count(9) == 1
    asha = _scheduler(OpenedCampaign(_spec(type="asha", brackets=2), str(tmp_path)))
    assert isinstance(asha, ASHAScheduler) and len(asha._brackets) == 2  # Ray's own brackets
    assert len(_scheduler(OpenedCampaign(_spec(type="asha"), str(tmp_path)))._brackets) == 1  # Ray's default


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
                            reduction_factor=3, max_t=EPOCHS)
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


def test_every_scheduler_type_a_campaign_file_may_name_has_a_builder():
    from qkvsearch.search.scheduling.tune_schedulers import SCHEDULERS, make_scheduler
    from qkvsearch.spaces.sections import TRIAL_SCHEDULERS

    assert set(SCHEDULERS) == set(TRIAL_SCHEDULERS)
    for kind in TRIAL_SCHEDULERS:
        built = make_scheduler(kind, max_t=9, metrics=["top1", "gmacs"], modes=["max", "min"], metric="top1",
                               mode="max")
        assert hasattr(built, "on_trial_result") and hasattr(built, "choose_trial_to_run")


def test_forced_saves_take_a_bounded_share_of_the_driver_once_they_are_slow():
    from qkvsearch.search.scheduling.forced_saves import CHEAP_SAVE_S, SAVE_SHARE, save_due

    assert save_due(CHEAP_SAVE_S / 2, 0.0)  # a quick save follows every trial change
    slow = 4 * CHEAP_SAVE_S
    assert not save_due(slow, slow / SAVE_SHARE * 0.99)
    assert save_due(slow, slow / SAVE_SHARE)
    # over a long run of changes, the time spent saving stays within the share (plus one save)
    clock, saving, last, since = 0.0, 0.0, slow, 0.0
    for _ in range(10_000):
        clock += 0.01
        since += 0.01
        if save_due(last, since):
            saving, clock, since = saving + slow, clock + slow, 0.0
    assert saving <= SAVE_SHARE * clock + slow
