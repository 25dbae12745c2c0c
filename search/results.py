"""Collect a campaign's record files into two Arrow tables (trials, epochs) and write them as Parquet.

Reads ``<exp>/qs_campaign.json`` and ``<exp>/qs_trials/*.json`` through ``search.records`` (so the
experiment dir may be a local path or a URI: ``s3://``, ``gs://``, ``file://``). A campaign may still
be running: what has been recorded so far is collected, and a damaged record is left out, with a
warning logged naming the file. The campaign's own files are only ever read.
Column names, types and units: search/RESULTS_SCHEMA.md.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from qkvsearch.search.records import TRIALS_DIR, read_campaign, read_trial_records
from qkvsearch.search.storage import open_location, write_bytes
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.keys import COST_METRICS, RESOLVED_KEYS

__all__ = [
    "collect",
    "load_campaign_record",
    "resolve_out_dir",
    "write_results",
    "TRIALS_FILE",
    "EPOCHS_FILE",
]

TRIALS_FILE = "trials.parquet"
EPOCHS_FILE = "epochs.parquet"

# Per-epoch metrics every trainer reports (contract), in column order; other numeric keys follow sorted.
KNOWN_METRICS = ("train_loss", "val_loss", "top1", "top5", "lr", "images_per_s", "epoch_s", "train_s")
FINAL_SKIP = ("epoch", *COST_METRICS)  # constant per trial (older records carry them per epoch)
BEST = {"top1": "max", "top5": "max", "val_loss": "min", "train_loss": "min"}

ARROW_TYPES = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string()}
# Column type of every trial key (spaces.keys); keys of older records get an inferred type.
CONFIG_TYPES: dict[str, pa.DataType] = {k.name: ARROW_TYPES[k.arrow] for k in RESOLVED_KEYS.values()}
CONFIG_PREFIX = "config_"


def config_columns_markdown() -> str:
    """The config-column table of search/RESULTS_SCHEMA.md, from the key declarations (a test compares)."""
    rows = ["| column | type | default | unit | meaning |", "|---|---|---|---|---|"]
    for key in RESOLVED_KEYS.values():
        default = "" if key.default is None else f"`{json.dumps(key.default)}`"
        rows.append(f"| `{CONFIG_PREFIX}{key.name}` | {key.arrow} | {default} | {key.unit} | {key.doc} |")
    return "\n".join(rows)
TS = pa.timestamp("us", tz="UTC")

TRIAL_HEAD: tuple[tuple[str, pa.DataType], ...] = (
    ("trial_id", pa.string()), ("trial_name", pa.string()), ("campaign", pa.string()),
    ("code_version", pa.string()), ("status", pa.string()),
)
TRIAL_COST: tuple[tuple[str, pa.DataType], ...] = (
    ("params_m", pa.float64()), ("gmacs", pa.float64()), ("params", pa.int64()),
    ("embed_params", pa.int64()),
)
TRIAL_TAIL: tuple[tuple[str, pa.DataType], ...] = (
    ("best_epoch", pa.int64()), ("epochs_run", pa.int64()), ("epochs_planned", pa.int64()),
    ("train_s_total", pa.float64()), ("checkpoint_path", pa.string()), ("started_at", TS), ("ended_at", TS),
    ("error", pa.string()), ("config_json", pa.string()),
)


load_campaign_record = read_campaign  # the parsed qs_campaign.json; CampaignFileError naming it otherwise


# ---------------------------------------------------------------------------------------- coercion
def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _to_float(v):
    return float(v) if _is_num(v) else None


def _to_int(v):
    if _is_num(v) and math.isfinite(v) and float(v).is_integer():
        return int(v)
    return None


def _to_str(v):
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _to_bool(v):
    return v if isinstance(v, bool) else None


_CASTS = {pa.float64(): _to_float, pa.int64(): _to_int, pa.string(): _to_str, pa.bool_(): _to_bool}


def _infer_type(values: list) -> pa.DataType:
    """Type of an unknown config key from its non-null values: bool, int64, float64, else string."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.bool_()
    if present and all(_is_num(v) for v in present):
        return pa.int64() if all(isinstance(v, int) for v in present) else pa.float64()
    return pa.string()


def _timestamp(v):
    """Unix seconds -> int microseconds (the storage of TS)."""
    return int(round(v * 1e6)) if _is_num(v) and math.isfinite(v) else None


# ---------------------------------------------------------------------------------------- epochs
def _epoch_metric_names(epoch_lists: list[list]) -> list[str]:
    seen: set[str] = set()
    for epochs in epoch_lists:
        seen.update(*epochs)  # keys of every epoch dict, iterated in C
    seen.discard("epoch")
    return list(KNOWN_METRICS) + sorted(seen - set(KNOWN_METRICS))


