"""Campaigns side by side (`qkvsearch compare DIR DIR...`): one report of several campaigns' fronts.

    campaigns    each folder's trials (search.analysis.results.collect) and spec. What they must share: their
                 objectives (metric and direction; in any order: the first campaign's is used) and their data (the
                 dataset, its path and validation share, the classes and image size). Otherwise they are refused,
                 every difference named (BadInput: exit 2), unless ``shared``: then they are compared on the
                 objectives they all have, the data allowed to differ, and the report opens with what differs
    fronts       each campaign's front on those objectives, over its completed trials (search.analysis.front),
                 overlaid per pair of objectives (the first against each other), a colour per campaign
    hypervolume  each front's, under one common reference: per objective the worst of the campaigns' fixed
                 references (search.analysis.hv_reference); where one has none, pareto.reference_point over every
                 campaign's completed trials
    dominance    per ordered pair (A, B): the share of B's front points some point of A's front weakly dominates
                 (the coverage C(A, B) of Zitzler and Thiele); along each cost objective, the cost ranges where
                 each campaign's front reaches the best accuracy (search.analysis.effects' step functions)
    compute      per campaign: its trials and epochs, seconds of training (train_s_total), and from its first
                 trial's start to its last one's end; a one-shot campaign also its supernet's training
                 (<exp>/supernet) and the subnets it scored with inherited weights

Written into ``out`` (default: beside the first campaign, ``compare-<name>-<name>...``): compare.html
(self-contained), compare.md, compare.json.
"""
from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from qkvsearch.search.analysis import hv_reference
from qkvsearch.search.analysis.effects import accuracy_objective, attained, cost_objectives
from qkvsearch.search.analysis.figures import EXTRA_COLORS, axis_title, figure_layout, figures_html, numbers
from qkvsearch.search.analysis.front import FrontInfo, front_info
from qkvsearch.search.analysis.pareto import hypervolume, reference_point, to_minimise
from qkvsearch.search.analysis.results import collect
from qkvsearch.search.records import inherited
from qkvsearch.search.records.layout import CAMPAIGN_FILE, Campaign, open_campaign
from qkvsearch.search.records.outputs import check_output_dir
from qkvsearch.spaces import base_config
from qkvsearch.spaces.errors import BadInput
from qkvsearch.storage import exists, write_bytes

DATA_KEYS = ("dataset", "data_path", "val_fraction", "num_classes", "img_size")   # what "the same data" means
COLORS = ("#1f77b4", "#d62728", "#2ca02c", *EXTRA_COLORS)


class CompareRefused(BadInput):
    """Campaigns that are not judged on the same objectives or data (and ``shared`` was not asked)."""


@dataclass
class Compared:
    """One campaign as the comparison reads it."""

    exp: str
    campaign: Campaign
    info: FrontInfo
    compute: dict

    @property
    def name(self) -> str:
        return self.campaign.name


# ---------------------------------------------------------------------------------------- what they share
def _objectives_text(campaign: Campaign) -> str:
    return ", ".join(f"{m} {d}" for m, d in campaign.objectives)


def _data(campaign: Campaign) -> dict:
    base = base_config(campaign.spec)
    return {k: base.get(k) for k in DATA_KEYS}


def differences(campaigns: list[Campaign]) -> list[str]:
    """What the campaigns do not share, in words: their objectives, each key of their data."""
    out = []
    if len({frozenset(c.objectives) for c in campaigns}) > 1:
        out.append("objectives: " + "; ".join(f"{c.name} {_objectives_text(c)}" for c in campaigns))
    datas = [_data(c) for c in campaigns]
    for key in DATA_KEYS:
        values = [d[key] for d in datas]
        if len({json.dumps(v) for v in values}) > 1:
            out.append(f"data.{key}: " + "; ".join(f"{c.name} {v}" for c, v in zip(campaigns, values)))
    return out


def shared_objectives(campaigns: list[Campaign]) -> list[tuple[str, str]]:
    """The objectives every campaign has, in the first one's order."""
    sets = [set(c.objectives) for c in campaigns]
    return [o for o in campaigns[0].objectives if all(o in s for s in sets)]


# ---------------------------------------------------------------------------------------- compute
def _seconds(df: pd.DataFrame) -> float:
    return float(df["train_s_total"].fillna(0).sum()) if "train_s_total" in df and len(df) else 0.0


def _span(frames: list[pd.DataFrame]) -> float | None:
    """Seconds from the first trial's start to the last one's end over ``frames``; None without both."""
    starts = [f["started_at"].dropna().min() for f in frames if len(f) and f["started_at"].notna().any()]
    ends = [f["ended_at"].dropna().max() for f in frames if len(f) and f["ended_at"].notna().any()]
    return float((max(ends) - min(starts)).total_seconds()) if starts and ends else None


