"""The one-shot fidelity section's figures: inherited against stand-alone top-1 of every retrained subnet (chosen
and control apart, a control subnet's seeds as an interval, the diagonal, Kendall tau in the title) and the scored
subnets' inherited top-1 against each cost objective (the chosen marked); drawn from the subnet table, on a
subnet table built here and on a one-shot campaign's report. Then the supernet's own training curves, drawn from
supernet_epochs.parquet: only a campaign that trained its own supernet (a nested campaign in <exp>/supernet/) has
table and figure."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers.campaign_files import SPEC, synthetic_record, write_campaign, write_record

from qkvsearch.search.analysis import report
from qkvsearch.search.analysis.fidelity import measure, section_lines
from qkvsearch.search.analysis.oneshot_figures import oneshot_figures
from qkvsearch.search.analysis.results import EPOCHS_FILE, collect
from qkvsearch.search.analysis.supernet_training import SUPERNET_EPOCHS_FILE, supernet_figure

OBJECTIVES = (("top1", "max"), ("gmacs", "min"), ("params_m", "min"))


def _numbers(values) -> np.ndarray:
    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), "<f8")
    return np.asarray(values, dtype=float)


def _subnets() -> pd.DataFrame:
    """9 control subnets (two seeds each), 5 chosen, 4 scored only; two chosen with the same inherited and
    stand-alone top-1, two scored with the same inherited top-1 and GMACs."""
    n_control, n_chosen, n_scored = 9, 5, 4
    standalone = np.linspace(40, 80, n_control)
    control = pd.DataFrame({"top1_inherited": standalone - 20, "top1_standalone": standalone,
                            "top1_standalone_reseeded": standalone + np.tile([3.0, -3.0], 5)[:n_control],
                            "gmacs": np.linspace(2.0, 0.5, n_control), "params_m": np.linspace(1, 3, n_control),
                            "selected": "control", "retrained_from": "scratch"})
    chosen = pd.DataFrame({"top1_inherited": [60.0, 61.0, 61.0, 63.0, 64.0], "top1_standalone": [70.0, 71, 71, 73, 74],
                           "top1_standalone_reseeded": np.nan, "gmacs": 3.0 + np.arange(n_chosen),
                           "params_m": 2.0, "selected": "chosen", "retrained_from": "scratch"})
    scored = pd.DataFrame({"top1_inherited": [10.0, 10.0, 20.0, np.nan], "top1_standalone": np.nan,
                           "top1_standalone_reseeded": np.nan, "gmacs": [1.0, 1.0, 1.5, 1.2], "params_m": 1.0,
                           "selected": None, "retrained_from": None})
    df = pd.concat([control, chosen, scored], ignore_index=True)
    df.insert(0, "subnet_id", [f"subnet_{i:06d}" for i in range(n_control + n_chosen + n_scored)])
    df["config_embedding"] = np.resize(["linear", "sne", "psne", "fsne"], len(df))
    df["config_depth"] = np.resize([1, 2, 4], len(df))
    return df


def _by_name(fig) -> dict[str, dict]:
    return {t["name"].split(";")[0].split(" (")[0]: t for t in fig["data"]}


def test_inherited_against_standalone_marks_chosen_and_control_with_the_seed_spread_and_tau():
    df = _subnets()
    tau_line = section_lines(measure(df, OBJECTIVES, None))[1]
    figs = oneshot_figures(df, OBJECTIVES, tau_line, ("embedding", "depth"))
    assert list(figs) == ["inherited_vs_standalone", "inherited_top1_vs_gmacs", "inherited_top1_vs_params_m"]

    fig = figs["inherited_vs_standalone"]
    traces = _by_name(fig)
    control, chosen, diagonal = traces["control"], traces["chosen"], traces["inherited = stand-alone"]
    assert len(control["customdata"]) == 9 and len(chosen["customdata"]) == 5
    y = _numbers(control["y"])
    np.testing.assert_allclose(y, df["top1_standalone"][:9])
    seeds = df[["top1_standalone", "top1_standalone_reseeded"]][:9].to_numpy()
    np.testing.assert_allclose(y + control["error_y"]["array"], seeds.max(axis=1))  # the interval spans both seeds
    np.testing.assert_allclose(y - np.asarray(control["error_y"]["arrayminus"]), seeds.min(axis=1))
    assert "error_y" not in chosen  # retrained under one seed
    x = _numbers(chosen["x"])
    assert len(set(x)) == 5 and sorted(x)[1:3] != [61.0, 61.0]  # the two coincident chosen, side by side
    assert diagonal["x"] == diagonal["y"] and diagonal["x"][0] <= 20.0 and diagonal["x"][1] >= 83.0
    title = fig["layout"]["title"]["text"]
    assert "Kendall tau, inherited vs standalone top-1 over the 9 control subnets: 1.00 (95 %" in title
    assert "14 retrained subnets" in title
    assert "embedding = linear" in control["hovertext"][0] and "depth = 1" in control["hovertext"][0]


def test_inherited_top1_against_each_cost_objective_holds_every_scored_subnet():
    df = _subnets()
    figs = oneshot_figures(df, OBJECTIVES, "tau", ())
    for metric in ("gmacs", "params_m"):
        traces = _by_name(figs[f"inherited_top1_vs_{metric}"])
        assert {k: len(t["customdata"]) for k, t in traces.items()} == {"scored only": 3, "control": 9, "chosen": 5}
        shown = {i for t in traces.values() for i in t["customdata"]}
        assert shown == set(df["subnet_id"][df["top1_inherited"].notna()])  # every scored subnet with a top-1
    scored = _by_name(figs["inherited_top1_vs_gmacs"])["scored only"]
    assert len(set(_numbers(scored["x"]))) == 3  # two coincident subnets drawn apart
    assert list(oneshot_figures(df, (("top1", "max"),), "tau")) == ["inherited_vs_standalone"]  # no cost objective


def _one_shot_campaign(exp: Path) -> None:
    """A one-shot campaign's records without training: 6 configurations retrained (3 control ones also under the
    next seed), scored with inherited weights beside 3 scored only; the first 3 control, the last 3 chosen."""
    from qkvsearch.search.records import inherited

    write_campaign(exp, [], spec=dict(SPEC, supernet={"train": {"epochs": 2}}))
    rng = np.random.default_rng(0)
    records = [synthetic_record(i, "completed", rng=rng, overrides={"seed": 0}) for i in range(9)]
    for k, rec in enumerate(records[6:]):  # the control subnets again, under the next seed
        rec["config"] = {**records[k]["config"], "seed": 1}
    for rec in records:
        write_record(exp, rec)
    filled = [json.loads(c) for c in collect(exp)[0]["config_json"].to_pylist()]  # as the trials resolved them
    configs = filled[:6] + [{**filled[i], "lr": 0.1 + i} for i in range(3)]
    keys = [{"subnet": i} for i in range(len(configs))]
    inherited.write_batch(str(exp), 0, [
        {"subnet_id": f"subnet_{i:06d}", "keys": keys[i], "config": c, "cost": records[i % 6]["cost"],
         "metrics": {"top1": 30.0 + i, "top5": 80.0, "val_loss": 1.0}, "supernet": "s", "space": "h"}
        for i, c in enumerate(configs)])
    inherited.write_selection(str(exp), {"chosen": keys[3:6], "control": keys[:3], "seed": 0})


def test_a_one_shot_report_holds_the_figures_in_the_page_and_the_static_export(tmp_path, monkeypatch):
    exp = tmp_path / "oneshot"
    _one_shot_campaign(exp)
    exported = {}
    monkeypatch.setattr(report, "export_static", lambda figs, out: exported.update(figs) or {})
    paths = report.build_report(exp, static=True)
    assert {"inherited_vs_standalone", "inherited_top1_vs_gmacs", "inherited_top1_vs_params_m"} <= set(exported)
    traces = _by_name(exported["inherited_vs_standalone"])
    assert len(traces["control"]["customdata"]) == 3 and len(traces["chosen"]["customdata"]) == 3
    assert len(traces["control"]["error_y"]["array"]) == 3
    for metric in ("gmacs", "params_m"):
        assert sum(len(t["customdata"]) for t in exported[f"inherited_top1_vs_{metric}"]["data"]) == 9

    page = Path(paths["html"]).read_text()
    section = page.split("<h2>One-shot fidelity</h2>", 1)[1]
    plotted = re.findall(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', section, re.S)
    assert len(plotted) == 3 and "plotly.js v" not in section  # plotly.js once, above, for every figure
    names = [[t["name"] for t in json.loads(data)] for data in plotted]
    assert names[0][:2] == ["control (drawn at random, retrained from scratch); bar: its top-1 under the two seeds",
                            "chosen (retrained)"]
    assert "Inherited top-1 of the 9 scored subnets vs gmacs" in section
    assert "supernet_epochs" not in paths and "supernet_training" not in exported  # no supernet of its own
    assert not (Path(paths["html"]).parent / SUPERNET_EPOCHS_FILE).exists()


SUPERNET_EPOCHS = 5


def _supernet_folder(exp: Path, epochs: int = SUPERNET_EPOCHS) -> dict:
    """The nested campaign that trains a one-shot campaign's supernet, <exp>/supernet/: one completed trial whose
    epochs carry the supernet trainer's metrics beside a trial's; epoch 3 lacks the smallest subnet's top-1.
    -> the trial's record."""
    folder = exp / "supernet"
    write_campaign(folder, [], spec=dict(SPEC, name="supernet"), name="supernet")
    rec = synthetic_record(0, "completed", rng=np.random.default_rng(1), epochs_planned=epochs, campaign="supernet")
    for e in rec["epochs"]:
        e.update(top1_smallest=e["top1"] / 3, val_loss_smallest=e["val_loss"] + 0.5,
                 train_loss_students=0.1 * e["epoch"], step=20 * e["epoch"])
    del rec["epochs"][2]["top1_smallest"]
    write_record(folder, rec)
    return rec


