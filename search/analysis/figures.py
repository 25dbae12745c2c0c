"""The report's plotly figures, each rendered from one FrontInfo (search.analysis.front), and the text
helpers its tables share (escaping, number formats).

Figures are plotly figure dicts ({"data": [trace, ...], "layout": {...}}) in the form plotly.py's graph
objects serialise to: numbers as typed arrays, the template written out. Building them as dicts skips
plotly.py's per-value validation, which at 10,000 trials costs about a second.
"""
from __future__ import annotations

import base64
import html
import json
import re
from functools import lru_cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from qkvsearch.search.analysis.front import FrontInfo, rows
from qkvsearch.search.analysis.markers import BASELINE, baseline_marker, shared_note, spread, title_note
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.storage import loads_json

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
                  "interrupted": "diamond", "diverged": "x", "failed": "cross", "infeasible": "square-open",
                  "pending": "circle-open"}
SYMBOLS_3D = {"circle", "circle-open", "cross", "diamond", "diamond-open", "square", "square-open", "x"}
HOVER_CONFIG_LIMIT = 2000  # above this many trials only front points carry the full config on hover


# ---------------------------------------------------------------------------------------- text
_HTML_SPECIAL = re.compile("[&<>\"']")  # what html.escape replaces


def escaped(texts: list[str]) -> list[str]:
    """html.escape of each text. Most columns hold nothing to escape (names, numbers): one scan of
    them joined says so; otherwise each distinct text is escaped once."""
    if not _HTML_SPECIAL.search("".join(texts)):
        return texts
    done = {t: html.escape(t) for t in set(texts)}
    return [done[t] for t in texts]


def g4(s: pd.Series, missing: str) -> list[str]:
    """Values with 4 significant digits ({:.4g}), ``missing`` where NA."""
    na = s.isna().to_numpy()
    return [missing if m else f"{v:.4g}" for v, m in zip(s.tolist(), na)]


def config_of(config_json: str) -> dict:
    """A trial's config_json parsed (orjson where it can: a few times faster than json for thousands)."""
    return loads_json(config_json.encode("utf-8"))


def _hover_details(config_json: str, error) -> str:
    """The config's set keys (sorted) and the error, as hover lines after the objectives."""
    config = config_of(config_json)
    lines = [f"{html.escape(str(k))} = {html.escape(json.dumps(v))}"
             for k, v in sorted(config.items()) if v is not None]
    if isinstance(error, str) and error:  # a missing error is NaN here
        lines.append("error: " + html.escape(error[:200]))
    return "".join("<br>" + line for line in lines)


def hover_texts(info: FrontInfo) -> list[str]:
    """Per trial: name, status and objectives; up to HOVER_CONFIG_LIMIT trials every one, beyond it
    front trials only, also its config and error."""
    df = info.trials
    names = escaped(df["trial_name"].astype(str).tolist())
    out = [f"<b>{n}</b> ({s})" for n, s in zip(names, df["status"].astype(str).tolist())]
    for m, c in zip(info.metrics, info.columns):
        out = [f"{h}<br>{m} = {v}" for h, v in zip(out, g4(df[c], "n/a"))]
    full = np.ones(len(df), dtype=bool) if len(df) <= HOVER_CONFIG_LIMIT else info.on_front
    configs, errors = df["config_json"].to_numpy(dtype=object), df["error"].to_numpy(dtype=object)
    for i in np.flatnonzero(full):
        out[i] += _hover_details(configs[i], errors[i])
    return out


# ---------------------------------------------------------------------------------------- parts
def embed_color(emb: str, order: list[str]) -> str:
    return EMBED_COLORS.get(emb) or EXTRA_COLORS[order.index(emb) % len(EXTRA_COLORS)]


def axis_title(metric: str) -> str:
    return AXIS_TITLES.get(metric, metric)


def numbers(values) -> dict | list:
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


