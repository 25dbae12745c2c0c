"""The epochs file of a trial, `qs_trials/<trial_id>.epochs.csv`: a header line of metric names ("epoch"
among them), then one line per reported epoch.

The file is CSV so that a person can read it (or open it in a spreadsheet) and a reader can hand the
epochs of a thousand trials to one pyarrow call, with no Python object per epoch (JSON lines parse
several times slower, through orjson or pyarrow alike). Cells are numbers as Python writes them (exact
round trip; whole numbers without ".0"), an empty cell is a metric that epoch did not report, names
are CSV-quoted where they need it, lines end in "\n". A reader keeps one row per epoch, the line
written last, in epoch order. A line that does not parse, or a last line without its newline (an
interrupted write), is left out and reported naming the file and line; the trial's other epochs are
still read.
"""
from __future__ import annotations

import csv
import io
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from qkvsearch.spaces.metrics import EPOCH

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
        return None, ("expected a UTF-8 header line of metric names, given bytes that are not UTF-8 "
                      f"(at byte {exc.start})")
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

