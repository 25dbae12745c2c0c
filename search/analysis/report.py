"""Pareto report of a campaign: pareto.html (self-contained, loads offline), pareto.csv, report.md,
trials.parquet / epochs.parquet and, when a static exporter works here, png/svg figures.

    from qkvsearch.search.analysis.report import build_report
    paths = build_report("results/my-campaign")   # -> {"html": ..., "csv": ..., ...}

Everything shown is recomputed from the collected tables (search.analysis.results). The report opens with what
each design value is worth against its baseline at equal cost (search.analysis.effects); it says which searched key
mattered (search.analysis.importance) and lays the results out as the SNE paper's tables
(search.analysis.paper_table: paper_table.md, .tex, .csv). Objectives come from the campaign spec
(``spec.objectives``; when it names none, the spec loader's default: top1 max). The front
is computed once (search.analysis.front.front_info: objective columns, front masks, hypervolume); the
figures (search.analysis.figures) and the tables here render from that one FrontInfo, the tables' columns laid
out by search.analysis.columns (the searched keys first, fixed settings folded into one line). Only trials whose
status is in ``front_statuses`` (default: completed) form the front; the others are drawn but never on it.
A running campaign is reported as far as it has got. Nothing is written outside ``out_dir``, and every
file is written whole (storage).
"""
from __future__ import annotations

import html
import io
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from qkvsearch.search.analysis import hv_reference
from qkvsearch.search.analysis.columns import (
    FIXED_TITLE,
    TableLayout,
    cell_text,
    fixed_line,
    header,
    table_layout,
)
from qkvsearch.search.analysis.effects import (
    accuracy_objective,
    design_effects,
    effects_html,
    effects_markdown,
)
from qkvsearch.search.analysis.fidelity import fidelity_report
from qkvsearch.search.analysis.figures import config_of, escaped, figures_html, g4
from qkvsearch.search.analysis.figures import figures as make_figures
from qkvsearch.search.analysis.front import FrontInfo, front_info, metric_column, objective_columns, rows
from qkvsearch.search.analysis.importance import importance_html, importance_markdown, importances
from qkvsearch.search.analysis.mislead import where_macs_mislead
from qkvsearch.search.analysis.paper_table import (
    TABLE_TITLE,
    paper_note,
    paper_points,
    paper_setting,
    paper_table,
    table_csv,
    table_html,
    table_latex,
    table_markdown,
)
from qkvsearch.search.analysis.results import (
    CONFIG_PREFIX,
    collect,
    parquet_files,
    resolve_out_dir,
    write_results,
)
from qkvsearch.search.analysis.stages import stage_report
from qkvsearch.search.analysis.static_export import export_static
from qkvsearch.search.analysis.targets_report import target_folders, targets_report
from qkvsearch.search.records import inherited
from qkvsearch.search.records.layout import FINAL_STATUSES, Campaign, open_campaign
from qkvsearch.search.records.outputs import REPORT_DIR
from qkvsearch.spaces.keys import RESOLVED_KEYS, identity
from qkvsearch.spaces.metrics import COST_METRICS
from qkvsearch.storage import write_bytes

__all__ = ["build_report", "objective_columns", "paper_setting"]

logger = logging.getLogger(__name__)

TABLE_CONFIG = tuple(k.name for k in RESOLVED_KEYS.values() if k.report)  # trial keys pareto.csv and the tables hold


# ---------------------------------------------------------------------------------------- tables / text
SORT_JS = """<script>
document.querySelectorAll("table.sortable th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0], rows = Array.from(body.rows);
    var asc = th.dataset.asc !== "1"; th.dataset.asc = asc ? "1" : "0";
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v, nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
</script>"""


def _front_columns(df: pd.DataFrame, cols) -> list[str]:
    """pareto.csv's columns (every one: the tables lay out and fold theirs, search.analysis.columns)."""
    wanted = ["trial_name", "status"] + [f"{CONFIG_PREFIX}{c}" for c in TABLE_CONFIG] + list(cols)
    wanted += ["best_top1", "epochs_run", "train_s_total"]
    seen, out = set(), []
    for c in wanted:
        if c in df and c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _formatted(df: pd.DataFrame, col: str) -> list[str]:
    """Column as display strings (HTML-escaped); floats with 4 significant digits, missing -> ""."""
    s = df[col]
    if pd.api.types.is_float_dtype(s):
        return g4(s, "")  # digits, sign, point, exponent: nothing to escape
    na = s.isna().to_numpy()
    return escaped(["" if m else str(v) for v, m in zip(s.astype(object).tolist(), na)])