def compute_spent(exp: str, trials: pd.DataFrame) -> dict:
    """What a campaign spent (module docstring)."""
    frames = [trials]
    out = {"trials": int(len(trials)), "epochs": int(trials["epochs_run"].sum()) if len(trials) else 0,
           "train_s": _seconds(trials)}
    supernet = f"{exp.rstrip('/')}/{inherited.SUPERNET_DIR}"
    if exists(f"{supernet}/{CAMPAIGN_FILE}"):
        sn = collect(supernet)[0].to_pandas()
        out |= {"supernet_train_s": _seconds(sn), "supernet_epochs": int(sn["epochs_run"].sum()) if len(sn) else 0}
        out["train_s"] += out["supernet_train_s"]
        frames.append(sn)
    out["wall_s"] = _span(frames)
    scored = inherited.read_evaluations(exp)
    if scored:
        out["subnets_scored"] = len(scored)
    return out


# ---------------------------------------------------------------------------------------- the comparison
def open_compared(dirs, shared: bool = False) -> tuple[list[Compared], list[tuple[str, str]], list[str]]:
    """(the campaigns, the objectives they are compared on, what they do not share). CompareRefused when they
    differ and ``shared`` is not asked, or share no objective."""
    if len(dirs) < 2:
        raise BadInput(f"DIR: expected two campaign folders or more, given {len(dirs)}")
    exps = [os.fspath(d).rstrip("/") for d in dirs]
    campaigns = [open_campaign(e) for e in exps]
    differ = differences(campaigns)
    if differ and not shared:
        raise CompareRefused("the campaigns are not judged alike: " + "; ".join(differ)
                             + " (--shared compares them on the objectives they share, across their data)")
    objectives = shared_objectives(campaigns)
    if not objectives:
        raise CompareRefused("objectives: expected at least one objective every campaign has, given "
                             + "; ".join(f"{c.name} {_objectives_text(c)}" for c in campaigns))
    specs = [{"metric": m, "mode": d} for m, d in objectives]
    out = []
    for exp, campaign in zip(exps, campaigns):
        trials, _ = collect(exp)
        info = front_info(trials, specs)
        out.append(Compared(exp, campaign, info, compute_spent(exp, info.trials)))
    return out, objectives, differ


def common_reference(compared: list[Compared], objectives) -> np.ndarray | None:
    """The one reference (module docstring) in the objectives' units; None when no campaign has a complete point."""
    pools = [c.info.points[c.info.eligible] for c in compared]
    pool = np.concatenate(pools) if pools else np.zeros((0, len(objectives)))
    pool = pool[~np.isnan(pool).any(axis=1)]
    if not len(pool):
        return None
    directions = [d for _, d in objectives]
    fallback = reference_point(pool, directions)
    fixed = []
    for c in compared:
        record = hv_reference.read(c.exp)
        ready = hv_reference.ready(record)
        fixed.append({m: v for (m, _), v in zip(record["objectives"], ready)} if ready else {})
    out = []
    for j, (metric, mode) in enumerate(objectives):
        values = [f.get(metric) for f in fixed]
        if any(v is None for v in values):
            out.append(fallback[j])
        else:
            out.append(min(values) if mode == "max" else max(values))
    return np.array(out, dtype=float)


def coverage(a: np.ndarray, b: np.ndarray, directions) -> float | None:
    """C(A, B): the share of B's points that some point of A weakly dominates (minimised form); None: B empty."""
    if not len(b):
        return None
    pa, pb = to_minimise(a, directions), to_minimise(b, directions)
    if not len(pa):
        return 0.0
    covered = (pa[None, :, :] <= pb[:, None, :]).all(axis=2).any(axis=1)   # (|B|,)
    return float(covered.mean())


