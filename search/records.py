"""The campaign's own record of every trial: one JSON file per trial, rewritten atomically on each event.

Tune's `result.json` is overwritten when a trial restarts, and it cannot say *why* a trial ended
(completed, stopped early, diverged, infeasible). These records can. Layout, under the experiment dir:

    qs_campaign.json                    the validated spec, code version, creation time
    qs_trials/<trial_id>.json           config, cost, status, per-epoch metrics, timings, error
    qs_trials/<trial_id>.json.damaged   a record that could not be read, moved aside (not a record)

`read_campaign` and `read_trial_records` are the only readers of these files (status, results, report
and resume use them); `TrialRecorder` is their only writer.

The `qs_` prefix means one thing across the project: a name qkvsearch reserves where it shares a
namespace with Ray Tune, i.e. its files in Tune's experiment folder and the reserved keys of a trial's
results (never a trial config key, never a metric).
"""
from __future__ import annotations

import logging
import math
import os
import subprocess
import time
import types
from functools import lru_cache
from pathlib import Path

import pyarrow.fs as pafs

from qkvsearch.search.storage import loads_json, open_location, write_json
from qkvsearch.spaces.errors import BadInput, show
from qkvsearch.spaces.keys import COST_METRICS

# Reserved result keys: how a trial ended without a score, and the epochs it plans (schedulers and
# searchers tell a stopped trial from a finished one by it). Other reserved keys: trainers.engine.
STATUS_KEY, ERROR_KEY, PLANNED_KEY = "qs_status", "qs_error", "qs_epochs_planned"
# A duplicate trial (its resolved config was trained already) reports its original's outcome under these.
DUPLICATE_OF_KEY, ORIGINAL_STATUS_KEY = "qs_duplicate_of", "qs_original_status"

logger = logging.getLogger(__name__)

CAMPAIGN_FILE = "qs_campaign.json"
TRIALS_DIR = "qs_trials"
DAMAGED_SUFFIX = ".damaged"
# Keys a trial may report that are Tune's bookkeeping, not metrics of ours.
_TUNE_KEYS = {
    "time_this_iter_s", "done", "training_iteration", "trial_id", "date", "timestamp", "time_total_s",
    "pid", "hostname", "node_ip", "config", "time_since_restore", "iterations_since_restore",
    "checkpoint_dir_name", "should_checkpoint", "experiment_tag",
}
_ABSENT = object()