def _table_layout(df: pd.DataFrame, campaign: Campaign, info: FrontInfo, extra=()) -> TableLayout:
    """A trial table's layout (search.analysis.columns): the space's keys, then the objectives and constraints, each
    front point's mean and spread over its seeds where it has them (front_with_seeds), then ``extra``."""
    constraints = [metric_column(df.columns, c.metric) for c in campaign.spec.constraints]
    return table_layout(df, campaign.spec.space.keys, [*info.columns, *constraints, *_seed_columns(df)],
                        _front_columns(df, info.columns) + list(extra))


def _html_table(df: pd.DataFrame, layout: TableLayout | list[str], table_id: str, front_flag: bool) -> str:
    """Sortable table, one <tr data-trial-id=.. data-front=0|1> per trial; cells carry data-v for sorting. A
    TableLayout's searched keys have their headings marked, its fixed settings a footer row."""
    columns, searched, fixed = (layout.columns, layout.searched, fixed_line(layout)) \
        if isinstance(layout, TableLayout) else (layout, (), "")
    marks = {c: ' class="searched"' for c in searched}
    head = "".join(f"<th{marks.get(c, '')} title='click to sort'>{html.escape(header(c))}</th>" for c in columns)
    cells = [[f'<td data-v="{v}">{v}</td>' for v in _formatted(df, c)] for c in columns]  # per column (n,)
    lines = ["".join(r) for r in zip(*cells)] if cells else [""] * len(df)
    if "trial_id" in df:
        ids = escaped(df["trial_id"].tolist())
        flags = [f' data-front="{int(f)}"' for f in df["on_front"].tolist()] if front_flag else [""] * len(df)
        trs = [f'<tr data-trial-id="{i}"{f}>{r}</tr>' for i, f, r in zip(ids, flags, lines)]
    else:  # a table of configurations (repeats), not of trials
        trs = [f"<tr>{r}</tr>" for r in lines]
    foot = (f"<tfoot><tr><td class=\"fixed\" colspan=\"{max(1, len(columns))}\">{FIXED_TITLE}: "
            f"{html.escape(fixed)}</td></tr></tfoot>") if fixed else ""
    return (f"<table id=\"{table_id}\" class=\"sortable\"><thead><tr>{head}</tr></thead><tbody>{''.join(trs)}</tbody>"
            f"{foot}</table>")


def _markdown_table(df: pd.DataFrame, layout: TableLayout | list[str]) -> str:
    """A markdown table; a TableLayout's fixed settings on a line of their own below it."""
    columns = layout.columns if isinstance(layout, TableLayout) else layout
    lines = ["| " + " | ".join(header(c) for c in columns) + " |",
             "|" + "---|" * len(columns)]
    for rec in df[columns].to_dict("records"):
        lines.append("| " + " | ".join(cell_text(rec[c]).replace("|", "\\|") for c in columns) + " |")
    fixed = fixed_line(layout) if isinstance(layout, TableLayout) else ""
    return "\n".join(lines + (["", f"{FIXED_TITLE}: {fixed}"] if fixed else []))


def _configurations(pool: pd.DataFrame) -> list[str]:
    """Each row's configuration: its training identity without the seed (the seeds of one design together)."""
    return [identity(config_of(c), ignore=("seed",)) for c in pool["config_json"]]


def repeat_summary(df: pd.DataFrame, metrics, cols) -> pd.DataFrame:
    """Configurations trained with several seeds (search.repeats): per configuration, the eligible
    trials, their seeds, and each objective's mean and sample standard deviation over them."""
    pool = rows(df, df["eligible"], ["config_json", "trial_name", "config_seed", *cols])
    out = []
    for _key, group in pool.groupby(_configurations(pool), sort=False):
        if len(group) < 2:
            continue
        row = {"configuration": str(group["trial_name"].iloc[0]).rsplit("-", 1)[0], "n": len(group),
               "seeds": ", ".join(str(v) for v in sorted(group["config_seed"]))}
        for m, c in zip(metrics, cols):
            values = group[c].astype("float64")
            row[f"{m} mean"], row[f"{m} sd"] = values.mean(), values.std(ddof=1)
        out.append(row)
    return pd.DataFrame(out)


