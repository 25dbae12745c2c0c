"""The campaign's own record of every trial: a JSON record per trial, rewritten atomically on each
event, and a CSV file of its epochs that grows by one line per reported epoch.

Tune's `result.json` is overwritten when a trial restarts, and it cannot say *why* a trial ended
(completed, stopped early, diverged, infeasible). These records can. Layout, under the experiment dir:

    qs_campaign.json                          the validated spec, code version, creation time
    qs_trials/<trial_id>.json                 config, cost, status, timings, error; "epochs_file" names
                                              the epochs file (older records hold "epochs" here instead)
    qs_trials/<trial_id>.epochs.csv           per-epoch metrics: a header line of metric names ("epoch"
                                              among them), then one line per reported epoch
    qs_trials/<name>.damaged[.<n>]            a record or epochs file that could not be read, moved aside

The epochs file is CSV so that a person can read it (or open it in a spreadsheet) and a reader can
hand the epochs of a thousand trials to one pyarrow call, with no Python object per epoch (JSON
lines parse several times slower, through orjson or pyarrow alike). Cells are numbers as Python
writes them (exact round trip; whole numbers without ".0"), an empty cell is a metric that epoch did
not report, names are CSV-quoted where they need it, lines end in "\n". The recorder appends a line
per epoch (in place on a local disk; on an object store, which cannot append, it replaces the small
file atomically), and rewrites it whole and atomically when an epoch brings a new metric or repeats
one already written with other values (a resumed trial reports its checkpoint's epochs again: with the
values written, they change nothing). A reader keeps one row per epoch, the line written last, in
epoch order. A line that does not parse, or a last line without its newline (an interrupted write),
is left out and reported naming the file and line; the trial's other epochs are still read. On
resume the recorder moves a damaged record or epochs file aside, never overwriting it, and keeps the
epochs it still gives. Records of older campaigns carry their epochs inside the record, as a list of
{metric: value} objects, and have no epochs file; they are read as they are (when both exist, the
epochs file holds them all: the recorder writes it before the record drops its list).

`read_campaign` and `read_trials` are the only readers of these files (status, results, report and
resume use them; `read_trial_records` is `read_trials` with each record's epochs as a list of
objects); `TrialRecorder` is their only writer.

The `qs_` prefix means one thing across the project: a name qkvsearch reserves where it shares a
namespace with Ray Tune, i.e. its files in Tune's experiment folder and the reserved keys of a trial's
results (never a trial config key, never a metric).
"""
from __future__ import annotations

import csv
import io
import logging
import math
import os
import subprocess
import time
import types
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs

from qkvsearch.search.storage import (
    append_bytes,
    list_files,
    loads_json,
    open_location,
    read_many,
    write_bytes,
    write_json,
)
from qkvsearch.spaces.errors import BadInput, show
from qkvsearch.spaces.keys import COST_METRICS

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

    def read_chunk(part: list[str]) -> dict[str, object]:
        wanted = part + [e for e in (n[:-5] + EPOCHS_SUFFIX for n in part) if e in files]
        return dict(zip(wanted, read_many(fs, [f"{folder}/{n}" for n in wanted])))

    records, problems, sources, blocks, chunks = [], [], [], [], []
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
    return (rec, None) if problem is None else (None, problem)


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


# ---------------------------------------------------------------------------------------- epochs files
_CSV_BLOCK = 1 << 24  # bytes pyarrow parses per block: few blocks, since the epochs of a campaign are small


def epochs_csv(epochs: list[dict], names: list[str] | None = None) -> bytes:
    """A whole epochs file: the header line (``names``; default "epoch", then every other key in the
    order first seen) and one line per epoch object."""
    names = names or _epoch_names(epochs)
    return _header_line(names) + _epoch_lines(epochs, names)


def _epoch_names(epochs: list[dict], first: list[str] | tuple = ()) -> list[str]:
    """Header names for ``epochs``: ``first`` (an existing header), then "epoch", then new keys in the
    order seen. A key with a line break could not be one header line: such a metric is not stored."""
    names = dict.fromkeys(first or (EPOCH,))
    for e in epochs:
        names.update(dict.fromkeys(e))
    return [n for n in names if "\n" not in n and "\r" not in n]


