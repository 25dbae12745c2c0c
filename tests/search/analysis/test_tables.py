"""The report's trial tables lead with what was searched: the space's keys first, then the objectives and
constraints, then the rest that varies; empty columns left out, constant ones folded into one fixed-settings line,
by one rule (search.analysis.columns) in pareto.html and report.md alike. pareto.csv keeps every column."""
import re
from pathlib import Path

import pandas as pd
from helpers.campaign_files import ALL_STATUSES, SPEC, write_campaign

from qkvsearch.search.analysis.columns import FIXED_TITLE, table_layout
from qkvsearch.search.analysis.report import build_report

SPACE = {"variants": [{"embedding": "linear"}, {"embedding": "sne", "hidden_width": 0.25},
                      {"embedding": "fsne", "hidden_width": 0.5, "code_size": 8}]}


def _md_table(md: str) -> tuple[list[str], list[list[str]], str]:
    """(header, rows, the fixed-settings line) of report.md's front table."""
    section = md.split("## Pareto front\n\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines if line.startswith("|")]
    fixed = [line for line in lines if line.startswith(FIXED_TITLE)]
    return cells[0], cells[2:], fixed[0] if fixed else ""


def _html_table(page: str, table_id: str) -> tuple[list[str], str]:
    """(headings, footer text) of one of pareto.html's tables."""
    table = re.search(rf'<table id="{table_id}".*?</table>', page, re.S).group(0)
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    foot = re.search(r"<tfoot>.*?<td[^>]*>(.*?)</td>", table, re.S)
    return heads, foot.group(1) if foot else ""


def test_the_front_table_leads_with_the_searched_keys_and_folds_the_fixed_ones(tmp_path):
    exp = tmp_path / "synth"
    write_campaign(exp, ALL_STATUSES * 2, seed=1, spec=dict(SPEC, space=SPACE))
    paths = build_report(exp, static=False)
    md, page = Path(paths["md"]).read_text(), Path(paths["html"]).read_text()

    header, rows, fixed = _md_table(md)
    assert len(rows) >= 2
    # the space's keys in its order (width solved from hidden_width beside it), then objectives and constraints
    searched = [c for c in ("embedding", "hidden_width", "width", "code_size") if c in header]
    assert header[:1 + len(searched)] == ["trial_name", *searched] and header[1:3] == ["embedding", "hidden_width"]
    assert header[1 + len(searched):4 + len(searched)] == ["final_top1", "gmacs", "params_m"]
    for j, column in enumerate(header):  # no column empty in every row
        assert any(row[j] for row in rows), column
    for column in ("attention", "attn_features", "pos_embed", "key_charts", "status", "activation", "epochs_run"):
        assert column not in header  # empty (ViT-only keys on an XCiT) or one value in every row
    assert fixed.startswith(f"{FIXED_TITLE}: status: completed;") and "activation: relu" in fixed
    assert "epochs_run: 6" in fixed and "attention" not in fixed  # empty columns are left out, not listed

    heads, foot = _html_table(page, "front")
    assert heads == header and foot.replace("&amp;", "&") == fixed  # one rule for both
    assert page.count('<th class="searched"') >= len(searched)
    every, foot_all = _html_table(page, "trials")
    assert every[:3] == ["trial_name", "status", "embedding"] and "error" in every  # statuses and errors vary
    assert "activation: relu" in foot_all and "status:" not in foot_all

    csv_header = Path(paths["csv"]).read_text().splitlines()[0].split(",")
    assert {"config_attention", "config_activation", "status", "epochs_run", "config_embedding"} <= set(csv_header)


def test_the_layout_rule_on_a_table():
    df = pd.DataFrame({
        "trial_name": ["a", "b", "c"], "status": ["completed"] * 3,
        "config_depth": [2, 4, 2], "config_embedding": ["sne", "sne", "sne"],   # searched, constant here: a column
        "config_embedding.0": ["fsne", None, "sne"], "config_embedding.1": [None, None, None],
        "config_attention": [None, None, None], "config_activation": ["relu"] * 3, "config_lr": [1e-3, 2e-3, 1e-3],
        "final_top1": [50.0, 60.0, 55.0], "gmacs": [0.1, 0.2, 0.1], "params_m": [1.0, 1.0, 1.0],
        "error": ["", "", ""], "epochs_run": pd.array([6, 6, pd.NA], dtype="Int64"),
    })
    rest = ["config_attention", "config_activation", "config_lr", "error", "epochs_run"]
    layout = table_layout(df, ("embedding", "depth"), ["final_top1", "gmacs", "params_m"], rest)
    assert layout.columns == ["trial_name", "config_embedding", "config_embedding.0", "config_depth", "final_top1",
                              "gmacs", "params_m", "config_lr", "epochs_run"]
    assert layout.searched == ("config_embedding", "config_embedding.0", "config_depth")
    assert layout.fixed == [("status", "completed"), ("config_activation", "relu")]  # empty ones nowhere
    # a space that names none of these columns (an older spec): the configuration columns that vary lead
    older = table_layout(df, ("code_size",), ["final_top1"], ["config_depth", "config_activation", "gmacs"])
    assert older.columns[:3] == ["trial_name", "config_depth", "final_top1"] and older.searched == ("config_depth",)
    one = table_layout(df.iloc[:1], ("depth",), ["final_top1"], ["config_lr"])  # one row: the name stays
    assert one.columns == ["trial_name", "config_depth", "final_top1"] and ("config_lr", "0.001") in one.fixed
    assert table_layout(df.iloc[:0], ("depth",), ["final_top1"], ["config_lr"]).columns == ["trial_name"]
