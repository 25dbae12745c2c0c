"""The deployment targets' part of a campaign's report (a campaign file's ``targets``, spaces.targets): each
target's own report in its folder (<exp>/targets/<name>/report/: its front of inherited and, where retrained,
stand-alone accuracy against its own costs), and one table that puts the targets side by side:

    report/targets.parquet, report/targets.md, and a "Deployment targets" section in report.md and pareto.html

One row per target: where its costs were measured (the resources it asked for, the nodes that measured), its
precisions, constraints and objectives, the subnets scored and feasible, the chosen subnets and the best of
its first objective among the chosen (best_chosen), and the measured-cost predictor's use and error: on
held-out measured shapes, and on the chosen subnets whose predicted cost was then measured (confirmed_mape;
predictor.json).
"""
from __future__ import annotations

import html
import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from qkvsearch.search.records import inherited
from qkvsearch.search.records.outputs import REPORT_DIR
from qkvsearch.spaces.schema import violations
from qkvsearch.storage import exists, read_bytes, write_bytes

TARGETS_FILE = "targets.parquet"
TARGETS_MD = "targets.md"


def target_folders(exp: str, campaign) -> list[str]:
    """The folders of the campaign's targets that have scored subnets (each has a report of its own)."""
    return [f for t in getattr(campaign.spec, "targets", ()) or ()
            if exists(f"{(f := inherited.target_dir(exp, t.name))}/{inherited.INHERITED_DIR}")]


def target_rows(exp: str, spec) -> pd.DataFrame:
    """The side-by-side table (module docstring), one row per target in the campaign file's order."""
    from qkvsearch.search.records.layout import open_campaign

    rows = []
    for target in spec.targets:
        folder = inherited.target_dir(exp, target.name)
        if not exists(f"{folder}/{inherited.INHERITED_DIR}"):
            continue
        tspec = open_campaign(folder).spec   # the target's own campaign: its constraints and objectives
        records = inherited.read_evaluations(folder)
        done = [r for r in records if r.get("status", "completed") == "completed"]
        feasible = [r for r in done if not violations(tspec.constraints, {**r["cost"], **r["metrics"]})]
        chosen = inherited.read_selection(folder) or {"chosen": []}
        picked = {inherited.keys_text(k) for k in chosen["chosen"]}
        chosen_records = [r for r in done if inherited.keys_text(r["keys"]) in picked]
        first = tspec.objectives[0]
        best = [v for r in chosen_records if (v := r["metrics"].get(first.metric, r["cost"].get(first.metric)))
                is not None]
        predictor = inherited.read_predictor(folder)
        held_out = next(iter((predictor.get("held_out") or {}).items()), (None, {}))
        nodes = {(r.get("measured_on") or {}).get("node") for r in records} - {None}
        rows.append({
            "target": target.name,
            "resources": ", ".join(f"{k} {v:g}" for k, v in target.resources.items()) or "the trials' device",
            "measured_on_nodes": len(nodes),
            "precisions": ", ".join(target.precisions) or "all",
            "constraints": "; ".join(_bound(c) for c in tspec.constraints) or "none",
            "objectives": ", ".join(f"{o.metric} ({o.mode})" for o in tspec.objectives),
            "scored": len(records), "feasible": len(feasible), "chosen": len(chosen_records),
            "first_objective": first.metric,
            "best_chosen": (max if first.mode == "max" else min)(best) if best else np.nan,
            "predicted": predictor.get("predicted"), "shapes_measured": predictor.get("shapes_measured"),
            "predictor_metric": held_out[0], "predictor_mape": held_out[1].get("mape"),
            "predictor_kendall_tau": held_out[1].get("kendall_tau"),
            "confirmed_mape": ((predictor.get("confirmed_error") or {}).get(held_out[0]) or {}).get("mape"),
            "report": f"../{inherited.TARGETS_DIR}/{target.name}/{REPORT_DIR}/pareto.html",
        })
    return pd.DataFrame(rows)


def _bound(c) -> str:
    return " ".join(f"{c.metric} {op} {v:g}" for op, v in (("<=", c.max), (">=", c.min)) if v is not None)


def targets_report(exp: str, out: str, campaign, report_md: str) -> dict[str, str]:
    """The side-by-side table and section (module docstring; each target's own report is written by
    search.analysis.report.build_report); {} without targets."""
    spec = campaign.spec
    if not target_folders(exp, campaign):
        return {}
    df = target_rows(exp, spec)
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), sink, compression="zstd")
    paths = {"targets": f"{out}/{TARGETS_FILE}", "targets_md": f"{out}/{TARGETS_MD}"}
    write_bytes(paths["targets"], sink.getvalue())
    shown = df.drop(columns=["report"]).astype(object).where(df.drop(columns=["report"]).notna(), "")
    md = "## Deployment targets\n\n" + _markdown(shown) + "\nEach target's own report: " + ", ".join(
        f"[{t}]({link})" for t, link in zip(df["target"], df["report"])) + "\n"
    write_bytes(paths["targets_md"], md.encode("utf-8"))
    write_bytes(report_md, read_bytes(report_md) + ("\n" + md).encode("utf-8"))
    page = f"{report_md.rsplit('/', 1)[0]}/pareto.html"
    head, sep, tail = read_bytes(page).rpartition(b"</body>")
    if sep:
        links = "".join(f"<li><a href='{html.escape(link)}'>{html.escape(t)}</a></li>"
                        for t, link in zip(df["target"], df["report"]))
        section = (f"<h2>Deployment targets</h2>{shown.to_html(index=False, escape=True)}"
                   f"<p>Each target's own report:</p><ul>{links}</ul>")
        write_bytes(page, head + section.encode("utf-8") + sep + tail)
    return paths


def _markdown(df: pd.DataFrame) -> str:
    def cell(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"
