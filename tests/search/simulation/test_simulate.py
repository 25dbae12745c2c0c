"""search.simulation: replays of recorded curves through the campaign's own scheduler classes (no Ray
runtime, no training): determinism, a FIFO replay of a recorded campaign, the tabular format, speed."""

import numpy as np
import pandas as pd
import pytest
from helpers.campaign_files import ALL_STATUSES, write_campaign

from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.cli import main
from qkvsearch.search.scheduling.tune_schedulers import MOASHAScheduler
from qkvsearch.search.simulation.curves import curves_from_frame, load_source
from qkvsearch.search.simulation.replay import Setting, build_scheduler, compare, default_settings, simulate
from qkvsearch.spaces.errors import BadInput

TWO = [("top1", "max"), ("params_m", "min")]


def table(n: int = 30, epochs: int = 9, seed: int = 0, crossing: bool = True) -> pd.DataFrame:
    """n configurations x epochs in the tabular format; larger models learn slower when crossing."""
    rng = np.random.default_rng(seed)
    params = rng.uniform(1, 6, n)
    final = 60 + 4 * params + rng.normal(0, 2, n)
    tau = 1 + (params - 1) * 0.6 if crossing else np.full(n, 2.0)
    e = np.arange(1, epochs + 1)
    top1 = final[:, None] * (1 - np.exp(-e[None] / tau[:, None])) / (1 - np.exp(-epochs / tau[:, None]))
    return pd.DataFrame({"config_id": np.repeat(np.arange(n), epochs), "config_lr": np.repeat(params / 10, epochs),
                         "epoch": np.tile(e, n), "top1": top1.reshape(-1), "params_m": np.repeat(params, epochs),
                         "epoch_s": np.repeat(10 * params, epochs)})


def _trace(run):
    return (run.end_time_s.tolist(), run.end_epochs.tolist(), run.end_curve.tolist(), run.end_complete.tolist(),
            run.hv.tolist())


def test_same_seed_same_run_other_seed_other_order():
    curves = curves_from_frame(table(), "t", TWO)
    settings = [Setting("fifo"), Setting("asha", 1, 3, 2), Setting("moasha", 1, 3, 2)]
    state = np.random.get_state()[1].copy()
    a = compare(curves, settings, concurrency=3, startup_s=5, seed=7)
    b = compare(curves, settings, concurrency=3, startup_s=5, seed=7)
    assert [_trace(r) for r in a] == [_trace(r) for r in b]
    assert (np.random.get_state()[1] == state).all()  # Ray's ASHA draws from numpy: restored afterwards
    c = simulate(curves, settings[2], concurrency=3, startup_s=5, seed=8)
    assert _trace(c) != _trace(a[2])


def test_fifo_replay_of_a_recorded_campaign_reproduces_its_front(tmp_path):
    exp = tmp_path / "synth"
    write_campaign(exp, ALL_STATUSES)  # 14 trials, every status; completed ones trained 6 of 6 epochs
    trials = collect(exp)[0].to_pandas()
    done = trials[trials["status"] == "completed"]
    values = done[["final_top1", "gmacs", "params_m"]].to_numpy()
    front = set(done["trial_id"][nondominated_mask(values, ["max", "min", "min"])])

    curves = load_source(exp)
    assert curves.max_t == 6 and curves.metrics == ["top1", "gmacs", "params_m"]
    run = simulate(curves, Setting("fifo"), concurrency=2, seed=3)
    assert run.trials == (trials["epochs_run"] > 0).sum()  # pending and infeasible trials never trained
    completed = run.completed_curves()
    assert {curves.ids[c] for c in completed} == set(done["trial_id"])
    finals = curves.finals[completed]
    replayed = {curves.ids[c] for c in completed[nondominated_mask(finals, curves.directions)]}
    assert replayed == front
    assert run.final_hv == pytest.approx(curves.grid_hv)
    assert run.truncated == run.trials - len(done)  # curves that end early end there, not complete
    assert run.epochs == curves.grid_epochs


