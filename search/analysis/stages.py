"""The stages' results (search.records.stages) as one table, one row per configuration that went on, and its
front on the stages' objectives (spaces.stages: ``stages.objectives``, ``stages.constraints``).

    stage records + trials table --stage_table--> (n rows) trial_id, trial_name, config_embedding, config_width,
        <pretraining objective columns>, top1@<dataset> per fine-tuning, transfer_avg (their mean, once all
        have completed), fpr95 det_err auroc aupr_in aupr_out (the OOD stage's means), <stage>_status and
        <stage>_s (seconds) per stage, feasible (meets stages.constraints), stage_rank (non-dominated rank on
        the stages' objectives among the feasible; 0 = the final front), on_stage_front
A configuration that never reached a stage has no value there (NaN), and no rank.
Written by the report as stages.csv / stages.parquet and a section of report.md.
"""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa

from qkvsearch.search.analysis.front import objective_columns
from qkvsearch.search.analysis.pareto import nondominated_ranks
from qkvsearch.search.records.stages import latest_by_stage, read_selection, read_stages
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.metrics import FINETUNE_METRIC, OOD_METRICS, STAGE_METRIC_LIST, TRANSFER_AVG
from qkvsearch.storage import write_bytes

STAGES_CSV, STAGES_PARQUET = "stages.csv", "stages.parquet"


def stage_metric_markdown() -> str:
    """The stage-metric rows of search/RESULTS_SCHEMA.md's stages table, from spaces.metrics (docs/hooks.py renders
    them there when the documentation site is built)."""
    return "\n".join(f"| `{m.name}` | float64 | % | {m.doc} ({m.stage} stage) |" for m in STAGE_METRIC_LIST)


def stage_names(stages) -> list[str]:
    return [f.name for f in stages.finetune] + (["ood"] if stages.ood else [])


def stage_table(exp: str, stages, trials: pa.Table) -> pd.DataFrame:
    """The table above for a campaign (stages: its spec's StagesSpec; trials: results.collect's table)."""
    selection = read_selection(exp) or {"trial_ids": []}
    latest = latest_by_stage(read_stages(exp))
    ids = list(dict.fromkeys([*selection["trial_ids"], *(t for t, _ in latest)]))
    df = trials.to_pandas()
    df = df[df["trial_id"].isin(ids)].copy()
    names, finetunes = stage_names(stages), [FINETUNE_METRIC + f.dataset for f in stages.finetune]
    for metric in [*finetunes, TRANSFER_AVG, *(OOD_METRICS if stages.ood else ())]:
        df[metric] = np.nan
    for name in names:
        df[f"{name}_status"], df[f"{name}_s"] = "pending", np.nan
    for i, tid in zip(df.index, df["trial_id"]):
        for name in names:
            rec = latest.get((tid, name))
            if rec is None:
                continue
            df.at[i, f"{name}_status"] = rec.get("status", "?")
            df.at[i, f"{name}_s"] = finite(rec.get("duration_s"), np.nan)
            if rec.get("status") == "completed":
                for metric, value in (rec.get("metrics") or {}).items():
                    if metric in df.columns:
                        df.at[i, metric] = finite(value, np.nan)
    if finetunes:
        df[TRANSFER_AVG] = df[finetunes].mean(axis=1, skipna=False)
    return _ranked(df, stages)


def _ranked(df: pd.DataFrame, stages) -> pd.DataFrame:
    feasible = np.ones(len(df), dtype=bool)
    for c in stages.constraints:
        v = df[c.metric].to_numpy(dtype=float)
        feasible &= ~np.isnan(v) & (v <= (c.max if c.max is not None else np.inf)) & \
            (v >= (c.min if c.min is not None else -np.inf))
    df["feasible"] = feasible
    specs = [{"metric": o.metric, "mode": o.mode} for o in stages.objectives]
    _, cols, dirs = objective_columns(pa.Table.from_pandas(df, preserve_index=False), specs)
    ranks = np.full(len(df), np.nan)
    if feasible.any():
        r = nondominated_ranks(df.loc[feasible, cols].to_numpy(dtype=float), dirs).astype(float)
        r[np.isnan(df.loc[feasible, cols].to_numpy(dtype=float)).any(axis=1)] = np.nan  # never reached a stage
        ranks[feasible] = r
    df["stage_rank"] = ranks
    df["on_stage_front"] = ranks == 0
    by = ["stage_rank", cols[0]]
    return df.sort_values(by, ascending=[True, dirs[0] == "min"], na_position="last").reset_index(drop=True)


