"""The report's "Where MACs mislead" section: counted GMACs beside the cost measured on the campaign's device
(spaces.metrics.MEASURED), over the campaign's distinct models.

- Spearman's rank correlation of GMACs with each measured metric (throughput, where more is better, is
  compared as seconds per image: a correlation of 1 then means MACs rank the models as the device does);
- the pairs of models whose order flips: fewer MACs, yet slower (or more memory);
- the Pareto front of the first objective against GMACs beside its front against each measured metric,
  over the completed trials, and the trials on one front but not the other.

Pure data (pandas, no Ray or torch): ``where_macs_mislead`` -> ``Mislead`` with ``markdown`` / ``html``.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from qkvsearch.search.analysis.pareto import nondominated_mask
from qkvsearch.spaces.blocks import split_block_key
from qkvsearch.spaces.choices import policy_text
from qkvsearch.spaces.keys import MODEL_GROUPS, QUANT_KEYS, is_policy_key, names, quant_policy
from qkvsearch.spaces.metrics import MEASURED, MEASURED_METRICS

TITLE = "Where MACs mislead"
MAX_PAIRS = 10   # flipped pairs listed (the largest flips first)
# A model as deployed: its architecture and its quantization policy (each policy of one training is a row).
MODEL_COLUMNS = tuple(f"config_{k}" for k in (*names(*MODEL_GROUPS), "width", *QUANT_KEYS))


@dataclass
class Mislead:
    models: pd.DataFrame                          # one row per distinct model: label, gmacs, measured metrics
    spearman: dict[str, float]                    # metric -> rank correlation with GMACs (NaN: < 3 models)
    flips: dict[str, pd.DataFrame] = field(default_factory=dict)   # metric -> flipped pairs
    fronts: dict[str, list[str]] = field(default_factory=dict)     # "gmacs" | metric -> trial names on its front

    @property
    def markdown(self) -> str:
        return "\n".join(_lines(self, md=True))

    @property
    def html(self) -> str:
        return "\n".join(_lines(self, md=False))


def _cost_of(metric: str, values: pd.Series) -> pd.Series:
    """A measured metric as a cost (lower is better): throughput -> ms per image."""
    return 1e3 / values if MEASURED[metric][0] == "max" else values


def distinct_models(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct model that has GMACs and a measured metric (its first trial's name as label), with
    the quantization policy it was measured under (``fp``: none; a campaign without policy keys shows fp)."""
    measured = [m for m in MEASURED_METRICS if m in trials and trials[m].notna().any()]
    if not measured or "gmacs" not in trials:
        return pd.DataFrame()
    keys = [c for c in trials if c in MODEL_COLUMNS or split_block_key(c.removeprefix("config_"))]
    have = trials[trials["gmacs"].notna() & trials[measured].notna().any(axis=1)]
    first = have.astype({c: "string" for c in keys}).drop_duplicates(keys)
    label = first["trial_name"].astype(str).str.rsplit("-", n=1).str[0]
    policy_keys = [k for c in trials if is_policy_key(k := c.removeprefix("config_"))]   # a block's own too
    policy = [policy_text(quant_policy({k: v if isinstance(v := row.get(f"config_{k}"), str) else None
                                        for k in policy_keys})) for row in first.to_dict("records")]
    return pd.DataFrame({"model": label, "policy": policy, "gmacs": first["gmacs"].astype(float),
                         **{m: first[m].astype(float) for m in measured}}).reset_index(drop=True)


def flipped_pairs(models: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Pairs (a, b) where a has fewer GMACs but costs more by ``metric``, largest ratio first."""
    cost = _cost_of(metric, models[metric]).to_numpy()
    g = models["gmacs"].to_numpy()
    a, b = np.nonzero((g[:, None] < g[None, :]) & (cost[:, None] > cost[None, :]))
    out = pd.DataFrame({"fewer MACs": models["model"].to_numpy()[a], "more MACs": models["model"].to_numpy()[b],
                        "GMACs ratio": g[a] / g[b], f"{metric} ratio": models[metric].to_numpy()[a]
                        / models[metric].to_numpy()[b]})
    return out.sort_values(f"{metric} ratio", key=lambda r: -abs(np.log(r))).head(MAX_PAIRS)


def _front_names(done: pd.DataFrame, ycol: str, ydir: str, xcol: str, xdir: str) -> list[str]:
    pts = done[[ycol, xcol]].astype("float64").to_numpy()
    ok = ~np.isnan(pts).any(axis=1)
    mask = np.zeros(len(done), dtype=bool)
    mask[ok] = nondominated_mask(pts[ok], [ydir, xdir])
    return sorted(done.loc[mask, "trial_name"].astype(str))


def where_macs_mislead(trials: pd.DataFrame, columns: list[str], directions: list[str]) -> Mislead | None:
    """The section's data from the report's trials frame (search.analysis.front.FrontInfo.trials); columns
    and directions: the objectives' (the first is the quality the fronts put against cost). None when no
    trial has a measured metric."""
    models = distinct_models(trials)
    if models.empty:
        return None
    measured = [m for m in MEASURED_METRICS if m in models]
    spearman = {m: float(models["gmacs"].corr(_cost_of(m, models[m]), method="spearman"))
                if models[m].notna().sum() >= 3 else float("nan") for m in measured}
    out = Mislead(models, spearman, {m: flipped_pairs(models.dropna(subset=[m]), m) for m in measured})
    cost_cols = {"gmacs", *MEASURED_METRICS}
    if columns and columns[0] not in cost_cols:
        done = trials[trials["status"] == "completed"]
        out.fronts = {m: _front_names(done, columns[0], directions[0], m, MEASURED.get(m, ("min",))[0])
                      for m in ("gmacs", *measured)}
    return out


def _table(df: pd.DataFrame, md: bool) -> str:
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in df.itertuples(index=False)]
    if md:
        return "\n".join(["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns),
                          *("| " + " | ".join(r) + " |" for r in cells)])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in cells)
    return f"<table><tr>{head}</tr>{body}</table>"


def _lines(m: Mislead, md: bool) -> list[str]:
    def heading(text, level=2):
        return f"{'#' * level} {text}" if md else f"<h{level}>{html.escape(text)}</h{level}>"

    def para(text):
        return text if md else f"<p>{html.escape(text)}</p>"

    rho = "; ".join(f"{k} {v:.2f}" if np.isfinite(v) else f"{k} n/a (fewer than 3 models)"
                    for k, v in m.spearman.items())
    out = [heading(TITLE), para(f"{len(m.models)} distinct model(s). Spearman rank correlation of GMACs with "
                                f"the measured cost (throughput as time per image): {rho}."), _table(m.models, md)]
    for metric, pairs in m.flips.items():
        out += [heading(f"Order flips: fewer MACs, higher {metric}" if MEASURED[metric][0] == "min"
                        else f"Order flips: fewer MACs, lower {metric}", 3),
                _table(pairs, md) if len(pairs) else para("none: GMACs order these models as measured")]
    if m.fronts:
        gmacs = set(m.fronts["gmacs"])
        out.append(heading("Front by measured cost beside the front by GMACs", 3))
        for metric, front in m.fronts.items():
            if metric != "gmacs":
                only = sorted(set(front) - gmacs)
                lost = sorted(gmacs - set(front))
                out.append(para(f"against {metric}: {', '.join(front) or '-'}; not on the GMACs front: "
                                f"{', '.join(only) or '-'}; on the GMACs front only: {', '.join(lost) or '-'}"))
        out.append(para(f"against gmacs: {', '.join(m.fronts['gmacs']) or '-'}"))
    return [line + ("\n" if md else "") for line in out]