CURVES = {"teacher (largest subnet) top-1": "top1", "smallest subnet top-1": "top1_smallest",
          "teacher validation loss": "val_loss", "teacher training loss": "train_loss",
          "smallest subnet validation loss": "val_loss_smallest", "students' mean training loss": "train_loss_students"}


def test_a_one_shot_report_holds_the_supernet_epochs_and_their_curves(tmp_path, monkeypatch):
    exp = tmp_path / "oneshot"
    _one_shot_campaign(exp)
    rec = _supernet_folder(exp)
    exported = {}
    monkeypatch.setattr(report, "export_static", lambda figs, out: exported.update(figs) or {})
    paths = report.build_report(exp, static=True)

    table = pq.read_table(paths["supernet_epochs"])
    assert Path(paths["supernet_epochs"]).name == SUPERNET_EPOCHS_FILE
    assert table.num_rows == SUPERNET_EPOCHS  # one row per supernet epoch, in order
    assert table["epoch"].to_pylist() == list(range(1, SUPERNET_EPOCHS + 1))
    assert set(table["trial_id"].to_pylist()) == {rec["trial_id"]}
    head = pq.read_table(Path(paths["html"]).parent / EPOCHS_FILE).column_names[:11]  # epochs.parquet's own columns
    assert table.column_names == [*head, "step", "top1_smallest", "train_loss_students", "val_loss_smallest"]
    assert table["top1_smallest"].null_count == 1 and table["top1_smallest"][2].as_py() is None
    np.testing.assert_allclose(table["top1"].to_numpy(), [e["top1"] for e in rec["epochs"]])

    fig = exported["supernet_training"]  # exported as png/svg beside the other one-shot figures
    traces = {t["name"]: t for t in fig["data"]}
    assert list(traces) == list(CURVES)
    for name, column in CURVES.items():
        t = traces[name]
        assert len(_numbers(t["x"])) == len(_numbers(t["y"])) == SUPERNET_EPOCHS
        np.testing.assert_allclose(_numbers(t["y"]), table[column].to_numpy(zero_copy_only=False), equal_nan=True)
        panel = ("x", "y") if "top-1" in name else ("x2", "y2")  # top-1 above, the losses below
        assert (t["xaxis"], t["yaxis"]) == panel
    assert np.isnan(_numbers(traces["smallest subnet top-1"]["y"])[2])  # a gap where the epoch lacks it
    layout = fig["layout"]
    assert layout["yaxis"]["domain"][0] > layout["yaxis2"]["domain"][1] and layout["xaxis2"]["matches"] == "x"
    assert f"epoch {SUPERNET_EPOCHS}: teacher (largest subnet) top-1 {rec['epochs'][-1]['top1']:.2f} %" \
        in layout["title"]["text"]

    section = Path(paths["html"]).read_text().split("<h2>One-shot fidelity</h2>", 1)[1]
    plotted = re.findall(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', section, re.S)
    assert len(plotted) == 4  # the subnets' three, then the supernet's training
    assert [t["name"] for t in json.loads(plotted[-1])] == list(CURVES)


def test_an_ordinary_campaign_gets_no_supernet_table_nor_figure(tmp_path, monkeypatch):
    exp = tmp_path / "plain"
    write_campaign(exp, ["completed"] * 3)
    _supernet_folder(exp)  # a nested folder alone makes no one-shot campaign
    exported = {}
    monkeypatch.setattr(report, "export_static", lambda figs, out: exported.update(figs) or {})
    paths = report.build_report(exp, static=True)
    assert "supernet_epochs" not in paths and "supernet_training" not in exported and exported
    assert not (Path(paths["html"]).parent / SUPERNET_EPOCHS_FILE).exists()
    assert "Supernet training" not in Path(paths["html"]).read_text()


def _epochs(trials: int = 1, **columns) -> pd.DataFrame:
    n = SUPERNET_EPOCHS
    return pd.DataFrame({"trial_id": np.repeat([f"t{i}" for i in range(trials)], n),
                         "trial_name": np.repeat([f"supernet-{i}" for i in range(trials)], n),
                         "epoch": np.tile(np.arange(1, n + 1), trials),
                         **{c: np.linspace(1, 2, n * trials) for c in columns}})


@pytest.mark.parametrize(("columns", "panels"), [
    (("top1", "top1_smallest"), {("x", "y")}),       # no loss: one panel, top-1
    (("val_loss", "train_loss"), {("x", "y")}),      # no top-1: one panel, the losses
    (("top1", "val_loss_smallest"), {("x", "y"), ("x2", "y2")}),
])
def test_the_supernet_figure_draws_the_curves_present(columns, panels):
    fig = supernet_figure(_epochs(**dict.fromkeys(columns)))
    assert {(t["xaxis"], t["yaxis"]) for t in fig["data"]} == panels
    assert [CURVES[t["name"]] for t in fig["data"]] == list(columns)
    assert ("yaxis2" in fig["layout"]) == (len(panels) == 2)


def test_the_supernet_figure_names_each_trial_when_there_are_several_and_draws_nothing_without_metrics():
    fig = supernet_figure(_epochs(2, top1=None))
    assert [t["name"] for t in fig["data"]] == ["teacher (largest subnet) top-1 · supernet-0",
                                                "teacher (largest subnet) top-1 · supernet-1"]
    assert all(len(_numbers(t["x"])) == SUPERNET_EPOCHS for t in fig["data"])
    assert supernet_figure(_epochs(top5=None)) is None


def test_scored_subnets_carry_their_measured_costs_the_predicted_ones_marked(tmp_path):
    """subnets.parquet's latency_ms, throughput, peak_mem_gb: measured (measured_on says how), or predicted (the
    evaluation's ``predicted`` names them); against a measured cost objective a predicted point has an open marker,
    and every hover says which."""
    import pyarrow as pa

    from qkvsearch.search.analysis.fidelity import subnet_table
    from qkvsearch.search.records import inherited

    exp = str(tmp_path / "measured")
    rows = []
    for i, emb in enumerate(("linear", "sne", "psne", "fsne")):
        cost = {"gmacs": 0.1 * (i + 1), "latency_ms": 1.0 + i, "throughput": 1000.0 / (1 + i), "peak_mem_gb": 0.5}
        rows.append({"subnet_id": f"subnet_{i:06d}", "keys": {"embedding": emb}, "config": {"embedding": emb},
                     "cost": cost, "metrics": {"top1": 50.0 + i}, "supernet": "s", "space": "h",
                     **({"measured_on": "cpu, fp32", } if i < 2 else
                        {"measured_on": {"predicted": ["latency_ms", "throughput", "peak_mem_gb"]},
                         "predicted": ["latency_ms", "throughput", "peak_mem_gb"]})})
    inherited.write_batch(exp, 0, rows + [{"subnet_id": "subnet_000004", "keys": {"embedding": "sne"},
                                           "config": {"embedding": "sne", "depth": 1}, "cost": {"gmacs": 0.05},
                                           "metrics": {"top1": 40.0}, "supernet": "s", "space": "h"}])
    inherited.write_selection(exp, {"chosen": [{"embedding": "fsne"}], "control": [], "seed": 0})
    df = subnet_table(exp, pa.table({"status": pa.array([], pa.string())}))
    assert list(df["latency_ms"][:4]) == [1.0, 2.0, 3.0, 4.0] and list(df["throughput"][:2]) == [1000.0, 500.0]
    assert list(df["measured_on"][:2]) == ["cpu, fp32"] * 2 and df["measured_on"][2:].isna().all()
    assert [list(p) if p is not None else None for p in df["predicted"]] == \
        [[], [], ["latency_ms", "throughput", "peak_mem_gb"], ["latency_ms", "throughput", "peak_mem_gb"], None]
    assert np.isnan(df["latency_ms"][4])   # a campaign that measured nothing for it
    table = pa.Table.from_pandas(df, preserve_index=False)   # as subnets.parquet is written
    assert table.schema.field("predicted").type == pa.list_(pa.string())
    figs = oneshot_figures(df, (("top1", "max"), ("latency_ms", "min")), "tau", ("embedding",))
    traces = figs["inherited_top1_vs_latency_ms"]["data"]
    scored, chosen = (t for t in traces if t["legendgroup"] in ("None", "chosen"))
    assert scored["marker"]["symbol"] == ["circle", "circle", "circle-open"]    # linear, sne measured; psne not
    assert chosen["marker"]["symbol"] == ["circle-open"] and "latency_ms predicted" in chosen["name"]
    hover = dict(zip(scored["customdata"], scored["hovertext"]))
    assert "latency_ms = 1 (measured)" in hover["subnet_000000"]
    assert "latency_ms = 3 (predicted)" in hover["subnet_000002"]