def shown_columns(df: pd.DataFrame, stages) -> list[str]:
    """What a reader compares: names, the design, the stage metrics, ranks, statuses and times."""
    specs = [{"metric": o.metric, "mode": o.mode} for o in stages.objectives]
    _, cols, _ = objective_columns(pa.Table.from_pandas(df, preserve_index=False), specs)
    metrics = [c for c in df.columns if c.startswith(FINETUNE_METRIC)] + \
        [c for c in (TRANSFER_AVG, *OOD_METRICS) if c in df.columns and df[c].notna().any()]
    per_stage = [f"{n}_{k}" for n in stage_names(stages) for k in ("status", "s")]
    base = ["stage_rank", "trial_name", "config_embedding", "config_width"]
    return list(dict.fromkeys([*base, *cols, *metrics, "feasible", *per_stage]))


def stage_markdown(df: pd.DataFrame, stages) -> str:
    """The report.md section: the configurations ranked on the stages' objectives."""
    objectives = ", ".join(f"{o.metric} ({o.mode})" for o in stages.objectives)
    cols = shown_columns(df, stages)
    lines = ["", "## Stages", "", f"- stage objectives: {objectives}; {int(df['on_stage_front'].sum())} on the "
             f"final front (stage_rank 0); {len(df)} configuration(s) went on", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_cell(row[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    if isinstance(v, (float, np.floating)):
        return "" if np.isnan(v) else f"{v:.4g}"
    return "" if v is None or v is pd.NA else str(v)


def write_stage_files(out: str, df: pd.DataFrame) -> dict[str, str]:
    """stages.csv and stages.parquet into ``out``: {name: path}."""
    import pyarrow.parquet as pq

    paths = {"stages_csv": f"{out}/{STAGES_CSV}", "stages_parquet": f"{out}/{STAGES_PARQUET}"}
    write_bytes(paths["stages_csv"], df.to_csv(index=False).encode("utf-8"))
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf)
    write_bytes(paths["stages_parquet"], buf.getvalue())
    return paths


def stage_report(exp: str, out: str, campaign, trials: pa.Table, report_md: str) -> dict[str, str]:
    """The stages' part of a campaign's report (none without stages): their files, and their section
    appended to report.md."""
    from qkvsearch.storage import read_bytes

    stages = getattr(campaign.spec, "stages", None)
    if not stages:
        return {}
    df = stage_table(exp, stages, trials)
    paths = write_stage_files(out, df)
    write_bytes(report_md, read_bytes(report_md) + stage_markdown(df, stages).encode("utf-8"))
    page = f"{report_md.rsplit('/', 1)[0]}/pareto.html"
    head, sep, tail = read_bytes(page).rpartition(b"</body>")
    if sep:  # the section goes before the page's end
        write_bytes(page, head + stage_html(df, stages).encode("utf-8") + sep + tail)
    return paths


def stage_html(df: pd.DataFrame, stages) -> str:
    """The pareto.html section: the same table as report.md's, the final front in bold."""
    import html

    cols = shown_columns(df, stages)
    rows = "".join(f"<tr data-front='{int(bool(r['on_stage_front']))}'>"
                   + "".join(f"<td>{html.escape(_cell(r[c]))}</td>" for c in cols) + "</tr>" for _, r in df.iterrows())
    objectives = ", ".join(f"{o.metric} ({o.mode})" for o in stages.objectives)
    return (f"<h2>Stages</h2><p>ranked on the stage objectives: {html.escape(objectives)}</p><table><tr>"
            + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + f"</tr>{rows}</table>")
