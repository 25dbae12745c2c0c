"""The report's Pareto computation, done once: ``front_info`` turns the collected trials table and the
objectives into a ``FrontInfo`` (points, objective names and directions, front masks, the 2-D fronts of
each plotted pair, hypervolume and its reference point) that every figure (search.analysis.figures) and
table (search.analysis.report) renders from, as Optuna's ``_ParetoFrontInfo`` serves its Pareto plots.

A metric maps to the trial column of the same name when there is one (gmacs, params_m, train_s_total, ...),
else to ``final_<metric>`` (its value at the trial's last reported epoch). Only trials whose status is in
``front_statuses`` are eligible for the front; the others are drawn but never on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from qkvsearch.search.analysis.pareto import hypervolume_trace, nondominated_mask, reference_point
from qkvsearch.search.analysis.results import CONFIG_PREFIX
from qkvsearch.spaces.blocks import block_text, is_block_key_of


@dataclass
class FrontInfo:
    """What the report shows, computed once. n trials, k objectives."""

    trials: pd.DataFrame                # (n rows) collect's columns + embedding, eligible, on_front
    metrics: list[str]                  # (k,) objective names
    columns: list[str]                  # (k,) the trial column of each objective
    directions: list[str]               # (k,) "min" | "max"
    front_statuses: tuple[str, ...]     # statuses eligible for the front
    points: np.ndarray                  # (n, k) float64 objective values, NaN where missing
    eligible: np.ndarray                # (n,) bool: status in front_statuses
    on_front: np.ndarray                # (n,) bool: eligible and non-dominated on all k objectives
    pair_fronts: dict[int, pd.DataFrame]  # j -> eligible trials on the front of (objective 0, objective j),
    #                                       sorted along objective j: the staircase of that plane
    hypervolume: pd.DataFrame           # eligible ended trials in completion order, with column "hypervolume":
    #                                     the front's hypervolume once each had ended
    reference: np.ndarray | None        # (k,) the hypervolume's reference point; None: no complete point
    reference_kind: str = "the campaign's fixed reference"   # or: these trials' own (pareto.reference_point)

    @property
    def front(self) -> pd.DataFrame:
        """The trials on the front, best first on objective 0."""
        return self.trials[self.trials["on_front"]].sort_values(self.columns[0], ascending=self.directions[0] == "min")

    @property
    def final_hypervolume(self) -> float | None:
        return float(self.hypervolume["hypervolume"].iloc[-1]) if len(self.hypervolume) else None


def objective_columns(trials: pa.Table, objectives) -> tuple[list[str], list[str], list[str]]:
    """Spec objectives ({"metric", "mode"} each) -> (metric names, trial columns, directions); ValueError
    naming a bad one."""
    metrics, cols, dirs = [], [], []
    for i, obj in enumerate(objectives):
        metric, mode = (obj or {}).get("metric"), (obj or {}).get("mode")
        if mode not in ("min", "max"):
            raise ValueError(f"objectives[{i}].mode: expected 'min' or 'max', given {mode!r}")
        col = metric_column(trials.column_names, metric)
        if col not in trials.column_names:
            raise ValueError(f"objectives[{i}].metric: expected a reported metric or a cost column "
                             f"(e.g. top1, gmacs, params_m), given {metric!r}")
        metrics.append(metric)
        cols.append(col)
        dirs.append(mode)
    if not metrics:
        raise ValueError("objectives: expected at least one objective, given none")
    return metrics, cols, dirs


def metric_column(columns, metric) -> str:
    """The trial column of a metric (module docstring): its own when ``columns`` hold one, else final_<metric>."""
    return metric if metric in columns and not str(metric).startswith(CONFIG_PREFIX) else f"final_{metric}"


def rows(df: pd.DataFrame, mask, columns: list[str]) -> pd.DataFrame:
    """The rows where ``mask``, with only ``columns`` (each once): a copy of what is used, not of the
    whole frame's seventy-odd columns."""
    return df.loc[mask, list(dict.fromkeys(columns))]


