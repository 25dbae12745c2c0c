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
"""
from __future__ import annotations

import json
import time

from qkvsearch.spaces.keys import identity
from qkvsearch.storage import exists, list_files, loads_json, open_location, read_json, read_many, write_json

INHERITED_DIR = "qs_inherited"
SELECTION_FILE = "selection.json"
MEASURED_FILE = "measured.json"
PREDICTOR_FILE = "predictor.json"   # <target>/predictor.json: the measured-cost predictor's use and held-out error
SUBNETS_DIR = "subnets"
SUPERNET_DIR = "supernet"   # <exp>/supernet/: the nested campaign (search.campaign.oneshot.plan)
TARGETS_DIR = "targets"     # <exp>/targets/<name>/: a deployment target's folder (search.campaign.oneshot.targets)
FIDELITY_INHERITED, FIDELITY_STANDALONE, FIDELITY_SUPERNET = "inherited", "standalone", "supernet"
PREDICTED = "predicted"     # an evaluation's and a measurement record's list of the metrics predicted, not measured


def subnet_identity(config: dict, ignore: tuple[str, ...] = ()) -> str:
    """A subnet's identity: its training identity and its quantization policy (one scored per policy)."""
    return identity(config, ignore=ignore, policy=True)


def keys_text(keys: dict) -> str:
    """Space keys as one comparable text: how a selection names the evaluations it picked."""
    return json.dumps(keys, sort_keys=True, default=str)


def write_batch(exp: str, n: int, evaluations: list[dict]) -> None:
    stamped = [{**e, "fidelity": FIDELITY_INHERITED, "evaluated_at": time.time()} for e in evaluations]
    write_json(f"{exp.rstrip('/')}/{INHERITED_DIR}/batch-{n:06d}.json", stamped)


def read_evaluations(exp) -> list[dict]:
    """Every recorded evaluation, in the order they were written ([] when none)."""
    fs, root = open_location(exp)
    folder = f"{root}/{INHERITED_DIR}"
    try:
        names = sorted(f for f in list_files(fs, folder) if f.startswith("batch-") and f.endswith(".json"))
    except (FileNotFoundError, OSError):
        return []
    out = []
    for data in read_many(fs, [f"{folder}/{name}" for name in names]):
        if isinstance(data, bytes):
            try:
                out.extend(loads_json(data))
            except ValueError:
                continue  # a batch cut short by a kill is written again
    uri = f"{str(exp).rstrip('/')}/{INHERITED_DIR}/{MEASURED_FILE}"
    measured = read_json(uri) if exists(uri) else {}
    return [_measured(e, measured[e["subnet_id"]]) if e.get("subnet_id") in measured else e for e in out]


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
    write_json(uri, {**(read_json(uri) if exists(uri) else {}), **found})


def batches_written(exp) -> int:
    fs, root = open_location(exp)
    try:
        return sum(1 for f in list_files(fs, f"{root}/{INHERITED_DIR}") if f.startswith("batch-"))
    except (FileNotFoundError, OSError):
        return 0


def write_selection(exp: str, selection: dict) -> None:
    write_json(f"{exp.rstrip('/')}/{INHERITED_DIR}/{SELECTION_FILE}", selection)


def read_selection(exp) -> dict | None:
    uri = f"{str(exp).rstrip('/')}/{INHERITED_DIR}/{SELECTION_FILE}"
    return read_json(uri) if exists(uri) else None


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
