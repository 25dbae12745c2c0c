"""The campaign's own record of every trial, and where its files lie under the campaign folder.

Tune's `result.json` is overwritten when a trial restarts, and it cannot say *why* a trial ended
(completed, stopped early, diverged, infeasible). These records can. Layout, under the experiment dir:

    qs_campaign.json                          the validated spec, code version, creation time
    qs_driver.lease                           the live driver's hold, while one runs (search.records.lease)
    qs_hv_reference.json                      the fixed hypervolume reference (search.analysis.hv_reference)
    qs_trials/<trial_id>.json                 config, cost, status, timings, error; "epochs_file" names
                                              the epochs file (older records hold "epochs" here instead)
    qs_trials/<trial_id>.epochs.csv           per-epoch metrics (search.records.epochs_csv)
    qs_trials/<name>.damaged[.<n>]            a record or epochs file that could not be read, moved aside
    qs_weights/<trial_id>.pt                  the weights an ended trial keeps (search.campaign.retention)
    train_runs/<run name>/                    each trial's Train run: its checkpoints
    qs_stages/<key>.json                      one stage of one selected configuration (search.records.stages)
    qs_stages/selection.json                  the configurations the stages run for, once the trials ended
    stage_runs/<run name>/                    each fine-tuning's Train run: its checkpoints

`read_campaign` (here; `open_campaign` reads its spec) and `readers.read_trials` are the only readers of these files;
`CampaignFolder` is the only writer of qs_campaign.json, `recorder.Recorder` of the trial records.

The `qs_` prefix means one thing across the project: a name qkvsearch reserves where it shares a
namespace with Ray Tune, i.e. its files in Tune's experiment folder and the reserved keys of a trial's
results (never a trial config key, never a metric).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow.fs as pafs

from qkvsearch.spaces.checks import finite
from qkvsearch.spaces.errors import BadInput, SpecError, reason, section_failed, show
from qkvsearch.spaces.loader import load_campaign, read_stored_spec
from qkvsearch.spaces.spec import CampaignSpec
from qkvsearch.storage import loads_json, open_location, sizes_by_entry, write_json

# Reserved result keys: how a trial ended without a score, and the epochs it plans (schedulers and
# searchers tell a stopped trial from a finished one by it). Other reserved keys: trainers.training.engine.
STATUS_KEY, ERROR_KEY, PLANNED_KEY = "qs_status", "qs_error", "qs_epochs_planned"


# A duplicate trial (its resolved config was trained already) reports its original's outcome under these.
DUPLICATE_OF_KEY, ORIGINAL_STATUS_KEY = "qs_duplicate_of", "qs_original_status"
# A trial that evaluated another trial's weights under its own quantization policy names that trial so.
TRAINED_BY_KEY = "qs_trained_by"
# How a trial's measured cost was measured (JSON: environment, p90 latency, stats; search.campaign.measured).
MEASURED_ON_KEY = "qs_measured_on"


ERROR_CHARS = 4000  # the end of a failed trial's traceback kept in its record (the cause is at the end)

# The numbers of a result that Tune does not steer by, as one JSON object. Tune's controller keeps, in the
# campaign's driver until the run ends, running statistics and two deques of recent values for every numeric
# key of every trial's last result (about 2 KB a key and trial: benchmarks/README.md, "Driver scale"); a string
# costs it nothing. The records hold every number, read back whole (`from_tune`).
METRICS_KEY = "qs_metrics"


def for_tune(result: dict, steering) -> dict:
    """``result`` as a trial hands it to Tune: the numbers named in ``steering`` (what schedulers and searchers
    read: the objectives, the epoch, the planned epochs) and every value that is not a number as they are; the
    other numbers under METRICS_KEY."""
    steering = set(steering)
    kept, packed = {}, {}
    for key, value in result.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        (packed if number and key not in steering else kept)[key] = value
    if packed:
        kept[METRICS_KEY] = json.dumps(packed)  # NaN and infinities as JSON's NaN, Infinity: read back as such
    return kept


def from_tune(result: dict | None) -> dict | None:
    """The result a trial reported, whole again (``for_tune`` undone); a result of a campaign from before
    results were packed, as it is."""
    if not result or METRICS_KEY not in result:
        return result
    whole = {k: v for k, v in result.items() if k != METRICS_KEY}
    return {**json.loads(result[METRICS_KEY]), **whole}


logger = logging.getLogger(__name__)


# A trial's status in its record. Final ones end the trial for this campaign; "interrupted" is a trial
# its driver stopped (Ctrl-C, SIGTERM): `resume` continues it from its checkpoint.
STATUSES = ("pending", "running", "interrupted", "completed", "stopped_early", "diverged", "failed", "infeasible",
            "duplicate")


FINAL_STATUSES = STATUSES[3:]
UNSCORED_STATUSES = ("diverged", "failed", "infeasible")   # final, and ended without a score
UNTRAINED_STATUSES = ("duplicate", "infeasible")          # final, and never trained an epoch


# qs_campaign.json: unix times the campaign's driver finished, or was stopped before the end (absent: running)
ENDED_KEY, INTERRUPTED_KEY = "ended_at", "interrupted_at"


CAMPAIGN_FILE = "qs_campaign.json"


HV_REFERENCE_FILE = "qs_hv_reference.json"  # the campaign's fixed hypervolume reference (search.analysis.hv_reference)


TRIALS_DIR = "qs_trials"


TRAIN_RUNS_DIR = "train_runs"  # <exp>/train_runs/<run name>/: each trial's Train run (checkpoints)


WEIGHTS_DIR = "qs_weights"  # <exp>/qs_weights/<trial_id>.pt: the weights an ended trial keeps (campaign.retention)


STAGES_DIR, STAGE_RUNS_DIR = "qs_stages", "stage_runs"   # the stages after training (search.records.stages)
STAGE_STATUSES = ("running", "completed", "failed", "interrupted")   # a stage record's status


# search.front_repeats (search.records.front_repeats): the runs planned once the search ended, and the Tune experiment
# that trains them (its trials' records in qs_trials/ beside the search's)
FRONT_REPEATS_FILE, FRONT_REPEATS_DIR = "qs_front_repeats.json", "front_repeats"


def experiment_dir(spec) -> str:
    """A spec's campaign folder: <storage>/<name> (a local storage made absolute)."""
    storage = spec.storage
    if "://" not in storage:
        storage = os.path.abspath(storage)
    return f"{storage.rstrip('/')}/{spec.name}"


