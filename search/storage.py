"""Whole-file reads and atomic writes on a local path or a URI (``s3://``, ``gs://``, ``file://``, ...).

A write is all or nothing: a reader sees the old file or the new one, never part of one. Locally the
bytes go to a hidden temp file in the target's folder (``.<name>.<random>.tmp``) that ``os.replace``
then renames over the target; the temp file is removed on any failure. On an object store one PUT
is already atomic. Every file the package writes (records, scheduler state, checkpoints, Parquet,
report pages) goes through ``write_bytes``.
"""
from __future__ import annotations

import contextlib
import json
import os
import uuid

import pyarrow.fs as pafs

try:  # records are float-heavy JSON: orjson parses them several times faster than json
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover
    _fast_loads = None

__all__ = ["open_location", "write_bytes", "read_bytes", "write_json", "read_json", "loads_json"]


def open_location(uri_or_path) -> tuple[pafs.FileSystem, str]:
    """Local path or URI -> (filesystem, path inside it); local paths are made absolute."""
    text = os.fspath(uri_or_path)
    if "://" in text:
        fs, path = pafs.FileSystem.from_uri(text)
        return fs, path.rstrip("/") or "/"
    return pafs.LocalFileSystem(), os.path.abspath(text)


def write_bytes(uri, data) -> None:
    """Replace the file at ``uri`` with ``data`` (bytes or any buffer: memoryview, pyarrow.Buffer)
    atomically, creating its parent folders."""
    fs, path = open_location(uri)
    if isinstance(fs, pafs.LocalFileSystem):
        _write_local(path, data)
        return
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(data)


def _write_local(path: str, data: bytes) -> None:
    folder, name = os.path.split(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        # O_EXCL: never write through a name someone else holds; 0o666 lets the umask decide, as open() does.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_bytes(uri) -> bytes:
    """The whole file at ``uri``; FileNotFoundError when there is none."""
    fs, path = open_location(uri)
    with fs.open_input_stream(path) as f:
        return f.read()


def write_json(uri, obj) -> None:
    """``obj`` as JSON (numpy scalars as numbers, other unknown objects as strings), atomically."""
    write_bytes(uri, json.dumps(obj, indent=1, default=_json_default, allow_nan=True).encode("utf-8"))


def read_json(uri):
    return loads_json(read_bytes(uri))


def loads_json(data: bytes):
    """Parse UTF-8 JSON. Raises ValueError: UnicodeDecodeError (not UTF-8), json.JSONDecodeError (not
    JSON), or a plain ValueError for nesting too deep to parse."""
    if _fast_loads is not None:
        try:
            return _fast_loads(data)
        except ValueError:
            pass  # NaN/Infinity (written by write_json) or bad input: json accepts the first, explains the second
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def _json_default(obj):
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)
