"""Pareto report of a campaign: pareto.html (self-contained, loads offline), pareto.csv, report.md,
trials.parquet / epochs.parquet and, when a static exporter works here, png/svg figures.

    from qkvsearch.search.analysis.report import build_report
    paths = build_report("results/my-campaign")   # -> {"html": ..., "csv": ..., ...}

Everything shown is recomputed from the collected tables (search.analysis.results). Objectives come from
the campaign spec (``spec.objectives``; when it names none, the spec loader's default: top1 max). A metric maps to
the trial column of the same name when there is one (gmacs, params_m, train_s_total, ...), else to
``final_<metric>`` (its value at the trial's last reported epoch). Only trials whose status is in
``front_statuses`` (default: completed) form the front; the others are drawn but never on it. A
running campaign is reported as far as it has got. Nothing is written outside ``out_dir``, and every
file is written whole (storage).
"""
from __future__ import annotations

import base64
import html
import io
import json
import logging
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from qkvsearch.search.analysis.pareto import hypervolume_trace, nondominated_mask, reference_point
from qkvsearch.search.analysis.results import (
    CONFIG_PREFIX,
    collect,
    parquet_files,
    resolve_out_dir,
    write_results,
)
from qkvsearch.search.records.layout import ENDED_KEY, FINAL_STATUSES, INTERRUPTED_KEY, read_campaign
from qkvsearch.spaces.keys import RESOLVED_KEYS, identity
from qkvsearch.spaces.schema import DEFAULT_OBJECTIVES as SPEC_DEFAULT_OBJECTIVES
from qkvsearch.storage import loads_json, write_bytes

__all__ = ["build_report", "DEFAULT_OBJECTIVES", "objective_columns", "paper_setting"]

logger = logging.getLogger(__name__)

# For a campaign file whose spec names no objectives: the spec loader's default for a spec without any.
DEFAULT_OBJECTIVES = tuple(vars(o) for o in SPEC_DEFAULT_OBJECTIVES)  # the loader's, for specs without any
PAPER_CSV = resources.files("qkvsearch.reference") / "sne_paper_imagenet.csv"   # package data
PAPER_SIZES = {"xcit_nano_12": "S", "xcit_tiny_12": "M", "xcit_small_12": "L"}
AXIS_TITLES = {
    "gmacs": "GMACs (multiply-accumulates; the papers' 'FLOPs')",
    "params_m": "parameters (M)",
    "top1": "top-1 accuracy (%)",
    "top5": "top-5 accuracy (%)",
    "val_loss": "validation loss",
    "train_s_total": "training time (s)",
}
EMBED_COLORS = {"linear": "#7f7f7f", "sne": "#1f77b4", "psne": "#2ca02c", "fsne": "#d62728"}
EXTRA_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e")
STATUS_SYMBOLS = {"completed": "circle", "stopped_early": "triangle-down", "running": "diamond-open",
                  "interrupted": "diamond", "diverged": "x", "failed": "cross", "infeasible": "square-open", "pending": "circle-open"}
SYMBOLS_3D = {"circle", "circle-open", "cross", "diamond", "diamond-open", "square", "square-open", "x"}
HOVER_CONFIG_LIMIT = 2000  # above this many trials only front points carry the full config on hover
TABLE_CONFIG = tuple(k.name for k in RESOLVED_KEYS.values() if k.report)  # trial keys the tables show


# ---------------------------------------------------------------------------------------- data
def objective_columns(trials: pa.Table, objectives) -> tuple[list[str], list[str], list[str]]:
    """Spec objectives -> (metric names, trial columns, directions); ValueError naming a bad one."""
    metrics, cols, dirs = [], [], []
    for i, obj in enumerate(objectives):
        metric, mode = (obj or {}).get("metric"), (obj or {}).get("mode")
        if mode not in ("min", "max"):
            raise ValueError(f"objectives[{i}].mode: expected 'min' or 'max', given {mode!r}")
        col = metric if metric in trials.column_names and not str(metric).startswith("config_") else f"final_{metric}"
        if col not in trials.column_names:
            raise ValueError(f"objectives[{i}].metric: expected a reported metric or a cost column "
                             f"(e.g. top1, gmacs, params_m), given {metric!r}")
        metrics.append(metric)
        cols.append(col)
        dirs.append(mode)
    if not metrics:
        raise ValueError("objectives: expected at least one objective, given none")
    return metrics, cols, dirs


