"""How well the weights a subnet inherits from its supernet rank it (one-shot search, search.campaign.oneshot),
measured against the subnets retrained on their own, with the retraining's own noise beside it.

    inherited evaluations (search.records.inherited) + the campaign's trials (results.collect)
      --subnet_table--> subnets.parquet, one row per scored subnet:
          subnet_id, config_<key>..., params_m, gmacs, params, embed_params, top1_inherited, top5_inherited,
          val_loss_inherited, top1_q_inherited, size_mb, supernet, space, evaluated_at, selected (chosen | control | null),
          retrained_from (scratch | inherited: where its standalone training started; null when not selected),
          top1_standalone (its retrained final top-1 under the campaign's seed; null when not retrained, or not
          completed), top1_standalone_reseeded (control subnets: under the next seed)
      --measure--> fidelity.json and the report's section:
          kendall_tau, its 95 % bootstrap interval, spearman_rho: inherited against standalone top-1 over every
              subnet retrained from scratch (chosen and control; the control ones alone when the chosen ones
              trained on from their inherited weights, whose final top-1 the inherited one would bias);
              ranked_over says which
          noise_floor_tau and its interval: standalone top-1 under the campaign's seed against the next seed
              over the control subnets: the best any proxy can rank, given the retraining's noise
          top_k_overlap: of the top_k subnets by standalone top-1, the share among the top_k by inherited
          hv_inherited, hv_standalone: the chosen subnets' hypervolume on the campaign's objectives (its fixed
              reference, search.analysis.hv_reference), with inherited and with standalone top-1
A figure that needs more points than there are is null, and the section says why.
"""
from __future__ import annotations

import html
import io
import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from qkvsearch.search.analysis.pareto import hypervolume
from qkvsearch.search.analysis.results import config_columns
from qkvsearch.search.records import inherited
from qkvsearch.storage import read_bytes, write_bytes, write_json

SUBNETS_FILE, FIDELITY_FILE = "subnets.parquet", "fidelity.json"
BOOTSTRAP = 2000        # resamples of the retrained pairs for a rank correlation's interval
MIN_PAIRS = 3           # fewer pairs have no rank correlation worth a figure
INHERITED_METRICS = ("top1", "top5", "val_loss", "top1_q")
COST_COLUMNS = (("params_m", pa.float64()), ("gmacs", pa.float64()), ("params", pa.int64()),
                ("embed_params", pa.int64()))


def subnet_table(exp: str, trials: pa.Table) -> pd.DataFrame:
    """The subnets.parquet rows of a one-shot campaign (module docstring); empty without evaluations."""
    records = inherited.read_evaluations(exp)
    selection = inherited.read_selection(exp) or {"chosen": [], "control": [], "seed": None}
    df = pa.table({name: array for name, _, array in config_columns([r["config"] for r in records])}).to_pandas() \
        if records else pd.DataFrame()
    df.insert(0, "subnet_id", [r["subnet_id"] for r in records])
    for name, _ in COST_COLUMNS:
        df[name] = [r["cost"].get(name) for r in records]
    for metric in INHERITED_METRICS:
        df[f"{metric}_inherited"] = [_num(r["metrics"].get(metric)) for r in records]
    df["size_mb"] = [_num(r["metrics"].get("size_mb")) for r in records]  # under its policy (none: fp)
    for name in ("supernet", "space", "evaluated_at"):
        df[name] = [r.get(name) for r in records]
    groups = {inherited.subnet_identity(r["config"], ignore=("seed",)): i for i, r in enumerate(records)}
    by_keys = {inherited.keys_text(r["keys"]): i for i, r in enumerate(records)}
    selected = [None] * len(records)
    for role in ("chosen", "control"):
        for keys in selection[role]:
            if inherited.keys_text(keys) in by_keys:
                selected[by_keys[inherited.keys_text(keys)]] = role
    df["selected"] = selected
    # Where each retrained subnet's training started: the chosen ones from their inherited weights when the
    # campaign said so (an older selection file says nothing: scratch), the control ones always from scratch.
    chosen_from = selection.get("retrain_from") or "scratch"
    df["retrained_from"] = [None if role is None else chosen_from if role == "chosen" else "scratch"
                            for role in selected]
    df["top1_standalone"], df["top1_standalone_reseeded"] = np.nan, np.nan
    seed = selection.get("seed")
    done = trials.to_pandas() if trials.num_rows else pd.DataFrame(columns=["status"])
    for _, t in done[done["status"] == "completed"].iterrows():
        cfg = json.loads(t["config_json"])
        i = groups.get(inherited.subnet_identity(cfg, ignore=("seed",)))
        if i is not None:
            col = "top1_standalone" if seed is None or cfg.get("seed") == seed else "top1_standalone_reseeded"
            df.at[i, col] = _num(t.get("final_top1"))
    return df


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan


def rank_agreement(x, y, seed: int = 0) -> dict:
    """Kendall's tau-b and Spearman's rho of paired values, with tau's percentile bootstrap interval (pairs
    resampled); nulls when fewer than MIN_PAIRS finite pairs, or the values do not vary."""
    from scipy.stats import kendalltau, spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    out = {"pairs": int(len(x)), "tau": None, "tau_ci": None, "rho": None}
    if len(x) < MIN_PAIRS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    out["tau"], out["rho"] = float(kendalltau(x, y).statistic), float(spearmanr(x, y).statistic)
    rng = np.random.default_rng(seed)
    taus = []
    for _ in range(BOOTSTRAP):
        i = rng.integers(0, len(x), len(x))
        if np.ptp(x[i]) > 0 and np.ptp(y[i]) > 0:
            taus.append(kendalltau(x[i], y[i]).statistic)
    if taus:
        out["tau_ci"] = [float(np.percentile(taus, 2.5)), float(np.percentile(taus, 97.5))]
    return out


