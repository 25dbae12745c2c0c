"""Subnets scored with the weights they inherit from a supernet (one-shot search, search.campaign.oneshot): one file per
batch of evaluations, written once, atomically, and the searcher's state beside them.

    qs_inherited/batch-<n>.json    [{"subnet_id", "config", "cost", "metrics": {top1, top5, val_loss, top1_q, size_mb},
                                     "fidelity": "inherited", "supernet": its checkpoint, "space": the space's
                                     hash, "evaluated_at"}, ...]
    qs_inherited/selection.json    the subnets chosen to train on their own, and the control sample
    qs_inherited/measured.json     {subnet_id: {"cost", "measured_on"} or {"error"}}: costs measured for real
                                   where they were predicted (search.campaign.oneshot.predictor), read in place
    subnets/<subnet_id>.pt         each selected subnet as a stand-alone checkpoint: {"model": the state dict
                                   build_model(config) loads, BatchNorm recalibrated; "config"; "supernet"}
    supernet/                      the nested campaign whose one trial trains the supernet (its own records)
    targets/<name>/                a deployment target's own campaign folder (search.campaign.oneshot.targets):
                                   its campaign file, qs_inherited/ and subnets/ as above, and predictor.json

Every batch is written whole (qkvsearch.storage): one that cannot be read, or holds no evaluation, was damaged
since; it is skipped and named (``read_scored``), as a damaged trial record is. The selection, the measured costs
and a predictor's report are read through search.records.layout.read_json_record: a damaged one is a DamagedRecord
naming the file (the command exits 2).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from qkvsearch.search.records.layout import (
    _ABSENT,
    CAMPAIGN_FILE,
    _display,
    _kind,
    _parse_object,
    read_json_record,
)
from qkvsearch.spaces.checks import is_int
from qkvsearch.spaces.keys import identity
from qkvsearch.spaces.upgrade import upgraded
from qkvsearch.storage import exists, list_files, open_location, read_many, write_json

logger = logging.getLogger(__name__)

INHERITED_DIR = "qs_inherited"
SELECTION_FILE = "selection.json"
MEASURED_FILE = "measured.json"
PREDICTOR_FILE = "predictor.json"   # <target>/predictor.json: the measured-cost predictor's use and held-out error
SUBNETS_DIR = "subnets"
SUPERNET_DIR = "supernet"   # <exp>/supernet/: the nested campaign (search.campaign.oneshot.plan)
TARGETS_DIR = "targets"     # <exp>/targets/<name>/: a deployment target's folder (search.campaign.oneshot.targets)
FIDELITY_INHERITED, FIDELITY_STANDALONE, FIDELITY_SUPERNET = "inherited", "standalone", "supernet"
PREDICTED = "predicted"     # an evaluation's and a measurement record's list of the metrics predicted, not measured
TUNER_FILE = "tuner.pkl"  # written when a retraining's Tune experiment starts, before any trial's record


def subnet_identity(config: dict, ignore: tuple[str, ...] = ()) -> str:
    """A subnet's identity: its training identity and its quantization policy (one scored per policy)."""
    return identity(config, ignore=ignore, policy=True)


def keys_text(keys: dict) -> str:
    """Space keys as one comparable text: how a selection names the evaluations it picked."""
    return json.dumps(keys, sort_keys=True, default=str)


def write_batch(exp: str, n: int, evaluations: list[dict]) -> None:
    stamped = [{**e, "fidelity": FIDELITY_INHERITED, "evaluated_at": time.time()} for e in evaluations]
    write_json(f"{exp.rstrip('/')}/{INHERITED_DIR}/batch-{n:06d}.json", stamped)


BATCH = "a batch of scored subnets (a non-empty JSON list of evaluations)"
MEASURED = 'costs measured for real (a JSON object {subnet_id: {"cost", "measured_on"} or {"error"}})'
SELECTION = 'the subnets selected to retrain (a JSON object {"chosen", "control", "seed"})'


def read_evaluations(exp) -> list[dict]:
    """Every recorded evaluation, in the order they were written ([] when none); a damaged batch is skipped, and
    logged naming it (``read_scored``)."""
    return read_scored(exp)[0]


