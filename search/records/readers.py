"""Reading a campaign's trial records and their epochs (local path or URI): `read_trials` (epochs as
columns, counts or last rows) and `read_trial_records` (epochs as lists of objects). Status, results,
report, progress and resume read through them. Records of older campaigns carry their epochs inside
the record, as a list of {metric: value} objects, and have no epochs file; they are read as they are
(when both exist, the epochs file holds them all: the recorder writes it before the record drops its
list).
"""
from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow.fs as pafs

from qkvsearch.search.records.epochs_csv import _dicts_into, _parse_epoch_files, _parse_group
from qkvsearch.search.records.layout import (
    _ABSENT,
    EPOCHS_SUFFIX,
    TRIALS_DIR,
    _display,
    _kind,
    _parse_object,
)
from qkvsearch.spaces.metrics import EPOCH
from qkvsearch.spaces.upgrade import upgraded
from qkvsearch.storage import can_append, list_files, open_location, read_many

logger = logging.getLogger(__name__)


def read_trial_records(exp) -> tuple[list[dict], list[str]]:
    """Every readable trial record of a campaign (local path or URI), in file-name order, each with its
    epochs as "epochs": a list of {metric: value} objects in epoch order; and one message per damaged
    record or epochs file ("<file>: expected ..., given ..."), each also logged as a warning. A trial
    whose epochs file is damaged keeps the epochs that could be read. See `read_trials`."""
    trials = read_trials(exp)
    for rec, epochs in zip(trials.records, trials.epoch_lists()):
        rec["epochs"] = epochs
    return trials.records, trials.problems


class EpochColumns:
    """Every epoch of the trials read, as columns: ``names`` ("epoch" first, then each metric once),
    ``values`` (E, len(names)) float64 in column-major order (NaN: not reported), rows trial after
    trial in record order; ``counts`` (T,) int64 rows per record."""

    def __init__(self, names: list[str], values: np.ndarray, counts: np.ndarray):
        self.names, self.values, self.counts = names, values, counts


class TrialRecords:
    """What `read_trials` read: ``records`` (dicts as stored, in file-name order, without "epochs"),
    ``problems`` (one message per damaged file), and the records' epochs: as columns
    (``epoch_columns()``), per record as a count and its last epoch (``epoch_counts()``,
    ``last_epochs()``), or as lists of objects (``epoch_lists()``: an object per epoch, which for a
    million epochs takes seconds)."""

    def __init__(self, records: list[dict], problems: list[str], sources: list, blocks: list):
        self.records, self.problems = records, problems
        self._sources = sources  # per record: (block index, first row, end row) or a list of epoch objects
        self._blocks = blocks  # parsed epochs files: (names, (n, len(names)) float64 rows)

    def epoch_counts(self) -> list[int]:
        """Per record the number of epochs it reported."""
        return [len(src) if isinstance(src, list) else src[2] - src[1] for src in self._sources]

    def last_epochs(self) -> list[dict]:
        """Per record its last epoch as {metric: value} ({} for none): what a one-line summary needs,
        without an object per epoch."""
        out = []
        for src in self._sources:
            if isinstance(src, list):
                out.append(src[-1] if src else {})
            elif src[2] > src[1]:
                names, rows = self._blocks[src[0]]
                out.append({n: v for n, v in zip(names, rows[src[2] - 1].tolist()) if v == v})
            else:
                out.append({})
        return out

    def epoch_lists(self) -> list[list[dict]]:
        """Per record its epochs as {metric: value} objects (an epochs file's empty cells left out)."""
        out = []
        for src in self._sources:
            if isinstance(src, list):
                out.append(src)
                continue
            names, rows = self._blocks[src[0]]
            part = rows[src[1]:src[2]]
            if not np.isnan(part).any():
                out.append([dict(zip(names, r)) for r in part.tolist()])
            else:
                out.append([{n: v for n, v in zip(names, r) if v == v} for r in part.tolist()])
        return out

    def epoch_columns(self) -> EpochColumns:
        """All epochs as one column-major matrix (see EpochColumns)."""
        index = {EPOCH: 0}
        counts = np.zeros(len(self._sources), dtype=np.int64)
        for t, src in enumerate(self._sources):
            if isinstance(src, list):
                for e in src:
                    for k in e:
                        index.setdefault(k, len(index))
                counts[t] = len(src)
            else:
                for n in self._blocks[src[0]][0]:
                    index.setdefault(n, len(index))
                counts[t] = src[2] - src[1]
        values = np.empty((int(counts.sum()), len(index)), order="F")
        row, t = 0, 0
        while t < len(self._sources):
            src = self._sources[t]
            if isinstance(src, list):
                values[row:row + len(src)] = np.nan
                _dicts_into(values, row, src, index)
                row, t = row + len(src), t + 1
                continue
            b, start, end = src
            t += 1
            while t < len(self._sources) and not isinstance(self._sources[t], list) \
                    and self._sources[t][0] == b and self._sources[t][1] == end:
                end = self._sources[t][2]  # the next record's rows follow in the same block: one copy
                t += 1
            names, rows = self._blocks[b]
            cols = [index[n] for n in names]
            if cols == list(range(len(cols))):
                values[row:row + end - start, :len(cols)] = rows[start:end]
            else:
                values[row:row + end - start, cols] = rows[start:end]
            if len(cols) < len(index):  # metrics these files lack
                values[row:row + end - start, sorted(set(range(len(index))) - set(cols))] = np.nan
            row += end - start
        return EpochColumns(list(index), values, counts)


