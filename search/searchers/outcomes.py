"""How a finished trial ended, read from its last result: what the recorder, the duplicate trials and every
searcher learn from it (one rule for all of them)."""
from __future__ import annotations

from qkvsearch.search.records.layout import (
    _TUNE_KEYS,
    ORIGINAL_STATUS_KEY,
    PLANNED_KEY,
    STATUS_KEY,
    from_tune,
)
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.metrics import EPOCH

COMPLETE, PRUNED, FAIL = "COMPLETE", "PRUNED", "FAIL"   # the names of Optuna's TrialState members


def outcome_of_result(result: dict | None, error: bool) -> dict:
    """A finished trial's outcome from its last result: {"status", "metrics": finite numbers it reported}."""
    result = from_tune(result) or {}
    status = result.get(STATUS_KEY) or ("failed" if error else None)
    if status is None:
        planned = result.get(PLANNED_KEY)
        status = "stopped_early" if planned is not None and result.get(EPOCH, 0) < planned else "completed"
    metrics = {k: finite(v) for k, v in result.items() if _reported(k) and finite(v) is not None}
    return {"status": status, "metrics": metrics}


def scored_result(metrics: dict) -> dict:
    """The last result a searcher learns of work scored at once (a subnet's inherited score, an estimate): its
    figures as a trial's at its one planned epoch, so that it reads as completed (``outcome_of_result``)."""
    return {**metrics, EPOCH: 1.0, PLANNED_KEY: 1.0}


def _reported(key: str) -> bool:
    """A metric the trial reported: not a reserved (qs_) key, Tune's bookkeeping, nor the trial's config as Tune
    flattens it into the result a searcher gets (``config/...``)."""
    return not key.startswith(("qs_", "config/")) and key not in _TUNE_KEYS


def outcome_state(result: dict | None, error: bool, metrics) -> tuple[str, list[float] | None]:
    """(COMPLETE | PRUNED | FAIL, the objective values to learn) of a finished trial's last result: a trial
    stopped before its planned epochs is PRUNED, one without a score (infeasible, diverged, failed, a value
    missing or not finite) FAIL; a duplicate ends as the trial that trained its configuration ended."""
    if error or not result:
        return FAIL, None
    status = outcome_of_result(result, error)["status"]
    if status == "duplicate":
        status = result.get(ORIGINAL_STATUS_KEY)
    if status == "stopped_early":
        return PRUNED, None
    if status in ("infeasible", "diverged", "failed"):
        return FAIL, None
    metrics = metrics if isinstance(metrics, (list, tuple)) else [metrics]
    values = [result.get(m) for m in metrics]
    if any(finite(v) is None for v in values):
        return FAIL, None
    return COMPLETE, [float(v) for v in values]


def earlier_state(status: str, values) -> tuple[str, list[float] | None]:
    """The same rule for an earlier campaign's record: its final status and its objective values."""
    if status == "completed" and all(finite(v) is not None for v in values):
        return COMPLETE, [float(v) for v in values]
    return (PRUNED if status == "stopped_early" else FAIL), None