def front_with_seeds(info: FrontInfo) -> pd.DataFrame:
    """The front's trials, each with its configuration's mean and sample standard deviation over its seeds of every
    objective that is not a cost (``<metric> mean``, ``<metric> sd``) and the number of seeds (``seeds``), where
    some configuration on the front trained under several; else the front as it is."""
    front, df = info.front, info.trials
    measured = [(m, c) for m, c in zip(info.metrics, info.columns) if m not in COST_METRICS]
    pool = rows(df, df["eligible"], ["config_json", *[c for _, c in measured]])
    if not len(front) or not measured or not len(pool):
        return front
    pool["configuration"] = _configurations(pool)
    stats = pool.groupby("configuration")[[c for _, c in measured]].agg(["mean", "std", "count"])
    keys = pool.loc[front.index, "configuration"]
    if stats.loc[keys, (measured[0][1], "count")].max() < 2:
        return front
    out = front.copy()
    for m, c in measured:
        out[f"{m} mean"] = stats.loc[keys, (c, "mean")].to_numpy()
        out[f"{m} sd"] = stats.loc[keys, (c, "std")].to_numpy()
    out["seeds"] = stats.loc[keys, (measured[0][1], "count")].to_numpy()
    return out


@dataclass
class Findings:
    """What the report says about the research question: the effects at equal cost (search.analysis.effects), the
    importance of each searched key (search.analysis.importance) and the paper-style table
    (search.analysis.paper_table), computed once for report.md and pareto.html."""

    effects: list
    importance: object
    table: pd.DataFrame
    metric: str | None
    table_note: str = ""

    def table_markdown(self) -> list[str]:
        if not len(self.table):
            return []
        return [f"## {TABLE_TITLE}", "", table_markdown(self.table, self.metric, self.table_note), ""]

    def table_html(self) -> str:
        if not len(self.table):
            return ""
        return (f"<section id=\"paper-table\"><h2>{TABLE_TITLE}</h2>"
                f"{table_html(self.table, self.metric, self.table_note)}</section>")


def findings(campaign: Campaign, info: FrontInfo, reference_csv=None) -> Findings:
    table = paper_table(info, campaign.spec.space.keys, reference_csv)
    acc = accuracy_objective(info.metrics, info.directions)
    return Findings(design_effects(info), importances(info, campaign.spec.space), table,
                    None if acc is None else info.metrics[acc], paper_note(table, info.trials) if len(table) else "")


def _report_md(campaign: Campaign, info: FrontInfo, front: pd.DataFrame, repeats: pd.DataFrame,
               found: Findings, partial: str = "") -> str:
    df, metrics, ref = info.trials, info.metrics, info.reference
    counts = df["status"].value_counts().sort_index()
    objectives = ", ".join(f"{m} ({d})" for m, d in zip(metrics, info.directions))
    parts = [
        f"# Pareto report: {campaign.name}" + (" (partial)" if partial else ""), "",
        *([f"**{partial}**", ""] if partial else []),
        *effects_markdown(found.effects),
        f"- code version: {campaign.code_version or '?'}",
        f"- objectives: {objectives}",
        f"- trials: {len(df)} ({', '.join(f'{s} {n}' for s, n in counts.items())})",
        f"- front from statuses: {', '.join(info.front_statuses)}; {len(front)} trials on the front",
        f"- hypervolume reference ({info.reference_kind}): "
        f"{', '.join(f'{m}={r:.4g}' for m, r in zip(metrics, ref)) if ref is not None else 'n/a'}",
        "", "## Pareto front", "",
        _markdown_table(front, _table_layout(front, campaign, info)) if len(front) else "(empty)",
        *(["", f"## {REPEATS_TITLE}", "", _markdown_table(repeats, list(repeats.columns))] if len(repeats) else []),
        "", *importance_markdown(found.importance), *found.table_markdown(),
        "## Campaign settings", "", "```json", _settings_json(campaign), "```", "",
    ]
    return "\n".join(parts)


def _seed_columns(df: pd.DataFrame) -> list[str]:
    """The seed columns front_with_seeds gave ``df``, where it did."""
    return [c for c in df.columns if c.endswith((" mean", " sd")) or c == "seeds"]


