"""Learning curves to replay: a campaign's records or a tabular benchmark file.

A campaign folder (``qs_campaign.json`` + ``qs_trials/``), read through ``search.analysis.results.collect``: one
curve per recorded trial that reported an epoch, its ``epochs.parquet`` rows with the trial's cost
columns (``params_m``, ``gmacs``, ``params``, ``embed_params``) added to every epoch, as the
campaign's results carry them.
The campaign's spec gives the objectives, the planned epochs (``train.epochs``), the scheduler's
grace, reduction factor and brackets, and the concurrency (``resources.max_concurrent_trials`` when
a number). The default start-up per trial is the median over its trials of (ended_at - started_at
- sum of epoch_s).

A tabular benchmark file (``.parquet`` or ``.csv``), one row per (curve, epoch):

=================  ==========================================================================
column             meaning
=================  ==========================================================================
``config_<key>``   the configuration (any type). Rows with equal config columns are one curve.
``trial_id``       optional: names the curve instead (several curves may share a configuration)
``epoch``          1, 2, ... (int); a curve is its rows of epochs 1..n without a gap
``<metric>``       every other numeric column: reported to the scheduler as a result key. Training
                   metrics (``top1``, ``val_loss``, ...) change per epoch; cost metrics
                   (``TABLE_COSTS``: ``params_m``, ``gmacs``, ...) are repeated on every row, one
                   value per curve. A column named after a metric (spaces.metrics) must be numeric
``epoch_s``        optional: seconds the epoch took. Missing values: the curve's median, else the
                   file's, else 1 s
=================  ==========================================================================

The planned epochs (the schedulers' ``max_t``) are the longest curve's; a shorter curve is a trial that
stopped or failed. Objectives: ``objectives=[("top1", "max"), ...]``, by default those of
top1 (max), gmacs (min) and params_m (min) that are columns. Start-up per trial: 0 s by default.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from qkvsearch.search.analysis.pareto import hypervolume, reference_point
from qkvsearch.search.scheduling.moasha import as_float
from qkvsearch.spaces.errors import BadInput, clip
from qkvsearch.spaces.metrics import EPOCH

log = logging.getLogger(__name__)


CONFIG_PREFIX = "config_"


# A tabular source's objectives when none are given: those of these that are columns. (A campaign's are
# its spec's, defaults applied by the spec loader.)
TABLE_DEFAULT_OBJECTIVES = (("top1", "max"), ("gmacs", "min"), ("params_m", "min"))


COST_COLUMNS = ("params_m", "gmacs", "params", "embed_params")
# Columns a table may constrain: known before training (a campaign's cost metrics, a benchmark's latency).
TABLE_COSTS = (*COST_COLUMNS, "latency_ms")


# ---------------------------------------------------------------------------------------- sources
@dataclass
class Curves:
    """Recorded learning curves, one per candidate trial.

    results[c][e]: the result dict of curve c's epoch e + 1; epoch_s[c]: (E_c,) seconds per epoch;
    finals: (n, k) objective values at the planned epoch, NaN rows for curves shorter than max_t."""

    name: str
    ids: list[str]
    configs: list[dict]
    results: list[list[dict]]
    epoch_s: list[np.ndarray]
    max_t: int
    objectives: tuple[tuple[str, str], ...]
    startup_s: float = 0.0
    concurrency: int | None = None
    scheduler: dict = field(default_factory=dict)  # the campaign's: type, grace_epochs, reduction_factor, brackets
    costs: tuple[str, ...] = TABLE_COSTS  # the metrics known before training (a searcher's known costs)
    finals: np.ndarray = field(init=False)
    reference: np.ndarray = field(init=False)
    grid_hv: float = field(init=False)
    grid_epochs: int = field(init=False)

    def __post_init__(self):
        k = len(self.objectives)
        self.finals = np.full((len(self.ids), k), np.nan)
        for c, rows in enumerate(self.results):
            if len(rows) >= self.max_t:
                self.finals[c] = [as_float(rows[self.max_t - 1].get(m)) for m, _ in self.objectives]
        ok = ~np.isnan(self.finals).any(axis=1)
        if not ok.any():
            raise BadInput(f"{self.name}: expected at least one curve trained for the planned {self.max_t} "
                           f"epochs with every objective ({', '.join(self.metrics)}), given none")
        self.reference = reference_point(self.finals[ok], self.directions)
        self.grid_hv = hypervolume(self.finals[ok], self.directions, self.reference)
        self.grid_epochs = int(sum(len(r) for r in self.results))

    @property
    def metrics(self) -> list[str]:
        return [m for m, _ in self.objectives]

    @property
    def directions(self) -> list[str]:
        return [d for _, d in self.objectives]

    def __len__(self) -> int:
        return len(self.ids)


def load_source(source, objectives: Sequence[tuple[str, str]] | None = None) -> Curves:
    """A campaign folder or a tabular file (see the module doc) -> Curves. BadInput when unreadable."""
    text = os.fspath(source)
    lower = text.lower()
    if lower.endswith((".parquet", ".csv")):
        return load_table(text, objectives)
    if "://" not in text and not os.path.isdir(text):
        raise BadInput(f"source: expected a campaign folder or a .parquet/.csv file, given {text}")
    return _load_campaign(text, objectives)


def load_table(path, objectives: Sequence[tuple[str, str]] | None = None) -> Curves:
    """A tabular benchmark file (Parquet or CSV) -> Curves."""
    import pandas as pd

    text = os.fspath(path)
    try:
        if text.lower().endswith(".csv"):
            df = pd.read_csv(text)
        else:
            import pyarrow.parquet as pq

            df = pq.read_table(text).to_pandas()
    except (OSError, ValueError) as err:
        raise BadInput(f"{text}: expected a readable {'CSV' if text.lower().endswith('.csv') else 'Parquet'} "
                       f"file, given one that fails to read ({err})") from None
    return curves_from_frame(df, text, objectives)


def curves_from_frame(df, name: str, objectives=None, *, max_t: int | None = None, startup_s: float = 0.0,
                      concurrency: int | None = None, scheduler: dict | None = None, strict: bool = True,
                      costs: Sequence[str] = ()) -> Curves:
    """A pandas DataFrame in the tabular format -> Curves. ``strict`` (a table): BadInput naming the first
    curve whose epochs are not 1..n (a gap or a repeat). Else (a campaign's records, where a trial may
    still be running or have repeated epochs after a restart) a repeated epoch keeps its last row and
    the rows after a gap are left out, with a warning. ``costs``: columns known before training besides
    TABLE_COSTS (a packaged benchmark's, search.simulation.packaged)."""
    import pandas as pd

    if EPOCH not in df.columns:
        raise BadInput(f"{name}: expected an '{EPOCH}' column, given columns {', '.join(map(str, df.columns))}")
    epoch = pd.to_numeric(df[EPOCH], errors="coerce")
    bad = epoch.isna() | (epoch < 1) | (epoch != epoch.round())
    if bad.any():
        raise BadInput(f"{name}: {EPOCH}: expected ints >= 1, given {df[EPOCH][bad].iloc[0]!r}")
    df = df.assign(**{EPOCH: epoch.astype("int64")})
    config_cols = [c for c in df.columns if str(c).startswith(CONFIG_PREFIX)]
    keys = _curve_keys(df, config_cols, name)
    skip = {EPOCH, "epoch_s", "trial_id", "trial_name", *config_cols}
    metric_cols = [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])
                   and not pd.api.types.is_bool_dtype(df[c])]
    _refuse_text_metrics(df, [c for c in df.columns if c not in skip and c not in metric_cols],
                         {m for m, _ in objectives or ()}, name)
    objectives = _check_objectives(objectives, metric_cols, name)
    known = (*TABLE_COSTS, *(c for c in costs if c not in TABLE_COSTS))
    secs = pd.to_numeric(df["epoch_s"], errors="coerce") if "epoch_s" in df.columns else pd.Series(np.nan, df.index)
    secs = secs.where(secs > 0)
    overall = float(secs.median()) if secs.notna().any() else 1.0
    values = df[metric_cols].astype("float64").to_numpy()  # (rows, M)
    epochs = df[EPOCH].to_numpy()
    seconds = secs.to_numpy()
    config_values = {c[len(CONFIG_PREFIX):]: df[c].to_numpy() for c in config_cols}
    ids, configs, results, epoch_s = [], [], [], []
    dropped = 0
    groups = df.groupby(keys, dropna=False, sort=False).indices  # curve key -> its row positions
    if strict:
        _refuse_gaps(groups, epochs, keys, name)
        _refuse_uneven_costs(df, [c for c in metric_cols if c in known], groups, keys, name)
    for i, (key, idx) in enumerate(groups.items()):
        idx = idx[np.argsort(epochs[idx], kind="stable")]
        keep = _gapless(idx, epochs[idx])
        dropped += len(idx) - len(keep)
        rows = []
        for r in keep:
            res = {m: v for m, v in zip(metric_cols, values[r].tolist()) if v == v}  # NaN: not reported
            res[EPOCH] = int(epochs[r])
            rows.append(res)
        s = seconds[keep] if keep else np.zeros(0)
        own = np.nanmedian(s) if s.size and not np.isnan(s).all() else overall
        epoch_s.append(np.where(np.isnan(s), own, s))
        first = keep[0] if keep else idx[0]
        name_key = key[0] if isinstance(key, tuple) else key
        ids.append(str(name_key) if keys == ["trial_id"] else f"c{i:05d}")
        configs.append({k: v[first] for k, v in config_values.items()})
        results.append(rows)
    if dropped:
        log.warning(f"{name}: left out {dropped} row(s) after a gap or before epoch 1 in their curve")
    planned = max(len(r) for r in results) if max_t is None else int(max_t)
    return Curves(name, ids, configs, results, epoch_s, planned, objectives, startup_s, concurrency,
                  dict(scheduler or {}), known)


