"""How well the weights a subnet inherits from its supernet rank it (one-shot search, search.campaign.oneshot),
measured against the subnets retrained on their own, beside the retraining's own noise and a trivial cost proxy.

    inherited evaluations (search.records.inherited) + the campaign's trials (results.collect)
      --subnet_table--> subnets.parquet, one row per scored subnet:
          subnet_id, config_<key>..., params_m, gmacs, params, embed_params, top1_inherited, top5_inherited,
          val_loss_inherited, top1_q_inherited, size_mb, latency_ms, throughput, train_step_ms, peak_mem_gb (measured
          where the campaign measures, else null), measured_on, predicted (the measured metrics whose value a
          predictor gave, not a measurement: search.campaign.oneshot.predictor; null: nothing measured), supernet,
          space, evaluated_at, selected (chosen | control | null),
          retrained_from (scratch | inherited: where its standalone training started; null when not selected),
          top1_standalone (its retrained final top-1 under the campaign's seed; null when not retrained, or not
          completed), top1_standalone_reseeded (control subnets: under the next seed)
      --measure--> fidelity.json and the report's section:
          subnets_scored; chosen_retrained; control_pairs: the control subnets with an inherited and a standalone
              top-1, the subnets every control_*, noise_floor_* and proxy_* figure is over
          control_kendall_tau, its 95 % bootstrap interval, control_spearman_rho: inherited against standalone top-1
              over the control subnets, the headline. The control sample is drawn at random from the space (an earlier
              campaign drew it among the scored subnets), so its ranks are not already ordered by cost, as the chosen
              front's are: along a top-1-vs-GMACs front inherited top-1 rises with GMACs, and tau over it measures
              the cost as much as the supernet
          noise_floor_tau and its interval: standalone top-1 under the campaign's seed against the next seed over the
              control subnets: the best any predictor can rank, given the retraining's noise
          proxy_gmacs_tau, proxy_params_tau and their intervals: the cost as a predictor (more compute, more
              accuracy) against standalone top-1 over the same control subnets: what ranking costs alone reaches
          stronger_proxy, tau_minus_proxy and its 95 % paired bootstrap interval (the control subnets resampled, both
              taus on each resample), verdict_vs_proxy: beats | worse | not told apart (the interval above 0,
              below it, holding it). The stronger proxy is picked on the same data, which favours the proxy
          control_top_k_overlap: of the control_top_k best by standalone top-1, the share among the best by inherited
          front_kendall_tau, its interval, front_spearman_rho: the same over the chosen subnets retrained from scratch,
              apart; null, with front_null_reason, when they trained on from their inherited weights (their final
              top-1 carries the inherited one) or are too few
          hv_inherited, hv_standalone: the chosen subnets' hypervolume on the campaign's objectives (its fixed
              reference, search.analysis.hv_reference), with inherited and with standalone top-1
A figure that needs more points than there are is null, and the section says why. The section's plots are drawn
from the subnets.parquet rows (search.analysis.oneshot_figures), then the supernet's own training curves from
supernet_epochs.parquet (search.analysis.supernet_training).
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

from qkvsearch.search.analysis.figures import figures_html
from qkvsearch.search.analysis.oneshot_figures import SUBNET_MEASURED, oneshot_figures
from qkvsearch.search.analysis.pareto import hypervolume
from qkvsearch.search.analysis.results import config_columns
from qkvsearch.search.analysis.supernet_training import supernet_section
from qkvsearch.search.records import inherited
from qkvsearch.search.records.inherited import PREDICTED
from qkvsearch.spaces.metrics import INHERITED_METRICS
from qkvsearch.spaces.upgrade import upgraded
from qkvsearch.storage import read_bytes, write_bytes, write_json

SUBNETS_FILE, FIDELITY_FILE = "subnets.parquet", "fidelity.json"
BOOTSTRAP = 2000        # resamples of the subnets for a rank figure's interval
MIN_PAIRS = 3           # fewer pairs have no rank correlation worth a figure
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
    # the measured costs its evaluation carries (where the campaign measures; size_mb is its scored weights' size,
    # a column already), and which of them a predictor gave rather than a measurement
    for metric in SUBNET_MEASURED:
        df[metric] = [_num(r["cost"].get(metric)) for r in records]
    df["measured_on"] = [r.get("measured_on") if isinstance(r.get("measured_on"), str) else None for r in records]
    df[PREDICTED] = [list(r.get(PREDICTED) or []) if r.get("measured_on") is not None else None for r in records]
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
        cfg = upgraded(json.loads(t["config_json"]))   # as the evaluations are read (inherited.read_scored)
        i = groups.get(inherited.subnet_identity(cfg, ignore=("seed",)))
        if i is not None:
            col = "top1_standalone" if seed is None or cfg.get("seed") == seed else "top1_standalone_reseeded"
            df.at[i, col] = _num(t.get("final_top1"))
    return df


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan


def kendall_tau_b(x, y) -> np.ndarray:
    """Kendall's tau-b of paired values along the last axis (scipy.stats.kendalltau's default): concordant minus
    discordant pairs over the root of (pairs untied in x) x (pairs untied in y); nan where either side is constant.
    Vectorised so that the bootstrap ranks every resample in one call: x, y (..., n) -> (...)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    i, j = np.triu_indices(x.shape[-1], 1)
    dx, dy = np.sign(x[..., j] - x[..., i]), np.sign(y[..., j] - y[..., i])  # (..., n (n - 1) / 2)
    untied = np.count_nonzero(dx, axis=-1) * np.count_nonzero(dy, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (dx * dy).sum(axis=-1) / np.sqrt(untied)


def _bootstrap(statistic, columns, seed: int) -> list[float] | None:
    """statistic's 95 % percentile interval over BOOTSTRAP resamples of the rows (each resample the same rows of
    every column: a paired statistic stays paired), resamples where it is undefined (nan) left out; None if all are."""
    n = len(columns[0])
    rows = np.random.default_rng(seed).integers(0, n, (BOOTSTRAP, n))
    chunk = max(1, 2_000_000 // (n * n))  # bounds the (resamples, pairs) arrays to a few tens of MB
    values = np.concatenate([statistic(*(c[rows[s:s + chunk]] for c in columns)) for s in range(0, BOOTSTRAP, chunk)])
    values = values[np.isfinite(values)]
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if len(values) else None


def _finite(*columns) -> list[np.ndarray]:
    columns = [np.asarray(c, float) for c in columns]
    ok = np.logical_and.reduce([np.isfinite(c) for c in columns])
    return [c[ok] for c in columns]


def rank_agreement(x, y, seed: int = 0) -> dict:
    """Kendall's tau-b and Spearman's rho of paired values, with tau's percentile bootstrap interval (pairs
    resampled); nulls when fewer than MIN_PAIRS finite pairs, or the values do not vary."""
    from scipy.stats import spearmanr

    x, y = _finite(x, y)
    out = {"pairs": int(len(x)), "tau": None, "tau_ci": None, "rho": None}
    if len(x) < MIN_PAIRS or not np.isfinite(tau := kendall_tau_b(x, y)):
        return out
    out["tau"], out["rho"] = float(tau), float(spearmanr(x, y).statistic)
    out["tau_ci"] = _bootstrap(kendall_tau_b, (x, y), seed)
    return out


def paired_tau_difference(x, z, y, seed: int = 0) -> dict:
    """tau(x, y) - tau(z, y) over the rows where all three are finite, and its 95 % paired bootstrap interval (each
    resample of the rows ranks both), with the verdict: x ranks y better than z (beats), worse, or not told apart
    (the interval holds 0). Nulls when fewer than MIN_PAIRS rows, or either tau is undefined."""
    x, z, y = _finite(x, z, y)
    out = {"pairs": int(len(x)), "diff": None, "diff_ci": None, "verdict": None}

    def difference(a, c, b):
        return kendall_tau_b(a, b) - kendall_tau_b(c, b)

    if len(x) < MIN_PAIRS or not np.isfinite(diff := difference(x, z, y)):
        return out
    out["diff"], out["diff_ci"] = float(diff), _bootstrap(difference, (x, z, y), seed)
    if out["diff_ci"] is not None:
        low, high = out["diff_ci"]
        out["verdict"] = "beats" if low > 0 else "worse" if high < 0 else "not told apart"
    return out


def top_k_overlap(inherited_top1, standalone_top1, k: int) -> float | None:
    """Of the k best by standalone top-1, the share also among the k best by inherited top-1."""
    x, y = _finite(inherited_top1, standalone_top1)
    if len(x) < max(k, 1) or k < 1:
        return None
    best_x, best_y = set(np.argsort(-x, kind="stable")[:k]), set(np.argsort(-y, kind="stable")[:k])
    return len(best_x & best_y) / k


# The cost columns tried as a predictor of standalone top-1 (more compute, more accuracy), with their names in the
# report; on a tie the first is the stronger.
PROXIES = (("gmacs", "GMACs"), ("params", "params"))
FROM_INHERITED = ("the chosen subnets trained on from their inherited weights, whose final top-1 carries the "
                  "inherited one")


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    return np.asarray(frame[name], float) if name in frame else np.full(len(frame), np.nan)


def measure(df: pd.DataFrame, objectives, reference) -> dict:
    """fidelity.json (module docstring). objectives: ((metric, mode), ...); reference: the campaign's fixed
    hypervolume reference in the objectives' order (None: not fixed, no hypervolume)."""
    control = df[df["selected"] == "control"]
    # the control subnets ranked both ways: every control, noise-floor and proxy figure is over these alone
    ranked = control[np.isfinite(_column(control, "top1_inherited")) & np.isfinite(_column(control, "top1_standalone"))]
    inherited_top1, standalone_top1 = _column(ranked, "top1_inherited"), _column(ranked, "top1_standalone")
    headline = rank_agreement(inherited_top1, standalone_top1)
    floor = rank_agreement(standalone_top1, _column(ranked, "top1_standalone_reseeded"))
    proxies = {name: rank_agreement(_column(ranked, name), standalone_top1) for name, _ in PROXIES}
    usable = [name for name, _ in PROXIES if proxies[name]["tau"] is not None]
    stronger = max(usable, key=lambda name: proxies[name]["tau"]) if usable else None  # max keeps the first on a tie
    versus = paired_tau_difference(inherited_top1, _column(ranked, stronger), standalone_top1) \
        if stronger is not None else paired_tau_difference([], [], [])
    chosen = df[df["selected"] == "chosen"]
    scratch = chosen[chosen["retrained_from"] == "scratch"]
    front = rank_agreement(_column(scratch, "top1_inherited"), _column(scratch, "top1_standalone"))
    k = max(1, headline["pairs"] // 3)
    out = {"subnets_scored": int(len(df)),
           "chosen_retrained": int(np.isfinite(_column(chosen, "top1_standalone")).sum()),
           "control_pairs": headline["pairs"], "control_kendall_tau": headline["tau"],
           "control_kendall_tau_ci95": headline["tau_ci"], "control_spearman_rho": headline["rho"],
           "noise_floor_pairs": floor["pairs"], "noise_floor_tau": floor["tau"],
           "noise_floor_tau_ci95": floor["tau_ci"]}
    for name, _ in PROXIES:
        out[f"proxy_{name}_tau"], out[f"proxy_{name}_tau_ci95"] = proxies[name]["tau"], proxies[name]["tau_ci"]
    out.update({"stronger_proxy": stronger, "tau_minus_proxy": versus["diff"],
                "tau_minus_proxy_ci95": versus["diff_ci"], "verdict_vs_proxy": versus["verdict"],
                "control_top_k": k, "control_top_k_overlap": top_k_overlap(inherited_top1, standalone_top1, k),
                "front_pairs": front["pairs"], "front_kendall_tau": front["tau"],
                "front_kendall_tau_ci95": front["tau_ci"], "front_spearman_rho": front["rho"],
                "front_null_reason": None if front["tau"] is not None else FROM_INHERITED
                if (chosen["retrained_from"] == "inherited").any() else
                f"needs {MIN_PAIRS} chosen subnets retrained from scratch whose accuracies vary",
                "hv_inherited": None, "hv_standalone": None})
    if reference is not None and len(chosen):
        modes = [mode for _, mode in objectives]
        for fidelity in ("inherited", "standalone"):
            cols = [f"top1_{fidelity}" if metric == "top1" else metric for metric, _ in objectives]
            if all(c in chosen.columns for c in cols):
                out[f"hv_{fidelity}"] = hypervolume(chosen[cols].to_numpy(float), modes, reference)
    return out


def fidelity_report(exp: str, out: str, campaign, trials: pa.Table, report_md: str,
                    reference) -> tuple[dict[str, str], dict[str, dict]]:
    """The one-shot part of a campaign's report (none for another campaign): subnets.parquet, fidelity.json,
    supernet_epochs.parquet (where the campaign trained its own supernet), and the section appended to report.md
    and pareto.html, its figures after the page's own (plotly.js is inlined there already). -> ({name: written
    path}, the section's figures by name, for the static export)."""
    if not getattr(campaign.spec, "supernet", None):
        return {}, {}
    df = subnet_table(exp, trials)
    figures = measure(df, campaign.objectives, reference)
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), sink, compression="zstd")
    paths = {"subnets": f"{out}/{SUBNETS_FILE}", "fidelity": f"{out}/{FIDELITY_FILE}"}
    write_bytes(paths["subnets"], sink.getvalue())
    write_json(paths["fidelity"], figures)
    lines = section_lines(figures)
    plots = oneshot_figures(df, campaign.objectives, lines[1], campaign.spec.space.keys)
    supernet_paths, supernet_plots = supernet_section(exp, out)  # its training, after the subnets' figures
    paths |= supernet_paths
    plots |= supernet_plots
    write_bytes(report_md, read_bytes(report_md)
                + ("\n## One-shot fidelity\n\n" + "\n".join(f"- {line}" for line in lines) + "\n").encode("utf-8"))
    page = f"{report_md.rsplit('/', 1)[0]}/pareto.html"
    head, sep, tail = read_bytes(page).rpartition(b"</body>")
    if sep:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
        divs = "".join(f"<div class='fig'>{div}</div>" for div in figures_html(plots, plotlyjs=False))
        write_bytes(page, head + f"<h2>One-shot fidelity</h2><ul>{items}</ul>{divs}".encode() + sep + tail)
    return paths, plots


def _fig(v, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _ci(ci, kind: str = "bootstrap") -> str:
    return "" if ci is None else f" (95 % {kind} interval {ci[0]:.2f} to {ci[1]:.2f})"


def _tau(tau, ci, why: str) -> str:
    return _fig(tau) + (_ci(ci) if tau is not None else f" ({why})")


VERDICT_WORDS = {"beats": "beats it", "worse": "worse than it", "not told apart": "not told apart"}


def section_lines(f: dict) -> list[str]:
    few = f"needs {MIN_PAIRS} control subnets whose accuracies vary"
    names = dict(PROXIES)
    if f["tau_minus_proxy"] is not None:
        versus = (f"inherited top-1 against {names[f['stronger_proxy']]}, the stronger proxy "
                  f"(picked as the stronger on these same subnets): tau difference {f['tau_minus_proxy']:+.2f}"
                  f"{_ci(f['tau_minus_proxy_ci95'], 'paired bootstrap')}: "
                  + VERDICT_WORDS.get(f["verdict_vs_proxy"], "no verdict (no resample ranks both)"))
    else:
        versus = "inherited top-1 against the cost proxy: n/a (" + (
            few if f["control_kendall_tau"] is None else f"needs {MIN_PAIRS} control subnets whose costs vary") + ")"
    return [
        f"{f['subnets_scored']} subnets scored with inherited weights; {f['control_pairs']} control subnets (drawn at "
        f"random) retrained from scratch; {f['chosen_retrained']} chosen subnets retrained",
        f"Kendall tau, inherited vs standalone top-1 over the {f['control_pairs']} control subnets: "
        f"{_tau(f['control_kendall_tau'], f['control_kendall_tau_ci95'], few)}; "
        f"Spearman rho {_fig(f['control_spearman_rho'])}",
        f"noise floor, standalone top-1 under two seeds ({f['noise_floor_pairs']} control subnets): Kendall tau "
        f"{_tau(f['noise_floor_tau'], f['noise_floor_tau_ci95'], few)}",
        "cost proxy (more compute, more accuracy) vs standalone top-1 over the same control subnets: Kendall tau "
        + ", ".join(f"of {label} " + _tau(f[f"proxy_{name}_tau"], f[f"proxy_{name}_tau_ci95"],
                                          f"needs {MIN_PAIRS} control subnets whose accuracies and {label} vary")
                    for name, label in PROXIES),
        versus,
        f"top-{f['control_top_k']} overlap over the control subnets: {_fig(f['control_top_k_overlap'])}",
        f"Kendall tau over the chosen front, apart ({f['front_pairs']} chosen subnets retrained from scratch; ordered "
        "by cost, it measures the cost as much as the supernet): "
        + _tau(f["front_kendall_tau"], f["front_kendall_tau_ci95"], f["front_null_reason"])
        + ("" if f["front_kendall_tau"] is None else f"; Spearman rho {_fig(f['front_spearman_rho'])}"),
        f"hypervolume of the chosen subnets, inherited top-1 {_fig(f['hv_inherited'], '.4g')}, "
        f"retrained top-1 {_fig(f['hv_standalone'], '.4g')}",
    ]
