"""The campaign's own record of every trial: one JSON file per trial, rewritten atomically on each event.

Tune's `result.json` is overwritten when a trial restarts, and it cannot say *why* a trial ended
(completed, stopped early, diverged, infeasible). These records can. Layout, under the experiment dir:

    qs_campaign.json            the validated spec, code version, creation time
    qs_trials/<trial_id>.json   config, cost, status, per-epoch metrics, timings, error

Results collection (`search.results`) reads only these files.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import time
import uuid
from functools import lru_cache
from pathlib import Path

import pyarrow.fs as pafs
from ray.tune import Callback

STATUSES = ("pending", "running", "completed", "stopped_early", "diverged", "failed", "infeasible")
# Keys a trial may report that are Tune's bookkeeping, not metrics of ours.
_TUNE_KEYS = {
    "time_this_iter_s", "done", "training_iteration", "trial_id", "date", "timestamp", "time_total_s",
    "pid", "hostname", "node_ip", "config", "time_since_restore", "iterations_since_restore",
    "checkpoint_dir_name", "should_checkpoint", "experiment_tag",
}


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


def fs_and_path(uri: str) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(uri if "://" in uri else os.path.abspath(uri))


def write_json(uri: str, obj) -> None:
    """Write JSON atomically: temp file + rename locally; a single PUT is atomic on object stores."""
    data = json.dumps(obj, indent=1, default=_json_default, allow_nan=True).encode()
    fs, path = fs_and_path(uri)
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    else:
        with fs.open_output_stream(path) as f:
            f.write(data)


def read_json(uri: str):
    fs, path = fs_and_path(uri)
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def _metrics_of(result: dict) -> dict:
    """The per-epoch metrics a trial reported, without Tune's bookkeeping or non-numeric values."""
    out = {}
    for key, value in result.items():
        if key in _TUNE_KEYS or key.startswith("qs_") or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return out


class TrialRecorder(Callback):
    """Tune callback (runs in the campaign's driver process) that keeps `qs_trials/<id>.json` current.

    `describe(trial)` returns the trial's flat config, readable name, cost and planned epochs; the
    campaign supplies it so the recorder needs no knowledge of specs or models.
    """

    def __init__(self, experiment_uri: str, campaign: str, describe, echo=print):
        self.experiment_uri = experiment_uri.rstrip("/")
        self.campaign = campaign
        self.describe = describe
        self.echo = echo
        self.records: dict[str, dict] = {}

    # -- record bookkeeping ------------------------------------------------------------------
    def _record(self, trial) -> dict:
        rec = self.records.get(trial.trial_id)
        if rec is None:
            rec = self._load_existing(trial.trial_id)
        if rec is None:
            info = self.describe(trial)
            rec = {
                "trial_id": trial.trial_id, "trial_name": info["name"], "campaign": self.campaign,
                "code_version": code_version(), "status": "pending", "config": info["config"],
                "cost": info["cost"], "epochs": [], "epochs_planned": info["epochs_planned"],
                "error": None, "checkpoint_path": None, "started_at": None, "ended_at": None,
                "first_step_at": None, "train_s": 0.0,
            }
        self.records[trial.trial_id] = rec
        return rec

    def _load_existing(self, trial_id: str) -> dict | None:
        """On resume, continue the record a previous driver wrote (its epoch history survives)."""
        try:
            return read_json(self._uri(trial_id))
        except (FileNotFoundError, OSError, ValueError):
            return None

    def _uri(self, trial_id: str) -> str:
        return f"{self.experiment_uri}/qs_trials/{trial_id}.json"

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
        status = result.get("qs_status")
        if status in ("infeasible", "diverged"):
            rec["status"] = status
            rec["error"] = result.get("qs_error")
            rec["cost"].update({k: result[k] for k in ("params_m", "gmacs") if k in result})
        else:
            metrics = _metrics_of(result)
            if "epoch" in metrics:
                # A resumed trial re-reports epochs it already had: keep one row per epoch.
                rec["epochs"] = [e for e in rec["epochs"] if e.get("epoch") != metrics["epoch"]] + [metrics]
                rec["epochs"].sort(key=lambda e: e["epoch"])
                rec["train_s"] = sum(e.get("epoch_s", 0.0) for e in rec["epochs"])
        if result.get("qs_first_step_at") and not rec.get("first_step_at"):
            rec["first_step_at"] = float(result["qs_first_step_at"])  # start-up = this - started_at
        if result.get("checkpoint_path"):
            rec["checkpoint_path"] = str(result["checkpoint_path"])
        self._save(rec)

    def on_trial_complete(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        if rec["status"] not in ("infeasible", "diverged"):
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
    parts.append(f"{len(rec['epochs'])}/{rec['epochs_planned']} epochs, {rec['train_s']:.1f} s training")
    if rec.get("error") and rec["status"] in ("failed", "diverged", "infeasible"):
        parts.append(rec["error"].strip().splitlines()[-1][:160])
    return " | ".join(parts)