def _curve_keys(df, config_cols: list[str], name: str) -> list[str]:
    """The columns that name a curve: trial_id where the table has it, else the config columns."""
    if "trial_id" in df.columns:
        return ["trial_id"]
    if config_cols:
        return config_cols
    raise BadInput(f"{name}: expected config_<key> columns (or a trial_id column) naming each curve, "
                   f"given columns {', '.join(map(str, df.columns))}")


def _refuse_text_metrics(df, columns: list, named: set, name: str) -> None:
    """BadInput naming the first column among ``columns`` (those not numeric) that a metric (spaces.metrics)
    or an objective names: its non-numbers would otherwise leave it out of the table, silently."""
    import pandas as pd

    from qkvsearch.spaces.metrics import METRICS

    for col in columns:
        if col in METRICS or col in named:
            values = df[col]
            bad = pd.to_numeric(values, errors="coerce").isna() & values.notna()
            first = values[bad].iloc[0] if bad.any() else values.iloc[0]
            row = int(np.flatnonzero(bad.to_numpy())[0]) + 1 if bad.any() else 1
            raise BadInput(f"{name}: column {col}: expected numbers (the metric {col}), given {clip(repr(first))} "
                           f"in data row {row}")


def _refuse_uneven_costs(df, costs: list, groups: dict, keys: list[str], name: str) -> None:
    """BadInput naming a cost column (known before training) that is empty on a row, or changes between one curve's
    epochs: a cost is known before training, one value per configuration."""
    def label(key) -> str:
        return clip(", ".join(f"{k}={v}" for k, v in zip(keys, key if isinstance(key, tuple) else (key,))))

    for col in costs:
        values = df[col].to_numpy(dtype="float64")
        empty = np.flatnonzero(np.isnan(values))
        if empty.size:
            row = int(empty[0])
            key = next(k for k, idx in groups.items() if row in idx)
            raise BadInput(f"{name}: column {col}: expected a cost on every row of a curve, given an empty cell in "
                           f"data row {row + 1} (curve {label(key)})")
        spread = df.groupby(keys, dropna=False, sort=False)[col].agg(["min", "max"])
        uneven = spread.index[(spread["min"] != spread["max"]).to_numpy()]
        if len(uneven):
            key = uneven[0]
            given = ", ".join(f"{v:g}" for v in dict.fromkeys(values[groups[key]].tolist()))
            raise BadInput(f"{name}: column {col}: expected one value per curve (a cost is known before "
                           f"training), given {given} over the epochs of curve {label(key)}")