def figure_layout(title: str, height: int, **axes) -> dict:
    """Layout with the report's template; ``axes``: xaxis=..., yaxis=... axis titles, or a scene."""
    out = {"template": _template(), "title": {"text": title}, "height": height}
    for name, value in axes.items():
        out[name] = {"title": {"text": value}} if isinstance(value, str) else value
    return out


def placed(df: pd.DataFrame, axes: dict[str, str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """Where a figure draws each row of ``df`` (its "hover" column the rows' texts): ({axis: (n,) float64, NaN
    where missing; "shared": (n,) how many other rows share the row's point}, with x moved apart where points
    coincide (search.analysis.markers), and each row's hover text, noting the points drawn side by side)."""
    coords = {a: df[c].to_numpy(dtype="float64", na_value=np.nan) for a, c in axes.items()}
    coords["x"], shared = spread([coords["x"], *(v for a, v in coords.items() if a != "x")])
    hover = df["hover"].tolist()
    for i in np.flatnonzero(shared):
        hover[i] += shared_note(int(shared[i]))
    coords["shared"] = shared
    return coords, hover


def _scatter_traces(df: pd.DataFrame, groups: dict, coords: dict[str, np.ndarray], hover: list[str]) -> list[dict]:
    """One trace per (embedding, status) of ``groups`` ({(emb, status): row positions}, sorted) at ``coords``
    (placed): colour = embedding, symbol = status, the baseline's own marker; rows missing a coordinate are left
    out."""
    traces = []
    embeds = sorted(df["embedding"].unique())
    axes = {a: v for a, v in coords.items() if a in ("x", "y", "z")}
    three_d = "z" in axes
    present = np.logical_and.reduce([~np.isnan(v) for v in axes.values()])  # (n,)
    hover, ids = np.asarray(hover, dtype=object), df["trial_id"].to_numpy(dtype=object)
    for (emb, status), at in groups.items():
        at = at[present[at]]
        if at.size == 0:
            continue
        symbol = STATUS_SYMBOLS.get(status, "circle")
        if three_d and symbol not in SYMBOLS_3D:
            symbol = "diamond"  # 3-D markers have fewer symbols
        marker = {"color": embed_color(emb, embeds), "symbol": symbol, "size": 4 if three_d else 7, "opacity": 0.85}
        name = f"{emb} · {status}"
        if emb == BASELINE:
            marker |= baseline_marker(status == "completed", three_d)
            name = f"{emb} (baseline) · {status}"
        trace = {"type": "scatter3d" if three_d else "scatter", "name": name, "legendgroup": emb,
                 "mode": "markers", "marker": marker, "hovertext": hover[at].tolist(), "hoverinfo": "text",
                 "customdata": ids[at].tolist()}
        traces.append(trace | {a: numbers(v[at]) for a, v in axes.items()})
    return traces


def _trial_groups(df: pd.DataFrame) -> dict:
    """{(embedding, status): (m,) row positions}, keys sorted: the traces of every scatter figure."""
    groups = df.groupby(["embedding", "status"], sort=True).indices
    return {k: groups[k] for k in sorted(groups)}


# ---------------------------------------------------------------------------------------- figures
def _seed_spread(seeded: pd.DataFrame | None, xcol: str, metric: str) -> dict | None:
    """The trace of the front's configurations trained under several seeds (search.analysis.report.front_with_seeds):
    each at its mean of ``metric`` with a bar of one standard deviation either side; None when there are none."""
    mean, sd = f"{metric} mean", f"{metric} sd"
    if seeded is None or mean not in seeded or "seeds" not in seeded:
        return None
    many = seeded[(seeded["seeds"] >= 2).to_numpy()].drop_duplicates(subset=[xcol, mean])
    if not len(many):
        return None
    names = [f"{n}: {metric} {m:.4g} ± {s:.2g} over {k} seeds" for n, m, s, k in
             zip(many["trial_name"].astype(str), many[mean], many[sd], many["seeds"])]
    return {"type": "scatter", "mode": "markers", "name": f"front configuration: {metric} mean ± sd over its seeds",
            "x": numbers(many[xcol]), "y": numbers(many[mean]),
            "error_y": {"type": "data", "array": many[sd].astype("float64").tolist(), "visible": True,
                        "thickness": 1.5, "width": 5, "color": "black"},
            "marker": {"symbol": "line-ew-open", "size": 14, "color": "black", "line": {"width": 2}},
            "hovertext": names, "hoverinfo": "text"}


def _pair_figure(info: FrontInfo, groups, j: int, paper: pd.DataFrame | None,
                 seeded: pd.DataFrame | None = None) -> dict:
    """objectives[0] (y) against objectives[j] (x): all trials, the full front, the 2-D staircase, and where front
    configurations trained under several seeds their mean and spread."""
    df, metrics, dirs = info.trials, info.metrics, info.directions
    xcol, ycol = info.columns[j], info.columns[0]
    coords, hover = placed(df, {"x": xcol, "y": ycol})
    data = _scatter_traces(df, groups, coords, hover)
    front = np.flatnonzero(info.on_front)  # ringed where drawn
    data.append({"type": "scatter", "x": numbers(coords["x"][front]), "y": numbers(coords["y"][front]),
                 "mode": "markers", "name": "Pareto front (all objectives)",
                 "marker": {"size": 14, "color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 2}},
                 "hovertext": [hover[i] for i in front], "hoverinfo": "text",
                 "customdata": df["trial_id"].to_numpy(dtype=object)[front].tolist()})
    spread_trace = _seed_spread(seeded, xcol, metrics[0])
    if spread_trace is not None:
        data.append(spread_trace)
    stair = info.pair_fronts[j]
    shape = "hv" if dirs[0] == "max" and dirs[j] == "min" else "linear"
    data.append({"type": "scatter", "x": numbers(stair[xcol]), "y": numbers(stair[ycol]), "mode": "lines",
                 "line": {"color": "black", "width": 1.5, "shape": shape},
                 "name": f"front in this plane ({metrics[0]} vs {metrics[j]})", "hoverinfo": "skip"})
    if paper is not None and metrics[j] in paper and metrics[0] in paper:
        p = paper.dropna(subset=[metrics[j], metrics[0]])
        data.append({"type": "scatter", "x": numbers(p[metrics[j]]), "y": numbers(p[metrics[0]]), "mode": "markers",
                     "name": "paper (ImageNet-1k)",
                     "marker": {"symbol": "star", "size": 12, "color": "#ff7f0e",
                                "line": {"color": "black", "width": 1}},
                     "hovertext": p["label"].tolist(), "hoverinfo": "text+x+y"})
    out = figure_layout(f"{metrics[0]} vs {metrics[j]}" + title_note(coords["shared"]), 560,
                        xaxis=axis_title(metrics[j]), yaxis=axis_title(metrics[0]))
    out["legend"] = {"font": {"size": 10}}
    return {"data": data, "layout": out}


def _figure_3d(info: FrontInfo, groups) -> dict:
    df, metrics, cols = info.trials, info.metrics, info.columns
    coords, hover = placed(df, {"x": cols[1], "y": cols[2], "z": cols[0]})
    data = _scatter_traces(df, groups, coords, hover)
    front = np.flatnonzero(info.on_front)
    data.append({"type": "scatter3d", **{a: numbers(coords[a][front]) for a in "xyz"}, "mode": "markers",
                 "name": "Pareto front",
                 "marker": {"size": 7, "color": "rgba(0,0,0,0)", "line": {"color": "black", "width": 3}},
                 "hovertext": [hover[i] for i in front], "hoverinfo": "text"})
    scene = {f"{a}axis": {"title": {"text": axis_title(m)}}
             for a, m in zip("xyz", (metrics[1], metrics[2], metrics[0]))}
    title = f"{metrics[0]} vs {metrics[1]} and {metrics[2]}" + title_note(coords["shared"])
    return {"data": data, "layout": figure_layout(title, 650, scene=scene)}


def _curves_figure(info: FrontInfo, epochs: pa.Table, metric: str = "top1") -> dict:
    """Per-epoch curves of the front's trials only (never every epoch of every trial)."""
    df = info.trials
    front = rows(df, df["on_front"], ["trial_id", "embedding"])
    data = []
    if metric in epochs.column_names and len(front):
        sub = epochs.filter(pc.is_in(epochs["trial_id"], value_set=pa.array(front["trial_id"].tolist(), pa.string())))
        sub = sub.select(["trial_id", "trial_name", EPOCH, metric]).to_pandas().sort_values(["trial_id", EPOCH])
        embeds = sorted(df["embedding"].unique())
        emb_of = dict(zip(front["trial_id"], front["embedding"]))
        for tid, g in sub.groupby("trial_id", sort=True):
            data.append({"type": "scatter", "x": numbers(g[EPOCH]), "y": numbers(g[metric]), "mode": "lines+markers",
                         "name": str(g["trial_name"].iloc[0]), "line": {"color": embed_color(emb_of[tid], embeds)},
                         "marker": {"size": 4}})
    out = figure_layout(f"Learning curves of the front ({metric} per epoch)", 480,
                        xaxis="epoch", yaxis=axis_title(metric))
    return {"data": data, "layout": out}


def _hv_figure(info: FrontInfo) -> dict:
    hv, ref = info.hypervolume, info.reference
    trace = {"type": "scatter", "x": numbers(np.arange(1, len(hv) + 1)), "y": numbers(hv["hypervolume"]),
             "mode": "lines", "line": {"shape": "hv"}, "name": "hypervolume",
             "customdata": hv["ended_at"].astype(str).tolist(),
             "hovertemplate": "trial %{x} (ended %{customdata})<br>HV %{y:.4g}<extra></extra>"}
    ref_txt = ", ".join(f"{m}={r:.4g}" for m, r in zip(info.metrics, ref)) if ref is not None else "n/a"
    out = figure_layout(f"Hypervolume over completed trials (reference: {ref_txt})", 420,
                        xaxis="trials finished (completion order)", yaxis="hypervolume")
    return {"data": [trace], "layout": out}


def figures(info: FrontInfo, epochs: pa.Table, paper: pd.DataFrame | None,
            seeded: pd.DataFrame | None = None) -> dict[str, dict]:
    """The page's figures in order: name -> figure dict (the names of the static files). Adds the
    "hover" column to ``info.trials`` (what every scatter shows per trial). seeded: the front with its
    configurations' seed columns (search.analysis.report.front_with_seeds), drawn as their mean and spread."""
    info.trials["hover"] = hover_texts(info)
    groups = _trial_groups(info.trials)
    metrics = info.metrics
    out = {f"{metrics[0]}_vs_{metrics[j]}": _pair_figure(info, groups, j, paper, seeded)
           for j in range(1, len(metrics))}
    if len(metrics) >= 3:
        out["pareto_3d"] = _figure_3d(info, groups)
    out["learning_curves"] = _curves_figure(info, epochs)
    out["hypervolume"] = _hv_figure(info)
    return out


def figures_html(figs: dict[str, dict], plotlyjs: bool = True) -> list[str]:
    """Each figure as a <div>; plotly.js inlined once, in the first, so that the page loads offline
    (``plotlyjs=False``: figures placed further down a page whose first figure inlined it). The dicts are
    already in plotly.js form: no validation pass."""
    import plotly.io as pio

    return [pio.to_html(fig, full_html=False, include_plotlyjs=plotlyjs and i == 0, default_width="100%",
                        validate=False) for i, fig in enumerate(figs.values())]