def _first(df: pd.DataFrame, col: str):
    vals = df[col].dropna().unique() if col in df else []
    return vals[0] if len(vals) == 1 else None


def paper_setting(trials: pd.DataFrame) -> str | None:
    """Paper size S/M/L when every trial trains the paper's ImageNet setting (an imagefolder dataset of
    1000 classes at 224 px, on an XCiT of one of the paper's sizes), else None."""
    dataset, classes = _first(trials, "config_dataset"), _first(trials, "config_num_classes")
    img, model = _first(trials, "config_img_size"), _first(trials, "config_model")
    if dataset != "imagefolder" or classes != 1000 or img != 224 or not isinstance(model, str):
        return None
    for prefix, size in PAPER_SIZES.items():
        if model.startswith(prefix):
            return size
    return None


def _paper_points(size: str, csv_path) -> pd.DataFrame:
    ref = pd.read_csv(csv_path, comment="#")
    ref = ref[ref["size"] == size].copy()
    code = ref["code_size"].map(lambda c: "" if pd.isna(c) else f"-C{int(c)}")
    star = np.where(ref["param_matched"].astype(str).str.lower() == "true", "*", "")
    ref["label"] = "paper " + ref["embedding"].str.upper().str.replace("FSNE", "F-SNE").str.replace(
        "PSNE", "P-SNE") + code + star + f"-{size}"
    return ref.rename(columns={"gmacs_reported": "gmacs"})


_HTML_SPECIAL = re.compile("[&<>\"']")  # what html.escape replaces


def _escaped(texts: list[str]) -> list[str]:
    """html.escape of each text. Most columns hold nothing to escape (names, numbers): one scan of
    them joined says so; otherwise each distinct text is escaped once."""
    if not _HTML_SPECIAL.search("".join(texts)):
        return texts
    escaped = {t: html.escape(t) for t in set(texts)}
    return [escaped[t] for t in texts]


def _g4(s: pd.Series, missing: str) -> list[str]:
    """Values with 4 significant digits ({:.4g}), ``missing`` where NA."""
    na = s.isna().to_numpy()
    return [missing if m else f"{v:.4g}" for v, m in zip(s.tolist(), na)]


def _config(config_json: str) -> dict:
    """A trial's config_json parsed (orjson where it can: a few times faster than json for thousands)."""
    return loads_json(config_json.encode("utf-8"))


def _hover_details(config_json: str, error) -> str:
    """The config's set keys (sorted) and the error, as hover lines after the objectives."""
    config = _config(config_json)
    lines = [f"{html.escape(str(k))} = {html.escape(json.dumps(v))}" for k, v in sorted(config.items()) if v is not None]
    if isinstance(error, str) and error:  # a missing error is NaN here
        lines.append("error: " + html.escape(error[:200]))
    return "".join("<br>" + line for line in lines)


def _hover(df: pd.DataFrame, metrics, cols, full: np.ndarray) -> list[str]:
    """Per trial: name, status and objectives; where ``full`` (n,) bool, also its config and error."""
    names = _escaped(df["trial_name"].astype(str).tolist())
    out = [f"<b>{n}</b> ({s})" for n, s in zip(names, df["status"].astype(str).tolist())]
    for m, c in zip(metrics, cols):
        out = [f"{h}<br>{m} = {v}" for h, v in zip(out, _g4(df[c], "n/a"))]
    configs, errors = df["config_json"].to_numpy(dtype=object), df["error"].to_numpy(dtype=object)
    for i in np.flatnonzero(full):
        out[i] += _hover_details(configs[i], errors[i])
    return out