def test_schedulers_are_the_campaigns_own_classes_and_stop_early():
    curves = curves_from_frame(table(60, 9, crossing=False), "t", TWO)
    run = simulate(curves, Setting("moasha", 1, 3, 2), concurrency=4, seed=0)
    sched = run.scheduler
    assert isinstance(sched, MOASHAScheduler) and sched.bracket_rungs == [[1, 3], [3]]
    assert run.stopped == len(sched.stopped) > 0
    assert run.epochs < curves.grid_epochs
    brackets = [sched.bracket_of(f"sim_{k:05d}") for k in range(run.trials)]
    assert brackets[:8] == [1, 1, 1, 1, 0, 1, 1, 1]  # shares 1 : 9, dealt in the order trials started
    assert brackets.count(0) == pytest.approx(run.trials / 10, abs=1)
    equal = simulate(curves, Setting("moasha", 1, 3, 2, shares=(1, 1)), concurrency=4, seed=0).scheduler
    assert [equal.bracket_of(f"sim_{k:05d}") for k in range(6)] == [0, 1, 0, 1, 0, 1]
    fifo = simulate(curves, Setting("fifo"), concurrency=4, seed=0)
    assert fifo.complete == len(curves) and fifo.final_hv == pytest.approx(curves.grid_hv)
    with pytest.raises(BadInput, match="expected one of fifo, asha, moasha, given pbt"):
        build_scheduler(Setting("pbt"), curves)   # a type the campaign cannot build is not simulated as another


@pytest.mark.timeout(120)  # about a second (benchmarks/bench_search.py times it)
def test_a_thousand_trials_replay():
    curves = curves_from_frame(table(1000, 27, crossing=True), "t", TWO)
    run = simulate(curves, Setting("moasha", 1, 3, 1), concurrency=8, seed=0)
    assert run.trials == 1000 and run.complete > 0


def test_more_trials_than_curves_reuse_them_pass_by_pass():
    curves = curves_from_frame(table(10, 3), "t", TWO)
    run = simulate(curves, Setting("fifo"), concurrency=1, seed=0, num_trials=25)
    order = run.end_curve.tolist()
    assert len(order) == 25
    assert sorted(order[:10]) == list(range(10)) and sorted(order[10:20]) == list(range(10))


def test_tabular_files_csv_and_parquet(tmp_path):
    df = table(12, 5)
    df = df[~((df["config_id"] == 0) & (df["epoch"] >= 3))]  # a shorter curve (a trial that stopped): 1-2
    csv, parquet = tmp_path / "b.csv", tmp_path / "b.parquet"
    df.to_csv(csv, index=False)
    df.to_parquet(parquet)
    a, b = load_source(csv), load_source(parquet)
    assert len(a) == len(b) == 12 and a.max_t == 5  # the longest curve's
    assert a.objectives == (("top1", "max"), ("params_m", "min"))  # the defaults that are columns
    assert [len(r) for r in a.results][:2] == [2, 5]
    assert a.configs[1] == {"id": 1, "lr": pytest.approx(df["config_lr"].iloc[5])}
    assert [s.label for s in default_settings(a)] == ["fifo", "asha g1 rf3", "moasha g1 rf3",
                                                      "moasha g1 rf3 b2"]


@pytest.mark.parametrize("frame, objectives, field", [
    (table().drop(columns="epoch"), None, "epoch"),
    (table().drop(columns=["config_id", "config_lr"]), None, "config_"),
    (table().assign(epoch=0), None, "epoch"),
    (table(), [("gmacs", "min")], "objectives"),
    (table(), [("top1", "up")], "objectives"),
])
def test_bad_tables_are_bad_input(frame, objectives, field):
    with pytest.raises(BadInput, match=field):
        curves_from_frame(frame, "t.csv", objectives)


