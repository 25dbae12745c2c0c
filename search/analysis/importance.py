"""Which searched key mattered, for each objective: Optuna's importance evaluators and its standard views, over an
in-memory Optuna study built from the campaign's records (the library does the statistics; nothing is redrawn).

    the trials eligible for the front (search.analysis.front.FrontInfo) with every objective finite
      --study--> an in-memory optuna Study, one COMPLETE trial each: its values the objectives, its params the
                 campaign's searched keys (spaces.schema.Space.keys) as the trial's resolved config holds them,
                 with the space's distributions: a range its Int/FloatDistribution; a choice or a key the variants
                 set a CategoricalDistribution over the values the space offers (spaces.dimensions.possible_values),
                 then any other value a trial resolved to, then None where a key does not apply to some trial
                 (code_size of a linear one): every trial holds every key that is not a range
      --importances--> per key: fANOVA (FanovaImportanceEvaluator, seed 0) of each objective, and PED-ANOVA
                 (PedAnovaImportanceEvaluator: which key it takes to reach the objective's best 10 %, a maximised
                 one negated as it expects) of each objective and of the front (no target: all objectives at
                 once, by non-domination rank); each column as optuna.importance.get_param_importances gives it
                 (normalised to sum 1)
      --views--> plot_parallel_coordinate and plot_slice of the accuracy objective, as Optuna draws them

A column Optuna cannot compute (too few trials, no key with two values) is left empty and the note says why.
"""
from __future__ import annotations

import contextlib
import html
import json
import logging
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from qkvsearch.search.analysis.effects import accuracy_objective
from qkvsearch.spaces import dimensions

FANOVA, PED_ANOVA = "fANOVA", "PED-ANOVA"
FRONT = "front"   # PED-ANOVA's column over every objective at once
IMPORTANCE_TITLE = "What mattered: importance of each searched key"


@dataclass
class Importances:
    """table: one row per searched key, one column per (evaluator, objective) (plus PED-ANOVA's front), values in
    [0, 1] summing to 1 per column, NaN where not computed; trials: how many the study holds; notes: why a column
    is missing; views: Optuna's plotly figures by name."""

    table: pd.DataFrame
    trials: int
    notes: list[str] = field(default_factory=list)
    views: dict[str, dict] = field(default_factory=dict)


@contextlib.contextmanager
def _quiet():
    """Optuna's log lines (a study created) and its experimental warnings kept out of the report's output."""
    import optuna

    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            yield optuna
    finally:
        optuna.logging.set_verbosity(level)


def distributions(space, configs: list[dict]) -> dict:
    """key -> the Optuna distribution of each searched key of ``space`` (module docstring) over ``configs`` (the
    trials' resolved configs)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for key in space.keys:
        dim = space.dimension(key)
        if dim is not None and not dim.enumerable:
            cls = IntDistribution if dim.kind == "int" else FloatDistribution
            out[key] = cls(int(dim.low), int(dim.high), log=dim.log) if cls is IntDistribution \
                else cls(float(dim.low), float(dim.high), log=dim.log)
            continue
        offered = [v for v in dimensions.possible_values(key, space.dimensions, space.variants) or []
                   if v is not dimensions.ABSENT]
        seen = [c.get(key) for c in configs]
        choices = list(dict.fromkeys([*offered, *(v for v in seen if v is not None)]))
        if any(v is None for v in seen):
            choices.append(None)
        out[key] = CategoricalDistribution(choices)
    return out


def study(info, space):
    """The in-memory study of the campaign's eligible trials (module docstring). info: FrontInfo; space: the
    campaign's spaces.schema.Space."""
    with _quiet() as optuna:
        df = info.trials
        finite = np.isfinite(info.points).all(axis=1) & info.eligible
        configs = [json.loads(c) for c in df.loc[finite, "config_json"]]
        dists = distributions(space, configs)
        out = optuna.create_study(directions=["maximize" if d == "max" else "minimize" for d in info.directions])
        ranges, trials = _ranges(dists), []
        for config, values in zip(configs, info.points[finite]):
            params = {k: config.get(k) for k in dists if config.get(k) is not None or k not in ranges}
            trials.append(optuna.trial.create_trial(values=[float(v) for v in values], params=params,
                                                    distributions={k: dists[k] for k in params}))
        out.add_trials(trials)
        return out


def _ranges(dists: dict) -> set[str]:
    from optuna.distributions import CategoricalDistribution

    return {k for k, d in dists.items() if not isinstance(d, CategoricalDistribution)}


