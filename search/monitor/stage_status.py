"""The stages' progress for `qkvsearch status` (spaces.stages; records: search.records.stages)."""
from __future__ import annotations

from collections import Counter

from qkvsearch.search.records.stages import latest_by_stage, read_selection, read_stages


def stage_lines(exp: str, spec) -> list[str]:
    """A summary line per stage (done / selected), then one line per stage record; [] without stages."""
    stages = getattr(spec, "stages", None)
    if not stages:
        return []
    names = [f.name for f in stages.finetune] + (["ood"] if stages.ood else [])
    selection = read_selection(exp)
    if selection is None:
        return [f"stages: {', '.join(names)}: waiting for every trial to end ({stages.select} of the pretraining "
                f"goes on)"]
    latest = latest_by_stage(read_stages(exp))
    chosen = selection["trial_ids"]
    lines = [f"stages: {len(chosen)} configuration(s) go on ({selection.get('select', '?')} of the pretraining)"]
    for name in names:
        counts = Counter(latest[(t, name)].get("status", "?") for t in chosen if (t, name) in latest)
        pending = len(chosen) - sum(counts.values())
        parts = [f"{n} {s}" for s, n in sorted(counts.items())] + ([f"{pending} pending"] if pending else [])
        lines.append(f"  {name:<28} {counts.get('completed', 0)}/{len(chosen)} done ({', '.join(parts)})")
    for (tid, name), rec in sorted(latest.items(), key=lambda kv: kv[1].get("started_at") or 0):
        if tid not in chosen:
            continue
        metrics = ", ".join(f"{k} {v:.2f}" for k, v in (rec.get("metrics") or {}).items()
                            if isinstance(v, (int, float)))
        took = f"{rec['duration_s']:.1f} s" if isinstance(rec.get("duration_s"), (int, float)) else ""
        lines.append(f"  {str(rec.get('trial_name', tid)):<34} {name:<22} "
                     f"{rec.get('status', '?'):<11} {took:>8}  {metrics}")
    return lines


def stage_summary(exp: str, spec) -> str:
    """One line for `watch`: each stage's configurations done of those going on; "" without stages."""
    stages = getattr(spec, "stages", None)
    if not stages:
        return ""
    names = [f.name for f in stages.finetune] + (["ood"] if stages.ood else [])
    selection = read_selection(exp)
    if selection is None:
        return "stages: after the trials"
    latest, chosen = latest_by_stage(read_stages(exp)), selection["trial_ids"]
    done = {n: sum(latest.get((t, n), {}).get("status") == "completed" for t in chosen) for n in names}
    return "stages: " + ", ".join(f"{n} {k}/{len(chosen)}" for n, k in done.items())
