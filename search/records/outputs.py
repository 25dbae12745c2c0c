"""Where a command may write: one check of an output folder (``--out``) for every command that writes.

    out = check_output_dir(args.out, "--out", campaign=exp)   # -> the path or URI as given, "/" stripped

Refused with an OutputPathError (a BadInput: the command line exits 2), before anything is written:

- a path that is an existing file;
- a local folder that cannot be made or written: its nearest existing ancestor is a file, or no folder
  can be made in it. That is found by making an empty folder there and removing it: permission bits say
  nothing for root, and /proc or a read-only mount refuse what ``os.access`` allows;
- a path inside a campaign folder, except in the folders its commands write (OUTPUT_DIRS: report/,
  results/, simulate/, exports/): the campaign folder itself, its records (qs_trials/, qs_inherited/, ...), Train's
  checkpoints, its nested campaigns' folders (supernet/, targets/<name>/: campaigns of their own, whose output
  folders are theirs). The campaign is the innermost of ``campaign`` (when given) and the folders holding
  ``qs_campaign.json`` that the path lies in.

URIs (``s3://``, ``gs://``, ``file://``) pass the same file and campaign checks; whether a bucket accepts
writes is left to its store. A URI pyarrow cannot open is refused too. Nothing is left behind here (the
trial folder of the writability check is removed at once); the command creates its folder when it writes.
"""
from __future__ import annotations

import os
import posixpath
import tempfile

import pyarrow.fs as pafs

from qkvsearch.search.records.layout import CAMPAIGN_FILE, TRAIN_RUNS_DIR, TRIALS_DIR, TUNE_TRIAL_FILE
from qkvsearch.spaces.errors import BadInput, reason, show
from qkvsearch.storage import open_location

__all__ = ["OutputPathError", "check_output_dir"]

A_FOLDER = "a folder"
MAKEABLE = "a folder that exists or can be created"
OUTSIDE = "a folder outside a campaign's own files"
# The folders of a campaign its commands write into: `report`'s, `results`' (its Parquet tables alone),
# `simulate`'s and `export`'s defaults
REPORT_DIR, RESULTS_DIR, SIMULATE_DIR, EXPORTS_DIR = "report", "results", "simulate", "exports"
OUTPUT_DIRS = (REPORT_DIR, RESULTS_DIR, SIMULATE_DIR, EXPORTS_DIR)


class OutputPathError(BadInput):
    """An output folder a command must not or cannot write into."""


def check_output_dir(path, field: str = "--out", campaign=None, *, uris: bool = True) -> str:
    """``path`` (local path or URI) as given, without a trailing "/", once it is known to be a folder
    this command may write into (see the module's doc); OutputPathError naming ``field`` otherwise.
    ``campaign``: the campaign folder the command reads, if any (local path or URI). ``uris=False``: a
    command that writes local files only (a URI is refused, not taken for a local folder "s3:")."""
    text = os.fspath(path)
    stripped = text.rstrip("/")
    text = stripped if stripped and ("://" in stripped or "://" not in text) else text  # "s3://" stays a URI
    if not uris and "://" in text:  # a URI as storage.open_location tells one
        _refuse(field, "a local folder (this command writes no storage URI)", text, "which is a URI")
    fs, where = _open(text, field)
    try:
        kind = fs.get_file_info(where).type
    except (OSError, ValueError) as exc:
        _refuse(field, A_FOLDER, text, f"which cannot be looked at ({reason(exc)})")
    if kind == pafs.FileType.File:
        _refuse(field, A_FOLDER, text, "which is a file")
    _outside_campaigns(fs, where, text, field, campaign)
    if isinstance(fs, pafs.LocalFileSystem):
        _can_make(where, text, field)
    return text


def _refuse(field: str, expected: str, text: str, why: str):
    raise OutputPathError(f"{field}: expected {expected}, given {show(text)}, {why}")


def _open(text: str, field: str) -> tuple[pafs.FileSystem, str]:
    try:
        fs, where = open_location(text)
    except (ValueError, OSError) as exc:  # pyarrow: ArrowInvalid (unknown scheme, bad URI) is a ValueError
        _refuse(field, A_FOLDER, text, f"which is no path or URI this machine can open ({reason(exc)})")
    if "://" in text and not where.strip("/"):
        _refuse(field, A_FOLDER, text, "which names no bucket or folder in its store")
    return fs, where


def _outside_campaigns(fs: pafs.FileSystem, where: str, text: str, field: str, campaign) -> None:
    """Refuse ``where`` when it lies in the innermost campaign folder holding it outside its OUTPUT_DIRS (module
    doc)."""
    roots = []
    if campaign is not None:
        cfs, croot = open_location(campaign)
        if type(cfs) is type(fs):
            roots.append(croot.rstrip("/") or "/")
    for folder in _ancestors(where):  # any campaign folder the path lies in, whoever named it
        if folder not in roots and _is_file(fs, posixpath.join(folder, CAMPAIGN_FILE)):
            roots.append(folder)
    inside = [(root, rel) for root in roots if (rel := _relative(where, root)) is not None]
    if not inside:
        return
    root, rel = min(inside, key=lambda pair: len(pair[1]))   # the innermost campaign: a nested one's own
    if rel == "":
        _refuse(field, OUTSIDE, text, "which is the campaign folder itself")
    first = rel.split("/", 1)[0]
    if first in OUTPUT_DIRS:
        return
    if first in (TRIALS_DIR, TRAIN_RUNS_DIR):
        _refuse(field, OUTSIDE, text, f"which is inside the campaign's {first}/ folder")
    if _is_file(fs, posixpath.join(root, first, TUNE_TRIAL_FILE)):
        _refuse(field, OUTSIDE, text, f"which is inside the campaign's Tune trial folder {first}/")
    _refuse(field, OUTSIDE, text, f"which is inside the campaign folder {root}, where only "
                                  f"{', '.join(d + '/' for d in OUTPUT_DIRS)} take outputs beside its records")


def _ancestors(where: str) -> list[str]:
    """``where`` and every folder above it, nearest first ("a/b/c" -> a/b/c, a/b, a)."""
    out = [where]
    while True:
        parent = posixpath.dirname(out[-1])
        if not parent or parent == out[-1]:
            return out
        out.append(parent)


def _relative(where: str, root: str) -> str | None:
    """``where`` relative to ``root`` ("" for root itself), None when it is not inside it."""
    if where == root:
        return ""
    prefix = root if root.endswith("/") else root + "/"
    return where[len(prefix):] if where.startswith(prefix) else None


def _is_file(fs: pafs.FileSystem, path: str) -> bool:
    try:
        return fs.get_file_info(path).type == pafs.FileType.File
    except (OSError, ValueError):  # a store that cannot answer for one key: the write itself will say more
        return False


def _can_make(where: str, text: str, field: str) -> None:
    """Refuse a local folder that cannot be made: the nearest existing ancestor must be a folder in which
    a folder can be made (tried: an empty one, removed at once)."""
    here = where
    while not os.path.lexists(here):
        here = os.path.dirname(here)
    if os.path.islink(here) and not os.path.exists(here):
        _refuse(field, MAKEABLE, text, f"under {here}, a symbolic link to nowhere")
    if not os.path.isdir(here):
        _refuse(field, MAKEABLE, text, f"under {here}, which is a file" if os.path.isfile(here) else
                f"under {here}, which is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".qs-out-", dir=here))
    except OSError as exc:
        _refuse(field, MAKEABLE, text, f"and no folder can be made in {here} ({exc.strerror or reason(exc)})")