def leads(compared: list[Compared], acc: int, cost: int, directions) -> list[dict]:
    """Along cost objective ``cost``: the ranges of cost over which each campaign's front reaches the best
    accuracy (a campaign alone where the others have no point yet), as [{"from", "to", "campaign", "margin"}]
    in the cost's units, margin: its accuracy over the next best (None where alone)."""
    acc_sign = 1.0 if directions[acc] == "max" else -1.0
    cost_sign = 1.0 if directions[cost] == "min" else -1.0
    sides = []
    for c in compared:
        pts = c.info.points[c.info.on_front][:, [cost, acc]]
        pts = pts[~np.isnan(pts).any(axis=1)]
        order = np.argsort(cost_sign * pts[:, 0], kind="stable")
        sides.append((cost_sign * pts[order, 0], acc_sign * pts[order, 1]))
    at = np.unique(np.concatenate([s[0] for s in sides if len(s[0])] or [np.zeros(0)]))
    if not len(at):
        return []
    best = np.stack([attained(costs, values[None, :], at)[0] if len(costs) else np.full(len(at), -np.inf)
                     for costs, values in sides])   # (campaigns, m)
    out: list[dict] = []
    for j, x in enumerate(at):
        column = best[:, j]
        winner = int(np.argmax(column))
        others = np.delete(column, winner)
        margin = float(column[winner] - others.max()) if np.isfinite(others).any() else None
        if out and out[-1]["campaign"] == compared[winner].name and (out[-1]["margin"] is None) == (margin is None):
            out[-1]["to"] = float(cost_sign * x)
            if margin is not None:
                out[-1]["margin"] = min(out[-1]["margin"], margin)
            continue
        out.append({"from": float(cost_sign * x), "to": float(cost_sign * x), "campaign": compared[winner].name,
                    "margin": margin})
    return out


def comparison(dirs, shared: bool = False) -> dict:
    """Everything the comparison reports, as plain data (compare.json)."""
    compared, objectives, differ = open_compared(dirs, shared)
    directions = [d for _, d in objectives]
    ref = common_reference(compared, objectives)
    fronts = {c.name: c.info.points[c.info.on_front] for c in compared}
    rows = []
    for c in compared:
        rows.append({"campaign": c.name, "folder": c.exp, "one_shot": bool(getattr(c.campaign.spec, "supernet", None)),
                     "completed": int(c.info.eligible.sum()), "front": int(c.info.on_front.sum()),
                     "hypervolume": None if ref is None else hypervolume(fronts[c.name], directions, ref),
                     **c.compute})
    names = [c.name for c in compared]
    cover = {a: {b: coverage(fronts[a], fronts[b], directions) for b in names if b != a} for a in names}
    acc = accuracy_objective([m for m, _ in objectives], directions)
    along = {}
    if acc is not None:
        for j in cost_objectives([m for m, _ in objectives]):
            along[objectives[j][0]] = leads(compared, acc, j, directions)
    return {"objectives": [list(o) for o in objectives], "differences": differ,
            "reference": None if ref is None else ref.tolist(), "campaigns": rows, "coverage": cover,
            "leads": along, "accuracy": None if acc is None else objectives[acc][0], "_compared": compared}


# ---------------------------------------------------------------------------------------- output
def _pair_figures(compared: list[Compared], objectives) -> dict[str, dict]:
    out = {}
    metrics = [m for m, _ in objectives]
    for j in range(1, len(objectives)):
        data = []
        for k, c in enumerate(compared):
            color = COLORS[k % len(COLORS)]
            df, info = c.info.trials, c.info
            done = df[info.eligible]
            data.append({"type": "scatter", "mode": "markers", "name": f"{c.name}: completed trials",
                         "legendgroup": c.name, "x": numbers(done[info.columns[j]]),
                         "y": numbers(done[info.columns[0]]), "marker": {"color": color, "size": 6, "opacity": 0.35},
                         "hovertext": done["trial_name"].astype(str).tolist(), "hoverinfo": "text+x+y"})
            stair = info.pair_fronts[j]
            data.append({"type": "scatter", "mode": "lines+markers", "name": f"{c.name}: front",
                         "legendgroup": c.name, "x": numbers(stair[info.columns[j]]),
                         "y": numbers(stair[info.columns[0]]),
                         "line": {"color": color, "width": 2, "shape": "hv" if objectives[0][1] == "max" and
                                  objectives[j][1] == "min" else "linear"},
                         "marker": {"color": color, "size": 9, "line": {"color": "black", "width": 1}}})
        layout = figure_layout(f"{metrics[0]} vs {metrics[j]}: the campaigns' fronts", 560,
                               xaxis=axis_title(metrics[j]), yaxis=axis_title(metrics[0]))
        layout["legend"] = {"font": {"size": 10}}
        out[f"compare_{metrics[0]}_vs_{metrics[j]}"] = {"data": data, "layout": layout}
    return out


def _hours(seconds) -> str:
    if seconds is None:
        return ""
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.2f} h"