def test_settings_parse_and_refuse():
    assert Setting.parse("moasha:grace=3,rf=2,brackets=2") == Setting("moasha", 3, 2, 2)
    assert Setting("moasha", 1, 3, 2, shares=(1, 1)).label == "moasha g1 rf3 b2 shares 1:1"
    assert Setting.parse("asha", grace=2, rf=4) == Setting("asha", 2, 4, 1)
    for bad in ("hyperband", "moasha:brackets", "moasha:rf=1", "moasha:grace=x", "moasha:speed=2"):
        with pytest.raises(BadInput, match="schedulers"):
            Setting.parse(bad)
    curves = curves_from_frame(table(), "t", TWO)
    with pytest.raises(BadInput, match="at most 2 bracket"):
        simulate(curves, Setting("moasha", 1, 3, 3))
    for bad in (Setting("moasha", 1, 3, 2, shares=(1, 1, 1)), Setting("asha", 1, 3, 2, shares=(1, 1))):
        with pytest.raises(BadInput, match="shares"):
            simulate(curves, bad)


def test_cli_simulate_writes_figure_and_trace(tmp_path, capsys):
    path = tmp_path / "bench.parquet"
    table(20, 9).to_parquet(path)
    out = tmp_path / "sim"
    rc = main(["simulate", str(path), "--schedulers", "fifo", "moasha:brackets=2", "--concurrency", "2",
               "--startup-s", "30", "--seed", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "moasha g1 rf3 b2" in printed and "HV@50%" in printed
    assert (out / "simulate.html").read_text().count("plotly") > 0
    lines = (out / "simulate.csv").read_text().splitlines()
    assert lines[0] == "scheduler,seed,time_s,epochs,hypervolume,hv_fraction" and len(lines) > 2
    assert main(["simulate", str(path), "--schedulers", "moasha:brackets=9", "--out", str(out)]) == 2
    assert "scheduler" not in capsys.readouterr().out
    assert main(["simulate", str(tmp_path / "none.csv")]) == 2


# ------------------------------------------------------------------------ the campaign's searchers on a table
def grid_table(epochs: int = 9) -> pd.DataFrame:
    """6 x 5 configurations (config_a, config_b: every combination in the table) x epochs."""
    a, b = np.meshgrid(np.arange(6), np.arange(5), indexing="ij")
    a, b = a.ravel(), b.ravel()
    params = 1.0 + a + 0.3 * b
    final = 60 + 4 * params - 2.0 * (b - 2) ** 2
    e = np.arange(1, epochs + 1)
    top1 = final[:, None] * (1 - np.exp(-e[None] / (1 + 0.4 * params[:, None])))
    n = len(a)
    return pd.DataFrame({"config_a": np.repeat(a, epochs), "config_b": np.repeat(b, epochs),
                         "epoch": np.tile(e, n), "top1": top1.reshape(-1), "params_m": np.repeat(params, epochs)})


@pytest.mark.parametrize("searcher", ["shuffle", "random", "tpe", "nsga2", "gp", "ehvi", "mfehvi"])
def test_each_searcher_drives_a_table_replay_deterministically_for_a_seed(searcher):
    from qkvsearch.spaces.search_options import SIMULATED_SEARCHERS

    assert searcher in SIMULATED_SEARCHERS and len(SIMULATED_SEARCHERS) == 7   # every one of them is here
    curves = curves_from_frame(grid_table(), "g", TWO)
    setting = Setting("moasha", 1, 3, 2)
    a, b, c = (simulate(curves, setting, concurrency=2, seed=s, num_trials=14, searcher=searcher) for s in (3, 3, 4))
    assert _trace(a) == _trace(b) and a.trials == 14 and a.end_curve.tolist() != c.end_curve.tolist()
    assert len(set(a.end_curve.tolist())) == 14  # a configuration is trained once
    if searcher == "ehvi":  # what it read: trained ones with their top1, stopped ones without a result
        assert len(a.searcher.searcher.core.results) == a.complete > 0 and len(a.searcher.searcher.core.tried) == 14
    elif searcher == "mfehvi":  # and every epoch each reached, stopped ones included
        core = a.searcher.searcher.core
        assert len(core.results) == a.complete > 0 and len(core.epochs) == 14 and core.planned == 9
        assert sum(len(e) for e in core.epochs.values()) == a.epochs
    elif searcher != "shuffle":
        import optuna

        states = [t.state for t in a.searcher.searcher.study.trials]
        assert a.label == f"{searcher} moasha g1 rf3 b2"
        # what it read, as a campaign tells it: stopped trials PRUNED, trained ones COMPLETE
        assert states.count(optuna.trial.TrialState.PRUNED) == a.stopped > 0
        assert states.count(optuna.trial.TrialState.COMPLETE) >= a.complete > 0


def test_constrained_replay_trains_only_feasible_curves_and_the_searcher_learns_the_rest():
    from qkvsearch.search.simulation.searchers import parse_constraints

    curves = curves_from_frame(grid_table(3), "g", TWO)
    cons = parse_constraints(["params_m:max=4.5"], curves)
    run = simulate(curves, Setting("fifo"), concurrency=2, seed=0, num_trials=10, searcher="tpe", constraints=cons)
    started = run.end_curve.tolist()
    assert len(started) == 10 and all(curves.results[c][0]["params_m"] <= 4.5 for c in started)
    told = [t for t in run.searcher.searcher.study.trials if t.constraints.get("params_m", 0) > 0]
    assert run.searcher.infeasible == len(told) > 0 and 0 < run.infeasible_share < 1
    assert all(t.values[1] > 4.5 for t in told if t.values)  # its exact cost objective
    with pytest.raises(BadInput, match="constraints: expected METRIC:max=X"):
        parse_constraints(["top1:max=3"], curves)
    known = simulate(curves, Setting("fifo"), concurrency=2, seed=0, num_trials=10, searcher="ehvi", constraints=cons)
    assert known.infeasible_share == 0 and all(curves.results[c][0]["params_m"] <= 4.5 for c in known.end_curve)


def test_a_measured_cost_is_known_to_ehvi_once_proposed_and_the_replay_is_deterministic():
    """latency_ms measured (as a campaign measures a proposal's model before it trains): the candidates'
    costs lack it, each proposal's is learnt; known, every candidate's is there from the start."""
    df = grid_table(1).assign(latency_ms=lambda d: 2.0 + d["config_a"] + 0.1 * d["config_b"])
    curves = curves_from_frame(df, "g", [("top1", "max"), ("latency_ms", "min")])
    a, b = (simulate(curves, Setting("fifo"), concurrency=2, seed=1, num_trials=12, searcher="ehvi",
                     measured=("latency_ms",)) for _ in range(2))
    assert _trace(a) == _trace(b) and a.complete == 12
    costs = a.searcher.searcher.core.costs[:, 0]
    measured = np.flatnonzero(~np.isnan(costs))
    assert sorted(measured.tolist()) == sorted(a.end_curve.tolist())   # measured: exactly those proposed
    assert costs[measured].tolist() == [curves.results[c][0]["latency_ms"] for c in measured]
    known = simulate(curves, Setting("fifo"), concurrency=2, seed=1, num_trials=12, searcher="ehvi")
    assert not np.isnan(known.searcher.searcher.core.costs).any()
    with pytest.raises(BadInput, match="measured: expected cost columns of measured metrics"):
        simulate(curves, Setting("fifo"), seed=1, num_trials=2, searcher="ehvi", measured=("top1",))


@pytest.mark.timeout(120)
def test_a_thousand_random_trials_take_seconds():
    import time

    df = table(1200, 3, crossing=False).rename(columns={"config_id": "config_a"}).drop(columns="config_lr")
    curves = curves_from_frame(df, "t", TWO)
    start = time.perf_counter()
    run = simulate(curves, Setting("fifo"), concurrency=4, seed=0, num_trials=1000, searcher="random")
    assert run.trials == 1000 and time.perf_counter() - start < 30


def test_cli_simulate_with_searchers_and_constraints(tmp_path, capsys):
    path = tmp_path / "grid.csv"
    grid_table(3).to_csv(path, index=False)
    rc = main(["simulate", str(path), "--searcher", "random", "tpe", "--schedulers", "fifo", "--trials", "8",
               "--constraints", "params_m:max=4.5", "--out", str(tmp_path / "sim")])
    printed = capsys.readouterr().out
    assert rc == 0 and "random fifo" in printed and "tpe fifo" in printed
    assert "infeasible proposals (no trial slot): random fifo" in printed
    assert main(["simulate", str(path), "--constraints", "gmacs:max=1", "--out", str(tmp_path / "s2")]) == 2
