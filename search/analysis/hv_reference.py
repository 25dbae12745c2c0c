"""One hypervolume reference per campaign, fixed once and never moved, so that the hypervolume a user watches
(the terminal, `qkvsearch watch`, the campaign metrics and their Grafana panel, the report) only grows while
the front does, and two moments of one campaign compare.

Per objective (in the objectives' own units), the worst value that can still count:

=======================  =================================================================  ==============
objective                reference                                                          fixed
=======================  =================================================================  ==============
a bounded metric         its bound on the bad side (spaces.metrics.BOUNDS: top-1 0 %)      at launch
any metric maximised     0 (every metric is >= 0: throughput, images/s)                     at launch
a counted cost           the worst over the space's models (spaces' model configurations,  at launch
                         ranges at their bounds) plus COST_MARGIN of it
anything else minimised  the first completed trial's value times 1 + FIRST_MARGIN (losses,  at its first
                         times, measured costs)                                             completion
=======================  =================================================================  ==============

A trial past a reference adds nothing on that objective. It is stored in the campaign folder
(``qs_hv_reference.json``) and a resume keeps it. A campaign launched before references existed gets one
by the same rule at its first read (a counted cost's worst then over the trials and proposals recorded so
far), recorded. `qkvsearch simulate` and benchmarks/bench_searchers.py keep their whole-table reference
(search.analysis.pareto.reference_point), which needs every result up front.
"""
from __future__ import annotations

import math

from qkvsearch.search.records.layout import HV_REFERENCE_FILE
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.metrics import BOUNDS, COUNTED_METRICS
from qkvsearch.storage import exists, read_json, write_json

COST_MARGIN = 0.1    # a counted cost's reference: its worst over the space, 10 % further out
FIRST_MARGIN = 1.0   # an unbounded minimised metric's: twice its first completed value


def at_launch(objectives, model_costs) -> dict:
    """The reference as far as it is known before training: objectives ((metric, mode), ...); model_costs:
    the cost of each model of the space. Unknown parts are None."""
    ref, how = [], []
    for metric, mode in objectives:
        if metric in BOUNDS:
            ref.append(BOUNDS[metric][0] if mode == "max" else BOUNDS[metric][1])
            how.append("bound")
        elif mode == "max":
            ref.append(0.0)
            how.append("zero")
        elif metric in COUNTED_METRICS:
            worst = max((v for c in model_costs if (v := finite(c.get(metric))) is not None), default=None)
            ref.append(None if worst is None else worst * (1 + COST_MARGIN))
            how.append("space")
        else:
            ref.append(None)
            how.append("first")
    return {"objectives": [list(o) for o in objectives], "reference": ref, "how": how}


def completed(record: dict, first_values: dict | None, recorded_costs=()) -> dict:
    """``record`` with its unknown parts fixed: a counted cost's from ``recorded_costs`` (a campaign launched
    before references existed), the rest from ``first_values`` (the first completed trial's objective values)
    once there is one. The record itself when nothing can be fixed yet."""
    ref, how = list(record["reference"]), list(record["how"])
    for j, ((metric, _), value) in enumerate(zip(record["objectives"], ref)):
        if value is not None:
            continue
        if how[j] == "space":
            worst = max((v for c in recorded_costs if (v := finite(c.get(metric))) is not None), default=None)
            if worst is not None:
                ref[j], how[j] = worst * (1 + COST_MARGIN), "recorded"
        elif first_values is not None and finite(first_values.get(metric)) is not None:
            ref[j] = abs(first_values[metric]) * (1 + FIRST_MARGIN)
    return {**record, "reference": ref, "how": how}


def ready(record: dict | None) -> list[float] | None:
    """The reference when every objective has one, else None (no hypervolume to show yet)."""
    if record is None or any(v is None or not math.isfinite(v) for v in record["reference"]):
        return None
    return [float(v) for v in record["reference"]]


def read(exp) -> dict | None:
    uri = f"{str(exp).rstrip('/')}/{HV_REFERENCE_FILE}"
    try:
        record = read_json(uri) if exists(uri) else None
    except (OSError, ValueError):  # damaged: made again by the rule (it is a function of the records)
        return None
    ok = isinstance(record, dict) and isinstance(record.get("reference"), list) and isinstance(record.get("how"), list)
    return record if ok else None


def write(exp, record: dict) -> None:
    write_json(f"{str(exp).rstrip('/')}/{HV_REFERENCE_FILE}", record)


def describe(record: dict | None) -> str:
    """``top1 0, gmacs 0.62`` (what a reader is shown beside the hypervolume); "" when not fixed yet."""
    ref = ready(record)
    if ref is None:
        return ""
    return ", ".join(f"{m} {v:.4g}" for (m, _), v in zip(record["objectives"], ref))