def front_info(trials: pa.Table, objectives, front_statuses=("completed",), reference=None) -> FrontInfo:
    """The collected trials table (search.analysis.results.collect) -> FrontInfo on ``objectives``.
    reference: the campaign's fixed hypervolume reference (search.analysis.hv_reference); None: these
    trials' own (search.analysis.pareto.reference_point), for other objectives or a campaign without one."""
    from qkvsearch.spaces.metrics import METRICS

    for obj in objectives:   # a known metric no trial has reported yet (a one-shot target that retrains none)
        col = metric_column(trials.column_names, (obj or {}).get("metric"))
        if col not in trials.column_names and (obj or {}).get("metric") in METRICS and not trials.num_rows:
            trials = trials.append_column(col, pa.nulls(0, pa.float64()))
    metrics, cols, dirs = objective_columns(trials, objectives)
    # Integer columns stay integers where a trial has no value (code_size of a linear trial): 4, not 4.0.
    df = trials.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    points = df[cols].astype("float64").to_numpy()  # (n, k), NaN where missing
    eligible = df["status"].isin(list(front_statuses)).to_numpy()
    on_front = np.zeros(len(df), dtype=bool)
    on_front[eligible] = nondominated_mask(points[eligible], dirs)
    df["on_front"] = on_front
    df["eligible"] = eligible
    df["embedding"] = _embedding_labels(df)
    pairs = {j: _pair_front(df, cols[j], dirs[j], cols[0], dirs[0]) for j in range(1, len(cols))}
    trace, ref = _hypervolume(df, cols, dirs, reference)
    kind = "the campaign's fixed reference" if reference is not None else "these trials' own"
    return FrontInfo(df, metrics, cols, dirs, tuple(front_statuses), points, eligible, on_front, pairs, trace, ref,
                     kind)


def _embedding_labels(df: pd.DataFrame) -> pd.Series:
    """Each trial's embedding in words; a trial whose blocks have their own, every block's (keys.block_text)."""
    label = df["config_embedding"].fillna("?")
    own = [c for c in df.columns if c.startswith(CONFIG_PREFIX)
           and is_block_key_of(c.removeprefix(CONFIG_PREFIX), "embedding")]
    if not own:
        return label
    per_block = df[own].notna().any(axis=1) & df["config_json"].notna()
    label[per_block] = [block_text(json.loads(text), "embedding") for text in df.loc[per_block, "config_json"]]
    return label


def _pair_front(df: pd.DataFrame, xcol, xdir, ycol, ydir) -> pd.DataFrame:
    """Eligible trials on the front of this pair of objectives, sorted along x (the staircase)."""
    pts = rows(df, df["eligible"], [xcol, ycol])
    mask = nondominated_mask(pts[[xcol, ycol]].astype("float64").to_numpy(), [xdir, ydir])
    return pts[mask].sort_values([xcol, ycol], ascending=[True, ydir == "min"])


def _hypervolume(df: pd.DataFrame, cols, dirs, reference=None) -> tuple[pd.DataFrame, np.ndarray | None]:
    """HV of the eligible trials in completion order (ended_at), against ``reference`` (None: the default
    reference of these points)."""
    done = rows(df, df["eligible"] & df["ended_at"].notna(), [*cols, "ended_at", "trial_id"])
    done = done.sort_values(["ended_at", "trial_id"])
    values = done[cols].astype("float64").to_numpy()
    ok = ~np.isnan(values).any(axis=1)
    if not ok.any():
        return done.iloc[:0].assign(hypervolume=[]), None
    ref = np.asarray(reference, dtype=np.float64) if reference is not None else reference_point(values[ok], dirs)
    trace = hypervolume_trace(values, dirs, ref)
    return done.assign(hypervolume=trace), ref
