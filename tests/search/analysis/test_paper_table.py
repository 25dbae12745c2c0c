"""The campaign's results in the SNE paper's layout (search.analysis.paper_table): one row per design with its mean
and spread over seeds, the difference to the linear baseline with a Welch interval (scipy's, computed apart), and
the paper's own figures beside where the setting is the paper's; as Markdown, LaTeX and CSV."""
from __future__ import annotations

import io

import pandas as pd
import pytest
from scipy.stats import ttest_ind

from qkvsearch.search.analysis.report import build_report
from qkvsearch.storage import write_json

PAPER = {"model": "xcit_nano_12_p16_224", "dataset": "imagefolder", "num_classes": 1000, "img_size": 224}
SPEC = {"space": {"variants": [{"embedding": "linear"}, {"embedding": "fsne", "hidden_width": "paper"},
                               {"embedding": "sne", "hidden_width": 0.25}]},
        "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}]}
LINEAR, FSNE = [69.0, 70.0, 71.0], [70.5, 71.0, 72.5]


def _write(exp: str, setting: dict) -> None:
    write_json(f"{exp}/qs_campaign.json", {"name": "paper", "spec": SPEC, "ended_at": 1.8e9})
    rows = [({"embedding": "linear", "width": 0}, 3.05, 0.55, t) for t in LINEAR] \
        + [({"embedding": "fsne", "hidden_width": "paper", "width": 128, "code_size": 8, "code_sharing": "shared"},
            2.87, 0.52, t) for t in FSNE] \
        + [({"embedding": "sne", "hidden_width": 0.25, "width": 32}, 2.9, 0.53, 65.0)]
    seeds: dict[str, int] = {}
    for i, (design, params_m, gmacs, top1) in enumerate(rows):
        seed = seeds[design["embedding"]] = seeds.get(design["embedding"], -1) + 1
        config = {**setting, **design, "seed": seed, "epochs": 1, "lr": 1e-3}
        write_json(f"{exp}/qs_trials/t{i:03d}.json", {
            "trial_id": f"t{i:03d}", "trial_name": f"{design['embedding']}-{i}", "campaign": "paper",
            "status": "completed", "config": config, "cost": {"params_m": params_m, "gmacs": gmacs},
            "epochs": [{"epoch": 1.0, "top1": top1, "train_s": 1.0}], "epochs_planned": 1,
            "started_at": 1.7e9 + i, "ended_at": 1.7e9 + i + 1})


def test_the_paper_table_holds_means_differences_and_the_paper_s_figures(tmp_path):
    exp = str(tmp_path / "paper")
    _write(exp, PAPER)
    paths = build_report(exp, static=False)
    table = pd.read_csv(paths["paper_csv"])
    assert list(table["design"]) == ["linear (baseline)", "SNE h=32", "F-SNE-C8 h=128"]   # the paper's order
    linear, sne, fsne = (table.iloc[i] for i in range(3))
    assert (linear["top1"], linear["sd"], linear["seeds"]) == (pytest.approx(70.0), pytest.approx(1.0), 3)
    assert fsne["top1"] == pytest.approx(sum(FSNE) / 3) and fsne["seeds"] == 3
    assert fsne["vs linear"] == pytest.approx(sum(FSNE) / 3 - 70.0)
    welch = ttest_ind(FSNE, LINEAR, equal_var=False).confidence_interval(0.95)
    assert (fsne["ci low"], fsne["ci high"]) == (pytest.approx(welch.low), pytest.approx(welch.high))
    assert pd.isna(sne["ci low"]) and sne["vs linear"] == pytest.approx(65.0 - 70.0)   # one seed: no interval
    # the paper's figures (results/reference/sne_paper_imagenet.csv, size S) where the design is the paper's
    assert (linear["paper top1"], fsne["paper top1"], fsne["paper vs linear"]) == (69.9, 70.6, pytest.approx(0.7))
    assert fsne["paper params_m"] == 2.9 and pd.isna(sne["paper top1"])   # h=32 is not the paper's width
    md = open(paths["md"]).read()
    assert "## Results in the paper's layout" in md and "| F-SNE-C8 h=128 | fsne | 128 | 8 | shared |" in md
    assert f"71.33 ± {pd.Series(FSNE).std():.2f} (3)" in md
    tex = open(paths["paper_tex"]).read()
    assert tex.startswith(r"\begin{tabular}") and r"\toprule" in tex and r"$\pm$" in tex and r"95 \% CI" in tex
    assert open(paths["paper_md"]).read().startswith("| design |")


def test_outside_the_paper_s_setting_the_table_says_why_its_figures_are_not_beside(tmp_path):
    exp = str(tmp_path / "digits")
    _write(exp, {"model": "xcit_nano_12_p8_224", "dataset": "digits", "num_classes": 10, "img_size": 32})
    paths = build_report(exp, static=False)
    table = pd.read_csv(io.BytesIO(open(paths["paper_csv"], "rb").read()))
    assert not [c for c in table.columns if c.startswith("paper")]
    assert "not beside: this campaign trains xcit_nano_12_p8_224 on digits" in open(paths["md"]).read()