def _header_line(names: list[str]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(names)
    return buf.getvalue().encode("utf-8")


def _epoch_lines(epochs: list[dict], names: list[str]) -> bytes:
    return "".join(",".join([_cell(e.get(n)) for n in names]) + "\n" for e in epochs).encode("ascii")


def _cell(v) -> str:
    """A number as Python writes it (read back exactly), whole numbers without ".0"; else empty."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return ""
    try:
        text = repr(float(v))
    except OverflowError:  # an int beyond float range
        return ""
    return text[:-2] if text.endswith(".0") else text


def _parse_epoch_files(files: list[tuple[str, object]], blocks: list, parser=None):
    """Per epochs file (shown name, content: bytes or the OSError reading it): where its rows are,
    ``(block, first row, end row)`` into ``blocks`` (to which parsed (names, rows) blocks are
    appended) or [] for none, and a problem message or None. With an executor ``parser``, returns
    (that list, still to be completed, and per group of files sharing a header (names, files, the
    pending parse)): `_parse_group` completes it."""
    out: list = [None] * len(files)
    groups: dict[bytes, list[tuple[int, memoryview, int]]] = {}  # header line -> (file, lines after it, count)
    headers: dict[bytes, tuple[list[str] | None, str | None]] = {}
    for i, (shown, data) in enumerate(files):
        if isinstance(data, OSError):
            out[i] = ([], f"{shown}: expected a readable file, given {data}")
            continue
        end = data.find(b"\n")
        head = data if end < 0 else data[:end]
        if head not in headers:
            headers[head] = _parse_header(head)
        names, problem = (None, "expected a header line of metric names, given an empty file") \
            if not data or data.isspace() else headers[head]
        if problem is not None:
            out[i] = ([], f"{shown}: {problem}")
        elif end < 0 or end == len(data) - 1:
            out[i] = ([], None)  # a header and no epoch yet
        elif data.endswith(b"\n") and b"\r" not in data:
            groups.setdefault(head, []).append((i, memoryview(data)[end + 1:], data.count(b"\n") - 1))
        else:  # an interrupted last line, or line ends the fast parse would count differently
            out[i] = _parse_lines(shown, names, data[end + 1:], blocks)
    if parser is not None:
        return out, [(headers[head][0], members, parser.submit(_try_csv_numbers, members, len(headers[head][0])))
                     for head, members in groups.items()]
    for head, members in groups.items():
        _parse_group(headers[head][0], members, files, blocks, out)
    return out


def _try_csv_numbers(members: list[tuple[int, memoryview, int]], width: int) -> np.ndarray | None:
    try:
        return _csv_numbers(b"".join([body for _, body, _ in members]), width)
    except (pa.ArrowInvalid, ValueError):
        return None


def _parse_group(names: list[str], members: list[tuple[int, memoryview, int]], files, blocks: list, out: list,
                 rows=False) -> None:
    """Parse the lines of files sharing a header in one call (``rows``: that call's result, when it
    was made already). When it refuses them, halve the group until the refused files are alone; those
    are parsed line by line."""
    counts = [n for _, _, n in members]
    if rows is False:
        rows = _try_csv_numbers(members, len(names))
    if rows is None or len(rows) != sum(counts):
        if len(members) == 1:
            i, body, _ = members[0]
            out[i] = _parse_lines(files[i][0], names, bytes(body), blocks)
        else:
            half = len(members) // 2
            _parse_group(names, members[:half], files, blocks, out)
            _parse_group(names, members[half:], files, blocks, out)
        return
    b = len(blocks)
    blocks.append((names, rows))
    ends = np.cumsum(counts)
    starts = ends - counts
    for (i, _, _), start, end in zip(members, starts.tolist(), ends.tolist()):
        out[i] = ((b, start, end), None)
    # A file whose epochs are not increasing numbers: repeated epochs (a resumed trial) are resolved
    # here; a missing or non-finite epoch goes to the line parser, which names the line.
    epoch = rows[:, names.index(EPOCH)]
    ok = np.isfinite(epoch)
    ok[1:] &= epoch[1:] > epoch[:-1]
    ok[starts] |= np.isfinite(epoch[starts])
    for j in np.unique(np.searchsorted(ends, np.flatnonzero(~ok), side="right")).tolist():
        i, body, _ = members[j]
        part = rows[starts[j]:ends[j]]
        if np.isfinite(part[:, names.index(EPOCH)]).all():
            out[i] = (_add_block(blocks, names, _one_row_per_epoch(part, names.index(EPOCH))), None)
        else:
            out[i] = _parse_lines(files[i][0], names, bytes(body), blocks)


def _csv_numbers(body: bytes, width: int) -> np.ndarray:
    """CSV lines of ``width`` numbers or empty cells -> (n, width) float64, column-major, NaN for an
    empty cell. pyarrow.ArrowInvalid for anything else (a word, a wrong cell count, a blank line)."""
    cols = [f"c{j}" for j in range(width)]
    table = pacsv.read_csv(
        pa.py_buffer(body),
        read_options=pacsv.ReadOptions(column_names=cols, block_size=_CSV_BLOCK),
        parse_options=pacsv.ParseOptions(quote_char=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(cols, pa.float64()), null_values=[""],
                                             strings_can_be_null=False),
    )
    rows = np.empty((table.num_rows, width), order="F")
    for j, col in enumerate(table.columns):
        rows[:, j] = col.to_numpy()  # nulls come out as NaN
    return rows


def _parse_header(head: bytes) -> tuple[list[str] | None, str | None]:
    """The names on an epochs file's first line ``head``, or what is wrong with it."""
    try:
        text = head.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError as exc:
        return None, f"expected a UTF-8 header line of metric names, given bytes that are not UTF-8 (at byte {exc.start})"
    names = next(csv.reader([text]), [])
    if EPOCH not in names or "" in names or len(set(names)) != len(names):
        return None, f"expected a header line of distinct metric names including {EPOCH}, given {_shorten(head)}"
    return names, None


def _header_of(data: bytes) -> list[str] | None:
    end = data.find(b"\n")
    return _parse_header(data if end < 0 else data[:end])[0]


def _parse_lines(shown: str, names: list[str], body: bytes, blocks: list) -> tuple[object, str | None]:
    """The line-by-line parse of one epochs file: its good lines, and one message naming the first bad
    line and how many were left out."""
    width, e = len(names), names.index(EPOCH)
    lines = body.split(b"\n")
    tail = lines.pop()  # what follows the last newline: nothing, unless a write was cut short
    rows, bad = [], []
    for n, raw in enumerate(lines, start=2):
        values = _parse_line(raw, width, e)
        if values is None:
            bad.append((n, raw))
        else:
            rows.append(values)
    said = []
    if bad:
        n, raw = bad[0]
        said.append(f"line {n}: expected {width} comma-separated numbers or empty cells (a number for {EPOCH}), "
                    f"given {_shorten(raw)}; {len(bad)} such line(s) left out")
    if tail:
        said.append(f"line {len(lines) + 2}: expected a line ending in a newline, given {_shorten(tail)} "
                    "(an interrupted write); left out")
    problem = f"{shown}: {'; '.join(said)}" if said else None
    if not rows:
        return [], problem
    matrix = np.asfortranarray(np.array(rows, dtype=np.float64))
    return _add_block(blocks, names, _one_row_per_epoch(matrix, e)), problem


def _parse_line(raw: bytes, width: int, e: int) -> list[float] | None:
    try:
        text = raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        return None
    cells = next(csv.reader([text]), [""])
    if len(cells) != width:
        return None
    values = []
    for cell in cells:
        cell = cell.strip()
        try:
            values.append(float(cell) if cell else math.nan)
        except ValueError:
            return None
    return values if math.isfinite(values[e]) else None


def _one_row_per_epoch(rows: np.ndarray, e: int) -> np.ndarray:
    """Rows in epoch order, one per epoch: of rows with the same epoch the one written last."""
    epoch = rows[:, e]
    if len(epoch) < 2 or (epoch[1:] > epoch[:-1]).all():
        return rows
    order = np.argsort(epoch, kind="stable")
    ordered = epoch[order]
    last = np.append(ordered[1:] != ordered[:-1], True)
    return rows[order[last]]


def _add_block(blocks: list, names: list[str], rows: np.ndarray) -> tuple[int, int, int]:
    blocks.append((names, rows))
    return len(blocks) - 1, 0, len(rows)


def _dicts_into(out: np.ndarray, row: int, epochs: list[dict], index: dict[str, int]) -> None:
    """Epoch objects of an older record into out[row:row + len(epochs)], at the columns ``index``
    gives; a missing or non-numeric value stays NaN. Epochs sharing one key order (the usual case)
    are converted in one numpy call, others value by value."""
    if not epochs:
        return
    block = None
    if len(set(map(tuple, epochs))) == 1:
        try:
            block = np.array(list(map(list, map(dict.values, epochs))), dtype=np.float64)  # (n, K)
        except (TypeError, ValueError):
            block = None  # a string or nested value: value by value
    if block is not None and block.ndim == 2:
        out[row:row + len(epochs), [index[k] for k in epochs[0]]] = block
        return
    for i, e in enumerate(epochs):
        for k, v in e.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[row + i, index[k]] = float(v)


def _shorten(raw: bytes, limit: int = 60) -> str:
    text = raw.decode("utf-8", errors="replace")
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def _metrics_of(result: dict) -> dict:
    """The per-epoch metrics a trial reported, without Tune's bookkeeping, reserved (qs_) keys, its
    cost or non-numeric values."""
    out = {}
    for key, value in result.items():
        if key in _TUNE_KEYS or key in COST_METRICS or key.startswith("qs_") or isinstance(value, bool):
            continue  # cost metrics ride along each result for the schedulers; the record holds them once
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
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


class _Recorder:
    """Tune callback (runs in the campaign's driver process) that keeps `qs_trials/<id>.json` current
    and appends each reported epoch to `qs_trials/<id>.epochs.csv` (see the module's layout).

    `describe(trial)` returns the trial's flat config, readable name, cost and planned epochs; the
    campaign supplies it so the recorder needs no knowledge of specs or models. What a person sees of
    a finished trial is the terminal's (search.terminal), read from these records.
    """

    def __init__(self, experiment_uri: str, campaign: str, describe):
        self.experiment_uri = experiment_uri.rstrip("/")
        self.campaign = campaign
        self.describe = describe
        self.records: dict[str, dict] = {}
        self.epoch_logs: dict[str, _EpochLog] = {}

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
        rec = self._record(trial)
        status = result.get(STATUS_KEY)
        if status in ("infeasible", "diverged", "failed"):
            rec["status"] = status
            rec["error"] = result.get(ERROR_KEY)
        elif status == "duplicate":  # trained nothing: its outcome is its original's, recorded there
            rec["status"] = status
            rec["duplicate_of"] = result.get(DUPLICATE_OF_KEY)
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
        if rec["status"] not in ("infeasible", "diverged", "failed", "duplicate"):
            done = max((e.get("epoch", 0) for e in rec["epochs"]), default=0)
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

    def mark_interrupted(self) -> list[str]:
        """After the driver was stopped: every trial still running becomes "interrupted" (resume continues
        it). -> their names."""
        stopped = [rec for rec in self.records.values() if rec["status"] == "running"]
        for rec in stopped:
            rec["status"] = "interrupted"
            self._save(rec)
        return [rec["trial_name"] for rec in stopped]


def __getattr__(name: str):
    # TrialRecorder subclasses ray.tune.Callback. Built on first use, so that the readers above (status,
    # results, report) do not import Ray, which takes seconds.
    if name == "TrialRecorder":
        from ray.tune import Callback

        cls = types.new_class("TrialRecorder", (_Recorder, Callback),
                              exec_body=lambda ns: ns.update(__module__=__name__, __doc__=_Recorder.__doc__))
        globals()["TrialRecorder"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _error_text(trial) -> str:
    path = getattr(trial, "error_file", None) or ""
    try:
        if path and os.path.exists(path):
            text = Path(path).read_text().strip()
            return text[-ERROR_CHARS:]
    except OSError:
        pass
    return str(getattr(trial, "error_msg", None) or "trial failed (no error file)")