def read_scored(exp) -> tuple[list[dict], list[str]]:
    """(every readable evaluation, in the order written; one message per damaged batch: "<file>: expected ...,
    given ...", each also logged as a warning). The costs measured since (measured.json) in place of the
    predicted ones; DamagedRecord naming measured.json when it cannot be read."""
    fs, root = open_location(exp)
    folder = f"{root}/{INHERITED_DIR}"
    shown = f"{_display(exp)}/{INHERITED_DIR}"
    try:
        names = sorted(f for f in list_files(fs, folder) if f.startswith("batch-") and f.endswith(".json"))
    except (FileNotFoundError, OSError):
        return [], []
    out, problems = [], []
    for name, data in zip(names, read_many(fs, [f"{folder}/{name}" for name in names])):
        if data is None:
            continue  # removed since the listing
        batch, why = (None, f"expected {BATCH}, given a file that cannot be read ({data})") \
            if isinstance(data, OSError) else _parse_object(data, BATCH, list)
        why = why or _batch_problem(batch)
        if why is not None:
            problems.append(f"{shown}/{name}: {why}")
            logger.warning("skipped damaged scored batch %s (its subnets count as not scored)", problems[-1])
            continue
        out.extend({**e, "config": upgraded(e["config"])} for e in batch)   # written before some keys existed
    measured = read_json_record(f"{_display(exp)}/{INHERITED_DIR}/{MEASURED_FILE}", MEASURED, _measured_problem) \
        or {}
    return [_measured(e, measured[e["subnet_id"]]) if e["subnet_id"] in measured else e for e in out], problems


def _batch_problem(batch: list) -> str | None:
    """What makes a parsed batch unusable (the fields its readers rely on missing or of the wrong type), or None."""
    if not batch:
        return f"expected {BATCH}, given an empty list"
    for i, e in enumerate(batch):
        if not isinstance(e, dict):
            return f"[{i}]: expected an evaluation (an object), given {_kind(e)}"
        if not isinstance(e.get("subnet_id"), str):
            return f"[{i}].subnet_id: expected a string, given {_kind(e.get('subnet_id', _ABSENT))}"
        for key in ("keys", "config", "cost", "metrics"):
            if not isinstance(e.get(key), dict):
                return f"[{i}].{key}: expected an object, given {_kind(e.get(key, _ABSENT))}"
    return None


def _measured_problem(measured: dict) -> str | None:
    for sid, found in measured.items():
        if not isinstance(found, dict) or not ("error" in found or isinstance(found.get("cost"), dict)):
            return f'{sid}: expected {{"cost": {{...}}, "measured_on": ...}} or {{"error": ...}}, given {_kind(found)}'
    return None


def _measured(evaluation: dict, found: dict) -> dict:
    """An evaluation whose predicted costs were measured for real since: the measured ones in their place."""
    out = {k: v for k, v in evaluation.items() if k != PREDICTED}
    if "error" in found:
        return {**out, "status": "failed", "error": found["error"]}
    predicted = {m: evaluation["cost"][m] for m in evaluation.get(PREDICTED) or () if m in evaluation["cost"]}
    return {**out, "cost": {**evaluation["cost"], **found["cost"]}, "measured_on": found["measured_on"],
            "confirmed": True, "predicted_cost": predicted}


def write_measured(exp: str, found: dict) -> None:
    """Add costs measured for real (subnet_id -> {"cost", "measured_on"} or {"error"}) to those written."""
    uri = f"{exp.rstrip('/')}/{INHERITED_DIR}/{MEASURED_FILE}"
    write_json(uri, {**(read_json_record(uri, MEASURED, _measured_problem) or {}), **found})


def batches_written(exp) -> int:
    fs, root = open_location(exp)
    try:
        return sum(1 for f in list_files(fs, f"{root}/{INHERITED_DIR}") if f.startswith("batch-"))
    except (FileNotFoundError, OSError):
        return 0


def write_selection(exp: str, selection: dict) -> None:
    write_json(f"{exp.rstrip('/')}/{INHERITED_DIR}/{SELECTION_FILE}", selection)


def read_selection(exp) -> dict | None:
    """The selection once written, else None; DamagedRecord naming the file when it cannot be read."""
    return read_json_record(f"{_display(exp)}/{INHERITED_DIR}/{SELECTION_FILE}", SELECTION, _selection_problem)