def top_k_overlap(inherited_top1, standalone_top1, k: int) -> float | None:
    """Of the k best by standalone top-1, the share also among the k best by inherited top-1."""
    x, y = np.asarray(inherited_top1, float), np.asarray(standalone_top1, float)
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < max(k, 1) or k < 1:
        return None
    x, y = x[ok], y[ok]
    best_x, best_y = set(np.argsort(-x, kind="stable")[:k]), set(np.argsort(-y, kind="stable")[:k])
    return len(best_x & best_y) / k


def measure(df: pd.DataFrame, objectives, reference) -> dict:
    """fidelity.json (module docstring). objectives: ((metric, mode), ...); reference: the campaign's fixed
    hypervolume reference in the objectives' order (None: not fixed, no hypervolume)."""
    retrained = df[df["retrained_from"] == "scratch"]
    agreement = rank_agreement(retrained["top1_inherited"], retrained["top1_standalone"])
    fine_tuned = int((df["retrained_from"] == "inherited").sum())
    control = df[df["selected"] == "control"]
    floor = rank_agreement(control["top1_standalone"], control["top1_standalone_reseeded"])
    k = max(1, agreement["pairs"] // 3)
    out = {"subnets_scored": int(len(df)), "retrained": agreement["pairs"],
           "kendall_tau": agreement["tau"], "kendall_tau_ci95": agreement["tau_ci"], "spearman_rho": agreement["rho"],
           "noise_floor_pairs": floor["pairs"], "noise_floor_tau": floor["tau"], "noise_floor_tau_ci95": floor["tau_ci"],
           "top_k": k, "top_k_overlap": top_k_overlap(retrained["top1_inherited"], retrained["top1_standalone"], k),
           "hv_inherited": None, "hv_standalone": None,
           "ranked_over": "the control subnets (the chosen ones trained on from their inherited weights)"
           if fine_tuned else "every retrained subnet"}
    chosen = df[df["selected"] == "chosen"]
    if reference is not None and len(chosen):
        modes = [mode for _, mode in objectives]
        for fidelity in ("inherited", "standalone"):
            cols = [f"top1_{fidelity}" if metric == "top1" else metric for metric, _ in objectives]
            if all(c in chosen.columns for c in cols):
                out[f"hv_{fidelity}"] = hypervolume(chosen[cols].to_numpy(float), modes, reference)
    return out


def fidelity_report(exp: str, out: str, campaign, trials: pa.Table, report_md: str, reference) -> dict[str, str]:
    """The one-shot part of a campaign's report (none for another campaign): subnets.parquet, fidelity.json,
    and the section appended to report.md and pareto.html."""
    if not getattr(campaign.spec, "supernet", None):
        return {}
    df = subnet_table(exp, trials)
    figures = measure(df, campaign.objectives, reference)
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), sink, compression="zstd")
    paths = {"subnets": f"{out}/{SUBNETS_FILE}", "fidelity": f"{out}/{FIDELITY_FILE}"}
    write_bytes(paths["subnets"], sink.getvalue())
    write_json(paths["fidelity"], figures)
    lines = section_lines(figures)
    write_bytes(report_md, read_bytes(report_md) + ("\n## One-shot fidelity\n\n" + "\n".join(f"- {line}" for line in lines)
                                                    + "\n").encode("utf-8"))
    page = f"{report_md.rsplit('/', 1)[0]}/pareto.html"
    head, sep, tail = read_bytes(page).rpartition(b"</body>")
    if sep:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
        write_bytes(page, head + f"<h2>One-shot fidelity</h2><ul>{items}</ul>".encode() + sep + tail)
    return paths


def _fig(v, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _ci(ci) -> str:
    return "" if ci is None else f" (95 % bootstrap interval {ci[0]:.2f} to {ci[1]:.2f})"


def section_lines(f: dict) -> list[str]:
    few = f"needs {MIN_PAIRS} retrained subnets whose accuracies vary"
    return [
        f"{f['subnets_scored']} subnets scored with inherited weights; {f['retrained']} retrained on their own",
        f"Kendall tau, inherited vs standalone top-1 over {f.get('ranked_over', 'every retrained subnet')}: "
        f"{_fig(f['kendall_tau'])}{_ci(f['kendall_tau_ci95'])}"
        + ("" if f["kendall_tau"] is not None else f" ({few})") + f"; Spearman rho {_fig(f['spearman_rho'])}",
        f"noise floor, standalone top-1 under two seeds ({f['noise_floor_pairs']} control subnets): Kendall tau "
        f"{_fig(f['noise_floor_tau'])}{_ci(f['noise_floor_tau_ci95'])}"
        + ("" if f["noise_floor_tau"] is not None else f" ({few})"),
        f"top-{f['top_k']} overlap: {_fig(f['top_k_overlap'])}",
        f"hypervolume of the chosen subnets, inherited top-1 {_fig(f['hv_inherited'], '.4g')}, "
        f"retrained top-1 {_fig(f['hv_standalone'], '.4g')}",
    ]
