"""The campaign file's ``tracking`` section: which experiment trackers a campaign feeds, and their settings.

    tracking:
      mlflow: {tracking_uri: http://mlflow:5000, experiment: xcit-s}   # default: a SQLite store in the folder
      wandb: {project: qkv, mode: offline}                             # offline: run folders in the folder
      tensorboard: {}                                                  # event files in the folder
      optuna: {storage: sqlite:///optuna.db}                           # default: a journal file in the folder

Each tracker's settings and defaults are declared once, in spaces.schema.TRACKERS; the trackers themselves
live in qkvsearch.search.campaign.tracking.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from qkvsearch.spaces.errors import Collector
from qkvsearch.spaces.schema import TRACKERS, WANDB_MODES, CampaignSpec, FrozenMap, plain

# The setting that says where a tracker writes; None puts it inside the campaign folder.
LOCATION = {"mlflow": "tracking_uri", "optuna": "storage"}


def _remote(storage: str) -> bool:
    """Whether the campaign folder is in a bucket (s3://, gs://...), where trackers cannot write files."""
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", storage)
    return bool(scheme) and scheme.group(1).lower() != "file"


def parse_tracking(raw, storage: str, c: Collector) -> FrozenMap:
    """The tracking section -> tracker -> FrozenMap of its settings (defaults filled in). A tracker given as
    ``{}`` or null is on with its defaults; the section absent or null: no tracker."""
    raw = c.section("tracking", raw, TRACKERS, f"a mapping of trackers ({', '.join(TRACKERS)})")
    if raw is None:
        return FrozenMap()
    out = {}
    for name, given in raw.items():
        if name in TRACKERS:
            settings = _parse_tracker(name, given, storage, c)
            if settings is not None:
                out[name] = settings
    return FrozenMap(out)


def _parse_tracker(name: str, given, storage: str, c: Collector) -> FrozenMap | None:
    path, known = f"tracking.{name}", TRACKERS[name]
    if given is None:
        given = {}
    if not isinstance(given, dict):
        c.expected(path, f"a mapping ({', '.join(known)})" if known else "{} (no settings)", given)
        return None
    c.unknown_keys(path, given, known)
    values = dict(known)
    for key, value in given.items():
        if key not in known:
            continue
        if value is not None and not (isinstance(value, str) and value.strip()):
            c.expected(f"{path}.{key}", "a non-empty string", value)
            continue
        values[key] = value
    if name == "wandb" and values["mode"] not in WANDB_MODES:
        c.expected(f"{path}.mode", " | ".join(WANDB_MODES), values["mode"])
    if _remote(storage):
        where = LOCATION.get(name)
        if where is None:
            c.add(path, f"writes its files into the campaign folder, which must be on a local disk (storage is "
                        f"{storage})")
        elif values[where] is None:
            c.add(f"{path}.{where}", f"required when storage is a bucket (the default is a file inside the "
                                     f"campaign folder; storage is {storage})")
    return FrozenMap(values)


def add_trackers(spec: CampaignSpec, names: Iterable[str]) -> CampaignSpec:
    """``spec`` with the trackers ``names`` on (`--track NAME`): those its tracking section lacks get their
    defaults, those it has keep their settings. SpecError naming an unknown tracker."""
    from dataclasses import replace

    raw = plain(spec.tracking)
    for name in names:
        raw.setdefault(name, {})
    c = Collector()
    tracking = parse_tracking(raw, spec.storage, c)
    c.raise_if_any(spec.source)
    return replace(spec, tracking=tracking)
