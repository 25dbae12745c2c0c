"""Collect a campaign's record files into two Arrow tables (trials, epochs) and write them as Parquet.

Reads ``<exp>/qs_campaign.json``, ``<exp>/qs_trials/*.json`` and their ``*.epochs.csv`` through
``search.records.readers.read_trials`` (so the experiment dir may be a local path or a URI: ``s3://``,
``gs://``, ``file://``), which hands the epochs over as columns: no per-epoch Python objects. A
campaign may still be running: what has been recorded so far is collected, and a damaged record is
left out (a damaged epochs file gives the epochs it still can), with a warning logged naming the
file. The campaign's own files are only ever read. Column names, types and units:
search/RESULTS_SCHEMA.md.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from qkvsearch.search.records.inherited import FIDELITY_STANDALONE
from qkvsearch.search.records.layout import read_campaign
from qkvsearch.search.records.outputs import RESULTS_DIR, check_output_dir
from qkvsearch.search.records.readers import read_trials
from qkvsearch.spaces.blocks import PER_BLOCK_KEYS, block_key, split_block_key
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.keys import RESOLVED_KEYS, key_of
from qkvsearch.spaces.metrics import COST_METRICS, EPOCH, MEASURED_METRICS
from qkvsearch.storage import write_bytes

__all__ = [
    "collect",
    "resolve_out_dir",
    "parquet_file",
    "parquet_files",
    "write_results",
    "TRIALS_FILE",
    "EPOCHS_FILE",
]

TRIALS_FILE = "trials.parquet"
EPOCHS_FILE = "epochs.parquet"

# Per-epoch metrics every trainer reports (contract), in column order; other numeric keys follow sorted.
KNOWN_METRICS = ("train_loss", "val_loss", "top1", "top5", "lr", "images_per_s", "epoch_s", "train_s")
FINAL_SKIP = (EPOCH, *COST_METRICS)  # constant per trial (older records carry them per epoch)
BEST = {"top1": "max", "top5": "max", "val_loss": "min", "train_loss": "min"}

ARROW_TYPES = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string()}
# Column type of every trial key (spaces.keys); keys of older records get an inferred type.
CONFIG_TYPES: dict[str, pa.DataType] = {k.name: ARROW_TYPES[k.arrow] for k in RESOLVED_KEYS.values()}
CONFIG_PREFIX = "config_"


def config_columns_markdown() -> str:
    """The config-column table of search/RESULTS_SCHEMA.md, from the key declarations (docs/hooks.py renders it
    there when the documentation site is built)."""
    rows = ["| column | type | default | unit | meaning |", "|---|---|---|---|---|"]
    for key in RESOLVED_KEYS.values():
        default = "" if key.default is None else f"`{json.dumps(key.default)}`"
        rows.append(f"| `{CONFIG_PREFIX}{key.name}` | {key.arrow} | {default} | {key.unit} | {key.doc} |")
    for name in PER_BLOCK_KEYS:
        key = RESOLVED_KEYS[name]
        rows.append(f"| `{CONFIG_PREFIX}{block_key(name, '<i>')}` | {key.arrow} | | {key.unit} | block i's own {name} "
                    f"(spaces.blocks.PER_BLOCK_KEYS); null: the block takes `{CONFIG_PREFIX}{name}` |")
    return "\n".join(rows)
TS = pa.timestamp("us", tz="UTC")

TRIAL_HEAD: tuple[tuple[str, pa.DataType], ...] = (
    ("trial_id", pa.string()), ("trial_name", pa.string()), ("campaign", pa.string()),
    ("code_version", pa.string()), ("status", pa.string()),
)
TRIAL_COST: tuple[tuple[str, pa.DataType], ...] = (
    ("params_m", pa.float64()), ("gmacs", pa.float64()), ("params", pa.int64()),
    ("embed_params", pa.int64()),
    *((m, pa.float64()) for m in MEASURED_METRICS),   # null unless the campaign measures them
)
# How the measured cost was measured (the record's ``measured_on``): p90 latency, and the device and
# settings in words, e.g. "NVIDIA H100 80GB HBM3, bf16, compiled, batch 64 / 1 / 128, torch 2.9.0, CUDA 12.8".
TRIAL_MEASURED: tuple[tuple[str, pa.DataType], ...] = (("latency_p90_ms", pa.float64()), ("measured_on", pa.string()))
TRIAL_TAIL: tuple[tuple[str, pa.DataType], ...] = (
    ("best_epoch", pa.int64()), ("epochs_run", pa.int64()), ("epochs_planned", pa.int64()),
    ("train_s_total", pa.float64()), ("checkpoint_path", pa.string()), ("started_at", TS), ("ended_at", TS),
    ("error", pa.string()), ("fidelity", pa.string()), ("supernet", pa.string()), ("config_json", pa.string()),
)


# ---------------------------------------------------------------------------------------- coercion
def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _to_float(v):
    return float(v) if _is_num(v) else None


def _to_int(v):
    if finite(v) is not None and float(v).is_integer():
        return int(v)
    return None


def _to_str(v):
    if v is None:
        return None
    if type(v) is int:
        return str(v)  # what json.dumps writes for an int, without its call
    return v if isinstance(v, str) else _SORTED_JSON.encode(v)


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
    seconds = finite(v)
    return None if seconds is None else int(round(seconds * 1e6))


# ---------------------------------------------------------------------------------------- epochs
def _epoch_metric_names(read: list[str]) -> list[str]:
    """Metric columns: the contract's in order, then every other metric read, sorted."""
    extra = set(read) - set(KNOWN_METRICS) - {EPOCH}
    return list(KNOWN_METRICS) + sorted(extra)


