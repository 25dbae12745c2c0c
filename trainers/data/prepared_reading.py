"""A prepared dataset (trainers.data.prepared) as a trial reads it: a local folder (a node's own copy of one held in a
bucket, each file checked against its SHA-256 as it is copied), checked and repaired before it is read, and each
split's index as arrays."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from qkvsearch.storage import read_bytes, read_json, write_bytes
from qkvsearch.trainers.data.prepared import (
    MANIFEST,
    NAMED,
    UNITS,
    check,
    locked,
    read_manifest,
    repair,
    serial,
    shard_files,
    stamp,
)
from qkvsearch.trainers.data.sources import DatasetError

log = logging.getLogger(__name__)

CACHE_ENV = "QKVSEARCH_PREPARED_CACHE"   # node-local copies of bucket-held prepared datasets (default: temp dir)


def node_copy(location: str) -> str:
    """A local folder to read a prepared dataset from: the location itself when local, else a copy on this node's
    disk (CACHE_ENV, or the temp folder), each file checked against the manifest's SHA-256 as it is copied."""
    if "://" not in location:
        return location
    key = location.rstrip("/").rsplit("/", 1)[-1]
    local = os.path.join(os.environ.get(CACHE_ENV) or tempfile.gettempdir(), "qkvsearch-prepared", key)
    with locked(local):
        manifest = read_json(f"{location}/{MANIFEST}")
        for name in (MANIFEST, UNITS):
            write_bytes(f"{local}/{name}", read_bytes(f"{location}/{name}"))
        for entries in manifest["splits"].values():
            for entry in entries:
                for file, size, digest in shard_files(entry):
                    target = os.path.join(local, file)
                    if os.path.exists(target) and os.path.getsize(target) == size:
                        continue
                    data = read_bytes(f"{location}/{file}")
                    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
                        raise DatasetError(f"data.pipeline: the prepared file {location}/{file} is damaged (its "
                                           f"checksum differs from the manifest's); its campaign prepares it again "
                                           f"when it starts")
                    write_bytes(target, data)
        stamp(local, manifest)
    return local


def open_checked(location: str, run: Callable = serial) -> tuple[str, dict]:
    """(a local folder, its manifest) of a complete prepared dataset, checked; damaged shards prepared again first.
    DatasetError when there is none at ``location``."""
    folder = node_copy(location)
    with locked(folder):
        manifest = read_manifest(folder)
        if manifest is None:
            raise DatasetError(f"data.pipeline: expected a prepared dataset at {location} (a campaign prepares it "
                               f"before its trials start), given none")
        damaged = check(folder, manifest)
        if damaged:
            log.warning("prepared dataset %s: %d damaged shard(s), prepared again: %s", folder, len(damaged),
                        "; ".join(f"{k}: {v}" for k, v in sorted(damaged.items())[:NAMED]))
            manifest = repair(folder, manifest, damaged, run)
    return folder, manifest


@dataclass
class PreparedSplit:
    """One split of a prepared dataset as arrays: per image its shard (index into ``shards``), offset, length,
    height, width and label."""

    folder: str
    format: str
    shards: list[str]
    table: np.ndarray      # (N, 6) int64: shard, offset, length, h, w, label

    def __len__(self):
        return len(self.table)

    @property
    def labels(self) -> np.ndarray:
        return self.table[:, 5]


def read_split(folder: str, manifest: dict, role: str) -> PreparedSplit:
    rows, names = [], []
    for s, entry in enumerate(manifest["splits"][role]):
        with open(os.path.join(folder, f"{entry['name']}.idx"), "rb") as f:
            index = json.loads(f.read())
        names.append(f"{entry['name']}.bin")
        if index:
            rows.append(np.concatenate([np.full((len(index), 1), s), np.asarray(index, dtype=np.int64)], 1))
    table = np.concatenate(rows) if rows else np.zeros((0, 6), dtype=np.int64)
    return PreparedSplit(folder, manifest["format"], names, table)
