"""The searcher state a campaign saves, as plain data in a versioned format.

Tune saves its searcher with the experiment state, in ``<exp>/searcher-state-<session>.pkl`` (its name), and
restores it on resume. qkvsearch writes JSON there::

    {"format": "qkvsearch-searcher-state", "version": 1, "algorithm": "tpe",
     "proposals": {...the proposal wrapper's bookkeeping...}, "searcher": {...the searcher's state()...}}

A file of a newer version is refused (StateFormatError, exit 2) naming both versions; a file written before
this format existed (a pickle) is read by search.searchers.legacy. What Tune pickles into ``tuner.pkl`` is
``Unbuilt(version)``: the resuming driver builds the searcher from the campaign's spec and puts it in its place.
"""
from __future__ import annotations

import glob
import json
import os

from qkvsearch.spaces.errors import BadInput
from qkvsearch.storage import write_bytes

FORMAT = "qkvsearch-searcher-state"
VERSION = 2   # 2: the proposal wrapper's bookkeeping as ledger records (search.searchers.ledger)
FILE_PATTERN = "searcher-state-*.pkl"   # Tune's name (ray.tune.search.Searcher.CKPT_FILE_TMPL)


class StateFormatError(BadInput):
    """A campaign's searcher state this version of qkvsearch cannot read."""


def _refuse_newer(where: str, version) -> None:
    if not isinstance(version, int) or version > VERSION:
        raise StateFormatError(f"{where}: written by a newer qkvsearch (searcher state version {version}); this "
                               f"one reads versions up to {VERSION}: resume it with that version or a newer one")


class Unbuilt:
    """What tuner.pkl holds in the searcher's place (search.searchers.proposals.Proposals.__reduce__)."""

    def __init__(self, version: int = VERSION):
        self.version = version

    def check(self, where: str) -> None:
        _refuse_newer(where, self.version)


def write(path: str, algorithm: str, proposals: dict, searcher: dict) -> None:
    record = {"format": FORMAT, "version": VERSION, "algorithm": algorithm, "proposals": proposals,
              "searcher": searcher}
    write_bytes(path, json.dumps(record, allow_nan=True).encode("utf-8"))


def read(path: str, algorithm: str) -> dict:
    """The record at ``path`` ({"proposals", "searcher"}); one written before this format is converted."""
    with open(path, "rb") as f:
        data = f.read()
    record = json.loads(data) if data.lstrip().startswith(b"{") else None
    if record is None or "format" not in record:  # a pickle, or grid's count: written before this format
        from qkvsearch.search.searchers.legacy import convert

        return convert(path, algorithm, data)
    if record.get("format") != FORMAT:
        raise StateFormatError(f"{path}: expected a {FORMAT} record, given format {record.get('format')!r}")
    _refuse_newer(path, record.get("version"))
    if record.get("algorithm") != algorithm:
        raise StateFormatError(f"{path}: the saved searcher is {record.get('algorithm')!r}, the campaign's "
                               f"search.algorithm is {algorithm!r}")
    return record


def newest(exp: str) -> str | None:
    """The newest searcher state file of a local campaign folder (Tune's choice on restore), or None."""
    found = glob.glob(os.path.join(exp, FILE_PATTERN))
    return max(found) if found else None


def check_readable(exp: str) -> None:
    """Refuse, before anything is written, a campaign whose saved searcher state is of a newer version."""
    path = newest(exp) if "://" not in exp else None
    if path is None:
        return
    with open(path, "rb") as f:
        head = f.read()
    if head.lstrip().startswith(b"{"):
        try:
            record = json.loads(head)
        except ValueError:
            raise StateFormatError(f"{path}: expected a {FORMAT} record, given damaged JSON") from None
        if isinstance(record, dict) and "format" in record:  # else grid's count, before this format
            _refuse_newer(path, record.get("version"))