def _epochs_table(trial_ids: pa.Array, names: pa.Array, counts: np.ndarray, columns: dict[str, np.ndarray],
                  metric_names: list[str]) -> pa.Table:
    """Per trial its id and name; columns: epoch and every metric as (E,) float64, NaN where missing,
    rows trial after trial."""
    take = pa.array(np.repeat(np.arange(len(counts)), counts))
    epoch = columns[EPOCH]
    missing = np.isnan(epoch)
    out = {
        "trial_id": trial_ids.take(take),
        "trial_name": names.take(take),
        EPOCH: pa.array(np.where(missing, 0, epoch).astype(np.int64), mask=missing),
    }
    for m in metric_names:
        out[m] = pa.array(columns[m], pa.float64(), from_pandas=True)  # NaN -> null
    return pa.table(out)


# ---------------------------------------------------------------------------------------- trials
def _summaries(columns: dict[str, np.ndarray], counts: np.ndarray, metric_names: list[str]) -> dict[str, np.ndarray]:
    """Per trial (T,) float64, NaN for none: final_<m> (value at the last reported epoch), best_<m>
    (BEST direction, NaN-aware) and best_epoch (epoch of the best top1). Vectorised over segments of
    the flat epoch array."""
    n = len(counts)
    counts_a = np.asarray(counts, dtype=np.int64)
    nonempty = counts_a > 0
    starts = (np.cumsum(counts_a) - counts_a)[nonempty]  # (T,) first row of each non-empty trial
    last = (np.cumsum(counts_a) - 1)[nonempty]
    seg_of_row = np.repeat(np.arange(starts.size), counts_a[nonempty])  # (E,) segment of each row

    def column(m):
        return columns[m]  # (E,), NaN where missing

    def per_trial(seg_values):
        full = np.full(n, np.nan)
        full[nonempty] = seg_values
        return full

    out: dict[str, np.ndarray] = {}
    for m in metric_names:
        if m not in FINAL_SKIP:
            out[f"final_{m}"] = per_trial(column(m)[last])
    epoch = column(EPOCH)
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
    return out


# Python types a column takes as they are (pyarrow converts them as the casts would); others go through the cast.
_AS_IS = {pa.int64(): {int}, pa.float64(): {float, int}, pa.string(): {str}, pa.bool_(): {bool}}


def config_columns(configs: list[dict]) -> list[tuple[str, pa.DataType, pa.Array]]:
    keys: list[str] = list(CONFIG_TYPES)
    # per-block keys by key then block, then keys no longer declared by name
    extra = sorted(set().union(*configs) - set(CONFIG_TYPES),
                   key=lambda k: (0, *b) if (b := split_block_key(k)) else (1, k, 0))
    cols = []
    for key in keys + extra:
        raw = [c.get(key) for c in configs]
        declared = key_of(key)   # a per-block key's column is typed as its key's
        typ = ARROW_TYPES[declared.arrow] if declared is not None else _infer_type(raw)
        cols.append((CONFIG_PREFIX + key, typ, _typed(raw, typ)))
    return cols