def _rows(df: pd.DataFrame, mask: pd.Series, columns: list[str]) -> pd.DataFrame:
    """The rows where ``mask``, with only ``columns`` (each once): a copy of what is used, not of the
    whole frame's seventy-odd columns."""
    return df.loc[mask, list(dict.fromkeys(columns))]


def _prepare(trials: pa.Table, objectives, front_statuses) -> tuple[pd.DataFrame, list, list, list]:
    metrics, cols, dirs = objective_columns(trials, objectives)
    # Integer columns stay integers where a trial has no value (code_size of a linear trial): 4, not 4.0.
    df = trials.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    values = df[cols].astype("float64").to_numpy()  # (n, k), NaN where missing
    eligible = df["status"].isin(list(front_statuses)).to_numpy()
    on_front = np.zeros(len(df), dtype=bool)
    on_front[eligible] = nondominated_mask(values[eligible], dirs)
    df["on_front"] = on_front
    df["embedding"] = df["config_embedding"].fillna("?")
    full = np.ones(len(df), dtype=bool) if len(df) <= HOVER_CONFIG_LIMIT else on_front
    df["hover"] = _hover(df, metrics, cols, full)
    return df, metrics, cols, dirs


# ---------------------------------------------------------------------------------------- figures
# Figures are plotly figure dicts ({"data": [trace, ...], "layout": {...}}) in the form plotly.py's
# graph objects serialise to: numbers as typed arrays, the template written out. Building them as
# dicts skips plotly.py's per-value validation, which at 10,000 trials costs about a second.
def _color(emb: str, order: list[str]) -> str:
    return EMBED_COLORS.get(emb) or EXTRA_COLORS[order.index(emb) % len(EXTRA_COLORS)]


def _title(metric: str) -> str:
    return AXIS_TITLES.get(metric, metric)


def _numbers(values) -> dict | list:
    """(n,) numbers (Series, array) -> plotly.js typed array: float64, base64, missing -> NaN (a gap)."""
    if isinstance(values, pd.Series):
        values = values.to_numpy(dtype="float64", na_value=np.nan)
    v = np.ascontiguousarray(values, dtype="<f8")
    if v.size == 0:
        return []  # as plotly.py sends an empty array
    return {"dtype": "f8", "bdata": base64.b64encode(v).decode("ascii")}


@lru_cache(maxsize=1)
def _template() -> dict:
    """The plotly_white template as the layout carries it (plotly.js knows no template names)."""
    import plotly.io as pio

    return pio.templates["plotly_white"].to_plotly_json()


def _layout(title: str, height: int, **axes) -> dict:
    """Layout with the report's template; ``axes``: xaxis=..., yaxis=... axis titles, or a scene."""
    out = {"template": _template(), "title": {"text": title}, "height": height}
    for name, value in axes.items():
        out[name] = {"title": {"text": value}} if isinstance(value, str) else value
    return out


def _scatter_traces(df: pd.DataFrame, groups: dict, xcol: str, ycol: str, zcol: str | None = None) -> list[dict]:
    """One trace per (embedding, status) of ``groups`` ({(emb, status): row positions}, sorted):
    colour = embedding, symbol = status; rows missing a coordinate are left out."""
    traces = []
    embeds = sorted(df["embedding"].unique())
    axes = {"x": xcol, "y": ycol, **({"z": zcol} if zcol else {})}
    coords = {a: df[c].to_numpy(dtype="float64", na_value=np.nan) for a, c in axes.items()}
    present = np.logical_and.reduce([~np.isnan(v) for v in coords.values()])  # (n,)
    hover, ids = df["hover"].to_numpy(dtype=object), df["trial_id"].to_numpy(dtype=object)
    for (emb, status), rows in groups.items():
        rows = rows[present[rows]]
        if rows.size == 0:
            continue
        symbol = STATUS_SYMBOLS.get(status, "circle")
        if zcol is not None and symbol not in SYMBOLS_3D:
            symbol = "diamond"  # 3-D markers have fewer symbols
        marker = {"color": _color(emb, embeds), "symbol": symbol, "size": 7 if zcol is None else 4, "opacity": 0.85}
        trace = {"type": "scatter" if zcol is None else "scatter3d", "name": f"{emb} · {status}", "legendgroup": emb,
                 "mode": "markers", "marker": marker, "hovertext": hover[rows].tolist(), "hoverinfo": "text",
                 "customdata": ids[rows].tolist()}
        traces.append(trace | {a: _numbers(v[rows]) for a, v in coords.items()})
    return traces


