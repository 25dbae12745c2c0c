"""The campaign's own record of every trial, and where its files lie under the campaign folder.

Tune's `result.json` is overwritten when a trial restarts, and it cannot say *why* a trial ended
(completed, stopped early, diverged, infeasible). These records can. Layout, under the experiment dir:

    qs_campaign.json                          the validated spec, code version, creation time
    qs_trials/<trial_id>.json                 config, cost, status, timings, error; "epochs_file" names
                                              the epochs file (older records hold "epochs" here instead)
    qs_trials/<trial_id>.epochs.csv           per-epoch metrics (search.records.epochs_csv)
    qs_trials/<name>.damaged[.<n>]            a record or epochs file that could not be read, moved aside

`read_campaign` (here) and `readers.read_trials` are the only readers of these files;
`recorder.Recorder` is their only writer.

The `qs_` prefix means one thing across the project: a name qkvsearch reserves where it shares a
namespace with Ray Tune, i.e. its files in Tune's experiment folder and the reserved keys of a trial's
results (never a trial config key, never a metric).
"""
from __future__ import annotations

import logging
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import pyarrow.fs as pafs

from qkvsearch.spaces.errors import BadInput, show
from qkvsearch.storage import loads_json, open_location

# Reserved result keys: how a trial ended without a score, and the epochs it plans (schedulers and
# searchers tell a stopped trial from a finished one by it). Other reserved keys: trainers.engine.
STATUS_KEY, ERROR_KEY, PLANNED_KEY = "qs_status", "qs_error", "qs_epochs_planned"


# A duplicate trial (its resolved config was trained already) reports its original's outcome under these.
DUPLICATE_OF_KEY, ORIGINAL_STATUS_KEY = "qs_duplicate_of", "qs_original_status"


ERROR_CHARS = 4000  # the end of a failed trial's traceback kept in its record (the cause is at the end)


logger = logging.getLogger(__name__)


# A trial's status in its record. Final ones end the trial for this campaign; "interrupted" is a trial
# its driver stopped (Ctrl-C, SIGTERM): `resume` continues it from its checkpoint.
STATUSES = ("pending", "running", "interrupted", "completed", "stopped_early", "diverged", "failed", "infeasible",
            "duplicate")


FINAL_STATUSES = STATUSES[3:]


# qs_campaign.json: unix times the campaign's driver finished, or was stopped before the end (absent: running)
ENDED_KEY, INTERRUPTED_KEY = "ended_at", "interrupted_at"


CAMPAIGN_FILE = "qs_campaign.json"


TRIALS_DIR = "qs_trials"


DAMAGED_SUFFIX = ".damaged"


EPOCHS_SUFFIX = ".epochs.csv"  # <trial_id>.epochs.csv beside <trial_id>.json


EPOCH = "epoch"


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


def _parse_object(data: bytes) -> tuple[dict | None, str | None]:
    if not data or data.isspace():
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