def summary_lines(result: dict) -> list[str]:
    """The comparison in words: differences, hypervolumes under the common reference, coverage, leads, compute."""
    lines = [f"the campaigns differ in: {d}" for d in result["differences"]]
    ref = result["reference"]
    objectives = ", ".join(f"{m} {d}" for m, d in result["objectives"])
    lines.append(f"compared on: {objectives}; hypervolume reference: "
                 + (", ".join(f"{m} {v:.4g}" for (m, _), v in zip(result["objectives"], ref)) if ref else "n/a"))
    for row in result["campaigns"]:
        hv = "n/a" if row["hypervolume"] is None else f"{row['hypervolume']:.4g}"
        lines.append(f"{row['campaign']}: hypervolume {hv}; {row['front']} front point(s) of {row['completed']} "
                     f"completed trial(s)")
    for a, row in result["coverage"].items():
        for b, share in row.items():
            if share is not None:
                lines.append(f"{a}'s front dominates {share:.0%} of {b}'s")
    for cost, spans in result["leads"].items():
        parts = []
        for s in spans:
            where = f"{s['from']:.4g}" + (f"-{s['to']:.4g}" if s["to"] != s["from"] else "")
            how = " (alone)" if s["margin"] is None else f" (by {s['margin']:.3g} or more)"
            parts.append(f"{cost} {where}: {s['campaign']}{how}")
        if parts:
            lines.append(f"best {result['accuracy']} along {cost}: " + "; ".join(parts))
    for row in result["campaigns"]:
        supernet = row.get("supernet_train_s")
        trained = f"{row['train_s'] - (supernet or 0):.0f} s over {row['trials']} trial(s) ({row['epochs']} epoch(s))"
        if supernet is not None:
            trained += f" and {supernet:.0f} s on its supernet ({row['supernet_epochs']} epoch(s))"
        scored = f"; {row['subnets_scored']} subnets scored with inherited weights" if "subnets_scored" in row else ""
        lines.append(f"{row['campaign']} spent {row['train_s']:.0f} s of training: {trained}{scored}; "
                     f"{_hours(row['wall_s']) or 'n/a'} from first start to last end")
    return lines


def _table(result: dict) -> tuple[list[str], list[list[str]]]:
    head = ["campaign", "one-shot", "completed", "front", "hypervolume", "trials", "epochs", "training (s)",
            "wall", "subnets scored"]
    rows = [[r["campaign"], "yes" if r["one_shot"] else "no", str(r["completed"]), str(r["front"]),
             "" if r["hypervolume"] is None else f"{r['hypervolume']:.4g}", str(r["trials"]), str(r["epochs"]),
             f"{r['train_s']:.0f}", _hours(r["wall_s"]), str(r.get("subnets_scored", ""))]
            for r in result["campaigns"]]
    return head, rows


def _markdown(result: dict) -> str:
    names = " vs ".join(r["campaign"] for r in result["campaigns"])
    head, rows = _table(result)
    lines = [f"# Campaigns compared: {names}", "", *(f"- {line}" for line in summary_lines(result)), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows), ""]
    return "\n".join(lines)


def _page(result: dict, figures: dict[str, dict]) -> bytes:
    names = " vs ".join(r["campaign"] for r in result["campaigns"])
    head, rows = _table(result)
    table = ("<table id=\"campaigns\"><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
             + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                                                for r in rows) + "</tbody></table>")
    items = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(result))
    style = ("body{font-family:sans-serif;margin:16px;}table{border-collapse:collapse;font-size:12px;}"
             "th,td{border:1px solid #ccc;padding:2px 6px;}th{background:#f3f3f3;}")
    title = f"Campaigns compared: {names}"
    parts = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title><style>{style}"
             f"</style></head><body><h1>{html.escape(title)}</h1><ul id=\"summary\">{items}</ul>{table}"]
    parts += [f"<div class='fig'>{div}</div>" for div in figures_html(figures)]
    parts.append("</body></html>")
    return b"".join(p.encode("utf-8") for p in parts)


def default_out(dirs, names: list[str]) -> str:
    parent = os.path.dirname(os.fspath(dirs[0]).rstrip("/")) or "."
    return f"{parent}/compare-" + "-".join(names)


def write_comparison(dirs, out: str | None = None, shared: bool = False) -> dict[str, str]:
    """compare.html, compare.md and compare.json of the campaigns in ``dirs`` into ``out`` -> {kind: path}."""
    result = comparison(dirs, shared)
    compared = result.pop("_compared")
    out = check_output_dir(out or default_out(dirs, [c.name for c in compared]), "--out")
    figures = _pair_figures(compared, [tuple(o) for o in result["objectives"]])
    paths = {"html": f"{out}/compare.html", "md": f"{out}/compare.md", "json": f"{out}/compare.json"}
    write_bytes(paths["html"], _page(result, figures))
    write_bytes(paths["md"], _markdown(result).encode("utf-8"))
    write_bytes(paths["json"], json.dumps(result, indent=2, default=float).encode("utf-8"))
    return paths
