"""`qkvsearch status`: a campaign's trials, one line each, read from its `qs_trials/` records.

A damaged record never stops the listing: the readable trials are shown, then one line per damaged file.
"""
from __future__ import annotations

import math
from collections import Counter

from qkvsearch.search.monitor.oneshot_phases import read_phases
from qkvsearch.search.monitor.stage_status import stage_lines
from qkvsearch.search.records.layout import open_campaign, storage_use
from qkvsearch.search.records.lease import read_lease
from qkvsearch.search.records.readers import read_trial_records, read_trials
from qkvsearch.spaces.checks import finite


def load_records(exp: str) -> list[dict]:
    """Every readable trial record of a campaign (local path or URI), ordered by start time. Damaged
    records are left out (and logged); CampaignFileError when ``exp`` is not a campaign."""
    open_campaign(exp)
    records, _ = read_trial_records(exp)
    return _by_start(records)


def status_table(exp: str) -> str:
    campaign = open_campaign(exp)
    read = read_trials(exp)  # epochs as counts and last rows: no object per epoch
    problems = read.problems
    rows = sorted(zip(read.records, read.epoch_counts(), read.last_epochs()), key=lambda row: _start_key(row[0]))
    records = [r for r, _, _ in rows]
    header = f"{'trial':<34} {'status':<13} {'epochs':>7} {'top1 %':>7} {'params M':>9} {'GMACs':>8}  note"
    lines = [read_lease(exp).line(), header, "-" * len(header)]  # driver: live (host, pid, heartbeat age), stale, none
    lines.insert(1, storage_line(exp, campaign.spec.checkpoints.keep))
    for r, n_epochs, last in rows:
        top1 = f"{last['top1']:.1f}" if finite(last.get("top1")) is not None else "-"
        error = r.get("error")
        note = error.strip().splitlines()[-1][:60] if isinstance(error, str) and error.strip() else ""
        if r.get("duplicate_of"):
            note = f"same configuration as trial {r['duplicate_of']}"
        lines.append(f"{_text(r.get('trial_name', r['trial_id'])):<34} {_text(r.get('status')):<13} "
                     f"{n_epochs:>3}/{_text(r.get('epochs_planned')):<3} {top1:>7} "
                     f"{_num(r['cost'].get('params_m')):>9.3f} {_num(r['cost'].get('gmacs')):>8.4f}  {note}")
    lines += [f"damaged record {p}" for p in problems]
    counts = Counter(_text(r.get("status")) for r in records)
    summary = f"{len(records)} trial(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if problems:
        summary += f"; {len(problems)} damaged record(s) skipped"
    lines.append(summary)
    lines += stage_lines(exp, campaign.spec)
    oneshot = read_phases(exp, campaign, records)
    lines += oneshot.lines() if oneshot is not None else []
    return "\n".join(lines)


def storage_line(exp: str, keep: str) -> str:
    """One line: bytes under the campaign folder and, of them, its checkpoints (search.records.layout.storage_use)."""
    total, checkpoints = storage_use(exp)
    return (f"storage: {_bytes(total)} in the campaign folder, {_bytes(checkpoints)} of it checkpoints "
            f"(checkpoints: keep {keep})")


def _bytes(n: int) -> str:
    """Decimal units, as disks and buckets bill them: 6.7 GB."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _by_start(records: list[dict]) -> list[dict]:
    return sorted(records, key=_start_key)


def _start_key(r: dict):
    return _num(r.get("started_at"), math.inf), r["trial_id"]


def _num(v, default: float = math.nan) -> float:
    return finite(v, default)


def _text(v) -> str:
    return "?" if v is None else str(v)