def _settings_json(campaign: Campaign) -> str:
    """The spec as the campaign file holds it."""
    return json.dumps(campaign.stored_spec, indent=2, sort_keys=True)


REPEATS_TITLE = "Repeated configurations (mean and standard deviation over seeds)"


def _page(title: str, campaign: Campaign, summary_html: str, figures_html: list[str], front_table: str,
          all_table: str, repeats_table: str = "", found: Findings | None = None, views_html: list[str] = ()) -> bytes:
    """The whole page as UTF-8. Parts are encoded one by one and joined as bytes: the figures' text is
    not ASCII, and one str of the whole page would hold plotly.js at two bytes a character. The effects open it,
    after the title; the importance table and Optuna's views (``views_html``) follow the figures, the paper-style
    table the front's."""
    spec = html.escape(_settings_json(campaign))
    style = ("body{font-family:sans-serif;margin:16px;}table{border-collapse:collapse;font-size:12px;}"
             "th,td{border:1px solid #ccc;padding:2px 6px;}th{cursor:pointer;background:#f3f3f3;}"
             "tr[data-front='1']{font-weight:bold;}th.searched{background:#dde8f6;}td.fixed{color:#555;}"
             "li[data-verdict='better']{color:#1a7f37;}li[data-verdict='worse']{color:#b42318;}p.how{color:#555;}")
    opening = effects_html(found.effects) if found else ""
    parts = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
             f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{opening}{summary_html}"]
    for fig in figures_html:
        parts += ["<div class='fig'>", fig, "</div>"]
    if found:
        parts.append(importance_html(found.importance))
    for fig in views_html:
        parts += ["<div class='fig'>", fig, "</div>"]
    parts += [f"<h2>Pareto front</h2>{front_table}",
              f"<h2>{REPEATS_TITLE}</h2>{repeats_table}" if repeats_table else "",
              found.table_html() if found else "",
              f"<details><summary>All trials</summary>{all_table}</details>",
              f"<details><summary>Campaign settings</summary><pre>{spec}</pre></details>{SORT_JS}</body></html>"]
    return b"".join(part.encode("utf-8") for part in parts)


# ---------------------------------------------------------------------------------------- output
def _summary_html(info: FrontInfo, front: pd.DataFrame, size) -> str:
    counts = info.trials["status"].value_counts().sort_index()
    return (f"<p>{len(info.trials)} trials ({', '.join(f'{html.escape(s)} {n}' for s, n in counts.items())}); "
            f"objectives: {', '.join(f'{m} ({d})' for m, d in zip(info.metrics, info.directions))}; "
            f"{len(front)} on the front (from {', '.join(info.front_statuses)} trials)"
            + (f"; paper points: XCiT size {size}" if size else "") + "</p>")