def storage_use(exp) -> tuple[int, int]:
    """(bytes under the campaign folder, of them its checkpoints: Train runs and kept weights), local path
    or URI alike."""
    sizes = sizes_by_entry(exp)
    return sum(sizes.values()), sizes.get(TRAIN_RUNS_DIR, 0) + sizes.get(WEIGHTS_DIR, 0)


TUNE_TRIAL_FILE = "params.json"  # Tune's (ray.air.constants.EXPR_PARAM_FILE): in every Tune trial folder of <exp>


DAMAGED_SUFFIX = ".damaged"


EPOCHS_SUFFIX = ".epochs.csv"  # <trial_id>.epochs.csv beside <trial_id>.json


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
    try:
        fs, root = open_location(exp)
        with fs.open_input_stream(f"{root}/{CAMPAIGN_FILE}") as f:
            data = f.read()
    except ValueError as exc:  # pyarrow's ArrowInvalid: no filesystem for the scheme, a URI without a bucket
        raise CampaignFileError(f"{shown}: expected a campaign folder (a local path, or a URI such as s3://, "
                                f"gs://, file://), given {_display(exp)} ({reason(exc)})") from None
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


@dataclass(frozen=True)
class Campaign:
    """qs_campaign.json as its readers use it: the spec (a CampaignSpec, by the spec loader's rules and
    defaults) and what the driver recorded. ``problems``: what the loader found wrong in a stored spec that
    another version of qkvsearch wrote, or a partial one (those keys hold their defaults); empty for a spec
    written at launch."""

    name: str
    spec: CampaignSpec
    stored_spec: dict           # the spec as the file holds it (reports print it)
    code_version: str | None = None
    created_at: float | None = None
    ended_at: float | None = None       # ENDED_KEY
    interrupted_at: float | None = None  # INTERRUPTED_KEY
    problems: tuple[str, ...] = ()

    @property
    def objectives(self) -> list[tuple[str, str]]:
        """(metric, "min" | "max") of each objective; the loader's default when the spec states none."""
        return [(o.metric, o.mode) for o in self.spec.objectives]

    @property
    def trials_planned(self) -> int | None:
        """search.num_trials: the trials the campaign plans (grid: points x repeats, as the loader counts
        them); None when the stored spec holds no readable search section."""
        if not isinstance(self.stored_spec.get("search"), dict) or section_failed(self.problems, "search"):
            return None
        return self.spec.search.num_trials

    @property
    def epochs_planned(self) -> int | None:
        """train.epochs: the epochs each trial plans; None when the stored spec holds none."""
        return None if section_failed(self.problems, "train.epochs") else self.spec.train.epochs

    @property
    def max_concurrent_trials(self) -> int | None:
        wanted = self.spec.resources.max_concurrent_trials
        return wanted if isinstance(wanted, int) else None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    @property
    def interrupted(self) -> bool:
        return self.interrupted_at is not None and self.ended_at is None