@lru_cache(maxsize=1)
def code_version() -> str:
    """Package version plus the git commit of the source tree when there is one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("qkvsearch")
    except PackageNotFoundError:
        ver = "unknown"
    repo = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return f"{ver}+g{sha}{'.dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return ver


# ---------------------------------------------------------------------------------------- reading
class CampaignFileError(BadInput):
    """A folder holds no usable qs_campaign.json (missing, damaged, or without its spec)."""


def read_campaign(exp) -> dict:
    """The parsed ``<exp>/qs_campaign.json`` (local path or URI): an object with a "spec" mapping.
    Raises CampaignFileError naming the file when it is missing, unreadable, not a JSON object or
    lacks its spec."""
    shown = f"{_display(exp)}/{CAMPAIGN_FILE}"
    fs, root = open_location(exp)
    try:
        with fs.open_input_stream(f"{root}/{CAMPAIGN_FILE}") as f:
            data = f.read()
    except OSError as exc:
        kind = fs.get_file_info(root).type
        if kind == pafs.FileType.NotFound:
            given = f"{_display(exp)}, which does not exist"
        elif kind == pafs.FileType.File:
            given = f"{_display(exp)}, which is a file"
        elif isinstance(exc, FileNotFoundError):
            given = f"{_display(exp)}, which has no {CAMPAIGN_FILE}"
        else:
            given = f"an unreadable file ({exc})"
        raise CampaignFileError(f"{shown}: expected a campaign folder holding {CAMPAIGN_FILE}, given {given}") from None
    campaign, problem = _parse_object(data)
    if problem is None and not isinstance(campaign.get("spec"), dict):
        problem = f"spec: expected a mapping, given {_kind(campaign.get('spec', _ABSENT))}"
    if problem is not None:
        raise CampaignFileError(f"{shown}: {problem}")
    return campaign


def read_trial_records(exp) -> tuple[list[dict], list[str]]:
    """Every readable trial record of a campaign (local path or URI), in file-name order, and one
    message per damaged record ("<file>: expected ..., given ..."), each also logged as a warning.
    Only ``qs_trials/*.json`` files are records: hidden, temp (``*.tmp*``) and moved-aside files are not."""
    fs, root = open_location(exp)
    shown = f"{_display(exp)}/{TRIALS_DIR}"
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/{TRIALS_DIR}", allow_not_found=True))
    records, problems = [], []
    for info in sorted(infos, key=lambda i: i.base_name):
        name = info.base_name
        if info.type != pafs.FileType.File or not name.endswith(".json") or name.startswith(".") or ".tmp" in name:
            continue
        try:
            rec, problem = _read_record(fs, info.path)
        except FileNotFoundError:
            continue  # removed since the listing
        if problem is None:
            records.append(rec)
        else:
            problems.append(f"{shown}/{name}: {problem}")
            logger.warning("skipped damaged trial record %s", problems[-1])
    return records, problems


def _read_record(fs: pafs.FileSystem, path: str) -> tuple[dict | None, str | None]:
    """(record, None) or (None, what is wrong with the file); FileNotFoundError when there is none."""
    try:
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        return None, f"expected a readable file, given {exc}"
    rec, problem = _parse_object(data)
    if problem is None:
        problem = _record_problem(rec)
    return (rec, None) if problem is None else (None, problem)


def _parse_object(data: bytes) -> tuple[dict | None, str | None]:
    if not data.strip():
        return None, "expected a JSON object, given an empty file"
    try:
        obj = loads_json(data)
    except UnicodeDecodeError as exc:
        return None, f"expected UTF-8 JSON, given bytes that are not UTF-8 (at byte {exc.start})"
    except ValueError as exc:
        return None, f"expected a JSON object, given invalid or truncated JSON ({exc})"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, given {_kind(obj)}"
    return obj, None


def _record_problem(rec: dict) -> str | None:
    """What makes a parsed record unusable (the fields readers rely on have the wrong type), or None."""
    if not isinstance(rec.get("trial_id"), str):
        return f"trial_id: expected a string, given {_kind(rec.get('trial_id', _ABSENT))}"
    for key in ("config", "cost"):
        if not isinstance(rec.get(key), dict):
            return f"{key}: expected an object, given {_kind(rec.get(key, _ABSENT))}"
    epochs = rec.get("epochs", _ABSENT)
    if not isinstance(epochs, list):
        return f"epochs: expected a list of objects, given {_kind(epochs)}"
    if not set(map(type, epochs)) <= {dict}:
        bad = next(e for e in epochs if not isinstance(e, dict))
        return f"epochs: expected a list of objects, given a list holding {_kind(bad)}"
    return None


def _kind(value) -> str:
    """A JSON value as a message shows it: containers by type, scalars as written (shortened)."""
    if value is _ABSENT:
        return "nothing"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = show(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _display(exp) -> str:
    return os.fspath(exp).rstrip("/")


def _metrics_of(result: dict) -> dict:
    """The per-epoch metrics a trial reported, without Tune's bookkeeping, reserved (qs_) keys, its
    cost or non-numeric values."""
    out = {}
    for key, value in result.items():
        if key in _TUNE_KEYS or key in COST_METRICS or key.startswith("qs_") or isinstance(value, bool):
            continue  # cost metrics ride along each result for the schedulers; the record holds them once
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return out


class _Recorder:
    """Tune callback (runs in the campaign's driver process) that keeps `qs_trials/<id>.json` current.

    `describe(trial)` returns the trial's flat config, readable name, cost and planned epochs; the
    campaign supplies it so the recorder needs no knowledge of specs or models. A finished trial's
    summary line goes to `echo` (default: this module's logger, at info level).
    """

    def __init__(self, experiment_uri: str, campaign: str, describe, echo=None):
        self.experiment_uri = experiment_uri.rstrip("/")
        self.campaign = campaign
        self.describe = describe
        self.echo = echo or logger.info
        self.records: dict[str, dict] = {}

    # -- record bookkeeping ------------------------------------------------------------------
    def _record(self, trial) -> dict:
        rec = self.records.get(trial.trial_id)
        if rec is None:
            info = self.describe(trial)
            rec = {
                "trial_id": trial.trial_id, "trial_name": info["name"], "campaign": self.campaign,
                "code_version": code_version(), "status": "pending", "config": info["config"],
                "cost": info["cost"], "epochs": [], "epochs_planned": info["epochs_planned"],
                "error": None, "checkpoint_path": None, "started_at": None, "ended_at": None,
                "first_step_at": None, "train_s_total": 0.0,
            }
            rec.update(self._load_existing(trial.trial_id) or {})  # a field an older record lacks stays fresh
            self.records[trial.trial_id] = rec
        return rec

    def _load_existing(self, trial_id: str) -> dict | None:
        """On resume, continue the record a previous driver wrote (its epoch history survives). A damaged
        record is moved aside to `<trial_id>.json.damaged`, never overwritten: it may hold the only copy."""
        uri = self._uri(trial_id)
        fs, path = open_location(uri)
        try:
            rec, problem = _read_record(fs, path)
        except FileNotFoundError:
            return None
        if problem is None:
            return rec
        aside = path + DAMAGED_SUFFIX
        n = 0
        while fs.get_file_info(aside).type != pafs.FileType.NotFound:
            n += 1
            aside = f"{path}{DAMAGED_SUFFIX}.{n}"
        fs.move(path, aside)
        logger.warning("trial record %s is damaged (%s); moved it to %s and started a fresh record",
                       uri, problem, uri + aside[len(path):])
        return None

    def _uri(self, trial_id: str) -> str:
        return f"{self.experiment_uri}/{TRIALS_DIR}/{trial_id}.json"

    def _save(self, rec: dict) -> None:
        write_json(self._uri(rec["trial_id"]), rec)

    # -- Tune hooks ----------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        rec["status"] = "running"
        rec["started_at"] = rec["started_at"] or time.time()
        rec["ended_at"] = None
        self._save(rec)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        rec = self._record(trial)
        status = result.get(STATUS_KEY)
        if status in ("infeasible", "diverged"):
            rec["status"] = status
            rec["error"] = result.get(ERROR_KEY)
        elif status == "duplicate":  # trained nothing: its outcome is its original's, recorded there
            rec["status"] = status
            rec["duplicate_of"] = result.get(DUPLICATE_OF_KEY)
        else:
            metrics = _metrics_of(result)
            if "epoch" in metrics:
                # A resumed trial re-reports epochs it already had: keep one row per epoch.
                rec["epochs"] = [e for e in rec["epochs"] if e.get("epoch") != metrics["epoch"]] + [metrics]
                rec["epochs"].sort(key=lambda e: e["epoch"])
                rec["train_s_total"] = sum(e.get("train_s", 0.0) for e in rec["epochs"])
        if result.get("qs_first_step_at") and not rec.get("first_step_at"):
            rec["first_step_at"] = float(result["qs_first_step_at"])  # start-up = this - started_at
        if result.get("checkpoint_path"):
            rec["checkpoint_path"] = str(result["checkpoint_path"])
        self._save(rec)

    def on_trial_complete(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        if rec["status"] not in ("infeasible", "diverged", "duplicate"):
            done = max((e.get("epoch", 0) for e in rec["epochs"]), default=0)
            rec["status"] = "completed" if done >= rec["epochs_planned"] else "stopped_early"
        self._finish(rec)

    def on_trial_error(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        rec["status"] = "failed"
        rec["error"] = _error_text(trial)
        self._finish(rec)

    def _finish(self, rec: dict) -> None:
        rec["ended_at"] = time.time()
        self._save(rec)
        self.echo(_summary_line(rec))


def __getattr__(name: str):
    # TrialRecorder subclasses ray.tune.Callback. Built on first use, so that the readers above (status,
    # results, report) do not import Ray, which takes seconds.
    if name == "TrialRecorder":
        from ray.tune import Callback

        cls = types.new_class("TrialRecorder", (_Recorder, Callback),
                              exec_body=lambda ns: ns.update(__module__=__name__, __doc__=_Recorder.__doc__))
        globals()["TrialRecorder"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None) or ""
    try:
        if path and os.path.exists(path):
            text = Path(path).read_text().strip()
            return text[-4000:]
    except OSError:
        pass
    return str(getattr(trial, "error_msg", None) or "trial failed (no error file)")


def _summary_line(rec: dict) -> str:
    last = rec["epochs"][-1] if rec["epochs"] else {}
    cost = rec["cost"]
    parts = [f"[{rec['status']:>13}] {rec['trial_name']}"]
    if "top1" in last:
        parts.append(f"top1 {last['top1']:.1f}%")
    parts.append(f"{cost.get('params_m', float('nan')):.3f}M params, {cost.get('gmacs', float('nan')):.4f} GMACs")
    parts.append(f"{len(rec['epochs'])}/{rec['epochs_planned']} epochs, {rec['train_s_total']:.1f} s training")
    if rec.get("error") and rec["status"] in ("failed", "diverged", "infeasible"):
        parts.append(rec["error"].strip().splitlines()[-1][:160])
    if rec.get("duplicate_of"):
        parts.append(f"same configuration as trial {rec['duplicate_of']}: not trained again")
    return " | ".join(parts)