def _gapless(idx: np.ndarray, ep: np.ndarray) -> list:
    """Of a curve's rows ``idx`` (sorted by their epochs ``ep``), those of the gapless prefix 1..n; a
    repeated epoch keeps its last row."""
    run, keep = 0, []
    for j, e in enumerate(ep):
        if e == run:
            keep[-1] = idx[j]
        elif e == run + 1:
            run += 1
            keep.append(idx[j])
        else:
            break
    return keep


def _refuse_gaps(groups: dict, epochs: np.ndarray, keys: list[str], name: str) -> None:
    """BadInput naming the first curve (its trial_id, else its config values) whose epochs are not
    exactly 1..n, with the epochs it has; the count of any others."""
    bad = [(key, ep) for key, idx in groups.items()
           if not np.array_equal(ep := np.sort(epochs[idx]), np.arange(1, len(ep) + 1))]
    if not bad:
        return
    key, ep = bad[0]
    values = key if isinstance(key, tuple) else (key,)
    label = ", ".join(f"{k}={v}" for k, v in zip(keys, values))
    others = f" (and {len(bad) - 1} more curve(s) like it)" if len(bad) > 1 else ""
    raise BadInput(f"{name}: curve {clip(label)}: expected epochs 1..n, each once (a curve is its rows of "
                   f"epochs 1..n without a gap), given epochs {_epoch_runs(ep.tolist())}{others}")


def _epoch_runs(epochs: list[int]) -> str:
    """Sorted epochs as runs, for a message: [1, 2, 3, 5, 5, 6] -> "1-3, 5, 5-6" (at most 20 runs)."""
    runs: list[list[int]] = []
    for e in epochs:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:20]]
    return ", ".join(shown) + (f", ... ({len(epochs)} rows)" if len(runs) > 20 else "")


