"""The one-shot fidelity section's figures, drawn from the subnet table alone (search.analysis.fidelity builds it
and writes it as subnets.parquet):

    inherited_vs_standalone     each retrained subnet: inherited top-1 (x) against its stand-alone top-1 under the
                                campaign's seed (y), the chosen and the control subnets apart, a control subnet's
                                spread over its seeds as an interval, the diagonal (inherited = stand-alone), and
                                Kendall tau over the control subnets with its interval in the title
    inherited_top1_vs_<cost>    every scored subnet's inherited top-1 against each cost objective of the campaign,
                                the chosen subnets and the control sample marked; against a measured cost
                                (latency_ms, throughput, ...) a subnet whose value was predicted, not measured,
                                has an open marker

Every subnet's hover text holds its measured costs, each marked measured or predicted.

The supernet's own training curves (its teacher's and smallest subnet's top-1 per epoch) follow them, drawn from
supernet_epochs.parquet (search.analysis.supernet_training). Coincident points are drawn side by side as in every
scatter (search.analysis.markers).
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from qkvsearch.search.analysis.columns import cell_text, header, searched_columns
from qkvsearch.search.analysis.figures import axis_title, figure_layout, numbers, placed
from qkvsearch.search.analysis.markers import title_note
from qkvsearch.search.records.inherited import PREDICTED
from qkvsearch.spaces.metrics import COST_METRICS, MEASURED_METRICS

SUBNET_MEASURED = tuple(m for m in MEASURED_METRICS if m != "size_mb")   # the measured costs a subnet carries

INHERITED, STANDALONE, RESEEDED = "top1_inherited", "top1_standalone", "top1_standalone_reseeded"
# role (subnets.parquet's "selected") -> its legend name and marker
ROLES = {
    None: ("scored only", {"color": "#9aa5b1", "symbol": "circle", "size": 6}),
    "control": ("control (drawn at random, retrained from scratch)", {"color": "#1f77b4", "symbol": "diamond",
                                                                     "size": 9}),
    "chosen": ("chosen (retrained)", {"color": "#d62728", "symbol": "circle", "size": 10,
                                      "line": {"color": "black", "width": 2}}),
}


def _finite(df: pd.DataFrame, column: str) -> np.ndarray:
    return (np.isfinite(df[column].to_numpy(dtype="float64", na_value=np.nan)) if column in df
            else np.zeros(len(df), bool))


def _roles(df: pd.DataFrame) -> np.ndarray:
    return np.array([r if isinstance(r, str) else None for r in df["selected"]], dtype=object)


def _with_hover(df: pd.DataFrame, space_keys) -> pd.DataFrame:
    """``df`` (fresh index) with a "hover" column: the subnet, its role, its searched keys and top-1 figures."""
    out = df.reset_index(drop=True).copy()
    keys = searched_columns(list(out.columns), space_keys)
    texts = []
    for rec in out.to_dict("records"):
        role = rec.get("selected") if isinstance(rec.get("selected"), str) else "scored only"
        if role == "chosen" and rec.get("retrained_from") == "inherited":
            role += ", trained on from its inherited weights"
        lines = [f"<b>{html.escape(str(rec['subnet_id']))}</b> ({role})"]
        lines += [f"{html.escape(header(c))} = {html.escape(cell_text(rec[c]))}" for c in keys if cell_text(rec[c])]
        lines += [f"{c} = {cell_text(rec.get(c))}" for c in (INHERITED, STANDALONE, RESEEDED) if cell_text(rec.get(c))]
        predicted = set(_predicted(rec.get(PREDICTED)))
        lines += [f"{m} = {cell_text(rec.get(m))}" + (" (predicted)" if m in predicted else " (measured)")
                  for m in SUBNET_MEASURED if cell_text(rec.get(m))]
        texts.append("<br>".join(lines))
    out["hover"] = texts
    return out


def _predicted(value) -> list:
    """A subnet's list of predicted metrics (subnets.parquet's ``predicted``; null or NaN: none)."""
    return list(value) if isinstance(value, (list, tuple, np.ndarray)) else []


def _traces(pts: pd.DataFrame, coords: dict, hover: list[str], roles=(None, "control", "chosen"),
            measured: str | None = None) -> list[dict]:
    """One trace per role present, at the placed coordinates. measured: the measured metric on an axis, whose
    predicted values (not measured: subnets.parquet's ``predicted``) are drawn as open markers."""
    role_of, ids = _roles(pts), pts["subnet_id"].to_numpy(dtype=object)
    traces = []
    for role in roles:
        at = np.flatnonzero(role_of == role) if role is not None else np.flatnonzero(pd.isna(role_of))
        if at.size == 0:
            continue
        name, marker = ROLES[role]
        marker = dict(marker)
        if measured is not None and PREDICTED in pts:
            guessed = [measured in _predicted(v) for v in pts[PREDICTED].iloc[at]]
            if any(guessed):
                marker["symbol"] = [f"{marker['symbol']}-open" if g else marker["symbol"] for g in guessed]
                name += f" (open: {measured} predicted)"
        traces.append({"type": "scatter", "mode": "markers", "name": name, "legendgroup": str(role),
                       "x": numbers(coords["x"][at]), "y": numbers(coords["y"][at]), "marker": marker,
                       "hovertext": [hover[i] for i in at], "hoverinfo": "text", "customdata": ids[at].tolist()})
    return traces


def retrained_figure(df: pd.DataFrame, tau_line: str, space_keys=()) -> dict:
    """inherited_vs_standalone (module docstring). tau_line: the section's Kendall tau line, the title's second."""
    keep = df["selected"].isin(["chosen", "control"]).to_numpy() & _finite(df, INHERITED) & _finite(df, STANDALONE)
    pts = _with_hover(df[keep], space_keys)
    coords, hover = placed(pts, {"x": INHERITED, "y": STANDALONE})
    data = _traces(pts, coords, hover, roles=("control", "chosen"))
    y = coords["y"]
    other = pts[RESEEDED].to_numpy(dtype="float64", na_value=np.nan) if RESEEDED in pts else np.full(len(pts), np.nan)
    for trace in data:
        at = np.flatnonzero(_roles(pts) == "control") if trace["legendgroup"] == "control" else ()
        if len(at) and np.isfinite(other[at]).any():  # the seeds' spread: from the lower to the higher top-1
            low, high = np.fmin(y[at], other[at]), np.fmax(y[at], other[at])
            trace["error_y"] = {"type": "data", "symmetric": False, "array": (high - y[at]).tolist(),
                                "arrayminus": (y[at] - low).tolist(), "thickness": 1.5, "width": 4,
                                "color": ROLES["control"][1]["color"]}
            trace["name"] += "; bar: its top-1 under the two seeds"
    values = np.concatenate([coords["x"], y, other[np.isfinite(other)]]) if len(pts) else np.zeros(0)
    if values.size:
        ends = [float(values.min()), float(values.max())]
        data.append({"type": "scatter", "mode": "lines", "x": ends, "y": ends, "name": "inherited = stand-alone",
                     "line": {"color": "#555", "dash": "dash", "width": 1}, "hoverinfo": "skip"})
    title = (f"Inherited vs stand-alone top-1 of the {len(pts)} retrained subnets<br><sup>{html.escape(tau_line)}</sup>"
             + title_note(coords["shared"]))
    out = figure_layout(title, 560, xaxis="inherited top-1 (%) (weights from the supernet)",
                        yaxis="stand-alone top-1 (%) (retrained, the campaign's seed)")
    out["legend"] = {"font": {"size": 10}}
    return {"data": data, "layout": out}


def scored_figure(df: pd.DataFrame, metric: str, space_keys=()) -> dict:
    """inherited_top1_vs_<metric> (module docstring)."""
    pts = _with_hover(df[_finite(df, INHERITED) & _finite(df, metric)], space_keys)
    coords, hover = placed(pts, {"x": metric, "y": INHERITED})
    title = (f"Inherited top-1 of the {len(pts)} scored subnets vs {metric}, the chosen marked"
             + title_note(coords["shared"]))
    out = figure_layout(title, 560, xaxis=axis_title(metric), yaxis="inherited top-1 (%)")
    out["legend"] = {"font": {"size": 10}}
    return {"data": _traces(pts, coords, hover, measured=metric if metric in SUBNET_MEASURED else None),
            "layout": out}


def oneshot_figures(df: pd.DataFrame, objectives, tau_line: str, space_keys=()) -> dict[str, dict]:
    """The section's figures by name (the names of their static files). objectives: ((metric, mode), ...): a
    figure against each cost objective the subnet table holds."""
    out = {"inherited_vs_standalone": retrained_figure(df, tau_line, space_keys)}
    for metric, _ in objectives:
        if metric in COST_METRICS and _finite(df, metric).any():
            out[f"inherited_top1_vs_{metric}"] = scored_figure(df, metric, space_keys)
    return out