_SORTED_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(..., sort_keys=True), built once


def _typed(raw: list, typ: pa.DataType) -> pa.Array:
    """Values as a column of ``typ``, each coerced by the type's cast (one that does not fit is null);
    a column whose values all fit as they are goes to pyarrow in one call."""
    if set(map(type, raw)) - {type(None)} <= _AS_IS[typ]:
        try:
            return pa.array(raw, typ)
        except (pa.ArrowInvalid, OverflowError):
            pass  # e.g. an int too large for float64 exactly: the cast decides
    return pa.array(list(map(_CASTS[typ], raw)), typ)


def _timestamps(raw: list) -> pa.Array:
    """Unix seconds (numbers; anything else, or non-finite, is null) -> TS."""
    if set(map(type, raw)) <= {float, int, type(None)}:
        seconds = np.array(raw, dtype=np.float64)  # None -> NaN
        micros = np.round(seconds * 1e6)  # half to even, as round() does
        missing = ~np.isfinite(micros)
        return pa.array(np.where(missing, 0, micros).astype(np.int64), pa.int64(), mask=missing).cast(TS)
    return pa.array([_timestamp(v) for v in raw], pa.int64()).cast(TS)


def _trial_columns(records: list[dict]) -> dict[str, pa.Array]:
    """The record fields of the trials table (as read_trials checks records), in the schema's types."""
    cost = [r["cost"] for r in records]
    out = {"trial_id": pa.array([r["trial_id"] for r in records], pa.string())}
    for name, typ in TRIAL_HEAD[1:]:
        out[name] = _typed([r.get(name) for r in records], typ)
    for name, typ in TRIAL_COST:
        out[name] = _typed([c.get(name) for c in cost], typ)
    how = [r.get("measured_on") if isinstance(r.get("measured_on"), dict) else {} for r in records]
    out["latency_p90_ms"] = _typed([h.get("latency_p90_ms") for h in how], pa.float64())
    out["measured_on"] = pa.array([measured_on_text(h.get("env")) for h in how], pa.string())
    for name, typ in TRIAL_TAIL:
        if typ == TS:
            out[name] = _timestamps([r.get(name) for r in records])
        elif name == "fidelity":  # a trial without one trained its own weights, as every trial did before
            out[name] = pa.array([r.get(name) or FIDELITY_STANDALONE for r in records], pa.string())
        elif name == "config_json":
            out[name] = pa.array([_SORTED_JSON.encode(r["config"]) for r in records], pa.string())
        elif name not in ("best_epoch", "epochs_run"):  # those come from the epochs
            out[name] = _typed([r.get(name) for r in records], typ)
    return out


def measured_on_text(env) -> str | None:
    """A measurement's environment (trainers.deploy.measure.environment) in words; None without one."""
    if not isinstance(env, dict):
        return None
    compiled = "compiled" if env.get("compile") else "eager"
    batches = " / ".join(str(env.get(k)) for k in ("batch", "latency_batch", "train_batch"))
    parts = [str(env.get("device")), str(env.get("precision")), compiled, f"batch {batches}",
             f"torch {env.get('torch')}"]
    if env.get("cuda"):
        parts.append(f"CUDA {env['cuda']}" + (f", driver {env['driver']}" if env.get("driver") else ""))
    if env.get("device_type") == "cpu":
        parts.append(f"{env.get('threads')} threads")
    if env.get("gpu_shared"):
        parts.append("GPU shared with another process")
    return ", ".join(parts)


