"""Proposals that took no trial slot: a searcher's suggestion whose cost (known before training) breaks
the campaign's constraints is recorded here and the searcher is asked again (search.campaign.searchers).

Layout, under the campaign folder, beside ``qs_trials/`` (which holds only trials, so results, progress
and reports never count a proposal as a trial or a result):

    qs_proposals/<id>.json    {"proposal_id", "for_trial", "campaign", "status": "infeasible", "config",
                               "cost", "error": the constraints it breaks, "proposed_at"}

``id`` is ``<the trial it was proposed for>-infeasible-<n>`` (n counts the campaign driver's rejections).
"""
from __future__ import annotations

import time

from qkvsearch.storage import list_files, open_location, write_json

PROPOSALS_DIR = "qs_proposals"


def write_proposal(exp: str, campaign: str, proposal_id: str, for_trial: str, config: dict, cost: dict,
                   error: str) -> None:
    """Record one infeasible proposal (status "infeasible"); it never becomes a trial."""
    write_json(f"{exp.rstrip('/')}/{PROPOSALS_DIR}/{proposal_id}.json", {
        "proposal_id": proposal_id, "for_trial": for_trial, "campaign": campaign, "status": "infeasible",
        "config": config, "cost": cost, "error": error, "proposed_at": time.time()})


def count_proposals(exp) -> int:
    """How many infeasible proposals a campaign recorded (0 when it has none or no such folder)."""
    fs, root = open_location(exp)
    try:
        return sum(1 for f in list_files(fs, f"{root}/{PROPOSALS_DIR}") if f.endswith(".json"))
    except (FileNotFoundError, OSError):
        return 0