def open_campaign(exp, *, validate: bool = False) -> Campaign:
    """``<exp>/qs_campaign.json`` (local path or URI) read through ``read_campaign`` and its spec through
    the spec loader. Default: light (timm and torch stay unloaded, model and optimizer names are taken as
    given, a partial or older spec reads as far as it goes: see Campaign.problems), for the readers that
    report on a campaign. ``validate=True`` (resume): the spec fully validated, timm names included, as
    ``spaces.load_campaign``; CampaignFileError naming the file and listing the problems otherwise."""
    raw = read_campaign(exp)
    stored = raw["spec"]
    if validate:
        try:
            spec, problems = load_campaign(stored), ()
        except SpecError as exc:
            raise CampaignFileError(str(SpecError(exc.errors, f"{_display(exp)}/{CAMPAIGN_FILE}"))) from None
    else:
        spec, problems = read_stored_spec(stored)
    name = raw.get("name") if isinstance(raw.get("name"), str) and raw.get("name") else spec.name
    return Campaign(name or _display(exp).rsplit("/", 1)[-1], spec, stored, _text_or_none(raw.get("code_version")),
                    finite(raw.get("created_at")), finite(raw.get(ENDED_KEY)), finite(raw.get(INTERRUPTED_KEY)),
                    problems)


class CampaignFolder:
    """The one reader and writer of ``<exp>/qs_campaign.json`` for a command that changes it (launch,
    resume): opened once (``open``) or made (``create``), then changed in place; each change is written at
    once, atomically. ``campaign``: the file as its readers see it (Campaign)."""

    def __init__(self, exp: str, raw: dict, campaign: Campaign | None = None):
        self.exp, self.raw, self.campaign = exp, raw, campaign

    @classmethod
    def open(cls, exp: str) -> CampaignFolder:
        """A campaign folder to resume: its spec fully validated (CampaignFileError naming the file)."""
        return cls(exp, read_campaign(exp), open_campaign(exp, validate=True))

    @classmethod
    def create(cls, exp: str, spec, version: str) -> CampaignFolder:
        folder = cls(exp, {"name": spec.name, "spec": spec.to_dict(), "code_version": version,
                           "created_at": time.time()})
        folder._write()
        return folder

    def mark(self, key: str | None) -> None:
        """Record when the driver ended (ENDED_KEY) or was stopped (INTERRUPTED_KEY); None: running again."""
        for k in (ENDED_KEY, INTERRUPTED_KEY):
            self.raw.pop(k, None)
        if key is not None:
            self.raw[key] = time.time()
        self._write()

    def set_spec(self, spec) -> None:
        """The spec a resumed campaign goes on with (more trackers: `resume --track`), kept for later resumes."""
        self.raw["spec"] = spec.to_dict()
        self._write()

    def _write(self) -> None:
        write_json(f"{self.exp}/{CAMPAIGN_FILE}", self.raw)


def _text_or_none(value) -> str | None:
    return value if isinstance(value, str) else None


def _parse_object(data: bytes, expected: str = "a JSON object", kind=dict) -> tuple[dict | None, str | None]:
    """(the JSON value of ``data``, None), or (None, "expected <expected>, given <what it holds>") when it is not
    UTF-8 JSON of type ``kind``."""
    if not data or data.isspace():
        return None, f"expected {expected}, given an empty file"
    try:
        obj = loads_json(data)
    except UnicodeDecodeError as exc:
        return None, f"expected UTF-8 JSON, given bytes that are not UTF-8 (at byte {exc.start})"
    except ValueError as exc:
        return None, f"expected {expected}, given invalid or truncated JSON ({exc})"
    if not isinstance(obj, kind):
        return None, f"expected {expected}, given {_kind(obj)}"
    return obj, None


class DamagedRecord(BadInput):
    """A campaign's JSON record that its readers cannot use (``read_json_record``): the message names the file."""


def read_json_record(uri, expected: str, problem=None, kind=dict):
    """The JSON value (of type ``kind``) of the campaign record at ``uri`` (local path or URI); None when there is
    no file. DamagedRecord "<file>: expected <expected>, given <what it holds>" when it is no file (a folder, a pipe:
    never opened), cannot be read, is no UTF-8 JSON of that type (cut short, emptied), or ``problem(value)`` says
    what its content lacks ("<key>: expected ..., given ..."). The one reader of the records a command cannot do
    without (one-shot selections, measured costs, predictor reports); trial records are read apart
    (search.records.readers), a damaged one skipped and named."""
    shown = _display(uri)
    fs, path = open_location(uri)
    found = fs.get_file_info(path).type
    if found == pafs.FileType.NotFound:
        return None
    if found != pafs.FileType.File:
        what = "a folder" if found == pafs.FileType.Directory else "a pipe, socket or device"
        raise DamagedRecord(f"{shown}: expected {expected} (a file), given {what}")
    try:
        with fs.open_input_stream(path) as f:
            data = f.read()
    except OSError as exc:
        raise DamagedRecord(f"{shown}: expected {expected}, given a file that cannot be read ({reason(exc)})") from None
    value, why = _parse_object(data, expected, kind)
    if why is None and problem is not None:
        why = problem(value)
    if why is not None:
        raise DamagedRecord(f"{shown}: {why}")
    return value


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