def read_trials(exp) -> TrialRecords:
    """Every readable trial record of a campaign (local path or URI) and its epochs, in file-name
    order, with one message per damaged record or epochs file ("<file>: expected ..., given ..."),
    each also logged as a warning. Only ``qs_trials/*.json`` files are records: hidden, temp
    (``*.tmp*``) and moved-aside files are not; ``<name>.epochs.csv`` holds the epochs of ``<name>.json``.
    Files go in chunks: while a chunk's epochs files, those sharing a header line (the usual case: one
    trainer) together, are parsed by pyarrow in a second thread (without the GIL), the next chunk is
    read and its records parsed; a file that pyarrow call refuses is parsed line by line to name what
    is wrong with it. (A third thread reading ahead gains nothing measurable on two cores: each of its
    system calls waits for the GIL.)"""
    fs, root = open_location(exp)
    folder = f"{root}/{TRIALS_DIR}"
    shown = f"{_display(exp)}/{TRIALS_DIR}"
    files = {n for n in list_files(fs, folder) if not n.startswith(".") and ".tmp" not in n}
    names = sorted(n for n in files if n.endswith(".json"))
    problems = [f"{shown}/{name}: expected a trial record (a file), given {kind}"
                for name, kind in _not_files(fs, folder, files)]
    for problem in problems:
        logger.warning("skipped damaged trial record %s", problem)

    def read_chunk(part: list[str]) -> dict[str, object]:
        wanted = part + [e for e in (n[:-5] + EPOCHS_SUFFIX for n in part) if e in files]
        return dict(zip(wanted, read_many(fs, [f"{folder}/{n}" for n in wanted])))

    records, sources, blocks, chunks = [], [], [], []
    with ThreadPoolExecutor(1) as parser:
        for lo in range(0, len(names), _CHUNK):
            part = names[lo:lo + _CHUNK]
            contents = read_chunk(part)
            epoch_names = [n[:-5] + EPOCHS_SUFFIX for n in part]
            texts = []  # (record index, shown name, content) of this chunk's epochs files
            for name, epochs_name in zip(part, epoch_names):
                data = contents[name]
                if data is None:
                    continue  # removed since the listing
                rec, problem = (None, f"expected a readable file, given {data}") if isinstance(data, OSError) \
                    else _parse_record(data)
                if problem is not None:
                    problems.append(f"{shown}/{name}: {problem}")
                    logger.warning("skipped damaged trial record %s", problems[-1])
                    continue
                inline = rec.pop("epochs", [])
                text = contents.get(epochs_name)
                if text is None:  # no epochs file (an older record, or no epoch reported yet)
                    sources.append(inline)
                else:
                    sources.append([])
                    texts.append((len(sources) - 1, f"{shown}/{epochs_name}", text))
                records.append(rec)
            found = [(w, d) for _, w, d in texts]
            chunks.append((texts, found, _parse_epoch_files(found, blocks, parser)))
            if len(chunks) > 1:  # the previous chunk's parse is done or nearly: its file contents can go
                _finish_chunk(*chunks.pop(0), blocks, sources, problems)
        for chunk in chunks:
            _finish_chunk(*chunk, blocks, sources, problems)
    return TrialRecords(records, problems, sources, blocks)


