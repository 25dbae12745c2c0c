"""The only writer of the trial records: `Recorder` keeps `qs_trials/<id>.json` current and appends each
reported epoch to `qs_trials/<id>.epochs.csv`.

It appends a line per epoch (in place on a local disk; on an object store, which cannot append, it
replaces the small file atomically), and rewrites the file whole and atomically when an epoch brings
a new metric or repeats one already written with other values (a resumed trial reports its
checkpoint's epochs again: with the values written, they change nothing). On resume it moves a
damaged record or epochs file aside, never overwriting it, and keeps the epochs it still gives.
Ray stays out: the campaign layer subclasses it as a Tune callback (search.campaign.recording).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pyarrow.fs as pafs

from qkvsearch.search.records.epochs_csv import (
    _epoch_lines,
    _epoch_names,
    _header_of,
    _parse_epoch_files,
    epochs_csv,
)
from qkvsearch.search.records.layout import (
    _TUNE_KEYS,
    DAMAGED_SUFFIX,
    DUPLICATE_OF_KEY,
    EPOCHS_SUFFIX,
    ERROR_CHARS,
    ERROR_KEY,
    MEASURED_ON_KEY,
    STATUS_KEY,
    TRAINED_BY_KEY,
    TRIALS_DIR,
    UNSCORED_STATUSES,
    UNTRAINED_STATUSES,
    code_version,
    from_tune,
)
from qkvsearch.search.records.readers import TrialRecords, _read_record
from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.metrics import COST_METRICS, EPOCH, MEASURED_METRICS
from qkvsearch.storage import append_bytes, open_location, read_many, write_bytes, write_json

logger = logging.getLogger(__name__)

# Record fields a campaign's run may add to a trial's record: how it was trained (fidelity: standalone, its
# weights its own; the one-shot evaluations, fidelity inherited, are search.records.inherited's), the supernet
# it was chosen from, and the weights its training started from (a subnet trained on from what it inherits).
RECORD_FIELDS = ("fidelity", "supernet", "init_from")


def _metrics_of(result: dict) -> dict:
    """The per-epoch metrics a trial reported, without Tune's bookkeeping, reserved (qs_) keys, its
    cost or non-numeric values."""
    out = {}
    for key, value in result.items():
        if key in _TUNE_KEYS or key in COST_METRICS or key.startswith("qs_") or isinstance(value, bool):
            continue  # measured in a trial's process (an older campaign): the record's cost holds them
        if finite(value) is not None:
            out[key] = finite(value)
    return out


def _with_epoch(epochs: list[dict], metrics: dict) -> list[dict]:
    """A trial's epochs (in epoch order) with ``metrics`` as the row of its epoch: added, or replacing the
    row of that epoch (a resumed trial reports again the epochs of its checkpoint: one row per epoch, the
    latest). ``epochs`` itself when it holds that row already, so that an unchanged epochs file is not
    written again."""
    same = [e for e in epochs if e.get(EPOCH) == metrics[EPOCH]]
    if same == [metrics]:
        return epochs
    out = [e for e in epochs if e.get(EPOCH) != metrics[EPOCH]] + [metrics]
    out.sort(key=lambda e: e[EPOCH])
    return out


class _EpochLog:
    """What the recorder last wrote to a trial's epochs file: its header (None: unknown, write the
    file whole next time) and the epoch objects it holds, in order."""

    __slots__ = ("header", "written")

    def __init__(self):
        self.header: list[str] | None = None
        self.written: list[dict] = []

    def __getstate__(self):
        return self.header, self.written

    def __setstate__(self, state):
        self.header, self.written = state


def _move_aside(fs: pafs.FileSystem, path: str) -> str:
    """Rename a damaged file to ``<path>.damaged`` (``.damaged.<n>`` when that is taken); the new path."""
    aside = path + DAMAGED_SUFFIX
    n = 0
    while fs.get_file_info(aside).type != pafs.FileType.NotFound:
        n += 1
        aside = f"{path}{DAMAGED_SUFFIX}.{n}"
    fs.move(path, aside)
    return aside


class Recorder:
    """Keeps `qs_trials/<id>.json` current and appends each reported epoch to `qs_trials/<id>.epochs.csv`;
    its `on_trial_*` methods take Tune's callback arguments (search.campaign.recording makes it one).

    `describe(trial)` returns the trial's flat config, readable name, cost and planned epochs; the
    campaign supplies it so the recorder needs no knowledge of specs or models. What a person sees of
    a finished trial is the terminal's (search.monitor.terminal), read from these records.
    """

    def __init__(self, experiment_uri: str, campaign: str, describe):
        self.experiment_uri = experiment_uri.rstrip("/")
        self.campaign = campaign
        self.describe = describe
        self.records: dict[str, dict] = {}  # records that may still change (ended ones leave: forget_ended)
        self.epoch_logs: dict[str, _EpochLog] = {}
        self._ended: list[str] = []  # trials whose record ended since the last forget_ended()

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
            if info.get("measured_on"):
                rec["measured_on"] = info["measured_on"]
            for key in RECORD_FIELDS:  # what a run says of the trial (a one-shot campaign: fidelity, supernet, ...)
                if info.get(key) is not None:
                    rec[key] = info[key]
            rec.update(self._load_existing(trial.trial_id) or {})  # a field an older record lacks stays fresh
            self.records[trial.trial_id] = rec
        return rec

    def _load_existing(self, trial_id: str) -> dict | None:
        """On resume, continue the record and epochs file a previous driver wrote (its epoch history
        survives). A damaged record or epochs file is moved aside to `<name>.damaged`, never
        overwritten: it may hold the only copy. The epochs a damaged epochs file still gives are kept."""
        uri = self._uri(trial_id)
        fs, path = open_location(uri)
        try:
            rec, problem = _read_record(fs, path)
        except FileNotFoundError:
            rec, problem = None, None
        if problem is not None:
            aside = _move_aside(fs, path)
            logger.warning("trial record %s is damaged (%s); moved it to %s and started a fresh record",
                           uri, problem, uri + aside[len(path):])
        epochs = self._load_epochs(trial_id)
        if epochs is not None:  # the epochs file holds every epoch (an older record's list included)
            rec = rec or {}
            rec["epochs"] = epochs
        return rec

    def _load_epochs(self, trial_id: str) -> list[dict] | None:
        """The epochs in a previous driver's epochs file, None when there is none. The file is appended
        to only when it reads back exactly as this recorder would write it; otherwise it is written whole
        at the next save (a damaged one first moved aside)."""
        uri = self._epochs_uri(trial_id)
        fs, path = open_location(uri)
        data = read_many(fs, [path])[0]
        log = self.epoch_logs.setdefault(trial_id, _EpochLog())
        if data is None:
            return None
        blocks: list = []
        ((where, problem),) = _parse_epoch_files([(uri, data)], blocks)
        epochs = TrialRecords([{}], [], [where], blocks).epoch_lists()[0]
        if problem is None:
            names = _header_of(data)
            if data == epochs_csv(epochs, names):
                log.header, log.written = names, list(epochs)
            return epochs
        aside = _move_aside(fs, path)
        logger.warning("%s; moved it to %s and kept the %d epoch(s) it gives", problem, uri + aside[len(path):],
                       len(epochs))
        return epochs

    def _uri(self, trial_id: str) -> str:
        return f"{self.experiment_uri}/{TRIALS_DIR}/{trial_id}.json"

    def _epochs_uri(self, trial_id: str) -> str:
        return f"{self.experiment_uri}/{TRIALS_DIR}/{trial_id}{EPOCHS_SUFFIX}"

    def _save(self, rec: dict) -> None:
        # The epochs file first: the record drops an older record's list only once the file holds it.
        self._save_epochs(rec)
        name = f"{rec['trial_id']}{EPOCHS_SUFFIX}"
        write_json(self._uri(rec["trial_id"]),
                   {("epochs_file" if k == "epochs" else k): (name if k == "epochs" else v) for k, v in rec.items()})

    def _save_epochs(self, rec: dict) -> None:
        """Bring the epochs file up to rec["epochs"]: append the epochs added since the last save when
        those before are the ones written (the same objects) and their metrics are in the header;
        otherwise (a repeated epoch, a new metric, a first save) write it whole, atomically."""
        log = self.epoch_logs.setdefault(rec["trial_id"], _EpochLog())
        epochs, done = rec["epochs"], len(log.written)
        uri = self._epochs_uri(rec["trial_id"])
        if log.header is not None and len(epochs) >= done and all(a is b for a, b in zip(epochs, log.written)):
            new = epochs[done:]
            header = set(log.header)
            if all(header.issuperset(_epoch_names([e])) for e in new):
                if new:
                    names = log.header
                    log.header = None  # until the append is known to have happened
                    append_bytes(uri, _epoch_lines(new, names), whole=lambda: epochs_csv(epochs, names))
                    log.header, log.written = names, list(epochs)
                return
        if not epochs and log.header is None:
            return  # no epochs file before the first epoch
        names = _epoch_names(epochs, log.header or ())
        log.header = None
        write_bytes(uri, epochs_csv(epochs, names))
        log.header, log.written = names, list(epochs)

    # -- Tune hooks ----------------------------------------------------------------------------
    def on_trial_start(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        rec["status"] = "running"
        rec["started_at"] = rec["started_at"] or time.time()
        rec["ended_at"] = None
        self._save(rec)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        result = from_tune(result)
        rec = self._record(trial)
        _note_measured(rec, result)
        status = result.get(STATUS_KEY)
        if result.get(TRAINED_BY_KEY):  # evaluated that trial's weights under its own quantization policy
            rec["trained_by"] = str(result[TRAINED_BY_KEY])
        if status in UNSCORED_STATUSES:
            rec["status"] = status
            rec["error"] = result.get(ERROR_KEY)
        elif status == "duplicate":  # trained nothing: its outcome is its original's, recorded there
            rec["status"] = status
            rec["duplicate_of"] = result.get(DUPLICATE_OF_KEY)
        elif rec.get("trained_by"):  # its one result: the trained model's accuracy at the planned epoch
            metrics = _metrics_of(result)
            if status is None and metrics:
                rec["epochs"] = [{**metrics, EPOCH: float(rec["epochs_planned"])}]
        else:
            metrics = _metrics_of(result)
            if EPOCH in metrics:
                rec["epochs"] = _with_epoch(rec["epochs"], metrics)
                rec["train_s_total"] = sum(e.get("train_s", 0.0) for e in rec["epochs"])
        if result.get("qs_first_step_at") and not rec.get("first_step_at"):
            rec["first_step_at"] = float(result["qs_first_step_at"])  # start-up = this - started_at
        if result.get("checkpoint_path"):
            rec["checkpoint_path"] = str(result["checkpoint_path"])
        self._save(rec)

    def on_trial_complete(self, iteration, trials, trial, **info):
        rec = self._record(trial)
        if rec["status"] not in (*UNSCORED_STATUSES, *UNTRAINED_STATUSES):
            done = max((e.get(EPOCH, 0) for e in rec["epochs"]), default=0)
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
        self._ended.append(rec["trial_id"])

    def forget_ended(self) -> int:
        """Drop from memory the records of the trials that ended since the last call: their files hold them, and
        a trial that starts again (Tune restarts it, or retention notes what it kept) has its record read back.
        Called once every callback has seen the end (search.campaign.recording: at Tune's next step), so that
        the driver's memory does not grow with the campaign's trials. Returns how many ended."""
        ended, self._ended = self._ended, []
        for trial_id in ended:
            rec = self.records.get(trial_id)
            if rec is not None and rec.get("ended_at") is not None:
                del self.records[trial_id]
                self.epoch_logs.pop(trial_id, None)
        return len(ended)

    def note_checkpoint(self, trial_id: str, path: str | None, kept: str, note: str) -> None:
        """What an ended trial keeps of its checkpoints (search.campaign.retention): ``path`` its
        checkpoint_path from now on (None: nothing kept), ``kept`` what that is ("state": resumable
        training state, "weights", "none") and ``note`` why. A trial no driver has recorded yet (it ended
        before a resume) has its record read first; one without a record is left alone."""
        rec = self.records.get(trial_id)
        if rec is None:
            rec = self._load_existing(trial_id)
            if rec is None:
                return
            rec.setdefault("epochs", [])
            self.records[trial_id] = rec
        rec.update(checkpoint_path=path, checkpoint_kept=kept, checkpoint_note=note)
        self._save(rec)
        if rec.get("ended_at") is not None:
            self._ended.append(trial_id)

    def mark_interrupted(self) -> list[str]:
        """After the driver was stopped: every trial still running becomes "interrupted" (resume continues
        it). -> their names."""
        stopped = [rec for rec in self.records.values() if rec["status"] == "running"]
        for rec in stopped:
            rec["status"] = "interrupted"
            self._save(rec)
        return [rec["trial_name"] for rec in stopped]


def _note_measured(rec: dict, result: dict) -> None:
    """Cost a trial's own process measured before it trained (a campaign proposed before its driver measured)
    joins the record's cost, with how it was measured under ``measured_on``."""
    measured = {m: finite(result[m]) for m in MEASURED_METRICS if finite(result.get(m)) is not None}
    if measured:
        rec["cost"] = {**rec["cost"], **measured}
    if isinstance(result.get(MEASURED_ON_KEY), str):
        rec["measured_on"] = json.loads(result[MEASURED_ON_KEY])


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None) or ""
    try:
        if path and os.path.exists(path):
            text = Path(path).read_text().strip()
            return text[-ERROR_CHARS:]
    except OSError:
        pass
    return str(getattr(trial, "error_msg", None) or "trial failed (no error file)")
