"""The records of the stages after training (spaces.stages): one JSON file per stage of one configuration,
and the selection of configurations the stages run for. Layout (search.records.layout):

    qs_stages/selection.json   {"select", "trial_ids": [...], "at": unix time}: written once every trial has
                               ended; until then a stage may still want any completed trial's checkpoint
    qs_stages/<key>.json       {"key", "stage": "finetune@<dataset>" | "ood", "trial_id", "trial_name",
                                "status": running | completed | failed, "upstream": the checkpoint it started
                                from, "settings": the stage's settings, "metrics": {name: value},
                                "epochs": [per-epoch metrics], "checkpoint": its own final checkpoint (finetune),
                                "per_set": {OOD set: metrics} (ood), "started_at", "ended_at", "error"}

A stage's key is a digest of (the configuration's identity, the upstream checkpoint, the stage's settings):
a resumed campaign finds a completed stage under the same key and runs it not again; changed settings or
another upstream checkpoint make another key. Readers here load neither Ray nor torch.
"""
from __future__ import annotations

import hashlib
import json
import logging

from qkvsearch.search.records.layout import STAGES_DIR
from qkvsearch.storage import list_files, loads_json, open_location, read_bytes, read_many, write_json

log = logging.getLogger(__name__)

SELECTION_FILE = "selection.json"


def stage_key(identity: str, upstream: str, settings: dict) -> str:
    """The digest naming one stage of one configuration (24 hex characters)."""
    text = json.dumps([identity, upstream, settings], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def stage_path(exp: str, key: str) -> str:
    return f"{exp.rstrip('/')}/{STAGES_DIR}/{key}.json"


def write_stage(exp: str, record: dict) -> None:
    write_json(stage_path(exp, record["key"]), record)


def read_stage(exp: str, key: str) -> dict | None:
    """The record of one stage, or None when there is none (or it cannot be read: the stage runs again)."""
    try:
        return loads_json(read_bytes(stage_path(exp, key)))
    except (OSError, ValueError):
        return None


def read_stages(exp: str) -> list[dict]:
    """Every readable stage record of a campaign, oldest first; unreadable ones are logged and left out."""
    fs, root = open_location(f"{exp.rstrip('/')}/{STAGES_DIR}")
    names = sorted(n for n in list_files(fs, root) if n.endswith(".json") and n != SELECTION_FILE)
    out = []
    for name, data in zip(names, read_many(fs, [f"{root}/{n}" for n in names])):  # a pool of reads on a bucket
        try:
            if not isinstance(data, bytes):
                raise data or FileNotFoundError(name)
            rec = loads_json(data)
        except (OSError, ValueError) as err:
            log.warning("stage record %s unreadable: %s", name, err)
            continue
        if isinstance(rec, dict) and rec.get("key") and rec.get("trial_id"):
            out.append(rec)
    return sorted(out, key=lambda r: (r.get("started_at") or 0, r["key"]))


def write_selection(exp: str, select: str, trial_ids: list[str], at: float) -> None:
    write_json(f"{exp.rstrip('/')}/{STAGES_DIR}/{SELECTION_FILE}", {"select": select, "trial_ids": trial_ids, "at": at})


def read_selection(exp: str) -> dict | None:
    """The selection once written, else None (the trials have not all ended: any may still be chosen)."""
    try:
        sel = loads_json(read_bytes(f"{exp.rstrip('/')}/{STAGES_DIR}/{SELECTION_FILE}"))
    except (OSError, ValueError):
        return None
    return sel if isinstance(sel, dict) and isinstance(sel.get("trial_ids"), list) else None


def latest_by_stage(records: list[dict]) -> dict[tuple[str, str], dict]:
    """(trial_id, stage) -> its newest record (a stage re-run under new settings has a newer one)."""
    out: dict[tuple[str, str], dict] = {}
    for r in records:
        out[(r["trial_id"], r.get("stage", "?"))] = r
    return out