def _not_files(fs: pafs.FileSystem, folder: str, files: set[str]) -> list[tuple[str, str]]:
    """(name, what it is) of each entry named like a record (``*.json``, not hidden, not a temp file) that is
    not a plain file (``files``): a folder, a link to nowhere, a pipe or device (never opened: reading a pipe
    blocks). The listing of plain files passes them over; a record that is one is damaged all the same."""
    def named(name: str) -> bool:
        return name.endswith(".json") and name not in files and not name.startswith(".") and ".tmp" not in name

    out = []
    if can_append(fs):  # local: as storage.list_files lists, by the entry types scandir gives
        try:
            with os.scandir(folder) as it:
                for e in it:
                    if named(e.name) and not e.is_file():
                        kind = ("a folder" if e.is_dir() else "a link to nowhere" if e.is_symlink()
                                and not os.path.exists(e.path) else "a pipe, socket or device")
                        out.append((e.name, kind))
        except OSError:  # no folder, or an unreadable one: the listing of its files says as much
            return []
    else:  # an object store holds files and the folders their names imply
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        out = [(i.base_name, "a folder") for i in infos if named(i.base_name) and i.type == pafs.FileType.Directory]
    return sorted(out)


def _finish_chunk(texts, found, parsed, blocks, sources, problems) -> None:
    """Wait for a chunk's pyarrow parse, complete it, and point its records at their epoch rows."""
    out, jobs = parsed
    for names, members, job in jobs:
        _parse_group(names, members, found, blocks, out, job.result())
    for (t, _, _), (where, problem) in zip(texts, out):
        sources[t] = where
        if problem is not None:
            problems.append(problem)
            logger.warning("damaged epochs file %s (the trial's other epochs are read)", problem)


def read_record(exp, trial_id: str) -> dict | None:
    """One trial's record (without its epochs file), or None when it has none or it cannot be read."""
    fs, root = open_location(exp)
    try:
        rec, _ = _read_record(fs, f"{root}/{TRIALS_DIR}/{trial_id}.json")
    except FileNotFoundError:
        return None
    return rec


_CHUNK = 1024  # records per step of read_trials: a few MB of epochs, so that parsing overlaps reading


def _read_record(fs: pafs.FileSystem, path: str) -> tuple[dict | None, str | None]:
    """(record, None) or (None, what is wrong with the file); FileNotFoundError when there is none."""
    try:
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        return None, f"expected a readable file, given {exc}"
    return _parse_record(data)


def _parse_record(data: bytes) -> tuple[dict | None, str | None]:
    rec, problem = _parse_object(data)
    if problem is None:
        problem = _record_problem(rec)
    if problem is not None:
        return None, problem
    rec["config"] = upgraded(rec["config"])   # written before some keys existed: what it meant by their absence
    return rec, None


def _record_problem(rec: dict) -> str | None:
    """What makes a parsed record unusable (the fields readers rely on have the wrong type), or None."""
    if not isinstance(rec.get("trial_id"), str):
        return f"trial_id: expected a string, given {_kind(rec.get('trial_id', _ABSENT))}"
    for key in ("config", "cost"):
        if not isinstance(rec.get(key), dict):
            return f"{key}: expected an object, given {_kind(rec.get(key, _ABSENT))}"
    epochs = rec.get("epochs", [])  # a record of the current layout has none: its epochs are in its epochs file
    if not isinstance(epochs, list):
        return f"epochs: expected a list of objects, given {_kind(epochs)}"
    if not set(map(type, epochs)) <= {dict}:
        bad = next(e for e in epochs if not isinstance(e, dict))
        return f"epochs: expected a list of objects, given a list holding {_kind(bad)}"
    return None

