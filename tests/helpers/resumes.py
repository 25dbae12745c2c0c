"""Resume a campaign folder an earlier version left and check what every such resume must keep
(tests/search/campaign/test_earlier_campaigns.py, test_mid_training_campaigns.py)."""
from __future__ import annotations

import json

from qkvsearch.search.records.layout import FINAL_STATUSES
from qkvsearch.search.records.readers import read_trial_records


def records_by_id(exp) -> dict[str, dict]:
    return {r["trial_id"]: r for r in read_trial_records(exp)[0]}


def resume_checked(exp) -> tuple[dict[str, dict], dict[str, dict]]:
    """(records before, records after) of resuming ``exp`` with today's code, once it is checked that every
    planned trial ended in a final status and that no trial completed before the stop trained again."""
    from qkvsearch.search.campaign.launch import resume

    planned = json.loads((exp / "qs_campaign.json").read_text())["spec"]["search"]["num_trials"]
    before = records_by_id(exp)
    resume(str(exp))
    after = records_by_id(exp)
    assert len(after) == planned and set(before) <= set(after)
    assert all(r["status"] in FINAL_STATUSES for r in after.values()), {t: r["status"] for t, r in after.items()}
    for tid, rec in before.items():
        if rec["status"] == "completed":  # ended before the stop: kept as recorded, not trained again
            assert after[tid]["epochs"] == rec["epochs"] and after[tid]["started_at"] == rec["started_at"]
    return before, after