def collect(experiment_dir, *, opened: bool = False) -> tuple[pa.Table, pa.Table]:
    """Experiment dir (path or URI) -> (trials, epochs) Arrow tables, one row per trial (sorted by
    trial_id) and one per reported epoch. Works on a running campaign (what is recorded so far).
    opened: the caller has read the campaign file already (else it is read first, to fail naming it)."""
    if not opened:
        read_campaign(experiment_dir)  # fails early, naming the file, when the folder is not a campaign
    read = read_trials(experiment_dir)  # damaged records are left out and logged
    epochs = read.epoch_columns()
    order = sorted(range(len(read.records)), key=lambda i: read.records[i]["trial_id"])
    records = [read.records[i] for i in order]
    counts = epochs.counts[order]
    take = None  # epoch rows in trial_id order, when the records were read in another
    if order != sorted(order):
        firsts = np.cumsum(epochs.counts) - epochs.counts
        take = np.concatenate([np.arange(firsts[i], firsts[i] + epochs.counts[i]) for i in order]
                              + [np.zeros(0, np.int64)])
    fields = _trial_columns(records)

    metric_names = _epoch_metric_names(epochs.names)
    gap = np.full(len(epochs.values), np.nan)  # a contract metric nobody reported
    columns = {}
    for name in [EPOCH, *metric_names]:
        col = epochs.values[:, epochs.names.index(name)] if name in epochs.names else gap
        columns[name] = col if take is None else col[take]
    epochs_table = _epochs_table(fields["trial_id"], fields["trial_name"], counts, columns, metric_names)
    summary = _summaries(columns, counts, metric_names)
    summary["epochs_run"] = counts.astype(np.float64)

    out: dict[str, pa.Array] = {name: fields[name] for name, _ in TRIAL_HEAD}
    for name, _, array in config_columns([r["config"] for r in records]):
        out[name] = array
    for name, _ in (*TRIAL_COST, *TRIAL_MEASURED):
        out[name] = fields[name]
    for name in (sorted(k for k in summary if k.startswith("final_"))
                 + sorted(k for k in summary if k.startswith("best_") and k != "best_epoch")):
        out[name] = pa.array(summary[name], pa.float64(), from_pandas=True)  # NaN -> null
    for name, typ in TRIAL_TAIL:
        if name in summary:  # (T,) float64, NaN for none; the int64 ones hold whole numbers
            missing = np.isnan(summary[name])
            out[name] = pa.array(np.where(missing, 0, summary[name]).astype(np.int64), typ, mask=missing)
        else:
            out[name] = fields[name]
    return pa.table(out), epochs_table


# ---------------------------------------------------------------------------------------- writing
def parquet_file(table: pa.Table) -> pa.Buffer:
    """``table`` as a zstd-compressed Parquet file in memory, for storage.write_bytes to write whole."""
    sink = pa.BufferOutputStream()
    # Dictionary pages for the string columns only: metric values are nearly all distinct, and building
    # a dictionary for them before falling back to plain pages slows the write by about a sixth.
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(table, sink, compression="zstd", use_dictionary=strings)
    return sink.getvalue()


def resolve_out_dir(experiment_dir, out_dir, default: str) -> str:
    """An output folder as a path or URI in the form given: ``out_dir``, else ``<exp>/<default>``, once
    search.records.outputs.check_output_dir accepts it as --out (no file, nothing of the campaign's
    own: its files are never touched). Nothing is created here."""
    text = os.fspath(experiment_dir).rstrip("/") + "/" + default if out_dir is None else out_dir
    return check_output_dir(text, "--out", campaign=experiment_dir)


def parquet_files(trials: pa.Table, epochs: pa.Table) -> dict[str, pa.Buffer]:
    """{TRIALS_FILE: ..., EPOCHS_FILE: ...}: the two tables as zstd Parquet files in memory. pyarrow
    encodes without holding the GIL, so a thread can run this beside Python work."""
    return {TRIALS_FILE: parquet_file(trials), EPOCHS_FILE: parquet_file(epochs)}


def write_results(experiment_dir, out_dir=None, tables: tuple[pa.Table, pa.Table] | None = None,
                  files: dict[str, pa.Buffer] | None = None) -> dict[str, str]:
    """Collect and write trials.parquet and epochs.parquet (zstd) atomically into ``out_dir``
    (default ``<exp>/results/``). ``tables`` reuses an earlier ``collect`` result, ``files`` an
    earlier ``parquet_files`` one. Returns {"trials": path, "epochs": path} as paths (or URIs) in
    the form given."""
    out = resolve_out_dir(experiment_dir, out_dir, RESULTS_DIR)
    if files is None:
        files = parquet_files(*(tables if tables is not None else collect(experiment_dir)))
    written = {"trials": f"{out}/{TRIALS_FILE}", "epochs": f"{out}/{EPOCHS_FILE}"}
    write_bytes(written["trials"], files[TRIALS_FILE])
    write_bytes(written["epochs"], files[EPOCHS_FILE])
    return written
