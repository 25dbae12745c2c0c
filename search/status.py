"""`qkvsearch status`: a campaign's trials, one line each, read from its `qs_trials/` records."""
from __future__ import annotations

import json
from collections import Counter

import pyarrow.fs as pafs

from qkvsearch.search.records import fs_and_path


def load_records(exp: str) -> list[dict]:
    """Every readable trial record of a campaign (local path or URI), ordered by start time."""
    fs, root = fs_and_path(exp.rstrip("/"))
    if fs.get_file_info(f"{root}/qs_campaign.json").type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"DIR: no campaign at {exp} (expected {exp}/qs_campaign.json)")
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/qs_trials", allow_not_found=True))
    records = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        with fs.open_input_stream(info.path) as f:
            records.append(json.loads(f.read()))
    return sorted(records, key=lambda r: (r.get("started_at") or float("inf"), r["trial_id"]))


def status_table(exp: str) -> str:
    records = load_records(exp)
    header = f"{'trial':<34} {'status':<13} {'epochs':>7} {'top1 %':>7} {'params M':>9} {'GMACs':>8}  note"
    lines = [header, "-" * len(header)]
    for r in records:
        last = r["epochs"][-1] if r["epochs"] else {}
        top1 = f"{last['top1']:.1f}" if "top1" in last else "-"
        note = (r.get("error") or "").strip().splitlines()[-1][:60] if r.get("error") else ""
        lines.append(f"{r['trial_name']:<34} {r['status']:<13} {len(r['epochs']):>3}/{r['epochs_planned']:<3} "
                     f"{top1:>7} {r['cost'].get('params_m', float('nan')):>9.3f} "
                     f"{r['cost'].get('gmacs', float('nan')):>8.4f}  {note}")
    counts = Counter(r["status"] for r in records)
    lines.append(f"{len(records)} trial(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return "\n".join(lines)
