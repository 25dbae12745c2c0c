"""The runs ``search.front_repeats`` plans once a campaign's search has ended (search.campaign.front_repeats): written
once, so that a resumed campaign trains the same ones, and read by the progress to count them as planned.

    qs_front_repeats.json   {"front_repeats": n, "front": [the trial ids on the front when the search ended],
                             "baseline": [those on the baseline's front], "runs": [the space keys of each run, its
                             seed among them], "at": unix time}
"""
from __future__ import annotations

import time

from qkvsearch.search.records.layout import FRONT_REPEATS_FILE
from qkvsearch.storage import exists, read_json, write_json


def _uri(exp) -> str:
    return f"{str(exp).rstrip('/')}/{FRONT_REPEATS_FILE}"


def read_plan(exp) -> dict | None:
    """The plan written, or None (none yet, or a campaign without front repeats)."""
    uri = _uri(exp)
    try:
        plan = read_json(uri) if exists(uri) else None
    except (OSError, ValueError):   # damaged: made again from the records by the same rule
        return None
    return plan if isinstance(plan, dict) and isinstance(plan.get("runs"), list) else None


def write_plan(exp, front_repeats: int, front: list[str], baseline: list[str], runs: list[dict]) -> dict:
    plan = {"front_repeats": int(front_repeats), "front": list(front), "baseline": list(baseline), "runs": list(runs),
            "at": time.time()}
    write_json(_uri(exp), plan)
    return plan


def planned_runs(exp) -> int:
    """How many runs the plan holds (0 without one)."""
    plan = read_plan(exp)
    return len(plan["runs"]) if plan else 0