def _epoch_matrix(epoch_lists: list[list], names: list[str]) -> np.ndarray:
    """All epochs as one (E, 1 + M) float64 matrix, columns ["epoch", *names], trial after trial;
    missing or non-numeric values are NaN. A trial whose epochs share one key order (the usual case)
    is converted in one numpy call; others value by value."""
    col_of = {n: j for j, n in enumerate(["epoch", *names])}
    total = sum(len(e) for e in epoch_lists)
    out = np.full((total, len(col_of)), np.nan, order="F")  # column-major: each column contiguous
    row = 0
    for epochs in epoch_lists:
        if not epochs:
            continue
        block = None
        if len(set(map(tuple, epochs))) == 1:  # one key order for every epoch (C-level loops)
            try:
                block = np.array(list(map(list, map(dict.values, epochs))), dtype=np.float64)  # (E_t, K)
            except (TypeError, ValueError):
                block = None  # a string or nested value: fall back
        if block is not None and block.ndim == 2:
            out[row:row + len(epochs), [col_of[k] for k in epochs[0]]] = block
        else:
            for i, e in enumerate(epochs):
                for k, v in e.items():
                    f = _to_float(v)
                    if f is not None:
                        out[row + i, col_of[k]] = f
        row += len(epochs)
    return out


def _epochs_table(trial_ids: list[str], names: list[str], epoch_lists: list[list], metric_names: list[str]):
    matrix = _epoch_matrix(epoch_lists, metric_names)  # (E, 1 + M)
    counts = np.array([len(e) for e in epoch_lists], dtype=np.int64)
    take = pa.array(np.repeat(np.arange(len(counts)), counts))
    epoch = matrix[:, 0]
    columns = {
        "trial_id": pa.array(trial_ids, pa.string()).take(take),
        "trial_name": pa.array(names, pa.string()).take(take),
        "epoch": pa.array(np.where(np.isnan(epoch), 0, epoch).astype(np.int64), mask=np.isnan(epoch)),
    }
    for j, m in enumerate(metric_names, start=1):
        columns[m] = pa.array(matrix[:, j], pa.float64(), from_pandas=True)  # NaN -> null
    return pa.table(columns), matrix


# ---------------------------------------------------------------------------------------- trials
def _summaries(matrix: np.ndarray, counts: list[int], metric_names: list[str]) -> dict[str, list]:
    """Per trial: final_<m> (value at the last reported epoch), best_<m> (BEST direction, NaN-aware)
    and best_epoch (epoch of the best top1). Vectorised over segments of the flat epoch array."""
    n = len(counts)
    counts_a = np.asarray(counts, dtype=np.int64)
    nonempty = counts_a > 0
    starts = (np.cumsum(counts_a) - counts_a)[nonempty]  # (T,) first row of each non-empty trial
    last = (np.cumsum(counts_a) - 1)[nonempty]
    seg_of_row = np.repeat(np.arange(starts.size), counts_a[nonempty])  # (E,) segment of each row

    index = {n: j for j, n in enumerate(["epoch", *metric_names])}

    def column(m):
        return matrix[:, index[m]]  # (E,), NaN where missing

    def per_trial(seg_values):
        full = np.full(n, np.nan)
        full[nonempty] = seg_values
        return full

    out: dict[str, np.ndarray] = {}
    for m in metric_names:
        if m not in FINAL_SKIP:
            out[f"final_{m}"] = per_trial(column(m)[last])
    epoch = column("epoch")
    for m, mode in BEST.items():
        col = column(m)
        if starts.size == 0:
            out[f"best_{m}"] = np.full(n, np.nan)
            continue
        sign = 1.0 if mode == "max" else -1.0
        score = np.where(np.isnan(col), -np.inf, sign * col)
        best = np.maximum.reduceat(score, starts)  # (T,)
        hit_row = np.where(score == best[seg_of_row], np.arange(col.size), col.size)
        first = np.minimum.reduceat(hit_row, starts)  # (T,) first row reaching the best
        best_val = np.where(np.isneginf(best), np.nan, sign * best)
        out[f"best_{m}"] = per_trial(best_val)
        if m == "top1":
            out["best_epoch"] = per_trial(np.where(np.isneginf(best), np.nan, epoch[np.minimum(first, col.size - 1)]))
    out.setdefault("best_epoch", np.full(n, np.nan))
    return {k: [None if math.isnan(x) else float(x) for x in v.tolist()] for k, v in out.items()}


def _config_columns(configs: list[dict]) -> list[tuple[str, pa.DataType, list]]:
    keys: list[str] = list(CONFIG_TYPES)
    extra = sorted({k for c in configs for k in c} - set(CONFIG_TYPES))
    cols = []
    for key in keys + extra:
        raw = [c.get(key) for c in configs]
        typ = CONFIG_TYPES.get(key) or _infer_type(raw)
        cast = _CASTS[typ]
        cols.append((CONFIG_PREFIX + key, typ, [cast(v) for v in raw]))
    return cols