def _by_trial_id(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in trial_id order (collect's order already: then no sort and no copy)."""
    return df if df["trial_id"].is_monotonic_increasing else df.sort_values("trial_id")


def _front_csv(front: pd.DataFrame, fcols: list[str]) -> bytes:
    buf = io.StringIO()
    front[["trial_id"] + fcols + ["checkpoint_path", "config_json"]].to_csv(buf, index=False)
    return buf.getvalue().encode("utf-8")


def _write_page(out: str, campaign: Campaign, info: FrontInfo, epochs: pa.Table,
                reference_csv) -> tuple[dict[str, str], dict[str, dict]]:
    """pareto.html, pareto.csv, report.md and the paper-style table (paper_table.md, .tex, .csv) into ``out``,
    every part rendered from ``info``: ({name: path}, the figures by name)."""
    df = info.trials
    size = paper_setting(df)
    paper = paper_points(size, reference_csv) if size else None
    found = findings(campaign, info, reference_csv)
    front = front_with_seeds(info)
    figures = make_figures(info, epochs, paper, front)
    fcols = _front_columns(df, info.columns)
    repeats = repeat_summary(df, info.metrics, info.columns)
    partial = partial_note(campaign, df["status"])
    mislead = where_macs_mislead(df, info.columns, info.directions)  # None: nothing measured
    title = f"Pareto report: {campaign.name}" + (" (partial)" if partial else "")
    summary = (f"<p><b>{html.escape(partial)}</b></p>" if partial else "") + _summary_html(info, front, size)
    front_layout = _table_layout(front, campaign, info)
    page = _page(title, campaign, summary, figures_html(figures),
                 _html_table(front, front_layout, "front", True) + (mislead.html if mislead else ""),
                 _html_table(_by_trial_id(df), _table_layout(df, campaign, info, ["error"]), "trials", True),
                 _html_table(repeats, list(repeats.columns), "repeats", False) if len(repeats) else "", found,
                 figures_html(found.importance.views, plotlyjs=False))
    figures.update(found.importance.views)   # Optuna's own figures, exported beside the page's

    paths = {"html": f"{out}/pareto.html", "csv": f"{out}/pareto.csv", "md": f"{out}/report.md"}
    write_bytes(paths["html"], page)
    write_bytes(paths["csv"], _front_csv(front, fcols))
    md = _report_md(campaign, info, front, repeats, found, partial) + ("\n" + mislead.markdown if mislead else "")
    write_bytes(paths["md"], md.encode("utf-8"))
    if len(found.table):
        for kind, data in (("paper_md", table_markdown(found.table, found.metric, found.table_note) + "\n"),
                           ("paper_tex", table_latex(found.table, found.metric)),
                           ("paper_csv", table_csv(found.table))):
            paths[kind] = f"{out}/paper_table.{kind.removeprefix('paper_')}"
            write_bytes(paths[kind], data if isinstance(data, bytes) else data.encode("utf-8"))
    if partial:
        logger.warning(partial)
    return paths, figures


def partial_note(campaign: Campaign, statuses: pd.Series) -> str:
    """A note when the report shows a campaign that has not ended (running, or stopped before the end),
    else "". Older campaigns have no end time: there, every trial in a final status means ended."""
    if campaign.ended:
        return ""
    final = int(statuses.isin(FINAL_STATUSES).sum())
    if final == len(statuses) and campaign.interrupted_at is None:
        return ""
    planned = campaign.trials_planned
    of = f" of {max(planned, len(statuses))}" if planned is not None else ""
    return (f"partial report: the campaign has not ended; {final}{of} trial(s) had finished when it was "
            f"written ({len(statuses) - final} still running, pending or interrupted)")


def build_report(experiment_dir, out_dir=None, *, static: bool = True, front_statuses=("completed",),
                 reference_csv=None, objectives=None) -> dict[str, str]:
    """Build the report of a campaign folder (local path or URI) into ``out_dir`` (default
    ``<exp>/report/``). ``static=False`` skips png/svg export; ``reference_csv`` overrides the paper's
    reference points file; ``objectives`` overrides the spec's. Returns {name: written path}."""
    campaign = open_campaign(experiment_dir)
    if inherited.is_one_shot(campaign):   # its records read before anything is written: DamagedRecord, exit 2
        for problem in inherited.read_folders(experiment_dir, campaign).problems:
            logger.warning(f"{problem}: the report goes on without it")
    campaign_objectives = [{"metric": m, "mode": d} for m, d in campaign.objectives]
    objectives = objectives or campaign_objectives
    out = resolve_out_dir(experiment_dir, out_dir, REPORT_DIR)  # refuses a file before anything is written
    trials, epochs = collect(experiment_dir, opened=True)
    reference = hv_reference.ready(hv_reference.read(experiment_dir)) if objectives == campaign_objectives else None
    # pyarrow encodes the Parquet files without the GIL: in a second thread, beside the page's Python work.
    with ThreadPoolExecutor(1) as encoder:
        parquet = encoder.submit(parquet_files, trials, epochs)
        info = front_info(trials, objectives, front_statuses, reference)
        paths, figures = _write_page(out, campaign, info, epochs, reference_csv)
        paths.update(stage_report(experiment_dir, out, campaign, trials, paths["md"]))  # spaces.stages
        oneshot, oneshot_figures = fidelity_report(experiment_dir, out, campaign, trials, paths["md"], reference)
        paths.update(oneshot)
        figures.update(oneshot_figures)  # exported beside the page's own
        for folder in target_folders(experiment_dir, campaign):   # each deployment target's own report
            build_report(folder, static=static)
        paths.update(targets_report(experiment_dir, out, campaign, paths["md"]))
        paths.update(write_results(experiment_dir, out_dir=out, files=parquet.result()))
    if static:
        paths.update(export_static(figures, out))  # a child process, bounded in time
    return paths
