"""Which searched key mattered (search.analysis.importance): the importances are Optuna's own, equal to what its
evaluators give for a study of the same trials built here by hand; Optuna's views are in the report."""
from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator, get_param_importances

from qkvsearch.search.analysis.front import front_info
from qkvsearch.search.analysis.importance import FANOVA, FRONT, PED_ANOVA, importances
from qkvsearch.search.analysis.report import build_report
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.records.layout import open_campaign
from qkvsearch.storage import write_json

# variants set embedding and hidden_width (absent for linear: the choice None), lr is a log range
SPEC = {"space": {"variants": [{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.5},
                               {"embedding": "fsne", "hidden_width": 1.0}],
                  "lr": {"float": [1e-4, 1e-2], "log": True}},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]}
WIDTHS = {"linear": None, "sne": 0.5, "fsne": 1.0}


def _trials() -> list[tuple[str, float, float, float]]:
    """(embedding, lr, top1, gmacs): top1 follows the embedding and, less, the learning rate; gmacs the embedding."""
    out = []
    for i in range(18):
        emb = ("linear", "sne", "fsne")[i % 3]
        lr = 1e-4 * 100 ** ((i * 7 % 18) / 17)
        top1 = {"linear": 50.0, "sne": 60.0, "fsne": 66.0}[emb] + 4 * math.log10(lr / 1e-4) + (i % 4) * 0.5
        out.append((emb, lr, top1, {"linear": 0.10, "sne": 0.12, "fsne": 0.14}[emb] + 0.001 * (i % 2)))
    return out


def _write(exp: str) -> None:
    write_json(f"{exp}/qs_campaign.json", {"name": "imp", "spec": SPEC, "ended_at": 1.8e9})
    for i, (emb, lr, top1, gmacs) in enumerate(_trials()):
        config = {"model": "xcit_nano_12_p8_224", "embedding": emb, "hidden_width": WIDTHS[emb], "lr": lr, "seed": 0,
                  "epochs": 1}
        write_json(f"{exp}/qs_trials/t{i:03d}.json", {
            "trial_id": f"t{i:03d}", "trial_name": f"{emb}-{i}", "campaign": "imp", "status": "completed",
            "config": config, "cost": {"gmacs": gmacs, "params_m": 1.0}, "epochs_planned": 1,
            "epochs": [{"epoch": 1.0, "top1": top1, "train_s": 1.0}],
            "started_at": 1.7e9 + i, "ended_at": 1.7e9 + i + 1})


def _study_by_hand():
    """The same trials told to Optuna directly, with the distributions the space declares."""
    dists = {"embedding": CategoricalDistribution(["linear", "sne", "fsne"]),
             "hidden_width": CategoricalDistribution([0.5, 1.0, None]),
             "lr": FloatDistribution(1e-4, 1e-2, log=True)}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.add_trials([optuna.trial.create_trial(
        values=[top1, gmacs], params={"embedding": emb, "hidden_width": WIDTHS[emb], "lr": lr}, distributions=dists)
        for emb, lr, top1, gmacs in _trials()])
    return study


@pytest.mark.filterwarnings("ignore:PedAnovaImportanceEvaluator computes")   # the targets below say lower is better
def test_the_importances_are_optuna_s_for_the_same_trials(tmp_path):
    exp = str(tmp_path / "imp")
    _write(exp)
    trials, _ = collect(exp)
    info = front_info(trials, SPEC["objectives"])
    got = importances(info, open_campaign(exp).spec.space)
    assert got.trials == 18 and not got.notes
    table = got.table.set_index("key")
    assert list(table.index) == ["embedding", "hidden_width", "lr"]
    study = _study_by_hand()
    expected = {
        f"{FANOVA} top1": get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0),
                                                target=lambda t: t.values[0]),
        f"{FANOVA} gmacs": get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0),
                                                 target=lambda t: t.values[1]),
        f"{PED_ANOVA} top1": get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(),
                                                   target=lambda t: -t.values[0]),
        f"{PED_ANOVA} gmacs": get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(),
                                                    target=lambda t: t.values[1]),
        f"{PED_ANOVA} {FRONT}": get_param_importances(study, evaluator=PedAnovaImportanceEvaluator()),
    }
    assert list(table.columns) == list(expected)
    for column, values in expected.items():
        for key, value in values.items():
            assert table.loc[key, column] == pytest.approx(value, abs=1e-12), (column, key)
    # what the data says: gmacs is the embedding's (hidden_width follows it, so they share it); top1 too, first
    assert table.loc["embedding", f"{FANOVA} gmacs"] + table.loc["hidden_width", f"{FANOVA} gmacs"] > 0.9
    assert table[f"{FANOVA} top1"].idxmax() == "embedding" and table.loc["lr", f"{FANOVA} top1"] > 0


def test_the_report_holds_the_table_and_optuna_s_views(tmp_path):
    exp = str(tmp_path / "imp")
    _write(exp)
    paths = build_report(exp, static=False)
    md = Path(paths["md"]).read_text()
    section = md.split("## What mattered")[1].split("\n## ")[0]
    assert "| key | fANOVA top1 | fANOVA gmacs | PED-ANOVA top1 | PED-ANOVA gmacs | PED-ANOVA front |" in section
    assert "| embedding | " in section and "| lr | " in section
    page = Path(paths["html"]).read_text()
    assert 'id="importance-table"' in page
    # Optuna's figures as it draws them, after the page's own: its parallel coordinates and its slices
    assert page.count("Plotly.newPlot(") == 3 + 2   # the pair, learning curves, hypervolume; then Optuna's two
    assert '"type":"parcoords"' in page and "Slice Plot" in page