def _trial_row(rec: dict) -> dict:
    """Scalar fields of one record (as read_trial_records checks it), coerced to the schema's Python types."""
    cost, config = rec["cost"], rec["config"]
    return {
        "trial_id": rec["trial_id"], "trial_name": _to_str(rec.get("trial_name")),
        "campaign": _to_str(rec.get("campaign")), "code_version": _to_str(rec.get("code_version")),
        "status": _to_str(rec.get("status")),
        "params_m": _to_float(cost.get("params_m")), "gmacs": _to_float(cost.get("gmacs")),
        "params": _to_int(cost.get("params")), "embed_params": _to_int(cost.get("embed_params")),
        "epochs_planned": _to_int(rec.get("epochs_planned")),
        "train_s_total": _to_float(rec.get("train_s_total")),
        "checkpoint_path": _to_str(rec.get("checkpoint_path")),
        "started_at": _timestamp(rec.get("started_at")), "ended_at": _timestamp(rec.get("ended_at")),
        "error": _to_str(rec.get("error")), "config_json": json.dumps(config, sort_keys=True),
        "_config": config,
    }


def collect(experiment_dir) -> tuple[pa.Table, pa.Table]:
    """Experiment dir (path or URI) -> (trials, epochs) Arrow tables, one row per trial (sorted by
    trial_id) and one per reported epoch. Works on a running campaign (what is recorded so far)."""
    read_campaign(experiment_dir)  # fails early, naming the file, when the folder is not a campaign
    records, _ = read_trial_records(experiment_dir)  # damaged records are left out and logged
    rows = [_trial_row(rec) for rec in records]
    epoch_lists = [rec["epochs"] for rec in records]
    order = sorted(range(len(rows)), key=lambda i: rows[i]["trial_id"])
    rows = [rows[i] for i in order]
    epoch_lists = [epoch_lists[i] for i in order]

    metric_names = _epoch_metric_names(epoch_lists)
    ids = [r["trial_id"] for r in rows]
    epochs_table, matrix = _epochs_table(ids, [r["trial_name"] for r in rows], epoch_lists, metric_names)
    counts = [len(e) for e in epoch_lists]
    summary = _summaries(matrix, counts, metric_names)
    summary["epochs_run"] = counts

    columns: dict[str, pa.Array] = {}
    for name, typ in TRIAL_HEAD:
        columns[name] = pa.array([r[name] for r in rows], typ)
    for name, typ, values in _config_columns([r["_config"] for r in rows]):
        columns[name] = pa.array(values, typ)
    for name, typ in TRIAL_COST:
        columns[name] = pa.array([r[name] for r in rows], typ)
    for name in sorted(k for k in summary if k.startswith("final_")) + sorted(k for k in summary if k.startswith("best_") and k != "best_epoch"):
        columns[name] = pa.array(summary[name], pa.float64())
    for name, typ in TRIAL_TAIL:
        values = summary[name] if name in summary else [r[name] for r in rows]
        if typ == pa.int64():
            values = [None if v is None else int(v) for v in values]
        columns[name] = pa.array(values, pa.int64()).cast(typ) if typ == TS else pa.array(values, typ)
    return pa.table(columns), epochs_table


# ---------------------------------------------------------------------------------------- writing
def _parquet_file(table: pa.Table) -> pa.Buffer:
    """``table`` as a zstd-compressed Parquet file in memory, for storage.write_bytes to write whole."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def resolve_out_dir(experiment_dir, out_dir, default: str) -> str:
    """An output folder as a path or URI in the form given: ``out_dir``, else ``<exp>/<default>``.
    BadInput when it is an existing file, the campaign folder itself or its record folder (the
    campaign's files are never touched). Nothing is created here."""
    exp_fs, root = open_location(experiment_dir)
    text = os.fspath(experiment_dir).rstrip("/") + "/" + default if out_dir is None else os.fspath(out_dir).rstrip("/")
    fs, path = open_location(text)
    if type(fs) is type(exp_fs) and path.rstrip("/") in (root, f"{root}/{TRIALS_DIR}"):
        raise BadInput(f"out: expected a folder other than the campaign's own ({root}), given {text}")
    if fs.get_file_info(path).type == pafs.FileType.File:
        raise BadInput(f"out: expected a folder, given {text}, which is a file")
    return text


def write_results(experiment_dir, out_dir=None, tables: tuple[pa.Table, pa.Table] | None = None) -> dict[str, str]:
    """Collect and write trials.parquet and epochs.parquet (zstd) atomically into ``out_dir``
    (default ``<exp>/results/``). ``tables`` reuses an earlier ``collect`` result.
    Returns {"trials": path, "epochs": path} as paths (or URIs) in the form given."""
    out = resolve_out_dir(experiment_dir, out_dir, "results")
    trials, epochs = tables if tables is not None else collect(experiment_dir)
    written = {"trials": f"{out}/{TRIALS_FILE}", "epochs": f"{out}/{EPOCHS_FILE}"}
    write_bytes(written["trials"], _parquet_file(trials))
    write_bytes(written["epochs"], _parquet_file(epochs))
    return written