def importances(info, space) -> Importances:
    """Every column of the importance table and Optuna's views (module docstring)."""
    s = study(info, space)
    keys = list(space.keys)
    columns: dict[str, dict] = {}
    notes: list[str] = []
    with _quiet() as optuna:
        from optuna.importance import (
            FanovaImportanceEvaluator,
            PedAnovaImportanceEvaluator,
            get_param_importances,
        )

        targets = [(m, _target(i, d)) for i, (m, d) in enumerate(zip(info.metrics, info.directions))]
        plans = [(FANOVA, m, FanovaImportanceEvaluator(seed=0), _target(i, "min"))
                 for i, m in enumerate(info.metrics)]
        plans += [(PED_ANOVA, m, PedAnovaImportanceEvaluator(), t) for m, t in targets]
        if len(info.metrics) > 1:
            plans.append((PED_ANOVA, FRONT, PedAnovaImportanceEvaluator(), None))
        for name, metric, evaluator, target in plans:
            try:
                with warnings.catch_warnings(record=True) as said:   # e.g. too few trials: importances all equal
                    warnings.simplefilter("always", UserWarning)
                    columns[f"{name} {metric}"] = get_param_importances(s, evaluator=evaluator, target=target)
                notes += [f"{name} {metric}: {w.message}" for w in said if not _reminder(w.message)]
            except (ValueError, RuntimeError) as err:   # too few trials, no key that varies
                notes.append(f"{name} {metric}: not computed ({err})")
        views = _views(optuna, s, info) if len(s.trials) else {}
    table = pd.DataFrame({"key": keys, **{c: [v.get(k, np.nan) for k in keys] for c, v in columns.items()}})
    return Importances(table, len(s.trials), notes, views)


def _reminder(message) -> bool:
    """PED-ANOVA's reminder that it takes lower as better: a maximised objective is negated (_target)."""
    return str(message).startswith("PedAnovaImportanceEvaluator computes")


def _target(i: int, direction: str):
    """Objective i as the evaluators read it: PED-ANOVA takes lower as better, so a maximised one is negated;
    fANOVA decomposes the variance, which the sign does not change (it is given the value as it is)."""
    if direction == "max":
        return lambda t: -t.values[i]
    return lambda t: t.values[i]


def _views(optuna, s, info) -> dict[str, dict]:
    """Optuna's parallel coordinates and slices of the accuracy objective, as figure dicts."""
    i = accuracy_objective(info.metrics, info.directions) or 0
    metric = info.metrics[i]
    out = {}
    for name, plot in (("parallel_coordinate", optuna.visualization.plot_parallel_coordinate),
                       ("slice", optuna.visualization.plot_slice)):
        try:
            fig = plot(s, target=lambda t: t.values[i], target_name=metric)
        except (ValueError, RuntimeError) as err:
            logging.getLogger(__name__).warning(f"optuna's {name} view of {metric}: not drawn ({err})")
            continue
        out[f"importance_{name}"] = fig.to_plotly_json()
    return out


# ---------------------------------------------------------------------------------------- text
IMPORTANCE_HOW = ("Optuna's evaluators over an in-memory study of the completed trials: fANOVA (the share of each "
                  "objective's variance a key explains) and PED-ANOVA (how much a key's values differ between the "
                  "trials in an objective's best 10 % and all of them; 'front': the best by non-domination rank); "
                  "each column sums to 1")


def _cells(table: pd.DataFrame) -> list[list[str]]:
    return [[str(r["key"])] + ["" if pd.isna(r[c]) else f"{r[c]:.3f}" for c in table.columns[1:]]
            for _, r in table.iterrows()]


def importance_markdown(imp: Importances) -> list[str]:
    if not len(imp.table) or len(imp.table.columns) < 2:
        return [f"## {IMPORTANCE_TITLE}", "", f"(none: {'; '.join(imp.notes) or 'no searched key'})", ""]
    head = list(imp.table.columns)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in _cells(imp.table)]
    return [f"## {IMPORTANCE_TITLE}", "", f"{imp.trials} trials. _{IMPORTANCE_HOW}._", "", *lines,
            *(["", *(f"- {n}" for n in imp.notes)] if imp.notes else []), ""]


def importance_html(imp: Importances) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in imp.table.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in _cells(imp.table))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in imp.notes)
    return (f"<section id=\"importance\"><h2>{IMPORTANCE_TITLE}</h2><p>{imp.trials} trials. "
            f"{html.escape(IMPORTANCE_HOW)}.</p><table id=\"importance-table\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>" + (f"<ul>{notes}</ul>" if notes else "") + "</section>")