def _check_objectives(objectives, columns: list[str], name: str) -> tuple[tuple[str, str], ...]:
    if objectives is None:
        chosen = tuple(o for o in TABLE_DEFAULT_OBJECTIVES if o[0] in columns)
        if not chosen:
            raise BadInput(f"{name}: expected a column for an objective (top1, gmacs or params_m; or pass "
                           f"objectives), given columns {', '.join(columns) or '(no numeric column)'}")
        return chosen
    out = []
    for metric, mode in objectives:
        if mode not in ("min", "max"):
            raise BadInput(f"objectives: expected METRIC:min or METRIC:max, given {metric}:{mode}")
        if metric in [m for m, _ in out]:
            raise BadInput(f"objectives: expected each metric once, given {metric} twice ("
                           + ", ".join(f"{m}:{d}" for m, d in objectives) + ")")
        if metric not in columns:
            raise BadInput(f"objectives: expected numeric columns of {name} ({', '.join(columns)}), given {metric}")
        out.append((metric, mode))
    if not out:
        raise BadInput("objectives: expected at least one METRIC:MODE, given none")
    return tuple(out)


def _load_campaign(exp: str, objectives) -> Curves:
    import pyarrow.compute as pc

    from qkvsearch.search.analysis.results import collect
    from qkvsearch.search.records.layout import open_campaign

    campaign = open_campaign(exp)
    trials, epochs = collect(exp)
    if trials.num_rows == 0 or epochs.num_rows == 0:
        raise BadInput(f"{exp}: expected a campaign with recorded epochs, given none")
    if objectives is None:
        objectives = campaign.objectives
    cols = ["trial_id"] + [c for c in trials.column_names if c.startswith(CONFIG_PREFIX)]
    cols += [c for c in COST_COLUMNS if c in trials.column_names]
    frame = epochs.drop_columns([c for c in ("trial_name",) + COST_COLUMNS if c in epochs.column_names])
    df = frame.to_pandas().merge(trials.select(cols).to_pandas(), on="trial_id", how="left")
    if df[EPOCH].isna().any():  # an epoch record without its number: it cannot be placed
        log.warning(f"{exp}: left out {int(df[EPOCH].isna().sum())} epoch row(s) without an epoch number")
        df = df[df[EPOCH].notna()]
    max_t = campaign.epochs_planned
    if max_t is None:
        planned = pc.max(trials["epochs_planned"]).as_py()
        max_t = planned if planned else int(df[EPOCH].max())
    return curves_from_frame(df, exp, objectives, max_t=max_t, startup_s=_startup_estimate(trials, epochs),
                             concurrency=campaign.max_concurrent_trials, scheduler=vars(campaign.spec.scheduler),
                             strict=False)


def _startup_estimate(trials, epochs) -> float:
    """Median over trials of (ended_at - started_at - sum of epoch_s): what a trial spends not training."""
    t = trials.select(["trial_id", "started_at", "ended_at"]).to_pandas()
    if "epoch_s" not in epochs.column_names:
        return 0.0
    spent = epochs.select(["trial_id", "epoch_s"]).to_pandas().groupby("trial_id")["epoch_s"].sum()
    wall = (t["ended_at"] - t["started_at"]).dt.total_seconds()
    extra = (wall.to_numpy() - spent.reindex(t["trial_id"]).to_numpy())
    extra = extra[np.isfinite(extra)]
    return float(max(0.0, np.median(extra))) if extra.size else 0.0


def curves_frame(curves: Curves, metrics: Sequence[str]):
    """Curves back as a table in the format above (pandas DataFrame): one row per curve and epoch, the config
    columns that vary between curves, ``epoch``, ``metrics`` (those a row has) and ``epoch_s``; what
    ``qkvsearch simulate`` reads of a campaign, kept as a file."""
    import pandas as pd

    keys = [k for k in (curves.configs[0] if curves.configs else {})
            if len({repr(c.get(k)) for c in curves.configs}) > 1]
    rows = []
    for cfg, results, seconds in zip(curves.configs, curves.results, curves.epoch_s):
        for res, s in zip(results, seconds):
            row = {f"{CONFIG_PREFIX}{k}": _plain(cfg.get(k)) for k in keys}
            row.update({EPOCH: int(res[EPOCH]), **{m: res[m] for m in metrics if m in res}, "epoch_s": float(s)})
            rows.append(row)
    return pd.DataFrame(rows)


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def parse_objectives(text: str) -> list[tuple[str, str]]:
    """``"top1:max,params_m:min"`` -> [("top1", "max"), ("params_m", "min")]."""
    out = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        metric, sep, mode = part.partition(":")
        if not sep or not metric or mode not in ("min", "max"):
            raise BadInput(f"objectives: expected METRIC:min or METRIC:max, comma-separated, given {text!r}")
        out.append((metric, mode))
    if not out:
        raise BadInput(f"objectives: expected METRIC:min or METRIC:max, comma-separated, given {text!r}")
    return out