def _selection_problem(selection: dict) -> str | None:
    for role in ("chosen", "control"):
        keys = selection.get(role, _ABSENT)
        if not isinstance(keys, list) or not all(isinstance(k, dict) for k in keys):
            return f"{role}: expected a list of objects (space keys), given {_kind(keys)}"
    if not is_int(selection.get("seed")):
        return f"seed: expected an int, given {_kind(selection.get('seed', _ABSENT))}"
    return None


def read_predictor(folder) -> dict:
    """A target's predictor.json ({} when there is none); DamagedRecord naming the file when it cannot be read."""
    return read_json_record(f"{_display(folder)}/{PREDICTOR_FILE}", "the measured-cost predictor's report (a JSON "
                            "object)") or {}


def retrained_variants(selection: dict) -> list[dict]:
    """The space keys of every training a selection plans: each selected configuration once, the control ones a
    second time under the next seed (the noise floor their ranking is judged against)."""
    seed = selection["seed"]
    return [dict(k) for k in selection["chosen"]] + [dict(k) for k in selection["control"]] \
        + [{**k, "seed": seed + 1} for k in selection["control"]]


def subnet_file(exp: str, subnet_id: str) -> str:
    """Where a selected subnet's stand-alone checkpoint is written."""
    return f"{exp.rstrip('/')}/{SUBNETS_DIR}/{subnet_id}.pt"


def target_dir(exp: str, target: str | None) -> str:
    """The folder of a deployment target's evaluations, selection and subnets (the campaign's own without one)."""
    return exp.rstrip("/") if target is None else f"{exp.rstrip('/')}/{TARGETS_DIR}/{target}"


def is_one_shot(campaign) -> bool:
    """Whether the campaign (search.records.layout.Campaign) is a one-shot one: a ``supernet`` section."""
    return bool(campaign.spec.supernet) or isinstance(campaign.stored_spec.get("supernet"), dict)


@dataclass(frozen=True)
class Folders:
    """What a one-shot campaign's folders of scores hold (``read_folders``): its own, or one per deployment target
    (in the campaign file's order; a target's missing folder left out)."""

    scored: dict[str, int]                   # folder -> evaluations recorded
    selections: dict[str, dict | None]       # folder -> its selection (None: none written)
    problems: tuple[str, ...]                # "<file>: expected ..., given ...": damaged or missing records


def read_folders(exp, campaign, *, driver_live: bool = False) -> Folders:
    """A one-shot campaign's folders of scores, and what they lack or hold damaged: scored batches that cannot be
    read, a deployment target's folder missing beside the others' (every target's is made before any scores), and
    a selection missing once the phases went past it (its folder scored search.num_trials subnets, a later
    target's folder scored any, or its retraining began). ``driver_live``: a driver is at work (a selection about to
    be written is not missing). DamagedRecord when a selection or measured costs cannot be read."""
    root = _display(exp)
    targets = getattr(campaign.spec, "targets", ()) or ()
    folders = [target_dir(root, t.name) for t in targets] if targets else [root]
    present = [f for f in folders if not targets or exists(f"{f}/{CAMPAIGN_FILE}")]
    problems = [f"{f}: expected the folder of deployment target {t.name} (its scores, selection and subnets), "
                "given none" for t, f in zip(targets, folders) if present and f not in present]
    scored, selections = {}, {}
    for f in present:
        evaluations, damaged = read_scored(f)
        scored[f], selections[f] = len(evaluations), read_selection(f)
        problems += damaged
    planned = campaign.trials_planned
    for i, f in enumerate(present):
        later = any(scored[g] for g in present[i + 1:])
        begun = exists(f"{f}/{TUNER_FILE}") or (f == root and campaign.ended)   # its retraining
        if selections[f] is None and scored[f] and not driver_live and \
                (later or begun or (planned is not None and scored[f] >= planned)):
            problems.append(f"{f}/{INHERITED_DIR}/{SELECTION_FILE}: expected the subnets selected once "
                            f"{scored[f]} were scored, given no file (removed, or its driver stopped before it "
                            "chose)")
    return Folders(scored, selections, tuple(problems))