def _trial_groups(df: pd.DataFrame) -> dict:
    """{(embedding, status): (m,) row positions}, keys sorted: the traces of every scatter figure."""
    groups = df.groupby(["embedding", "status"], sort=True).indices
    return {k: groups[k] for k in sorted(groups)}


def _front_2d(df: pd.DataFrame, xcol, xdir, ycol, ydir) -> pd.DataFrame:
    """Eligible trials on the front of this pair of objectives, sorted along x (the staircase)."""
    pts = _rows(df, df["eligible"], [xcol, ycol])
    mask = nondominated_mask(pts[[xcol, ycol]].astype("float64").to_numpy(), [xdir, ydir])
    return pts[mask].sort_values([xcol, ycol], ascending=[True, ydir == "min"])


def _pair_figure(df, groups, metrics, cols, dirs, j: int, paper: pd.DataFrame | None) -> dict:
    """objectives[0] (y) against objectives[j] (x): all trials, the full front, the 2-D staircase."""
    xcol, ycol = cols[j], cols[0]
    data = _scatter_traces(df, groups, xcol, ycol)
    front = _rows(df, df["on_front"], [xcol, ycol, "hover", "trial_id"])
    data.append({"type": "scatter", "x": _numbers(front[xcol]), "y": _numbers(front[ycol]), "mode": "markers",
                 "name": "Pareto front (all objectives)",
                 "marker": {"size": 14, "color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 2}},
                 "hovertext": front["hover"].tolist(), "hoverinfo": "text", "customdata": front["trial_id"].tolist()})
    stair = _front_2d(df, xcol, dirs[j], ycol, dirs[0])
    shape = "hv" if dirs[0] == "max" and dirs[j] == "min" else "linear"
    data.append({"type": "scatter", "x": _numbers(stair[xcol]), "y": _numbers(stair[ycol]), "mode": "lines",
                 "line": {"color": "black", "width": 1.5, "shape": shape},
                 "name": f"front in this plane ({metrics[0]} vs {metrics[j]})", "hoverinfo": "skip"})
    if paper is not None and metrics[j] in paper and metrics[0] in paper:
        p = paper.dropna(subset=[metrics[j], metrics[0]])
        data.append({"type": "scatter", "x": _numbers(p[metrics[j]]), "y": _numbers(p[metrics[0]]), "mode": "markers",
                     "name": "paper (ImageNet-1k)",
                     "marker": {"symbol": "star", "size": 12, "color": "#ff7f0e", "line": {"color": "black", "width": 1}},
                     "hovertext": p["label"].tolist(), "hoverinfo": "text+x+y"})
    layout = _layout(f"{metrics[0]} vs {metrics[j]}", 560, xaxis=_title(metrics[j]), yaxis=_title(metrics[0]))
    layout["legend"] = {"font": {"size": 10}}
    return {"data": data, "layout": layout}


def _figure_3d(df, groups, metrics, cols) -> dict:
    data = _scatter_traces(df, groups, cols[1], cols[2], cols[0])
    front = _rows(df, df["on_front"], [*cols[:3], "hover"])
    data.append({"type": "scatter3d", "x": _numbers(front[cols[1]]), "y": _numbers(front[cols[2]]),
                 "z": _numbers(front[cols[0]]), "mode": "markers", "name": "Pareto front",
                 "marker": {"size": 7, "color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 3}},
                 "hovertext": front["hover"].tolist(), "hoverinfo": "text"})
    scene = {f"{a}axis": {"title": {"text": _title(m)}} for a, m in zip("xyz", (metrics[1], metrics[2], metrics[0]))}
    return {"data": data, "layout": _layout(f"{metrics[0]} vs {metrics[1]} and {metrics[2]}", 650, scene=scene)}


def _curves_figure(df, epochs: pa.Table, metric: str = "top1") -> dict:
    """Per-epoch curves of the front's trials only (never every epoch of every trial)."""
    front = _rows(df, df["on_front"], ["trial_id", "embedding"])
    data = []
    if metric in epochs.column_names and len(front):
        sub = epochs.filter(pc.is_in(epochs["trial_id"], value_set=pa.array(front["trial_id"].tolist(), pa.string())))
        sub = sub.select(["trial_id", "trial_name", "epoch", metric]).to_pandas().sort_values(["trial_id", "epoch"])
        embeds = sorted(df["embedding"].unique())
        emb_of = dict(zip(front["trial_id"], front["embedding"]))
        for tid, g in sub.groupby("trial_id", sort=True):
            data.append({"type": "scatter", "x": _numbers(g["epoch"]), "y": _numbers(g[metric]), "mode": "lines+markers",
                         "name": str(g["trial_name"].iloc[0]), "line": {"color": _color(emb_of[tid], embeds)},
                         "marker": {"size": 4}})
    layout = _layout(f"Learning curves of the front ({metric} per epoch)", 480, xaxis="epoch", yaxis=_title(metric))
    return {"data": data, "layout": layout}


def _hypervolume(df, cols, dirs) -> tuple[pd.DataFrame, np.ndarray | None]:
    """HV of the eligible trials in completion order (ended_at), against the default reference."""
    done = _rows(df, df["eligible"] & df["ended_at"].notna(), [*cols, "ended_at", "trial_id"])
    done = done.sort_values(["ended_at", "trial_id"])
    values = done[cols].astype("float64").to_numpy()
    ok = ~np.isnan(values).any(axis=1)
    if not ok.any():
        return done.iloc[:0].assign(hypervolume=[]), None
    ref = reference_point(values[ok], dirs)
    trace = hypervolume_trace(values, dirs, ref)
    return done.assign(hypervolume=trace), ref


def _hv_figure(hv: pd.DataFrame, ref, metrics) -> dict:
    trace = {"type": "scatter", "x": _numbers(np.arange(1, len(hv) + 1)), "y": _numbers(hv["hypervolume"]),
             "mode": "lines", "line": {"shape": "hv"}, "name": "hypervolume",
             "customdata": hv["ended_at"].astype(str).tolist(),
             "hovertemplate": "trial %{x} (ended %{customdata})<br>HV %{y:.4g}<extra></extra>"}
    ref_txt = ", ".join(f"{m}={r:.4g}" for m, r in zip(metrics, ref)) if ref is not None else "n/a"
    layout = _layout(f"Hypervolume over completed trials (reference: {ref_txt})", 420,
                     xaxis="trials finished (completion order)", yaxis="hypervolume")
    return {"data": [trace], "layout": layout}


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
    wanted = ["trial_name", "status"] + [f"{CONFIG_PREFIX}{c}" for c in TABLE_CONFIG] + list(cols)
    wanted += ["best_top1", "epochs_run", "train_s_total"]
    seen, out = set(), []
    for c in wanted:
        if c in df and c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _fmt(v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _formatted(df: pd.DataFrame, col: str) -> list[str]:
    """Column as display strings (HTML-escaped); floats with 4 significant digits, missing -> ""."""
    s = df[col]
    if pd.api.types.is_float_dtype(s):
        return _g4(s, "")  # digits, sign, point, exponent: nothing to escape
    na = s.isna().to_numpy()
    return _escaped(["" if m else str(v) for v, m in zip(s.astype(object).tolist(), na)])


def _html_table(df: pd.DataFrame, columns: list[str], table_id: str, front_flag: bool) -> str:
    """Sortable table, one <tr data-trial-id=.. data-front=0|1> per trial; cells carry data-v for sorting."""
    head = "".join(f"<th title='click to sort'>{html.escape(c.removeprefix('config_'))}</th>" for c in columns)
    cells = [[f'<td data-v="{v}">{v}</td>' for v in _formatted(df, c)] for c in columns]  # per column (n,)
    rows = ["".join(r) for r in zip(*cells)] if cells else [""] * len(df)
    if "trial_id" in df:
        ids = _escaped(df["trial_id"].tolist())
        flags = [f' data-front="{int(f)}"' for f in df["on_front"].tolist()] if front_flag else [""] * len(df)
        trs = [f'<tr data-trial-id="{i}"{f}>{r}</tr>' for i, f, r in zip(ids, flags, rows)]
    else:  # a table of configurations (repeats), not of trials
        trs = [f"<tr>{r}</tr>" for r in rows]
    return f"<table id=\"{table_id}\" class=\"sortable\"><thead><tr>{head}</tr></thead><tbody>{''.join(trs)}</tbody></table>"


def _markdown_table(df: pd.DataFrame, columns: list[str]) -> str:
    lines = ["| " + " | ".join(c.removeprefix("config_") for c in columns) + " |",
             "|" + "---|" * len(columns)]
    for rec in df[columns].to_dict("records"):
        lines.append("| " + " | ".join(_fmt(rec[c]).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines)


def repeat_summary(df: pd.DataFrame, metrics, cols) -> pd.DataFrame:
    """Configurations trained with several seeds (search.repeats): per configuration, the eligible
    trials, their seeds, and each objective's mean and sample standard deviation over them."""
    pool = _rows(df, df["eligible"], ["config_json", "trial_name", "config_seed", *cols])
    keys = [identity(_config(c), ignore=("seed",)) for c in pool["config_json"]]
    rows = []
    for _key, group in pool.groupby(keys, sort=False):
        if len(group) < 2:
            continue
        row = {"configuration": str(group["trial_name"].iloc[0]).rsplit("-", 1)[0], "n": len(group),
               "seeds": ", ".join(str(v) for v in sorted(group["config_seed"]))}
        for m, c in zip(metrics, cols):
            values = group[c].astype("float64")
            row[f"{m} mean"], row[f"{m} sd"] = values.mean(), values.std(ddof=1)
        rows.append(row)
    return pd.DataFrame(rows)


def _report_md(campaign: dict, df: pd.DataFrame, front: pd.DataFrame, metrics, cols, dirs, front_statuses, ref,
               repeats: pd.DataFrame, partial: str = "") -> str:
    counts = df["status"].value_counts().sort_index()
    objectives = ", ".join(f"{m} ({d})" for m, d in zip(metrics, dirs))
    parts = [
        f"# Pareto report: {campaign.get('name', '?')}" + (" (partial)" if partial else ""), "",
        *([f"**{partial}**", ""] if partial else []),
        f"- code version: {campaign.get('code_version', '?')}",
        f"- objectives: {objectives}",
        f"- trials: {len(df)} ({', '.join(f'{s} {n}' for s, n in counts.items())})",
        f"- front from statuses: {', '.join(front_statuses)}; {len(front)} trials on the front",
        f"- hypervolume reference: {', '.join(f'{m}={r:.4g}' for m, r in zip(metrics, ref)) if ref is not None else 'n/a'}",
        "", "## Pareto front", "", _markdown_table(front, _front_columns(front, cols)) if len(front) else "(empty)",
        *(["", f"## {REPEATS_TITLE}", "", _markdown_table(repeats, list(repeats.columns))] if len(repeats) else []),
        "", "## Campaign settings", "", "```json", json.dumps(campaign.get("spec", {}), indent=2, sort_keys=True), "```", "",
    ]
    return "\n".join(parts)


REPEATS_TITLE = "Repeated configurations (mean and standard deviation over seeds)"


def _page(title: str, campaign: dict, summary_html: str, figures_html: list[str], front_table: str, all_table: str,
          repeats_table: str = "") -> bytes:
    """The whole page as UTF-8. Parts are encoded one by one and joined as bytes: the figures' text is
    not ASCII, and one str of the whole page would hold plotly.js at two bytes a character."""
    spec = html.escape(json.dumps(campaign.get("spec", {}), indent=2, sort_keys=True))
    style = ("body{font-family:sans-serif;margin:16px;}table{border-collapse:collapse;font-size:12px;}"
             "th,td{border:1px solid #ccc;padding:2px 6px;}th{cursor:pointer;background:#f3f3f3;}"
             "tr[data-front='1']{font-weight:bold;}")
    parts = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
             f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{summary_html}"]
    for fig in figures_html:
        parts += ["<div class='fig'>", fig, "</div>"]
    parts += [f"<h2>Pareto front</h2>{front_table}",
              f"<h2>{REPEATS_TITLE}</h2>{repeats_table}" if repeats_table else "",
              f"<details><summary>All trials</summary>{all_table}</details>",
              f"<details><summary>Campaign settings</summary><pre>{spec}</pre></details>{SORT_JS}</body></html>"]
    return b"".join(part.encode("utf-8") for part in parts)


# ---------------------------------------------------------------------------------------- output
def _export_static(figures: dict, out: str) -> dict[str, str]:
    """png + svg of every figure through plotly's kaleido exporter; a one-line warning when it can't."""
    try:
        import plotly.io as pio

        with tempfile.TemporaryDirectory(prefix="qs-static-") as tmp:
            names = [f"{n}.{ext}" for n in figures for ext in ("png", "svg")]
            figs = [fig for fig in figures.values() for _ in ("png", "svg")]
            pio.write_images(figs, [os.path.join(tmp, n) for n in names], width=1100, height=650, validate=False)
            written = {}
            for n in names:
                write_bytes(f"{out}/{n}", Path(tmp, n).read_bytes())
                written[n.replace(".", "_")] = f"{out}/{n}"
            return written
    except Exception as exc:  # any exporter failure: the HTML report stands on its own
        logger.warning("static png/svg figures skipped (%s: %s); they need the kaleido package and a Chromium "
                       "browser (e.g. apt-get install chromium); pareto.html has every figure",
                       type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return {}


def _figures(df, groups, epochs, metrics, cols, dirs, paper, hv, ref) -> dict[str, dict]:
    """The page's figures in order: name -> figure dict (the names of the static files)."""
    figures = {f"{metrics[0]}_vs_{metrics[j]}": _pair_figure(df, groups, metrics, cols, dirs, j, paper)
               for j in range(1, len(cols))}
    if len(cols) >= 3:
        figures["pareto_3d"] = _figure_3d(df, groups, metrics, cols)
    figures["learning_curves"] = _curves_figure(df, epochs)
    figures["hypervolume"] = _hv_figure(hv, ref, metrics)
    return figures


def _figures_html(figures: dict[str, dict]) -> list[str]:
    """Each figure as a <div>; plotly.js inlined once, in the first, so that the page loads offline.
    The dicts are already in plotly.js form: no validation pass."""
    import plotly.io as pio

    return [pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0), default_width="100%", validate=False)
            for i, fig in enumerate(figures.values())]


def _summary_html(df: pd.DataFrame, front: pd.DataFrame, metrics, dirs, front_statuses, size) -> str:
    counts = df["status"].value_counts().sort_index()
    return (f"<p>{len(df)} trials ({', '.join(f'{html.escape(s)} {n}' for s, n in counts.items())}); "
            f"objectives: {', '.join(f'{m} ({d})' for m, d in zip(metrics, dirs))}; "
            f"{len(front)} on the front (from {', '.join(front_statuses)} trials)"
            + (f"; paper points: XCiT size {size}" if size else "") + "</p>")


def _by_trial_id(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in trial_id order (collect's order already: then no sort and no copy)."""
    return df if df["trial_id"].is_monotonic_increasing else df.sort_values("trial_id")


def _front_csv(front: pd.DataFrame, fcols: list[str]) -> bytes:
    buf = io.StringIO()
    front[["trial_id"] + fcols + ["checkpoint_path", "config_json"]].to_csv(buf, index=False)
    return buf.getvalue().encode("utf-8")


def _write_page(out: str, campaign: dict, trials: pa.Table, epochs: pa.Table, objectives, front_statuses,
                reference_csv) -> tuple[dict[str, str], dict[str, dict]]:
    """pareto.html, pareto.csv and report.md into ``out``: ({name: path}, the figures by name)."""
    df, metrics, cols, dirs = _prepare(trials, objectives, front_statuses)
    df["eligible"] = df["status"].isin(list(front_statuses))
    size = paper_setting(df)
    paper = _paper_points(size, reference_csv or PAPER_CSV) if size else None

    hv, ref = _hypervolume(df, cols, dirs)
    figures = _figures(df, _trial_groups(df), epochs, metrics, cols, dirs, paper, hv, ref)
    front = df[df["on_front"]].sort_values(cols[0], ascending=dirs[0] == "min")
    fcols = _front_columns(df, cols)
    repeats = repeat_summary(df, metrics, cols)
    partial = partial_note(campaign, df["status"])
    title = f"Pareto report: {campaign.get('name', '?')}" + (" (partial)" if partial else "")
    summary = (f"<p><b>{html.escape(partial)}</b></p>" if partial else "") + _summary_html(
        df, front, metrics, dirs, front_statuses, size)
    page = _page(title, campaign, summary, _figures_html(figures),
                 _html_table(front, fcols, "front", True),
                 _html_table(_by_trial_id(df), fcols + ["error"], "trials", True),
                 _html_table(repeats, list(repeats.columns), "repeats", False) if len(repeats) else "")

    paths = {"html": f"{out}/pareto.html", "csv": f"{out}/pareto.csv", "md": f"{out}/report.md"}
    write_bytes(paths["html"], page)
    write_bytes(paths["csv"], _front_csv(front, fcols))
    write_bytes(paths["md"], _report_md(campaign, df, front, metrics, cols, dirs, front_statuses, ref,
                                        repeats, partial).encode("utf-8"))
    if partial:
        logger.warning(partial)
    return paths, figures


def partial_note(campaign: dict, statuses: pd.Series) -> str:
    """A note when the report shows a campaign that has not ended (running, or stopped before the end),
    else "". Older campaigns have no end time: there, every trial in a final status means ended."""
    if campaign.get(ENDED_KEY) is not None:
        return ""
    final = int(statuses.isin(FINAL_STATUSES).sum())
    if final == len(statuses) and campaign.get(INTERRUPTED_KEY) is None:
        return ""
    planned = ((campaign.get("spec") or {}).get("search") or {}).get("num_trials")
    of = f" of {planned}" if isinstance(planned, int) and not isinstance(planned, bool) else ""
    return (f"partial report: the campaign has not ended; {final}{of} trial(s) had finished when it was "
            f"written ({len(statuses) - final} still running, pending or interrupted)")


def build_report(experiment_dir, out_dir=None, *, static: bool = True, front_statuses=("completed",),
                 reference_csv=None, objectives=None) -> dict[str, str]:
    """Build the report of a campaign folder (local path or URI) into ``out_dir`` (default
    ``<exp>/report/``). ``static=False`` skips png/svg export; ``reference_csv`` overrides the paper's
    reference points file; ``objectives`` overrides the spec's. Returns {name: written path}."""
    campaign = read_campaign(experiment_dir)
    objectives = objectives or campaign["spec"].get("objectives") or DEFAULT_OBJECTIVES
    out = resolve_out_dir(experiment_dir, out_dir, "report")  # refuses a file before anything is written
    trials, epochs = collect(experiment_dir)
    # pyarrow encodes the Parquet files without the GIL: in a second thread, beside the page's Python work.
    with ThreadPoolExecutor(1) as encoder:
        parquet = encoder.submit(parquet_files, trials, epochs)
        paths, figures = _write_page(out, campaign, trials, epochs, objectives, front_statuses, reference_csv)
        paths.update(write_results(experiment_dir, out_dir=out, files=parquet.result()))
    if static:
        paths.update(_export_static(figures, out))
    return paths
