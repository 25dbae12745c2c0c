"""Proposals that took no trial slot: a searcher's suggestion whose cost (known before training) breaks
the campaign's constraints is recorded here and the searcher is asked again (search.searchers.proposals).

Layout, under the campaign folder, beside ``qs_trials/`` (which holds only trials, so results, progress
and reports never count a proposal as a trial or a result):

    qs_proposals/<id>.json    {"proposal_id", "for_trial", "campaign", "status": "infeasible", "config",
                               "cost", "error": the constraints it breaks, "proposed_at",
                               "measured_on" when its cost was measured (as a trial record's)}

``id`` is ``<the trial it was proposed for>-infeasible-<n>`` (n counts the campaign driver's rejections).
"""
from __future__ import annotations

import time

from qkvsearch.storage import list_files, loads_json, open_location, read_many, write_json

PROPOSALS_DIR = "qs_proposals"


def write_proposal(exp: str, campaign: str, proposal_id: str, for_trial: str, config: dict, cost: dict,
                   error: str, measured_on: dict | None = None) -> None:
    """Record one infeasible proposal (status "infeasible"); it never becomes a trial. measured_on: how its
    measured cost was measured (search.campaign.measured), when it has one."""
    write_json(f"{exp.rstrip('/')}/{PROPOSALS_DIR}/{proposal_id}.json", {
        "proposal_id": proposal_id, "for_trial": for_trial, "campaign": campaign, "status": "infeasible",
        "config": config, "cost": cost, "error": error, "proposed_at": time.time(),
        **({"measured_on": measured_on} if measured_on else {})})


def read_proposals(exp) -> list[dict]:
    """A campaign's infeasible proposals, oldest first ([] when it has none); an unreadable file is skipped
    (it is being written, or damaged: the proposal is a record of something that did not run)."""
    fs, root = open_location(exp)
    folder = f"{root}/{PROPOSALS_DIR}"
    try:
        names = sorted(f for f in list_files(fs, folder) if f.endswith(".json"))
    except (FileNotFoundError, OSError):
        return []
    found = []
    for data in read_many(fs, [f"{folder}/{name}" for name in names]):
        if isinstance(data, bytes):
            try:
                found.append(loads_json(data))
            except ValueError:
                continue
    return sorted(found, key=lambda p: p.get("proposed_at") or 0)


def as_trial_record(proposal: dict) -> dict:
    """A proposal in a trial record's shape (its id as trial id and name, no epochs), for the readers that
    show proposals beside trials, e.g. the trackers, which log each as a run that was never trained."""
    return {"trial_id": proposal["proposal_id"], "trial_name": proposal["proposal_id"],
            "campaign": proposal.get("campaign"), "status": "infeasible", "config": proposal.get("config") or {},
            "cost": proposal.get("cost") or {}, "error": proposal.get("error"), "epochs": [], "epochs_planned": 0,
            "proposed_for": proposal.get("for_trial")}


def count_proposals(exp) -> int:
    """How many infeasible proposals a campaign recorded (0 when it has none or no such folder)."""
    fs, root = open_location(exp)
    try:
        return sum(1 for f in list_files(fs, f"{root}/{PROPOSALS_DIR}") if f.endswith(".json"))
    except (FileNotFoundError, OSError):
        return 0
